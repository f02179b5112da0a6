"""What the loop hands an algorithm, the interface it implements, and the registry by name.

The loop rolls out, scores and gathers; the algorithm picks which (sample, step) items to train and returns their
per-item losses. The loop sums those over microbatches and processes, normalizes by the global item count and
steps the optimizer, so every algorithm gets distributed training and exact resume for free.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flowrl.config import from_dict
from flowrl.devices import DEFAULT_BATCH_SIZE
from flowrl.errors import ConfigError
from flowrl.registry import Registry
from flowrl.rewards.augment import ShiftAverage
from flowrl.rollout import Trajectory


@dataclass
class RolloutBatch:
    trajectory: Trajectory  # this process's samples
    rewards: torch.Tensor  # [B_local]
    group_ids: torch.Tensor  # [B_local] prompt group of each sample (global numbering)
    seeds: list[int]  # per-sample seeds (they also seed each sample's choice of trained steps)
    global_rewards: torch.Tensor  # [B_global], gathered from every process
    global_group_ids: torch.Tensor  # [B_global]
    local_index: torch.Tensor  # positions of this process's samples in the global arrays
    prompts: list[str]  # this process's prompts (rewards that are called again during the update need them)
    progress: float = 0.0  # update / total updates (for schedules over the run)
    step_rewards: torch.Tensor | None = None  # [B_local, T + 1] intermediate rewards, when the algorithm asks
    global_step_rewards: torch.Tensor | None = None  # [B_global, T + 1]


def drop_groups(batch: RolloutBatch, dropped: torch.Tensor) -> RolloutBatch:
    """The batch without the samples of the `dropped` group ids (e.g. groups whose reward failed), on every process
    alike: global arrays lose the same entries everywhere and local indices follow."""
    from dataclasses import replace

    keep_global = ~torch.isin(batch.global_group_ids, dropped)
    position = torch.cumsum(keep_global.long(), 0) - 1
    rows = torch.nonzero(keep_global[batch.local_index]).flatten()
    traj = batch.trajectory
    traj = replace(
        traj,
        latents=traj.latents[:, rows.to(traj.latents.device)],
        log_probs=traj.log_probs[:, rows.to(traj.log_probs.device)],
        cond=traj.cond.select(rows),
    )
    picked = rows.tolist()
    return RolloutBatch(
        traj,
        batch.rewards[rows],
        batch.group_ids[rows],
        [batch.seeds[i] for i in picked],
        batch.global_rewards[keep_global],
        batch.global_group_ids[keep_global],
        position[batch.local_index[rows]],
        [batch.prompts[i] for i in picked],
        batch.progress,
        batch.step_rewards[rows] if batch.step_rewards is not None else None,
        batch.global_step_rewards[keep_global] if batch.global_step_rewards is not None else None,
    )


@dataclass
class WorkItems:
    """The (sample, step) pairs one update trains on this process, each with its own loss weight.

    `key` is each item's position in the list `prepare` built, so per-item tensors an algorithm computed there
    (fresh noise, old velocities, targets) can be looked up from any subset.
    """

    sample: torch.Tensor  # [N] long, index into the local batch
    step: torch.Tensor  # [N] long, denoising step index
    weight: torch.Tensor  # [N] float
    key: torch.Tensor | None = None  # [N] long

    def __post_init__(self):
        if self.key is None:
            self.key = torch.arange(len(self.sample))

    def __len__(self) -> int:
        return int(self.sample.numel())

    def trained(self) -> int:
        """How many items carry a loss weight (not a weight-0 placeholder that keeps a process's passes in step)."""
        return int((self.weight > 0).sum())

    def subset(self, index) -> WorkItems:
        return WorkItems(self.sample[index], self.step[index], self.weight[index], self.key[index])

    @staticmethod
    def build(samples: list[int], steps: list[int], weights: list[float] | None = None) -> WorkItems:
        weight = torch.ones(len(samples)) if weights is None else torch.tensor(weights, dtype=torch.float32)
        return WorkItems(torch.tensor(samples, dtype=torch.long), torch.tensor(steps, dtype=torch.long), weight)


@dataclass
class RewardGradientParams:
    """Options every method that climbs the reward's gradient shares (ReFL, DRaFT, MEND)."""

    reward_shift: int = 0  # average the reward over copies shifted by up to this many pixels (0: off)
    reward_shift_copies: int = 1

    def validate(self):
        if self.reward_shift < 0 or self.reward_shift_copies < 1:
            raise ConfigError(
                "algorithm.params.reward_shift / reward_shift_copies: expected an integer >= 0 and an "
                f"integer >= 1, got {self.reward_shift} and {self.reward_shift_copies}"
            )


@torch.no_grad()
def chunked_velocity(
    policy, x: torch.Tensor, t: torch.Tensor, cond, rows, guidance_scale: float, chunk: int = DEFAULT_BATCH_SIZE
) -> torch.Tensor:
    """The policy's velocities at states `x` [N, ...] and times `t` [N] under the conditioning of samples `rows`, no
    gradient, `chunk` states per forward: the old / rollout-policy velocities NFT and DHO regress around."""
    rows = torch.as_tensor(rows)
    out = torch.empty_like(x)
    for part in torch.split(torch.arange(len(x)), chunk):
        out[part] = policy.velocity(x[part], t[part], cond.select(rows[part]), guidance_scale)
    return out


def step_in_range(step_range: list[float], num_steps: int, seed: int) -> int:
    """A seeded step index k drawn uniformly from the fraction range [lo, hi) of an N-step schedule (at least one
    step wide): where ReFL takes its one-step prediction and MEND its prediction-space move."""
    lo, hi = step_range
    first, last = int(lo * num_steps), max(int(lo * num_steps) + 1, int(round(hi * num_steps)))
    return int(torch.randint(first, min(last, num_steps), (1,), generator=torch.Generator().manual_seed(seed + 11)))


def validate_step_range(step_range: list[float]) -> None:
    if len(step_range) != 2 or not 0 <= step_range[0] < step_range[1] <= 1:
        raise ConfigError(f"algorithm.params.step_range: expected [lo, hi] with 0 <= lo < hi <= 1, got {step_range}")


def trained_steps(trainable: torch.Tensor, fraction: float, seed: int, order: str = "random") -> torch.Tensor:
    """floor(fraction * n) (at least 1) of the n trainable step indices, as every anchor counts them (Flow-GRPO,
    DanceGRPO, DiffusionNFT, Flow-Factory: int(n * fraction); 0.99 of 10 steps is 9). `order` "random": a seeded
    random subset in a random order (DanceGRPO's and DiffusionNFT's per-sample permutation); "first": the first
    ones in sampling order (Flow-GRPO's: 0.99 drops the last, lowest-noise step)."""
    candidates = torch.nonzero(trainable).flatten()
    count = max(1, int(fraction * len(candidates))) if len(candidates) else 0  # the anchors' own rounding
    if order == "first":
        return candidates[:count]
    permutation = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed + 7919))
    return candidates[permutation[:count]]


class Algorithm:
    name = "algorithm"
    Params = None  # a dataclass of the algorithm's hyperparameters

    # items per no-grad forward of an algorithm's own passes (NFT's, DHO's and DPO's old velocities); the loop sets
    # it to train.rollout_microbatch when that is set
    chunk = DEFAULT_BATCH_SIZE

    def __init__(self, params, sampler):
        self.params = params
        self.sampler = sampler

    @classmethod
    def from_config(cls, params: dict, sampler):
        return cls(from_dict(cls.Params, params, "algorithm.params"), sampler)

    # rollout and reward needs
    shared_initial_noise = False
    needs_ode_rollout = False  # methods that read velocities off stored Euler steps
    # methods built on the flow's x_t = (1 - t) x0 + t eps and velocity targets (noise-predicting pipelines refused)
    needs_flow_matching = False
    # methods that compare the batch's rewards with rewards they compute themselves: the batch's must stay raw
    # (train.normalize_rewards would put the two on different scales)
    needs_raw_rewards = False
    needs_reward_gradient = False  # methods that backpropagate through the reward
    needs_step_rewards = False  # methods that credit steps by intermediate rewards (credit.IntermediateRewards)
    needs_reference = False  # methods whose loss compares against the frozen base (the LoRA-disabled policy)
    needs_whole_groups = False  # methods that pair or match samples within a group among the rows one process holds
    # methods whose likelihood ratio takes its old log-densities from the policy in `prepare`, not from the rollout:
    # a batch sampled with older weights (train.async_rollouts with staleness > 0) would go uncorrected
    old_policy_from_prepare = False
    reward = None  # set by the loop (`bind_reward`) for methods that call the reward during the update

    def check_sampler(self, sampler) -> None:
        if self.needs_ode_rollout and sampler.kind != "ode":
            raise ConfigError(
                f"sampler.kind: algorithm {self.name!r} trains on deterministic (Euler) rollouts; "
                f"expected 'ode', got {sampler.kind!r}"
            )

    def bind_reward(self, reward) -> None:
        if self.needs_reward_gradient and not reward.differentiable:
            raise ConfigError(
                f"reward: algorithm {self.name!r} backpropagates through the reward, but it is not "
                "differentiable; use a differentiable reward such as shapes_clip"
            )
        self.reward = reward

    def prepare(self, batch: RolloutBatch, policy) -> tuple[WorkItems, dict]:
        """Compute per-sample quantities (advantages, targets, ...) and choose the items to train; return metrics.

        Runs before any optimizer step of the update, so `policy` is still the policy that made the rollout.
        """
        raise NotImplementedError

    def score_latents(
        self, policy, latents: torch.Tensor, batch: RolloutBatch, rows: list[int], shifted: bool = True
    ) -> torch.Tensor:
        """Reward of decoded latents of the batch's samples `rows` (judged against their prompts and condition
        items), differentiable in the latents when the reward is.

        With `shifted` and a params `reward_shift` > 0 (RewardGradientParams), the score is averaged over shifted
        copies of each image, drawn from the samples' seeds (rewards/augment.py): the gradient the reward-gradient
        methods climb.
        """
        from flowrl.rewards import latent_scorer

        prompts = [batch.prompts[i] for i in rows]
        every_item = batch.trajectory.cond.items
        items = [every_item[i] for i in rows] if every_item else None
        shift = ShiftAverage(getattr(self.params, "reward_shift", 0), getattr(self.params, "reward_shift_copies", 1))
        if not shifted or not shift.active:
            return latent_scorer(policy, self.reward)(latents, prompts, items)
        return shift.score(self.reward, policy.decode(latents), prompts, [batch.seeds[i] for i in rows], items)

    def loss(self, policy, batch: RolloutBatch, items: WorkItems) -> tuple[torch.Tensor, dict]:
        """Per-item losses [N] (weights not yet applied) with gradients, plus per-item diagnostics."""
        raise NotImplementedError


ALGORITHMS = Registry(
    "algorithm",
    {
        "grpo": "flowrl.algorithms.grpo",
        "ddpo": "flowrl.algorithms.ddpo",
        "nft": "flowrl.algorithms.nft",
        "refl": "flowrl.algorithms.reward_backprop",
        "draft": "flowrl.algorithms.reward_backprop",
        "mend": "flowrl.algorithms.mend",
        "tvrl": "flowrl.algorithms.tvrl",
        "dho": "flowrl.algorithms.dho",
        "dpo": "flowrl.algorithms.dpo",
    },
)


def register_algorithm(cls):
    return ALGORITHMS.register()(cls)


def algorithm_names() -> list[str]:
    return ALGORITHMS.names()


def build_algorithm(name: str, params: dict, sampler) -> Algorithm:
    """An algorithm by registered name or dotted path `package.module:Class`, its params validated."""
    algorithm = ALGORITHMS.get(name, "algorithm.name").from_config(params, sampler)
    if hasattr(algorithm.params, "validate"):
        algorithm.params.validate()
    algorithm.check_sampler(sampler)
    return algorithm
