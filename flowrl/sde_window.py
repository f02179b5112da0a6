"""Which steps of a training rollout are stochastic: the SDE window of Flow-GRPO-Fast and MixGRPO.

With `sampler.sde_window_size` k > 0 only k consecutive steps draw noise (and train); the others are ODE steps. The
window's start moves over the run by `sampler.sde_window_schedule`:
  random       drawn uniformly from [lo, hi) = `sde_window_range` each update, from the run seed (Flow-GRPO-Fast).
  progressive  MixGRPO (arXiv 2507.21802): it starts at lo and moves `sde_window_stride` steps every
               `sde_window_shift_every` updates, from high noise to low, and wraps back to lo once it would start
               at hi or later: start(u) = lo + (stride floor(u / tau)) mod (stride K), K = ceil((hi - lo) / stride).
               Stride 0 keeps it at lo (MixGRPO-Flash*'s frozen window).
With `sampler.ode_solver: dpm2` the deterministic steps after the window take DPM-Solver++'s second-order multistep
update (`sde.dpm_solver_pp_step`), MixGRPO-Flash's "post" placement; steps before the window stay Euler, and the
window's SDE steps and log-probs are untouched.

Deviations from MixGRPO's code (Tencent-Hunyuan/MixGRPO):
- The window is whole: their window is clipped below step T - 2 and shrinks near the end; here `sde_window_range`
  keeps every start where the whole window fits (the config checks it), and the wrap is to lo.
- MixGRPO-Flash also re-spaces the steps after the window on a coarser schedule (fewer model calls); here the
  post-window steps keep the rollout's schedule, so dpm2 changes their accuracy, not their count.
- Their random schedule draws unseeded; here every start derives from the run seed and the update (exact resume).
"""

from __future__ import annotations

import torch

from flowrl.prompt_source import derived_seed

WINDOW_SCHEDULES = ("random", "progressive")


def window_start(sampler, run_seed: int, update: int) -> int:
    """The first SDE step of update `update` under the sampler's window schedule.

    Args:
        sampler: the config's sampler section (sde_window_range, sde_window_schedule, its stride and interval).
        run_seed: run.seed (the random schedule's draws derive from it).
        update: the update number, from 0.

    Returns:
        The window's start step.
    """
    if sampler.sde_window_schedule == "progressive":
        starts = window_starts(sampler)
        return starts[(update // sampler.sde_window_shift_every) % len(starts)]
    lo, hi = sampler.sde_window_range
    generator = torch.Generator().manual_seed(derived_seed(run_seed, update, 29))
    return int(torch.randint(lo, hi, (1,), generator=generator))


def window_starts(sampler) -> tuple[int, ...]:
    """Every start the window schedule can take, in the order the progressive schedule visits them: lo, lo + stride,
    ... below hi (lo alone for stride 0); every step of [lo, hi) under the random schedule."""
    lo, hi = sampler.sde_window_range
    if sampler.sde_window_schedule != "progressive":
        return tuple(range(lo, hi))
    stride = sampler.sde_window_stride
    return (lo,) if stride == 0 else tuple(range(lo, hi, stride))


def reachable_steps(sampler) -> tuple[int, ...]:
    """Every step some update's SDE window covers over the run, sorted (every step without a window): a stride
    wider than the window leaves steps between its windows that no update trains."""
    if not sampler.sde_window_size:
        return tuple(range(sampler.num_steps))
    size = sampler.sde_window_size
    return tuple(sorted({start + k for start in window_starts(sampler) for k in range(size)}))


def sde_window(sampler, run_seed: int, update: int) -> tuple[int, int] | None:
    """The update's SDE window (start, end), or None when every step is stochastic (sde_window_size 0)."""
    if not sampler.sde_window_size:
        return None
    start = window_start(sampler, run_seed, update)
    return start, start + sampler.sde_window_size
