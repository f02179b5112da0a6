import numpy as np
import pytest
import torch

from flowrl.errors import ConfigError
from flowrl.rewards import WeightedSum, build_reward, reward_names
from flowrl.worlds.shapes.scenes import sample_pairs


def _as_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255


def test_shapes_reward_scores_renders_and_mismatches():
    images, prompts = sample_pairs(16, np.random.default_rng(0))
    reward = build_reward("shapes")
    out = reward(_as_tensor(images), prompts)
    assert out.scores.shape == (16,) and torch.all(out.scores == 1) and torch.all(out.info["accuracy"] == 1)
    shuffled = reward(_as_tensor(images), prompts[1:] + prompts[:1])
    assert shuffled.scores.mean() < 0.9
    assert not reward.differentiable


def test_shapes_reward_exact_objects_lowers_only_cluttered_scores():
    from flowrl.worlds.shapes.world import ShapeObject, render

    clutter = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("square", "blue", 18, 18, 9)])
    single = render([ShapeObject("circle", "red", 2, 2, 9)])
    samples, prompts = _as_tensor(np.stack([clutter, single])), ["a circle", "a circle"]
    lenient, exact = (
        build_reward("shapes")(samples, prompts),
        build_reward("shapes", exact_objects=True)(samples, prompts),
    )
    assert lenient.scores.tolist() == [1.0, 1.0] and exact.scores.tolist() == [0.5, 1.0]
    assert exact.info["accuracy"].tolist() == [1.0, 1.0]  # the logged verdict is the eval's, unchanged


def test_jpeg_rewards_prefer_flat_or_busy_images():
    flat = torch.zeros(2, 3, 32, 32)
    busy = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    compress = build_reward("jpeg_compressibility")
    incompress = build_reward("jpeg_incompressibility")
    assert torch.all(compress(flat, ["", ""]).scores > compress(busy, ["", ""]).scores)
    assert torch.all(incompress(busy, ["", ""]).scores > incompress(flat, ["", ""]).scores)


def test_weighted_sum_and_registry():
    images, prompts = sample_pairs(4, np.random.default_rng(1))
    samples = _as_tensor(images)
    shapes, jpeg = build_reward("shapes"), build_reward("jpeg_compressibility")
    combined = WeightedSum([shapes, jpeg], [2.0, 0.5])(samples, prompts)
    expected = 2.0 * shapes(samples, prompts).scores + 0.5 * jpeg(samples, prompts).scores
    torch.testing.assert_close(combined.scores, expected)
    assert set(combined.info) >= {"shapes", "jpeg_compressibility"}
    from flowrl.rewards.base import standardized_sum

    a, b = torch.tensor([1.0, 3.0, 10.0, 30.0]), torch.tensor([0.0, 2.0, 0.0, 4.0])
    batch = standardized_sum([a, b], [1.0, 0.5])
    torch.testing.assert_close(batch, (a - a.mean()) / (a.std() + 1e-6) + 0.5 * (b - b.mean()) / (b.std() + 1e-6))
    groups = torch.tensor([0, 0, 1, 1])
    within = standardized_sum([a, b], [1.0, 0.5], groups)
    # each group of two standardizes to -1/sqrt(2), +1/sqrt(2): scale-free, unlike the batch form
    expected = torch.tensor([-1.0, 1.0, -1.0, 1.0]) / 2**0.5 * 1.5
    torch.testing.assert_close(within, expected, atol=1e-5, rtol=1e-5)
    assert {"shapes", "jpeg_compressibility", "jpeg_incompressibility"} <= set(reward_names())
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        build_reward("nope")


def test_group_standardized_terms_with_global_std_grpo_are_gdpo():
    """Flow-Factory's default multi-reward advantage (GDPO): each reward standardized within its group (population
    std), weighted, summed, then the whole batch standardized. flowrl's train.normalize_rewards: group followed by
    GRPO's std: global gives the same advantages (the group means of the sum are zero already; the per-term std
    convention rescales every term alike, which the batch step removes)."""
    from flowrl.algorithms.advantages import group_advantages
    from flowrl.rewards.base import standardized_sum

    generator = torch.Generator().manual_seed(0)
    groups = torch.arange(6).repeat_interleave(8)
    clip = 0.25 + 0.05 * torch.randn(48, generator=generator)  # CLIP cosines
    pick = 21 + 2 * torch.randn(48, generator=generator)  # PickScore logits
    weights = [1.0, 0.5]

    def gdpo(terms):  # by its definition, written out
        combined = torch.zeros(48, dtype=torch.float64)
        for term, weight in zip(terms, weights):
            term = term.double()
            for g in groups.unique():
                m = groups == g
                combined[m] += weight * (term[m] - term[m].mean()) / term[m].std(unbiased=False)
        return (combined - combined.mean()) / combined.std(unbiased=False)

    ours = group_advantages(standardized_sum([clip, pick], weights, groups), groups, "global", clip=None)
    torch.testing.assert_close(ours.double(), gdpo([clip, pick]), atol=1e-3, rtol=1e-3)
    # the plain weighted sum, group-normalised (their "sum"), is another advantage
    summed = group_advantages(clip + 0.5 * pick, groups, "group", clip=None)
    assert (summed.double() - gdpo([clip, pick])).abs().max() > 0.1


def test_the_loop_combines_standardized_reward_terms_within_groups(tiny_sd3_dir, tmp_path):
    from run_helpers import tiny_run_config

    from flowrl.config import load_config
    from flowrl.rewards.base import standardized_sum
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "norm", updates=1)
    terms = "reward=[{name: jpeg_compressibility, weight: 1.0}, {name: shapes, weight: 2.0}]"
    raw_trainer = Trainer(load_config(path, [terms]), log=False)
    batch, metrics = Trainer(load_config(path, [terms, "train.normalize_rewards=group"]), log=False).collect(0)
    raw, raw_metrics = raw_trainer.collect(0)
    images = raw_trainer.policy.decode(raw.trajectory.final)
    components = [
        raw_trainer.reward.rewards[0](images, raw.prompts).scores,
        raw_trainer.reward.rewards[1](images, raw.prompts).scores,
    ]
    torch.testing.assert_close(raw.global_rewards, components[0] + 2.0 * components[1])
    torch.testing.assert_close(batch.global_rewards, standardized_sum(components, [1.0, 2.0], raw.global_group_ids))


def test_each_reward_term_scores_in_its_own_batch_size():
    from flowrl.rewards.base import Reward, RewardOutput, WeightedSum

    class Sizes(Reward):
        name = "sizes"

        def __init__(self):
            self.calls = []

        def __call__(self, samples, prompts, meta=None):
            self.calls.append(len(prompts))
            return RewardOutput(samples.flatten(1).mean(1))

    small, whole = Sizes(), Sizes()
    samples = torch.rand(8, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    out = WeightedSum([small, whole], [1.0, 2.0], [3, 0])(samples, ["p"] * 8, {"seeds": list(range(8))})
    assert small.calls == [3, 3, 2] and whole.calls == [8]
    torch.testing.assert_close(out.scores, 3.0 * samples.flatten(1).mean(1))


def test_standardizing_ignores_failed_entries():
    from flowrl.rewards.base import standardized_sum

    scores = torch.tensor([1.0, float("nan"), 3.0, 5.0])
    z = standardized_sum([scores], [1.0])
    finite = torch.tensor([1.0, 3.0, 5.0])
    torch.testing.assert_close(z[[0, 2, 3]], (finite - finite.mean()) / (finite.std() + 1e-6))
    assert torch.isnan(z[1])  # one failed sample fails only itself, not the whole batch
