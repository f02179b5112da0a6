"""Rollouts: run a policy's sampler and keep what every method needs (the trajectory, per-step log-probs).

Each sample draws its initial noise and its per-step noise from its own generator, seeded from
(run seed, update, global sample index). A rollout is therefore the same whether a batch runs on one process or
is sharded across several, and a resumed run replays exactly the samples it would have drawn.
Callbacks run after every step and may replace the latents and re-index the particles (FK resampling,
in-generation steering); the conditioning follows the same index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sde import dpm_solver_pp_step


@dataclass
class Trajectory:
    """What a rollout keeps of a batch: every step's latents and log-probs, and what they were drawn under."""

    latents: torch.Tensor  # [T + 1, B, ...] fp32; latents[0] is the initial noise, latents[-1] the sample
    log_probs: torch.Tensor  # [T, B] log pi(latents[i + 1] | latents[i]); 0 on deterministic steps
    sigmas: torch.Tensor  # [T + 1] schedule points: sigmas (flow), DDIM timesteps with -1 for the end (epsilon)
    stochastic: torch.Tensor  # [T] bool: steps drawn with noise (the ones a log-prob method can train)
    kind: str
    noise_level: float
    guidance_scale: float
    cond: Conditioning

    @property
    def final(self) -> torch.Tensor:
        """The samples' final latents [B, ...]."""
        return self.latents[-1]

    @property
    def num_steps(self) -> int:
        """The number of sampler steps T."""
        return self.log_probs.shape[0]


@dataclass
class StepState:
    """What a callback sees after step i; it may assign `latents` and `index` (a particle re-indexing)."""

    step: int
    sigma: float
    sigma_next: float
    latents: torch.Tensor
    x0_pred: torch.Tensor
    cond: Conditioning
    index: torch.Tensor | None = None


def sample_generators(seeds: list[int]) -> list[torch.Generator]:
    """One CPU generator per sample, seeded with its seed."""
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def per_sample_noise(generators: list[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    """One N(0, I) draw of `shape` from each sample's generator, stacked: [B, *shape]."""
    return torch.stack([torch.randn(shape, generator=g) for g in generators])


def sde_step_mask(num_steps: int, kind: str, window: tuple[int, int] | None) -> torch.Tensor:
    """Which steps draw noise: all for an SDE kind (or only [start, end) of a window), none for 'ode'."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    if kind != "ode":
        start, end = window if window is not None else (0, num_steps)
        mask[start:end] = True
    return mask


@torch.no_grad()
def rollout(
    policy: FlowPolicy,
    cond: Conditioning,
    generators: list[torch.Generator],
    noise_shape: tuple[int, ...],
    num_steps: int,
    kind: str = "flow",
    noise_level: float = 0.7,
    guidance_scale: float = 1.0,
    sde_window: tuple[int, int] | None = None,
    initial_noise: torch.Tensor | None = None,
    callbacks: list[Callable[[StepState], None]] = (),
    progress=None,
    guide=None,
    ode_solver: str = "euler",
) -> Trajectory:
    """Sample len(cond) trajectories. `sde_window` (start, end) keeps SDE steps only in that range (ODE elsewhere);
    `ode_solver` "dpm2" takes DPM-Solver++'s second-order step on the deterministic steps after the first SDE step
    (sde.dpm_solver_pp_step, on every earlier step's x0 prediction; flowrl/sde_window.py).

    `guide` (see FlowPolicy.step) may change the model output at every step; it must follow particle
    re-indexing itself when combined with resampling callbacks (`guide.select(index)` is called when present).
    """
    device = policy.device
    sigmas = policy.sigmas(num_steps, noise_shape)
    stochastic = sde_step_mask(num_steps, kind, sde_window)
    # each sample's own x_T is drawn even when `initial_noise` replaces it, so its step noise never repeats the x_T
    # drawn from the same seed (DanceGRPO's shared x_T is the group's first sample's own draw)
    own = per_sample_noise(generators, noise_shape)
    x = initial_noise if initial_noise is not None else own
    x = x.to(device=device, dtype=torch.float32)
    latents, log_probs = [x], []
    x0_previous = sigma_previous = None  # the last step's prediction (dpm2's history)
    for i in range(num_steps):
        sigma, sigma_next = float(sigmas[i]), float(sigmas[i + 1])
        step_kind = kind if stochastic[i] else "ode"
        noise = per_sample_noise(generators, noise_shape).to(device) if step_kind != "ode" else None
        x_in = x
        x, _, std, log_prob, x0_pred = policy.step(
            step_kind, x, sigma, sigma_next, cond, guidance_scale, noise_level, noise=noise, guide=guide
        )
        if ode_solver == "dpm2" and step_kind == "ode" and bool(stochastic[:i].any()):
            x = dpm_solver_pp_step(x_in, x0_pred, x0_previous, sigma_previous, sigma, sigma_next)
        x0_previous, sigma_previous = x0_pred, sigma
        stochastic[i] = stochastic[i] and bool((torch.as_tensor(std) > 0).all())  # e.g. CPS's last step
        if callbacks:
            state = StepState(i, sigma, sigma_next, x, x0_pred, cond)
            for callback in callbacks:
                callback(state)
            if state.index is not None:  # particles were re-indexed: history and conditioning follow
                latents = [z[state.index] for z in latents]
                log_probs = [lp[state.index] for lp in log_probs]
                log_prob = log_prob[state.index]  # this step's transition belongs to the particle it moved too
                x0_previous = x0_previous[state.index]
                cond = cond.select(state.index)
                if guide is not None and hasattr(guide, "select"):
                    guide.select(state.index)
            x = state.latents
        latents.append(x)
        log_probs.append(log_prob)
        if progress is not None:
            progress.update(1)
    return Trajectory(
        torch.stack(latents), torch.stack(log_probs), sigmas, stochastic, kind, noise_level, guidance_scale, cond
    )


def rollout_in_chunks(
    chunk: int,
    policy: FlowPolicy,
    cond: Conditioning,
    generators: list[torch.Generator],
    noise_shape: tuple[int, ...],
    num_steps: int,
    kind: str = "flow",
    noise_level: float = 0.7,
    guidance_scale: float = 1.0,
    sde_window: tuple[int, int] | None = None,
    initial_noise: torch.Tensor | None = None,
    progress=None,
    ode_solver: str = "euler",
) -> Trajectory:
    """`rollout` over `chunk` samples at a time (memory), joined into one trajectory. Each sample's noise comes
    from its own generator, so the samples are those of one whole-batch rollout up to the model's batch-size
    numerics. Rollouts with callbacks (FK resampling, intermediate rewards) see whole groups and are not chunked."""
    if chunk <= 0 or chunk >= len(cond):
        return rollout(
            policy,
            cond,
            generators,
            noise_shape,
            num_steps,
            kind,
            noise_level,
            guidance_scale,
            sde_window,
            initial_noise,
            progress=progress,
            ode_solver=ode_solver,
        )
    parts = [
        part
        for _, part in rollout_chunks(
            chunk,
            policy,
            cond,
            generators,
            noise_shape,
            num_steps,
            kind,
            noise_level,
            guidance_scale,
            sde_window,
            initial_noise,
            progress,
            ode_solver,
        )
    ]
    return join_trajectories(parts, cond)


def rollout_chunks(
    chunk: int,
    policy: FlowPolicy,
    cond: Conditioning,
    generators: list[torch.Generator],
    noise_shape: tuple[int, ...],
    num_steps: int,
    kind: str,
    noise_level: float,
    guidance_scale: float,
    sde_window: tuple[int, int] | None,
    initial_noise: torch.Tensor | None,
    progress=None,
    ode_solver: str = "euler",
):
    """Yield (rows, trajectory of those rows) for consecutive chunks of `chunk` samples, one rollout each."""
    for rows in chunk_rows(len(cond), chunk):
        yield (
            rows,
            rollout(
                policy,
                cond.select(rows),
                [generators[i] for i in rows],
                noise_shape,
                num_steps,
                kind,
                noise_level,
                guidance_scale,
                sde_window,
                initial_noise[rows] if initial_noise is not None else None,
                progress=progress,
                ode_solver=ode_solver,
            ),
        )


def chunk_rows(count: int, chunk: int) -> list[list[int]]:
    """Consecutive row lists of at most `chunk` (all rows at once when chunk <= 0)."""
    chunk = chunk if chunk > 0 else count
    return [list(range(start, min(start + chunk, count))) for start in range(0, count, chunk)]


def join_trajectories(parts: list[Trajectory], cond: Conditioning) -> Trajectory:
    """Trajectories of consecutive sample chunks as one, conditioned on the chunks' joint `cond`."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    stochastic = torch.stack([p.stochastic for p in parts]).all(0)
    return Trajectory(
        torch.cat([p.latents for p in parts], 1),
        torch.cat([p.log_probs for p in parts], 1),
        first.sigmas,
        stochastic,
        first.kind,
        first.noise_level,
        first.guidance_scale,
        cond,
    )
