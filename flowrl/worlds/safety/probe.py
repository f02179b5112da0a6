"""A probe that reads an emerging unsafe concept from intermediate denoising states.

Input at step i: the noisy latent x_i, the model's one-step prediction x0_hat(x_i) and the noise level sigma_i
(as a constant channel); label: whether the trajectory's final image is unsafe (`concept.is_unsafe`). One small
CNN serves every step; it max-pools over positions (the concept may appear anywhere) and trains with random
horizontal flips (a mirrored red triangle is still one). `flowrl pretrain safety-probe` trains it on ODE
trajectories of the train-side safety prompts (5 seeds each) and reports its AUC per step on the held-out prompts
(concept.safety_split).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from flowrl.errors import UserError
from flowrl.eval.metrics import auc
from flowrl.images import to_uint8
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.worlds.safety.concept import PROMPT_SETS, is_unsafe, safety_split


class StateProbe(torch.nn.Module):
    def __init__(self, latent_channels: int = 4, width: int = 32):
        super().__init__()
        self.latent_channels, self.width = latent_channels, width
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(2 * latent_channels + 1, width, 3, padding=1),
            torch.nn.SiLU(),
            torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            torch.nn.SiLU(),
            torch.nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1),
            torch.nn.SiLU(),
            torch.nn.AdaptiveMaxPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(2 * width, 1),
        )  # "anywhere in the image"

    def forward(self, x_t: torch.Tensor, x0_pred: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        sigma = torch.as_tensor(sigma, dtype=x_t.dtype, device=x_t.device)
        level = sigma.reshape(-1, 1, 1, 1).expand(x_t.shape[0], 1, *x_t.shape[-2:])
        return self.net(torch.cat([x_t, x0_pred, level], dim=1)).squeeze(-1)  # logit of "will end unsafe"


def save_probe(probe: StateProbe, folder: str | Path, facts: dict) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in probe.state_dict().items()}, str(folder / "probe.safetensors"))
    (folder / "probe.json").write_text(
        json.dumps({"latent_channels": probe.latent_channels, "width": probe.width, **facts}, indent=2) + "\n"
    )


def write_probe_card(folder: str | Path) -> None:
    """README.md of a probe folder: what it is, how it was made, its held-out AUC per step (from probe.json)."""
    folder = Path(folder)
    d = json.loads((folder / "probe.json").read_text())
    rows = "\n".join(
        f"| {i} | {sigma:.3f} | {a:.3f} |" for i, (sigma, a) in enumerate(zip(d["sigmas"], d["held_out_auc_per_step"]))
    )
    (
        folder / "README.md"
    ).write_text(f"""# shapes-safety-probe: reads an emerging red triangle from intermediate states of {d["pipeline"]}

A small CNN (`flowrl.worlds.safety.probe.StateProbe`, 2 x 4 latent channels + a noise-level channel -> 3 convolutions ->
max-pool -> logit) on the noisy latent x_t and the one-step prediction x0_hat(x_t). Label: whether the
trajectory's final image holds a red triangle (the shapes verifier). Made by `flowrl pretrain safety-probe`
(seed {d["config"]["seed"]}, ~5 min on 2 CPU cores): {d["train_trajectories"]} ODE trajectories \
({d["config"]["num_steps"]} steps, CFG
{d["config"]["guidance_scale"]}) of the train-side safety prompts, {d["config"]["seeds_per_prompt"]} seeds each \
({d["train_unsafe_share"]:.0%} unsafe), {d["config"]["steps"]} AdamW
steps with random horizontal flips; fp16 weights.

Held-out AUC per step, on {d["held_out_trajectories"]} trajectories of prompts the probe never saw \
({d["held_out_unsafe_share"]:.0%} unsafe):

| step | sigma | AUC |
|---|---|---|
{rows}
""")


def load_probe(folder: str | Path) -> StateProbe:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "probe.safetensors").is_file() or not (folder / "probe.json").is_file():
        raise UserError(
            f"probe folder {folder}: expected probe.safetensors and probe.json (made by `flowrl pretrain safety-probe`)"
        )
    meta = json.loads((folder / "probe.json").read_text())
    probe = StateProbe(meta["latent_channels"], meta["width"])
    probe.load_state_dict({k: v.float() for k, v in load_file(str(folder / "probe.safetensors")).items()})
    return probe.eval().requires_grad_(False)


class _PredictionRecorder:
    def __init__(self):
        self.predictions: list[torch.Tensor] = []

    def __call__(self, state) -> None:
        self.predictions.append(state.x0_pred.detach().cpu())


@torch.no_grad()
def labelled_trajectories(
    policy, prompts: list[str], seeds: list[int], num_steps: int = 20, guidance: float = 4.5, batch_size: int = 64
) -> dict:
    """States [N, T, C, H, W], predictions, sigmas [T] and final-image labels [N] of ODE trajectories."""
    shape = policy.noise_shape(SampleSpec(32, 32))
    states, predictions, labels = [], [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        recorder = _PredictionRecorder()
        traj = rollout(
            policy,
            policy.encode(chunk, guidance),
            sample_generators(seeds[start : start + batch_size]),
            shape,
            num_steps,
            "ode",
            0.0,
            guidance,
            callbacks=[recorder],
        )
        states.append(traj.latents[:-1].transpose(0, 1).cpu())
        predictions.append(torch.stack(recorder.predictions, 1))
        labels += [is_unsafe(image) for image in to_uint8(policy.decode(traj.final))]
    return {
        "states": torch.cat(states),
        "predictions": torch.cat(predictions),
        "sigmas": traj.sigmas[:-1].clone(),
        "labels": torch.tensor(labels, dtype=torch.float32),
    }


def train_probe(data: dict, steps: int = 1500, batch: int = 256, lr: float = 2e-3, seed: int = 0) -> StateProbe:
    """Class-balanced logistic loss over random (trajectory, step) pairs, cosine-decayed AdamW."""
    torch.manual_seed(seed)
    probe = StateProbe(data["states"].shape[2])
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    generator = torch.Generator().manual_seed(seed)
    count, num_steps = data["states"].shape[:2]
    positives = data["labels"].mean().clamp(1e-3, 1 - 1e-3)
    weight = (1 - positives) / positives
    for _ in range(steps):
        rows = torch.randint(count, (batch,), generator=generator)
        cols = torch.randint(num_steps, (batch,), generator=generator)
        flip = (torch.rand(batch, generator=generator) < 0.5).reshape(-1, 1, 1, 1)
        states, predictions = data["states"][rows, cols], data["predictions"][rows, cols]
        states, predictions = (
            torch.where(flip, states.flip(-1), states),
            torch.where(flip, predictions.flip(-1), predictions),
        )
        logits = probe(states, predictions, data["sigmas"][cols])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, data["labels"][rows], pos_weight=weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    return probe.eval()


@torch.no_grad()
def auc_per_step(probe: StateProbe, data: dict) -> list[float]:
    return [
        auc(probe(data["states"][:, step], data["predictions"][:, step], data["sigmas"][step]), data["labels"])
        for step in range(data["states"].shape[1])
    ]


@dataclass
class ProbeConfig:
    seed: int = 0
    seeds_per_prompt: int = 5
    steps: int = 1500
    num_steps: int = 20
    guidance_scale: float = 4.5


def pretrain_probe(policy, cfg: ProbeConfig) -> tuple[StateProbe, dict]:
    """Train on the train-side safety prompts; AUC per step on held-out prompts (fresh seeds)."""
    from flowrl.prompt_source import derived_seed

    train_sets, held_sets = safety_split()

    def trajectories(sets: dict, salt: int) -> dict:
        prompts = [p for name in PROMPT_SETS for p in sets[name] for _ in range(cfg.seeds_per_prompt)]
        seeds = [derived_seed(cfg.seed, salt, i) for i in range(len(prompts))]
        return labelled_trajectories(policy, prompts, seeds, cfg.num_steps, cfg.guidance_scale)

    train, held = trajectories(train_sets, 1), trajectories(held_sets, 2)
    probe = train_probe(train, cfg.steps, seed=cfg.seed)
    aucs = auc_per_step(probe, held)
    facts = {
        "config": asdict(cfg),
        "train_trajectories": len(train["labels"]),
        "train_unsafe_share": round(float(train["labels"].mean()), 3),
        "held_out_trajectories": len(held["labels"]),
        "held_out_unsafe_share": round(float(held["labels"].mean()), 3),
        "sigmas": [round(float(s), 3) for s in held["sigmas"]],
        "held_out_auc_per_step": [round(a, 4) for a in aucs],
    }
    return probe, facts
