"""FK steering on a toy flow model whose velocity is exact for a 2-D Gaussian mixture, so the tilted target
p(x) exp(lambda r(x)) has a closed form."""

import math

import torch
from toy_flows import MEANS, SCALE, WEIGHTS, GaussianMixtureFlow

from flowrl.fk import FKConfig, FKSteering, effective_sample_size, log_potential, resample_indices
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.rollout import rollout, sample_generators


def _tilted_mean_x1(lam: float) -> float:
    log_w = torch.log(WEIGHTS) + lam * MEANS[:, 0] + lam**2 * SCALE**2 / 2
    w = torch.softmax(log_w, 0)
    return float((w * (MEANS[:, 0] + lam * SCALE**2)).sum())


def _sample(num_groups, fk: FKConfig | None, seed=0, steps=20):
    policy = GaussianMixtureFlow()
    k = fk.num_particles if fk else 1
    n = num_groups * k
    cond = Conditioning({"id": torch.zeros(n, 1)}, {}, ["p"] * n)
    callbacks, steering = [], None
    if fk is not None:
        steering = FKSteering(
            fk, lambda z, prompts, items: z[:, 0], steps, num_groups, torch.Generator().manual_seed(seed)
        )
        callbacks = [steering]
    traj = rollout(
        policy,
        cond,
        sample_generators(range(seed * 100_000, seed * 100_000 + n)),
        (2,),
        steps,
        "flow",
        0.5,
        1.0,
        callbacks=callbacks,
    )
    return traj.final.double(), steering


def test_potentials_multiply_to_exp_lambda_reward():
    for potential in ("diff", "max", "add", "rt"):
        final, steering = _sample(16, FKConfig(num_particles=4, lam=2.0, potential=potential, resample_every=3))
        torch.testing.assert_close(steering.log_product, 2.0 * final[:, 0], atol=1e-5, rtol=0)
        torch.testing.assert_close(steering.final_rewards, final[:, 0], atol=1e-6, rtol=0)


def test_log_potentials_by_hand():
    r_t, r_prev = torch.tensor([1.0, -0.5]), torch.tensor([0.25, 0.0])
    assert torch.allclose(log_potential("diff", 2.0, r_t, r_prev)[0], torch.tensor([1.5, -1.0]))
    assert torch.allclose(log_potential("max", 2.0, r_t, r_prev)[0], torch.tensor([2.0, 0.0]))
    assert torch.allclose(log_potential("add", 2.0, r_t, r_prev)[0], torch.tensor([2.5, -1.0]))
    assert torch.allclose(log_potential("rt", 2.0, r_t, r_prev)[0], torch.tensor([2.0, -1.0]))
    assert torch.allclose(effective_sample_size(torch.zeros(1, 4)), torch.tensor([4.0]))
    assert torch.allclose(effective_sample_size(torch.tensor([[0.0, -1e9, -1e9, -1e9]])), torch.tensor([1.0]))


def test_resampling_stays_within_groups_and_follows_the_weights():
    log_w = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    picks = torch.stack([resample_indices(log_w, torch.Generator().manual_seed(s)) for s in range(2000)])
    assert torch.all(picks[:, :4] < 4) and torch.all(picks[:, 4:] >= 4)
    share = (picks[:, :4] == 0).double().mean()
    assert abs(float(share) - 0.7) < 0.02
    kept = resample_indices(log_w, torch.Generator().manual_seed(0), torch.tensor([False, True]))
    assert kept[:4].tolist() == [0, 1, 2, 3]


def test_lambda_zero_leaves_the_marginal_unchanged():
    plain, _ = _sample(2048, None, seed=1)
    steered, steering = _sample(512, FKConfig(num_particles=4, lam=0.0, resample_every=1), seed=2)
    assert steering.resampled_at == [19]  # weights stay uniform: only the final (uniform) resampling happens
    for column in range(2):
        a, b = plain[:, column], steered[:, column]
        error = 3 * math.sqrt(a.var() / len(a) + b.var() / len(b))
        assert abs(float(a.mean() - b.mean())) < error
    assert abs(float(plain[:, 0].mean())) < 3 * float(plain[:, 0].std()) / math.sqrt(len(plain))


def test_fk_particles_match_the_closed_form_tilted_mean():
    # SMC is consistent as the particle count grows; with 8 particles per prompt the mean here is ~0.77 (a finite-k
    # bias that shrinks to ~0.81 at 32 and vanishes within Monte Carlo error at 128), so the test uses 128.
    lam, groups, k = 1.0, 32, 128
    config = FKConfig(num_particles=k, lam=lam, potential="diff", resample_every=1, ess_threshold=0.9)
    steered, steering = _sample(groups, config, seed=3, steps=50)
    expected = _tilted_mean_x1(lam)  # 0.852 for this mixture; the untilted mean is 0
    mean = float(steered[:, 0].mean())
    group_means = steered[:, 0].view(groups, k).mean(1)  # particles of a group are correlated; groups are not
    error = 4 * float(group_means.std()) / math.sqrt(groups)
    assert abs(mean - expected) < error, (mean, expected, error)
    assert abs(mean) > 10 * error  # far from the untilted mean 0: the test can tell steering from none
    assert len(steering.resampled_at) > 10  # intermediate resampling took part (20 of 50 steps here)


def test_fk_rollouts_as_training_groups(tiny_sd3_dir, tmp_path):
    """sampler.fk turns each prompt group into one set of FK particles; the loop trains on them and flags it."""
    from run_helpers import tiny_run_config

    from flowrl.config import load_config
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "fk.yaml", tiny_sd3_dir, tmp_path / "runs", "fk", updates=2)
    config = load_config(path, ["sampler.fk={num_particles: 4, lam: 5.0, resample_every: 1, ess_threshold: 1.0}"])
    trainer = Trainer(config, log=False)
    rows = []
    trainer.run(lambda update, metrics: rows.append(metrics))
    assert len(rows) == 2 and all(r["fk_resamplings"] >= 1 for r in rows)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


def test_fk_resampled_rollouts_are_on_policy_for_grpo():
    """After FK re-indexes particles, every stored log-prob belongs to its stored transition: with the rollout's own
    parameters GRPO's ratio is exactly 1 and nothing is clipped (the current step's log-prob once stayed behind)."""
    from tiny_pipelines import tiny_shapes_sd3

    from flowrl.algorithms import RolloutBatch, build_algorithm
    from flowrl.config import SamplerSection
    from flowrl.policies import policy_for
    from flowrl.rollout import rollout, sample_generators

    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    groups, k, steps = 2, 4, 4
    cond = policy.encode(["a red circle"] * k + ["a square"] * k, 2.0)
    fk = FKConfig(num_particles=k, lam=50.0, resample_every=1, ess_threshold=1.0)
    steering = FKSteering(
        fk, lambda z, prompts, items: z.flatten(1).mean(1), steps, groups, torch.Generator().manual_seed(0)
    )
    traj = rollout(
        policy,
        cond,
        sample_generators(range(groups * k)),
        policy.noise_shape(SampleSpec(32, 32)),
        steps,
        "flow",
        0.7,
        2.0,
        callbacks=[steering],
    )
    assert len(steering.resampled_at) >= 1
    rewards = torch.arange(groups * k, dtype=torch.float32)
    group_ids = torch.arange(groups).repeat_interleave(k)
    batch = RolloutBatch(
        traj, rewards, group_ids, list(range(groups * k)), rewards, group_ids, torch.arange(groups * k), cond.prompts
    )
    algorithm = build_algorithm("grpo", {}, SamplerSection(kind="flow"))
    items, _ = algorithm.prepare(batch, policy)
    _, diagnostics = algorithm.loss(policy, batch, items)
    assert torch.equal(diagnostics["ratio"], torch.ones_like(diagnostics["ratio"]))
    assert torch.all(diagnostics["clip_frac"] == 0)


def test_fk_steered_samples_do_not_depend_on_their_batch(tiny_sd3_dir):
    """Each output's resampling draws come from its own seed, as its noise does: a batch of one and a batch of
    three give the same steered samples (one generator per sampler call made them depend on the batching)."""
    from flowrl.fk import FKSteer
    from flowrl.inference import generate_samples
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.rewards import Reward, RewardOutput

    class Brightness(Reward):
        def __call__(self, samples, prompts, meta=None):
            return RewardOutput(samples.flatten(1).mean(1))

    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    steer = FKSteer(FKConfig(num_particles=3, lam=20.0, resample_every=1, ess_threshold=1.0), Brightness())
    prompts = ["a red circle", "two squares", "a blue triangle"]
    whole, records = generate_samples(
        policy,
        prompts,
        num_steps=4,
        guidance_scale=1.0,
        kind="flow",
        noise_level=0.7,
        steer=steer,
        batch_size=9,
        desc=None,
    )
    single, _ = generate_samples(
        policy,
        prompts,
        num_steps=4,
        guidance_scale=1.0,
        kind="flow",
        noise_level=0.7,
        steer=steer,
        batch_size=3,
        desc=None,
    )
    # the same particles kept (another pick moves pixels by ~0.1-1); batch size moves float rounding by ~1e-3 here
    torch.testing.assert_close(whole.tensor, single.tensor, atol=5e-3, rtol=0)


def test_a_particle_whose_reward_failed_weighs_nothing_and_its_group_still_resamples():
    """NaN log-weights count as 0 (as the reference code maps them). One NaN log-weight once made its group's
    softmax NaN: uniform picks (the best particle
    could be dropped and the failed one kept) and a NaN ESS that never triggered a scheduled resampling."""
    from flowrl.fk import effective_sample_size, resample_indices

    log_weights = torch.tensor([[0.0, float("nan"), -50.0, -50.0], [float("nan")] * 4])
    ess = effective_sample_size(log_weights)
    assert abs(float(ess[0]) - 1.0) < 1e-6 and float(ess[1]) == 4.0  # all failed: uniform, nothing to prefer
    picks = resample_indices(log_weights, torch.Generator().manual_seed(0))
    assert picks[:4].tolist() == [0, 0, 0, 0] and set(picks[4:].tolist()) <= {4, 5, 6, 7}
