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
    """What the loop hands an algorithm for one update: this process's rollout and rewards, plus the gathered
    (global) rewards and group ids every process sees alike, so group statistics are the same on one process or
    many. Local arrays index this process's samples; `local_index` maps them into the global ones."""

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
    reward_info: dict | None = None  # this process's per-sample reward components (e.g. "accuracy"), [B_local] each


def drop_groups(batch: RolloutBatch, dropped: torch.Tensor) -> RolloutBatch:
    """The batch without the samples of the `dropped` group ids (e.g. groups whose reward failed), on every process
    alike: global arrays lose the same entries everywhere and local indices follow.

    Args:
        batch: the update's batch.
        dropped: group ids to remove.

    Returns:
        A new RolloutBatch (the trajectory's latents, log-probs and conditions cut alike).
    """
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
        {k: v[rows.to(v.device)] for k, v in batch.reward_info.items()} if batch.reward_info is not None else None,
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
        """The items at `index` (a slice, index tensor or mask), keeping their `key`s."""
        return WorkItems(self.sample[index], self.step[index], self.weight[index], self.key[index])

    @staticmethod
    def build(samples: list[int], steps: list[int], weights: list[float] | None = None) -> WorkItems:
        """Items from parallel lists of local sample indices, step indices and loss weights (None: all 1); keys are
        the positions in these lists."""
        weight = torch.ones(len(samples)) if weights is None else torch.tensor(weights, dtype=torch.float32)
        return WorkItems(torch.tensor(samples, dtype=torch.long), torch.tensor(steps, dtype=torch.long), weight)


@dataclass
class RewardGradientParams:
    """Options every method that climbs the reward's gradient shares (ReFL, DRaFT, MEND)."""

    reward_shift: int = 0
    """Average the reward over copies of the sample shifted by up to this many pixels (0: off)."""
    reward_shift_copies: int = 1
    """Shifted copies averaged (>= 1)."""

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
    gradient, `chunk` states per forward: the old / rollout-policy velocities NFT and DHO regress around.

    Args:
        policy: the policy (`policy.velocity` is called).
        x: [N, ...] states; t: [N] times (sigmas).
        cond: the trajectory's conditioning (`cond.select(rows)` picks each state's).
        rows: [N] local sample index of each state.
        guidance_scale: the CFG scale of the velocity.
        chunk: states per forward.

    Returns:
        [N, ...] velocities, shaped like `x`.
    """
    rows = torch.as_tensor(rows)
    out = torch.empty_like(x)
    for part in torch.split(torch.arange(len(x)), chunk):
        out[part] = policy.velocity(x[part], t[part], cond.select(rows[part]), guidance_scale)
    return out


def step_in_range(step_range: list[float], num_steps: int, seed: int) -> int:
    """A seeded step index k drawn uniformly from the fraction range [lo, hi) of an N-step schedule (at least one
    step wide): where ReFL takes its one-step prediction and MEND its prediction-space move.

    Args:
        step_range: [lo, hi], fractions of the schedule with 0 <= lo < hi <= 1.
        num_steps: N, the schedule's step count.
        seed: the sample's seed.

    Returns:
        k in [floor(lo N), N).
    """
    lo, hi = step_range
    first, last = int(lo * num_steps), max(int(lo * num_steps) + 1, int(round(hi * num_steps)))
    return int(torch.randint(first, min(last, num_steps), (1,), generator=torch.Generator().manual_seed(seed + 11)))


def validate_step_range(step_range: list[float]) -> None:
    """ConfigError naming algorithm.params.step_range unless it is [lo, hi] with 0 <= lo < hi <= 1."""
    if len(step_range) != 2 or not 0 <= step_range[0] < step_range[1] <= 1:
        raise ConfigError(f"algorithm.params.step_range: expected [lo, hi] with 0 <= lo < hi <= 1, got {step_range}")


def trained_steps(trainable: torch.Tensor, fraction: float, seed: int, order: str = "random") -> torch.Tensor:
    """floor(fraction * n) (at least 1) of the n trainable step indices, as every anchor counts them (Flow-GRPO,
    DanceGRPO, DiffusionNFT, Flow-Factory: int(n * fraction); 0.99 of 10 steps is 9). `order` "random": a seeded
    random subset in a random order (DanceGRPO's and DiffusionNFT's per-sample permutation); "first": the first
    ones in sampling order (Flow-GRPO's: 0.99 drops the last, lowest-noise step).

    Args:
        trainable: [n_steps] bool, the steps that may train.
        fraction: the share of the trainable steps to train, in (0, 1].
        seed: the sample's seed (its own subset and order).
        order: "random" or "first".

    Returns:
        [count] long step indices (empty when nothing is trainable).
    """
    candidates = torch.nonzero(trainable).flatten()
    count = max(1, int(fraction * len(candidates))) if len(candidates) else 0  # the anchors' own rounding
    if order == "first":
        return candidates[:count]
    permutation = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed + 7919))
    return candidates[permutation[:count]]


class Algorithm:
    """A training method: per update, `prepare` chooses the (sample, step) items to train and computes what they
    need; `loss` returns their per-item losses, called once per microbatch of items with gradients on. Subclasses
    set `name`, `Params` (a dataclass of hyperparameters, optionally with `validate()`) and the `needs_*` flags
    the loop reads before it builds anything, and register with `@register_algorithm`.

    Args:
        params: the validated `Params` instance (algorithm.params).
        sampler: the config's sampler section (kind, steps, noise level, guidance).
    """

    name = "algorithm"
    Params = None  # a dataclass of the algorithm's hyperparameters

    # items per no-grad forward of an algorithm's own passes (NFT's, DHO's and DPO's old velocities); the loop sets
    # it to memory.rollout_microbatch when that is set
    chunk = DEFAULT_BATCH_SIZE

    def __init__(self, params, sampler):
        self.params = params
        self.sampler = sampler

    @classmethod
    def from_config(cls, params: dict, sampler):
        """The algorithm built from a config's `algorithm.params` mapping (unknown keys are a ConfigError)."""
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
    # why the method cannot train on a batch sampled with older weights (runtime.async_rollouts with staleness > 0),
    # completing "algorithm X ..." in the refusal; None: it can
    refuses_stale_rollouts: str | None = None
    reward = None  # set by the loop (`bind_reward`) for methods that call the reward during the update

    def check_sampler(self, sampler) -> None:
        """ConfigError when the algorithm cannot train on rollouts of `sampler` (e.g. a method that reads velocities
        off Euler steps given an SDE sampler); run before any model loads."""
        if self.needs_ode_rollout and sampler.kind != "ode":
            raise ConfigError(
                f"sampler.kind: algorithm {self.name!r} trains on deterministic (Euler) rollouts; "
                f"expected 'ode', got {sampler.kind!r}"
            )

    def bind_reward(self, reward) -> None:
        """Keep the run's reward for methods that call it during the update (`score_latents`); ConfigError when the
        method backpropagates through a reward that is not differentiable."""
        if self.needs_reward_gradient and not reward.differentiable:
            raise ConfigError(
                f"reward: algorithm {self.name!r} backpropagates through the reward, but it is not "
                "differentiable; use a differentiable reward such as shapes_clip"
            )
        self.reward = reward

    def prepare(self, batch: RolloutBatch, policy) -> tuple[WorkItems, dict]:
        """Compute per-sample quantities (advantages, targets, ...) and choose the items to train.

        Runs before any optimizer step of the update, so `policy` is still the policy that made the rollout (under
        asynchronous rollouts: the learner's current one).

        Args:
            batch: the update's rollout, rewards and group ids.
            policy: the policy being trained (for no-grad passes such as old velocities).

        Returns:
            (items, metrics): the WorkItems this process trains, and scalar metrics {name: float} to log.
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

        Args:
            policy: decodes the latents (`policy.decode`).
            latents: [len(rows), ...] latents.
            batch: the update's batch (prompts, condition items, seeds).
            rows: the local sample index of each latent.
            shifted: average over shifted copies when the params ask for it.

        Returns:
            [len(rows)] scores.
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
        """Per-item losses of a microbatch of the items `prepare` chose.

        Args:
            policy: the policy being trained (gradients on).
            batch: the update's batch.
            items: the microbatch (a subset of `prepare`'s items; `items.key` indexes what `prepare` computed).

        Returns:
            (losses, diagnostics): losses [N] with gradients, item weights not yet applied (the loop applies them
            and normalises by the global item count), and per-item diagnostics {name: [N] tensor}, logged as means.
        """
        raise NotImplementedError


ALGORITHMS = Registry(
    "algorithm",
    {
        "grpo": "flowrl.algorithms.grpo",
        "grpo_guard": "flowrl.algorithms.grpo_guard",
        "ddpo": "flowrl.algorithms.ddpo",
        "nft": "flowrl.algorithms.nft",
        "awm": "flowrl.algorithms.awm",
        "refl": "flowrl.algorithms.reward_backprop",
        "draft": "flowrl.algorithms.reward_backprop",
        "mend": "flowrl.algorithms.mend",
        "tvrl": "flowrl.algorithms.tvrl",
        "dho": "flowrl.algorithms.dho",
        "dpo": "flowrl.algorithms.dpo",
    },
)


def register_algorithm(cls):
    """Class decorator: register an Algorithm subclass under its `name` (what `algorithm.name` selects)."""
    return ALGORITHMS.register()(cls)


def algorithm_names() -> list[str]:
    """The registered algorithm names."""
    return ALGORITHMS.names()


def build_algorithm(name: str, params: dict, sampler) -> Algorithm:
    """An algorithm by registered name or dotted path `package.module:Class`, its params validated.

    Args:
        name: `algorithm.name`.
        params: `algorithm.params`.
        sampler: the config's sampler section, checked against the algorithm's needs.

    Returns:
        The built Algorithm; a ConfigError names the field at fault otherwise.
    """
    algorithm = ALGORITHMS.get(name, "algorithm.name").from_config(params, sampler)
    if hasattr(algorithm.params, "validate"):
        algorithm.params.validate()
    algorithm.check_sampler(sampler)
    return algorithm
