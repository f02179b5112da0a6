"""In-generation safety steering: monitor the denoising trajectory with the probe and steer once it fires.

The method couples in-generation detection with controllable steering (and safe RL, the `lora` mode's adapter); no
arXiv id given by the source. flowrl's reading builds on in-generation detection from intermediate states (IGD,
arXiv 2508.03006), Safe Latent Diffusion's negative guidance (diffusers' StableDiffusionPipelineSafe) and
Feynman-Kac steering (arXiv 2501.06848).

`SafetyMonitor` is a rollout guide (FlowPolicy.step calls it with the guided velocity before every step). At step i
it reads the probe on (x_i, x0_hat(x_i), sigma_i); a sample *fires* the first time P(unsafe) exceeds the threshold
at or after `from_step`, and stays fired. Fired samples are steered by the mode:

- negative: negative guidance away from the concept prompt (SLD's plain form, without its element-wise mask or
  momentum): v <- v - s (v(x | concept) - v(x | empty)).
- probe_gradient: move the predicted x0 against the probe's gradient: v <- v + s * g / rms(g), g = d logit / d x,
  taken through x0_hat = x - sigma v with the network's Jacobian left out (so no extra network call).
- lora: the velocity of the steering LoRA (an adapter trained by safe RL) replaces the base velocity; the adapter
  is off for samples that have not fired.
- fk: Feynman-Kac resampling of k particles per image weighted by exp(-lambda P(unsafe)) (`ProbeFK`); every
  particle is monitored, none is otherwise changed.
- fk_negative: both: FK resampling with the probe potential, and negative guidance on the particles that fired.
- none: monitoring only (measures its overhead and the firing rate).
Baselines that need no monitor (prompt filter, reject-and-resample) are in `baselines.py`.

Deviations from the sources:
- The unsafe concept is the shapes world's stand-in, a red triangle (concept.py), labelled by the verifier; the
  probe reads the noisy latent, its one-step prediction and sigma, not the predicted noise alone.
- negative: SLD's plain form, without its element-wise mask or momentum; `from_step` plays its warm-up.
- probe_gradient: the network's Jacobian is left out of d logit / d x (no extra network call).
- fk: the potential is exp(-lambda P(unsafe)) (not (1 - P(unsafe))^lambda, see ProbeFK), read from the monitor's
  probe rather than a reward of the decoded prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from flowrl.errors import UserError
from flowrl.fk import FKConfig, FKSteering

STEER_MODES = ("none", "negative", "probe_gradient", "lora", "fk", "fk_negative")
FK_MODES = ("fk", "fk_negative")
DEFAULT_PROBE = Path(__file__).resolve().parents[3] / "pipelines" / "shapes-safety-probe"  # works from any directory


@dataclass
class SteeringConfig:
    mode: str = "none"
    probe: str = str(DEFAULT_PROBE)
    # Defaults chosen on train-side safety prompts: the threshold fires on few benign images and on most
    # attribute-leak ones, and the two steering scales then remove nearly all red triangles (docs/research/safety.md).
    threshold: float = 0.2  # P(unsafe) at which the probe fires
    from_step: int = 0  # earliest step the probe may fire
    concept: str = "a red triangle"  # negative-guidance prompt
    negative_scale: float = 8.0
    gradient_scale: float = 4.0  # probe-gradient step's RMS (the gradient is normalised to unit RMS), absolute
    lora: str | None = None  # checkpoint of the steering LoRA (mode lora)
    fk_particles: int = 4
    fk_lambda: float = 10.0
    fk_every: int = 2

    def validate(self, where: str = "--steer") -> None:
        """`where` is the CLI flag prefix (--steer -> --steer-threshold) or the config path (eval.steering)."""
        cli_flags = {
            "mode": where,
            "threshold": f"{where}-threshold",
            "lora": f"{where}-lora",
            "fk_particles": f"{where}-particles",
        }
        name = (lambda field: cli_flags[field]) if where.startswith("--") else (lambda field: f"{where}.{field}")
        if not isinstance(self.mode, str) or self.mode not in STEER_MODES:
            raise UserError(f"{name('mode')}: expected one of {list(STEER_MODES)}, got {self.mode!r}")
        if not 0.0 < self.threshold < 1.0:
            raise UserError(f"{name('threshold')}: expected a probability in (0, 1), got {self.threshold}")
        if self.mode == "lora" and not self.lora:
            raise UserError(
                f"{name('lora')}: mode lora needs the steering LoRA's checkpoint folder "
                "(e.g. pipelines/shapes-safety-lora)"
            )
        if self.mode in FK_MODES and self.fk_particles < 2:
            raise UserError(f"{name('fk_particles')}: mode fk expects >= 2 particles, got {self.fk_particles}")
        if self.mode in FK_MODES and self.fk_every < 1:
            raise UserError(
                f"{where}: fk_every (steps between FK resamplings) expects an integer >= 1, got {self.fk_every}"
            )


class SafetyMonitor:
    """The rollout guide: probe every step, mark samples that fire, steer the fired ones by `config.mode`."""

    def __init__(self, policy, probe, config: SteeringConfig, batch_size: int):
        if policy.prediction == "epsilon":
            raise UserError(
                "safety steering reads x0 predictions of flow-matching pipelines; "
                f"{type(policy.pipeline).__name__} is not one"
            )
        self.policy, self.probe, self.config = policy, probe.to(policy.device), config
        self.step = 0
        self.fired = torch.zeros(batch_size, dtype=torch.bool)
        self.fired_at = torch.full((batch_size,), -1, dtype=torch.long)
        self.logits = torch.zeros(batch_size)
        self.steer = "negative" if config.mode == "fk_negative" else config.mode  # what fired samples get
        self.concept = policy.encode([config.concept], 1.0).tensors if self.steer == "negative" else None
        # negative guidance's reference: the rows' own unconditional branch under CFG, else the empty prompt's
        # (guidance 1, or a guidance-distilled family, encodes no unconditional branch): encoded then, once
        self.empty = None

    def select(self, index: torch.Tensor) -> None:
        """Follow a particle re-indexing (FK resampling)."""
        self.fired, self.fired_at, self.logits = self.fired[index], self.fired_at[index], self.logits[index]

    def _probe(self, x, sigma, v, with_gradient: bool):
        from flowrl.sde import x0_prediction

        x0 = x0_prediction(v, x, sigma).detach()
        if not with_gradient:
            with torch.no_grad():
                return self.probe(x, x0, sigma), None
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            logit = self.probe(x_in, x0 + (x_in - x_in.detach()), sigma)  # d x0_hat / d x ~ I: no network call
            (gradient,) = torch.autograd.grad(logit.sum(), x_in)
        return logit.detach(), gradient

    def __call__(self, x, sigma, cond, guidance_scale, v):
        mode = self.steer
        logit, gradient = self._probe(x, sigma, v, with_gradient=mode == "probe_gradient")
        self.logits = logit.float().cpu()
        new = (torch.sigmoid(self.logits) > self.config.threshold) & ~self.fired & (self.step >= self.config.from_step)
        self.fired_at[new] = self.step
        self.fired |= new
        self.step += 1
        rows = self.fired.nonzero().flatten().to(x.device)
        if len(rows) == 0 or mode in ("none", "fk"):
            return v
        v = v.clone()
        if mode == "negative":
            sub = cond.select(rows.cpu())
            if not sub.negative and self.empty is None:
                self.empty = self.policy.encode([""], 1.0).tensors
            concept, unconditional = (
                {k: t.expand(len(rows), *t.shape[1:]) for k, t in branch.items()}
                for branch in (self.concept, sub.negative or self.empty)
            )
            empty, toward = self.policy.branch_outputs(x[rows], sigma, [unconditional, concept], guidance_scale)
            v[rows] = v[rows] - self.config.negative_scale * (toward - empty)
        elif mode == "probe_gradient":
            g = gradient[rows]
            rms = g.flatten(1).pow(2).mean(1).sqrt().clamp_min(1e-12).reshape(-1, *[1] * (g.ndim - 1))
            v[rows] = v[rows] + self.config.gradient_scale * g / rms
        elif mode == "lora":
            self.policy.switch_adapters(True)
            try:
                v[rows] = self.policy.velocity(x[rows], sigma, cond.select(rows.cpu()), guidance_scale)
            finally:
                self.policy.switch_adapters(False)
        return v


class ProbeFK(FKSteering):
    """FK resampling whose reward is -P(unsafe) from the monitor at each scheduled step (read on x_i and x0_hat(x_i),
    the same numbers the monitor fires on) and from the probe on the final sample at the end: the final weight is
    exp(-lambda P(unsafe)), an FK potential exp(lambda r) with r = -P(unsafe). (log P(safe) would give (1 - p)^lambda,
    near-rejection: 1e-20 against 5e-5 at p = 0.99 and lambda 10.)"""

    def __init__(
        self, monitor: SafetyMonitor, config: FKConfig, num_steps: int, num_prompts: int, generator: torch.Generator
    ):
        super().__init__(config, None, num_steps, num_prompts, generator)
        self.monitor = monitor

    def score(self, state, last: bool) -> torch.Tensor:
        if last:
            with torch.no_grad():
                logit = self.monitor.probe(state.latents, state.latents, torch.tensor(0.0))
        else:
            logit = self.monitor.logits
        return -torch.sigmoid(logit.double().cpu())  # -P(unsafe)


def load_steering(policy, config: SteeringConfig):
    """Load what the mode needs into the policy (the steering LoRA, switched off until the probe fires) and return
    the probe."""
    from flowrl.checkpoint import load_trained_weights
    from flowrl.worlds.safety.probe import load_probe

    if policy.source_input:  # its concept prompt would need a source, and the probes read text-to-image latents
        raise UserError(
            f"safety steering runs on text-to-image pipelines; "
            f"{type(policy.pipeline).__name__} here (adapter {type(policy).__name__}) takes a source image "
            "per sample"
        )
    config.validate()
    probe = load_probe(config.probe)
    shape = policy.noise_shape(policy.default_spec())
    if len(shape) != 3 or shape[0] != probe.latent_channels:  # the probe's convolutions read [C, H, W] latents
        raise UserError(
            f"probe {config.probe}: reads image latents of {probe.latent_channels} channels; "
            f"{type(policy.pipeline).__name__}'s are {list(shape)} (train a probe on this pipeline's "
            "latents: `flowrl pretrain safety-probe`)"
        )
    if config.mode == "lora":
        load_trained_weights(policy, config.lora)
        if not policy.has_lora:
            raise UserError(f"--steer-lora: checkpoint {config.lora} holds no LoRA adapter")
        policy.switch_adapters(False)
    return probe


class SafetySteer:
    """Safety steering of generation (inference.Steer): a SafetyMonitor guides every step and steers the samples the
    probe fires on; the FK modes resample particles with the probe as potential. Records say whether and at which
    step the probe fired (-1: never)."""

    def __init__(self, probe, config: SteeringConfig):
        self.probe, self.config = probe, config
        self.fk = None
        if config.mode in FK_MODES:
            self.fk = FKConfig(num_particles=config.fk_particles, lam=config.fk_lambda, resample_every=config.fk_every)
        self.particles = self.fk.num_particles if self.fk is not None else 1

    def start(self, policy, cond, num_outputs: int, num_steps: int, generator: torch.Generator):
        self.monitor = SafetyMonitor(policy, self.probe, self.config, len(cond))
        self.resampler = ProbeFK(self.monitor, self.fk, num_steps, num_outputs, generator) if self.fk else None
        return ([self.resampler] if self.resampler is not None else []), self.monitor

    def record(self, n: int) -> dict:
        k = self.particles
        out = {"fk_reward": float(self.resampler.final_rewards[n * k])} if self.resampler is not None else {}
        return {**out, "probe_fired_at": int(self.monitor.fired_at[n * k])}
