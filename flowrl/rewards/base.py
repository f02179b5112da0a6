"""One contract for every reward, a registry by name, and weighted combination.

A reward maps a batch of decoded samples (float [B, 3, H, W] or video [B, 3, F, H, W], values in [0, 1]; 3D: SDF
grids [B, R, R, R]), their prompts and per-sample metadata to scores [B] plus an info dict of extra per-sample
tensors. Rewards that are differentiable in the samples say so, for methods that backpropagate through them (ReFL,
DRaFT, MEND).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flowrl.errors import ConfigError
from flowrl.registry import Registry


@dataclass
class RewardOutput:
    """What a reward returns for a batch of B samples.

    Args:
        scores: [B] fp32 scores (NaN for a sample the reward could not score).
        info: extra per-sample tensors [B] by name (logged, and read by plots and evaluations).
    """

    scores: torch.Tensor  # [B] fp32
    info: dict[str, torch.Tensor] = field(default_factory=dict)


class RewardUnavailable(Exception):
    """A reward that cannot score at all right now (e.g. its server is down): retrying sample by sample won't help."""


class Reward:
    """The reward contract. Subclasses set `name` and implement `__call__`; the class attributes say what the
    reward can do: `differentiable` (scores carry gradients to the samples, for ReFL, DRaFT and MEND),
    `modalities` (of "image", "video", "3d"; the loop checks the pipeline's at start-up) and `scores_groups`
    (the reward judges a condition's samples together, so callers keep them in one call). Register a reward, or
    a factory returning one, with `@register_reward(name)`."""

    name = "reward"
    differentiable = False
    modalities = ("image",)  # what it can score; the loop checks the pipeline's at start-up
    # whether it scores a condition's samples together (a group rubric): callers then keep them in one call
    scores_groups = False

    def __call__(self, samples: torch.Tensor, prompts: list[str], meta: dict | None = None) -> RewardOutput:
        """Score a batch.

        Args:
            samples: decoded samples in [0, 1] (see the module docstring for the shapes per modality).
            prompts: the B prompts.
            meta: per-sample metadata lists of length B, e.g. "conditions" (the condition items, with their inputs
                and metadata: see `condition_items`); None when there is none.

        Returns:
            A RewardOutput with [B] scores.
        """
        raise NotImplementedError

    @classmethod
    def groups_scored(cls, params: dict) -> bool:
        """Whether the reward built with `params` scores a condition's samples together (known before it is built,
        so a run can refuse training cuts that would split its groups before any model loads).

        Args:
            params: the reward's config params.

        Returns:
            True when it does (default: the class's `scores_groups`).
        """
        return cls.scores_groups

    def to(self, device) -> Reward:
        """Move the reward's models to `device`: its torch modules, its rewards, and the modules of flowrl objects it
        holds (a safety checker, a rubric's VLM judge); rewards without models ignore it. Returns the reward."""
        move_modules(self, device)
        return self

    def bind_policy(self, policy) -> None:
        """Learn what it needs of the policy whose samples it will score (a judge shown an editor's source sees it as
        the editor was given it); most rewards need nothing.

        Args:
            policy: the sampling policy (called once, before the first score).
        """


def move_modules(holder, device, seen: set | None = None) -> None:
    """`.to(device)` on every torch module and reward among `holder`'s attributes, looking into the flowrl-defined
    objects it holds (not into a tokenizer's or processor's insides)."""
    seen = set() if seen is None else seen
    seen.add(id(holder))
    for value in vars(holder).values():
        if isinstance(value, torch.nn.Module) or (isinstance(value, Reward) and value is not holder):
            value.to(device)
        elif id(value) not in seen and hasattr(value, "__dict__") and type(value).__module__.startswith("flowrl."):
            move_modules(value, device, seen)


def nested_params(values: dict, at: str):
    """(where, key, value) for every key of a params mapping at any depth (a judge's, a wrapped reward's params),
    `where` naming the mapping that holds it (reward[0].params.judge)."""
    for key, value in values.items():
        yield at, key, value
        if isinstance(value, dict):
            yield from nested_params(value, f"{at}.{key}")


REWARDS = Registry(
    "reward",
    {
        "shapes": "flowrl.worlds.shapes.rewards",
        "moving_shapes": "flowrl.worlds.moving_shapes.rewards",
        "shapes_edit": "flowrl.worlds.shapes_edit.rewards",
        "shapes_clip": "flowrl.rewards.clip",
        "pickscore": "flowrl.rewards.clip",
        "clipscore": "flowrl.rewards.clip",
        "hpsv2": "flowrl.rewards.learned_real",
        "aesthetic": "flowrl.rewards.learned_real",
        "imagereward": "flowrl.rewards.learned_real",
        "jpeg_compressibility": "flowrl.rewards.jpeg",
        "jpeg_incompressibility": "flowrl.rewards.jpeg",
        "safety_checker": "flowrl.rewards.safety_checker",
        "safe_shapes": "flowrl.worlds.safety.reward",
        "per_frame": "flowrl.rewards.video",
        "frame_consistency": "flowrl.rewards.video",
        "remote": "flowrl.rewards.remote",
        "ocr": "flowrl.rewards.ocr",
        "vlm_judge": "flowrl.rewards.vlm",
        "vlm_questions": "flowrl.rewards.vlm_questions",
        "moving_shapes_qa": "flowrl.worlds.moving_shapes.rewards",
        "edit_rubric": "flowrl.rewards.rubric",
        "silhouette_iou": "flowrl.worlds.shapes3d.rewards",
        "mesh_validity": "flowrl.worlds.shapes3d.rewards",
        "mesh_smoothness": "flowrl.worlds.shapes3d.rewards",
        "shape_match": "flowrl.worlds.shapes3d.rewards",
        "tactile_ssim": "flowrl.worlds.tactile.rewards",
        "tactile_physics": "flowrl.worlds.tactile.rewards",
    },
)


def register_reward(name: str):
    """Decorator: register a Reward subclass, or a factory function returning a Reward, under `name` (what a
    config's `reward[i].name` selects); its keyword arguments are the reward's `params`."""
    return REWARDS.register(name)


def reward_names() -> list[str]:
    """The registered reward names."""
    return REWARDS.names()


def build_reward(name: str, where: str = "reward", **params) -> Reward:
    """A reward by registered name or dotted path, built with `params` (ConfigError naming `where` otherwise).

    Args:
        name: a registered name or `package.module:Name`.
        where: the config path named in errors (e.g. "reward[0]").
        **params: the reward's keyword arguments.

    Returns:
        The built Reward.
    """
    factory = REWARDS.get(name, f"{where}.name")
    try:
        return factory(**params)
    except TypeError as error:
        raise ConfigError(f"{where}.params: {error}") from None


def groups_scored(name: str, params: dict, where: str = "reward") -> bool:
    """Whether reward `name` built with `params` scores a condition's samples together, known before it is built
    (Reward.groups_scored); a reward registered as a factory function says nothing: False."""
    factory = REWARDS.get(name, f"{where}.name")
    return bool(factory.groups_scored(params)) if hasattr(factory, "groups_scored") else False


def check_reward(name: str, params: dict, where: str = "reward") -> None:
    """What can be checked of a reward without loading it: its name is registered, and each local folder or file a
    built-in reward's `path` parameter names (at any depth: a judge's, a wrapped reward's) exists; a ConfigError
    naming `where` otherwise. A plug-in's parameters mean what it says (a `path` may be a hub id): left to it."""
    from pathlib import Path

    REWARDS.get(name, f"{where}.name")
    if ":" in name:
        return
    for at, key, value in nested_params(params, f"{where}.params"):
        if key in ("path", "questions_file") and isinstance(value, str) and not Path(value).exists():
            raise ConfigError(
                f"{at}.{key}: {value} does not exist; expected a local folder (nothing is fetched from a hub)"
            )


def condition_items(prompts: list[str], meta: dict | None) -> list:
    """The condition items of a reward call: meta['conditions'] as the loop passes them (a reward server rebuilds
    them, inputs and metadata, from the request); else bare prompts. Rewards that read a world's scene from an
    item's metadata, or a source image from its inputs, need this."""
    from flowrl.tasks.base import Condition

    meta = meta or {}
    if meta.get("conditions") is not None:
        return list(meta["conditions"])
    return [Condition(p) for p in prompts]


def score_in_chunks(reward: Reward, samples: torch.Tensor, prompts: list[str], meta: dict, chunk: int) -> RewardOutput:
    """`reward` over `chunk` samples at a time (0: all at once); per-sample lists in `meta` are split alike."""
    if chunk <= 0 or chunk >= len(prompts):
        return reward(samples, prompts, meta)
    parts = []
    for start in range(0, len(prompts), chunk):
        part = slice(start, start + chunk)
        parts.append(reward(samples[part], prompts[part], {k: v[part] for k, v in (meta or {}).items()}))
    return RewardOutput(
        torch.cat([p.scores for p in parts]), {k: torch.cat([p.info[k] for p in parts]) for k in parts[0].info}
    )


def score_robustly(
    reward: Reward, samples: torch.Tensor, prompts: list[str], meta: dict, chunk: int = 0
) -> tuple[RewardOutput, str | None]:
    """`score_in_chunks`, except that a reward raising is not fatal: the samples are then scored one by one (a
    reward that scores groups: one run of equal conditions at a time, so no rubric is built on part of a group) and
    those whose call raises get NaN (scores and every info key). Returns the output on the CPU and the first
    error's message (None when none raised)."""
    try:
        out = score_in_chunks(reward, samples, prompts, meta, chunk)
        return RewardOutput(out.scores.cpu(), {k: v.cpu() for k, v in out.info.items()}), None
    except RewardUnavailable as error:  # nothing to gain from asking again per sample
        return failed_output(reward, len(prompts)), str(error)
    except Exception as error:  # a reward's own failure; the loop decides whether the run can go on
        first = f"{type(error).__name__}: {error}"
    from flowrl.tasks.base import condition_runs

    items = (meta or {}).get("conditions")
    bounds = condition_runs(items) if reward.scores_groups and items else list(range(len(prompts) + 1))
    outputs = []
    for a, b in zip(bounds, bounds[1:]):
        try:
            out = reward(samples[a:b], prompts[a:b], {k: v[a:b] for k, v in (meta or {}).items()})
            outputs.append(
                (
                    b - a,
                    RewardOutput(
                        out.scores.float().reshape(b - a).cpu(),
                        {k: v.float().reshape(b - a).cpu() for k, v in out.info.items()},
                    ),
                )
            )
        except Exception:
            outputs.append((b - a, None))
    keys = sorted(set(failed_output(reward, 1).info).union(*[o.info for _, o in outputs if o is not None]))

    def part(size: int, out: RewardOutput | None, key: str | None) -> torch.Tensor:
        value = None if out is None else out.scores if key is None else out.info.get(key)
        return value if value is not None else torch.full((size,), float("nan"))

    return RewardOutput(
        torch.cat([part(size, out, None) for size, out in outputs]),
        {k: torch.cat([part(size, out, k) for size, out in outputs]) for k in keys},
    ), first


def failed_output(reward: Reward, count: int) -> RewardOutput:
    """NaN scores for `count` samples, with NaN for each term's raw score when the reward is a weighted sum (so every
    process logs the same keys)."""
    nan = torch.full((count,), float("nan"))
    terms = getattr(reward, "rewards", [])
    return RewardOutput(nan, {term.name: nan.clone() for term in terms})


def latent_scorer(policy, reward: Reward, robust: bool = False):
    """`(latents, prompts, items=None) -> scores` through the policy's decoder: what FK potentials, intermediate
    rewards and reward-gradient methods call on latents (differentiable when the reward is). `items` are the
    samples' condition items: rewards that judge against an item's own scene or source (shapes_edit, edit_rubric,
    the 3D rewards) need them; without, they fall back to the scene a bare prompt stands for. `robust`: a call that
    raises scores NaN (what score_robustly makes of a failure; FK weighs such particles 0, incremental credit
    drops their groups) instead of stopping the rollout."""

    def score(latents: torch.Tensor, prompts: list[str], items: list | None = None) -> torch.Tensor:
        try:
            return reward(policy.decode(latents), prompts, {"conditions": list(items)} if items else None).scores
        except Exception:
            if not robust:
                raise
            return torch.full((len(prompts),), float("nan"))

    return score


def standardized_sum(
    components: list[torch.Tensor], weights: list[float], groups: torch.Tensor | None = None, eps: float = 1e-6
) -> torch.Tensor:
    """sum_k w_k z_k with each component standardized first, over the whole batch (groups None) or within each
    prompt group (multi-reward GRPO variants), so one reward's scale does not drown the others."""

    def standardize(part: torch.Tensor) -> torch.Tensor:  # over the finite entries; non-finite ones stay NaN
        finite = torch.isfinite(part)
        if finite.sum() < 2:
            return torch.where(finite, torch.zeros_like(part), torch.full_like(part, float("nan")))
        values = part[finite]
        return torch.where(finite, (part - values.mean()) / (values.std() + eps), torch.full_like(part, float("nan")))

    total = torch.zeros_like(components[0], dtype=torch.float32)
    for scores, weight in zip(components, weights):
        scores = scores.float()
        if groups is None:
            z = standardize(scores)
        else:
            z = torch.zeros_like(scores)
            for g in torch.unique(groups):
                members = groups == g
                z[members] = standardize(scores[members])
        total = total + weight * z
    return total


class WeightedSum(Reward):
    """sum_k w_k r_k. Each component's raw scores are kept in info as '<name>' (for logging, and for the loop's
    standardized combination, `train.normalize_rewards`).

    Args:
        rewards: the component rewards.
        weights: one weight per reward.
        batch_sizes: per reward, samples per call (0: all it is given); None: all 0.
    """

    name = "weighted_sum"

    def __init__(self, rewards: list[Reward], weights: list[float], batch_sizes: list[int] | None = None):
        if len(rewards) != len(weights):
            raise ValueError("one weight per reward")
        self.rewards, self.weights = rewards, weights
        self.batch_sizes = batch_sizes or [0] * len(rewards)  # per reward: samples per call (0: all it is given)
        self.differentiable = all(r.differentiable for r in rewards)
        self.modalities = tuple(m for m in ("image", "video", "3d") if all(m in r.modalities for r in rewards))
        self.scores_groups = any(r.scores_groups for r in rewards)

    def to(self, device) -> WeightedSum:
        for reward in self.rewards:
            reward.to(device)
        return self

    def bind_policy(self, policy) -> None:
        for reward in self.rewards:
            reward.bind_policy(policy)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        total, info = 0.0, {}
        for reward, weight, batch_size in zip(self.rewards, self.weights, self.batch_sizes):
            out = score_in_chunks(reward, samples, prompts, meta, batch_size)
            info[reward.name] = out.scores.detach()
            info.update({f"{reward.name}/{k}": v for k, v in out.info.items()})
            total = total + weight * out.scores
        return RewardOutput(total, info)
