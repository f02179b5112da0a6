"""Per-step credit from intermediate rewards and timestep-window schedules (incremental Feynman-Kac training).

Incremental Feynman-Kac training for DDPO has no arXiv id given by the source and no public code: this is flowrl's
reading, built on FK steering's incremental potential (Singhal et al., arXiv 2501.06848) and on HRF's timestep
windows (arXiv 2410.08315). GRPO and DDPO take it as options (grpo.py).

The intermediate reward of a trajectory at state x_j is the reward of the model's one-step prediction,
r_j = r(D(x0_hat(x_j))) for j < T, and r_T = r(D(x_T)) for the final sample. The credit of step j (x_j -> x_{j+1})
is what it changed, delta_j = r_{j+1} - r_j (the log of FK's `diff` potential, up to lambda); the credits of a
trajectory telescope to r_T - r_0, its final reward gain over the first prediction. Per step, credits are
normalised over the prompt group like GRPO advantages, so early steps are credited for what they decide rather
than every step sharing the terminal advantage.

Window schedules choose which steps an update may train: `incremental` starts with the earliest (high-noise)
`size` steps and grows the window to every step by the end of the run; `latter` trains only the last `size`
(low-noise) steps, the baseline the method's description argues harms diversity; `all` trains every step.

Deviations from that reading:
- After an SDE window the deterministic steps' credits go to the window's last step (`fold_deterministic_tail`).
- FK-resampled training groups (`sampler.fk`) are used as they come, not importance-corrected: biased towards the
  reward, and flagged in the metrics.
"""

from __future__ import annotations

import math

import torch

from flowrl.algorithms.advantages import group_advantages

WINDOW_SCHEDULES = ("all", "incremental", "latter")


def incremental_credits(step_rewards: torch.Tensor) -> torch.Tensor:
    """[B, T + 1] intermediate rewards -> [B, T] per-step credits r_{j+1} - r_j."""
    return step_rewards[:, 1:] - step_rewards[:, :-1]


def fold_deterministic_tail(credits: torch.Tensor, stochastic: torch.Tensor) -> torch.Tensor:
    """Give the last stochastic step the credits of the deterministic (ODE) steps after it.

    After an SDE window the rest of the trajectory is a deterministic function of the state the window left, so
    what those steps change is the window's doing: the last stochastic step is credited r_T - r_j instead of
    r_{j+1} - r_j, and the credits of the stochastic steps telescope to r_T - r_first.
    """
    if not stochastic.any():
        return credits
    last = int(torch.nonzero(stochastic).max())
    out = credits.clone()
    out[:, last] += credits[:, last + 1 :].sum(1)
    out[:, last + 1 :] = 0
    return out


def step_advantages(
    credits: torch.Tensor, group_ids: torch.Tensor, std: str = "global", clip: float | None = 5.0
) -> torch.Tensor:
    """Group-normalised credits, one normalisation per step: [B, T]."""
    return torch.stack([group_advantages(credits[:, j], group_ids, std, clip=clip) for j in range(credits.shape[1])], 1)


def window_mask(num_steps: int, schedule: str, progress: float, size: int) -> torch.Tensor:
    """Steps an update may train, given the run's progress in [0, 1)."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    size = max(1, min(size, num_steps))
    if schedule == "all":
        mask[:] = True
    elif schedule == "incremental":
        mask[: size + math.floor(progress * (num_steps - size + 1))] = True
    elif schedule == "latter":
        mask[num_steps - size :] = True
    else:
        raise ValueError(f"unknown window schedule {schedule!r}; expected one of {WINDOW_SCHEDULES}")
    return mask


class IntermediateRewards:
    """A rollout callback recording r_j of every state (after the last step, the final sample's reward).

    `rewards` is [B, T + 1]; it follows any particle re-indexing an earlier callback (FK) made at a step.
    """

    def __init__(self, reward_of, num_steps: int):
        self.reward_of, self.num_steps = reward_of, num_steps
        self.history: list[torch.Tensor] = []

    def __call__(self, state) -> None:
        prediction, prompts, items = state.x0_pred, state.cond.prompts, state.cond.items
        if state.index is not None:  # an earlier callback re-indexed the particles at this step
            index = state.index.cpu()
            self.history = [h[index] for h in self.history]
            prediction = prediction[state.index.to(prediction.device)]
            prompts = [prompts[i] for i in index.tolist()]
            items = [items[i] for i in index.tolist()] if items else items
        with torch.no_grad():
            self.history.append(self.reward_of(prediction, prompts, items).float().cpu())  # r_i, from x_i's prediction
            if state.step == self.num_steps - 1:
                self.history.append(self.reward_of(state.latents, prompts, items).float().cpu())  # r_T, the sample

    @property
    def rewards(self) -> torch.Tensor:
        return torch.stack(self.history, dim=1)
