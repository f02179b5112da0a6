"""TVRL on a tiny WanPipeline: with uniform token weights its loss and gradient are GRPO's,
the on-policy ratio is 1, and a toy scorer that reads one region of one frame puts its credit on the tokens covering
that region; the token geometry follows Wan's causal VAE."""

import pytest
import torch
from tiny_pipelines import rolled_out, tiny_hunyuan_video, tiny_ltx, tiny_wan

from flowrl.algorithms import build_algorithm
from flowrl.algorithms.tvrl import pixels_to_tokens, smooth_weights, token_geometry, token_log_probs
from flowrl.config import SamplerSection
from flowrl.errors import ConfigError
from flowrl.rewards.base import WeightedSum
from flowrl.rewards.questions import QuestionScorer

FRAME, ROWS, COLS = 6, slice(0, 16), slice(16, 32)  # the toy scorer's region: top-right quadrant of frame 6


class RegionScorer(QuestionScorer):
    """log p(yes) = logsigmoid(8 (mean brightness of one region of one frame - 0.5)); one or two questions."""

    name = "region"

    def questions(self, prompt):
        return ["is the region bright"] if "circle" in prompt else ["is the region bright", "again"]

    def log_yes(self, samples, questions):
        region = samples[:, :, FRAME, ROWS, COLS].mean(dim=(1, 2, 3))
        return torch.nn.functional.logsigmoid(8 * (region - 0.5))


@pytest.fixture(scope="module")
def setup():
    return rolled_out(tiny_wan)


def tvrl(params=None):
    algorithm = build_algorithm("tvrl", params or {}, SamplerSection())
    algorithm.bind_reward(WeightedSum([RegionScorer()], [1.0]))
    return algorithm


def test_token_geometry_of_the_tiny_wan(setup):
    policy, batch = setup
    assert token_geometry(policy) == (4, 8, (1, 2, 2))
    assert batch.trajectory.final.shape[2:] == (3, 4, 4)  # 9 frames -> 3 latent frames; 32 px -> 4 latent px


def test_pixels_to_tokens_follows_the_causal_vae():
    m = torch.zeros(1, 9, 32, 32)
    m[0, FRAME, ROWS, COLS] = 1.0
    tokens = pixels_to_tokens(m, 3, 4, 8, (1, 2, 2))
    assert tokens.shape == (1, 3, 2, 2)
    expected = torch.zeros(1, 3, 2, 2)
    expected[0, 2, 0, 1] = 1 / 4  # latent frame 2 holds pixel frames 5-8: one of its four frames is lit
    torch.testing.assert_close(tokens, expected)


def test_credit_of_a_scorer_reading_one_region_lands_on_its_tokens(setup):
    policy, batch = setup
    algorithm = tvrl()
    raw = algorithm.credit_maps(policy, batch)  # [B, K], K = 3 x 2 x 2
    assert raw.shape == (6, 12)
    torch.testing.assert_close(raw.mean(1), torch.ones(6))
    target = 2 * 4 + 0 * 2 + 1  # latent frame 2, token row 0, token column 1
    share = raw[:, target] / raw.sum(1)
    assert (share > 0.9).all(), share
    weights = smooth_weights(raw, 0.5, 0.2, 5.0)
    torch.testing.assert_close(weights.mean(1), torch.ones(6))
    assert (weights[:, target] > weights.max(1).values - 1e-6).all()


@pytest.mark.parametrize("token_ratio", [False, True])
def test_uniform_weights_give_grpos_loss_and_gradient(setup, token_ratio):
    policy, batch = setup
    grpo = build_algorithm("grpo", {}, SamplerSection())
    items, _ = grpo.prepare(batch, policy)
    grpo_losses, grpo_diag = grpo.loss(policy, batch, items)
    grpo_grads = torch.autograd.grad(grpo_losses.sum(), list(policy.trainable_parameters()))

    algorithm = tvrl({"token_ratio": token_ratio})
    tv_items, _ = algorithm.prepare(batch, policy)
    assert torch.equal(tv_items.sample, items.sample) and torch.equal(tv_items.step, items.step)
    algorithm.token_weights = torch.ones_like(algorithm.token_weights)  # w = 1
    losses, diagnostics = algorithm.loss(policy, batch, tv_items)
    grads = torch.autograd.grad(losses.sum(), list(policy.trainable_parameters()))
    torch.testing.assert_close(diagnostics["ratio"], torch.ones_like(diagnostics["ratio"]), atol=1e-6, rtol=0)
    torch.testing.assert_close(losses, grpo_losses, atol=1e-6, rtol=1e-6)
    for a, b in zip(grads, grpo_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("make, geometry", [(tiny_ltx, (4, 4, (1, 1, 1))), (tiny_hunyuan_video, (4, 8, (1, 1, 1)))])
def test_tvrl_credits_ltx_and_hunyuan_video_tokens(make, geometry):
    """LTX-Video and HunyuanVideo name their VAE compressions and patches otherwise than Wan (an int patch_size and
    patch_size_t): credit lands on the read region's tokens and uniform weights still give GRPO's loss."""
    policy, batch = rolled_out(make)
    temporal, spatial, patch = token_geometry(policy)
    assert (temporal, spatial, patch) == geometry
    raw = tvrl().credit_maps(policy, batch)
    latent = batch.trajectory.final.shape[2:]
    grid = raw.view(6, *latent)  # patch 1: a token per latent position
    region = grid[:, 2, : 16 // spatial, 16 // spatial :]  # frame 6 is in latent frame 2
    assert (region.sum(dim=(1, 2)) / raw.sum(1) > 0.9).all()
    grpo = build_algorithm("grpo", {}, SamplerSection())
    items, _ = grpo.prepare(batch, policy)
    algorithm = tvrl()
    tv_items, _ = algorithm.prepare(batch, policy)
    assert algorithm.old_token_log_probs.shape[1] == raw.shape[1]
    algorithm.token_weights = torch.ones_like(algorithm.token_weights)
    torch.testing.assert_close(
        algorithm.loss(policy, batch, tv_items)[0], grpo.loss(policy, batch, items)[0], atol=1e-6, rtol=1e-6
    )


def test_tvrl_refuses_stale_asynchronous_rollouts():
    """Its old per-token log-densities come from the policy in prepare: a batch drawn S updates back would go
    uncorrected (GRPO's ratio uses the rollout's stored log-probs)."""
    from conftest import REPO

    from flowrl.config import load_config
    from flowrl.train import Trainer

    base = ["runtime.async_rollouts=true", "algorithm.name=tvrl", "runtime.threads=1"]
    with pytest.raises(ConfigError, match="runtime.staleness: algorithm 'tvrl'"):
        Trainer(load_config(REPO / "configs" / "shapes_grpo.yaml", base))


def test_credit_weights_change_the_loss_and_tokens_average_elements():
    lp = torch.randn(2, 4, 3, 4, 4)
    tokens = token_log_probs(lp, (1, 2, 2))
    assert tokens.shape == (2, 3, 2, 2)
    torch.testing.assert_close(tokens.mean(dim=(1, 2, 3)), lp.mean(dim=(1, 2, 3, 4)))
    torch.testing.assert_close(tokens[0, 1, 0, 1], lp[0, :, 1, 0:2, 2:4].mean())


def test_tvrl_needs_a_question_scorer_and_refuses_grpo_only_options():
    algorithm = build_algorithm("tvrl", {}, SamplerSection())
    from flowrl.rewards import build_reward

    with pytest.raises(ConfigError, match="question-answering reward"):
        algorithm.bind_reward(WeightedSum([build_reward("jpeg_compressibility")], [1.0]))
    with pytest.raises(ConfigError, match="kl_beta: 0"):
        build_algorithm("tvrl", {"kl_beta": 0.01}, SamplerSection())


@pytest.mark.parametrize("algorithm", ["grpo", "tvrl"])
def test_video_grpo_and_tvrl_train_the_moving_shapes_config_end_to_end(algorithm, tmp_path):
    """configs/moving_shapes_grpo.yaml on a tiny Wan pipeline: two updates with the video verifier (GRPO) or the
    question scorer (TVRL), held-out evaluation per tag, checkpoints."""
    import json

    from conftest import REPO

    from flowrl.config import load_config
    from flowrl.experiment import run_experiment
    from flowrl.worlds.moving_shapes.model_qa import build_model, save_model

    tiny_wan().save_pretrained(tmp_path / "wan")
    save_model(*build_model(0), tmp_path / "qa")
    overrides = [
        f"pipeline.path={tmp_path / 'wan'}",
        f"run.out_dir={tmp_path / 'runs'}",
        "train.updates=2",
        "train.groups_per_update=2",
        "train.group_size=2",
        "memory.microbatch_size=4",
        "runtime.threads=1",
        "train.checkpoint_every=1",
        "sampler.num_steps=3",
        "sampler.sde_window_range=[0, 2]",
        "sampler.sde_window_size=2",
        "eval.num_steps=2",
        "eval.num_per_prompt=1",
        "eval.every=2",
        f"algorithm.name={algorithm}",
    ]
    if algorithm == "tvrl":
        overrides.append(f"reward=[{{name: moving_shapes_qa, params: {{path: {tmp_path / 'qa'}}}}}]")
    run_dir = run_experiment(load_config(REPO / "configs" / "moving_shapes_grpo.yaml", overrides))
    evals = json.loads((run_dir / "eval.json").read_text())
    assert set(evals) == {"0", "2"} and set(evals["2"]["tags"]) == {
        "object",
        "motion",
        "static",
        "two_objects",
        "dynamic_attribute",
        "motion_order",
        "relative_motion",
    }
    assert (run_dir / "checkpoints" / "update_000002").is_dir()
    # the report plays base | tuned clips side by side (MP4 + GIF, two clips' width plus the gap)
    report = (run_dir / "report.html").read_text()
    gifs = sorted((run_dir / "before_after").glob("*.gif"))
    assert gifs and len(gifs) == len(list((run_dir / "before_after").glob("*.mp4")))
    assert all(f"before_after/{g.name}" in report for g in gifs)
    from PIL import Image

    with Image.open(gifs[0]) as gif:
        assert gif.size == (2 * 32 + 2, 32) and gif.n_frames > 1


def test_smoothing_at_gamma_other_than_one_half_with_a_clamp_that_bites():
    """gamma 0.8 on credit [0, 1, 3]: (1 - 0.8) + 0.8 w = [0.2, 1.0, 2.6], clamped to [0.5, 2] = [0.5, 1.0, 2.0],
    renormalised to mean 1 (divided by 3.5 / 3). At gamma 0.5, 1 - gamma and gamma coincide and hide a swap."""
    weights = smooth_weights(torch.tensor([[0.0, 1.0, 3.0]]), 0.8, 0.5, 2.0)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 1.0, 2.0]]) * 3 / 3.5)


class LeftColumnScorer(RegionScorer):
    """Reads the left half of frame 2 instead (another question reward); records how many frames it was shown."""

    name = "left"
    seen_frames: list[int] = []

    def log_yes(self, samples, questions):
        self.seen_frames.append(samples.shape[2])
        region = samples[:, :, 2, :, :16].mean(dim=(1, 2, 3))
        return torch.nn.functional.logsigmoid(8 * (region - 0.5))


def test_credit_combines_every_question_reward_by_its_weight(setup):
    """Two question rewards weighted 1 and 3: the credit is the weighted mean of each one's own maps (the first alone
    once took all the credit)."""
    policy, batch = setup

    def credit(rewards, weights):
        algorithm = build_algorithm("tvrl", {}, SamplerSection())
        algorithm.bind_reward(WeightedSum(rewards, weights))
        return algorithm.credit_maps(policy, batch)

    region, left = credit([RegionScorer()], [1.0]), credit([LeftColumnScorer()], [1.0])
    assert not torch.allclose(region, left)
    torch.testing.assert_close(credit([RegionScorer(), LeftColumnScorer()], [1.0, 3.0]), (region + 3 * left) / 4)


def test_the_scorers_see_at_most_max_scored_frames_evenly_spaced(setup):
    policy, batch = setup
    LeftColumnScorer.seen_frames.clear()
    for most, expected in [(16, 9), (4, 4)]:  # the tiny clips have 9 frames
        algorithm = build_algorithm("tvrl", {"max_scored_frames": most}, SamplerSection())
        algorithm.bind_reward(WeightedSum([LeftColumnScorer()], [1.0]))
        algorithm.credit_maps(policy, batch)
        assert set(LeftColumnScorer.seen_frames) == {expected}
        LeftColumnScorer.seen_frames.clear()
    from flowrl.algorithms.tvrl import scored_frames

    assert scored_frames(9, 16) is None and scored_frames(81, 5).tolist() == [0, 20, 40, 60, 80]


@pytest.mark.parametrize("token_ratio", [True, False])
def test_non_uniform_credit_weights_each_tokens_log_prob_in_loss_and_gradient(setup, token_ratio):
    """On policy (ratio 1, inside the clip) both forms give loss -A and gradient
    -A grad(sum_k w_k log pi_k / sum_k w_k): each token's log-prob counts by its credit, unlike weights of one."""
    policy, batch = setup
    algorithm = tvrl({"token_ratio": token_ratio})
    items, _ = algorithm.prepare(batch, policy)
    g = torch.Generator().manual_seed(0)
    algorithm.token_weights = 0.1 + torch.rand(algorithm.token_weights.shape, generator=g) ** 4  # far from uniform
    params = list(policy.trainable_parameters())
    losses, _ = algorithm.loss(policy, batch, items)
    grads = torch.autograd.grad(losses.sum(), params)
    advantage = algorithm.advantages[items.sample]
    torch.testing.assert_close(losses.detach(), -advantage, atol=1e-5, rtol=1e-5)
    w = algorithm.token_weights[items.sample].flatten(1)
    new = algorithm.token_terms(policy, batch.trajectory, items).flatten(1)
    expected = torch.autograd.grad((-advantage * (w * new).sum(1) / w.sum(1)).sum(), params, retain_graph=True)
    uniform = torch.autograd.grad((-advantage * new.mean(1)).sum(), params)
    for a, b, c in zip(grads, expected, uniform):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert max((b - c).abs().max().item() for b, c in zip(expected, uniform)) > 10 * max(
        b.abs().max().item() * 1e-4 for b in expected
    )
