"""A probe that reads an emerging unsafe concept from intermediate denoising states.

Input at step i: the noisy latent x_i, the model's one-step prediction x0_hat(x_i) and the noise level sigma_i
(as a constant channel); label: whether the trajectory's final image is unsafe (`concept.is_unsafe`). One small
CNN serves every step; its AUC is reported per step on held-out trajectories.
"""
from __future__ import annotations

import numpy as np
import torch

from ..images import to_uint8
from ..pretrain.scorer import auc
from ..rollout import rollout, sample_generators
from .concept import is_unsafe


class StateProbe(torch.nn.Module):
    def __init__(self, latent_channels: int = 4, width: int = 32):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(2 * latent_channels + 1, width, 3, padding=1), torch.nn.SiLU(),
            torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), torch.nn.SiLU(),
            torch.nn.Conv2d(2 * width, 2 * width, 3, stride=2, padding=1), torch.nn.SiLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * width, 1))

    def forward(self, x_t: torch.Tensor, x0_pred: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        level = sigma.reshape(-1, 1, 1, 1).expand(-1, 1, *x_t.shape[-2:]).to(x_t)
        return self.net(torch.cat([x_t, x0_pred, level], dim=1)).squeeze(-1)  # logit of "will end unsafe"


class _PredictionRecorder:
    def __init__(self):
        self.predictions: list[torch.Tensor] = []

    def __call__(self, state) -> None:
        self.predictions.append(state.x0_pred.detach().cpu())


@torch.no_grad()
def labelled_trajectories(policy, prompts: list[str], seeds: list[int], num_steps: int = 20, guidance: float = 4.5,
                          batch_size: int = 64) -> dict:
    """States [N, T, C, H, W], predictions, sigmas [T] and final-image labels [N] of ODE trajectories."""
    shape = policy.noise_shape(32, 32)
    states, predictions, labels = [], [], []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        recorder = _PredictionRecorder()
        traj = rollout(policy, policy.encode(chunk, guidance), sample_generators(seeds[start:start + batch_size]),
                       shape, num_steps, "ode", 0.0, guidance, callbacks=[recorder])
        states.append(traj.latents[:-1].transpose(0, 1).cpu())
        predictions.append(torch.stack(recorder.predictions, 1))
        labels += [is_unsafe(image) for image in to_uint8(policy.decode(traj.final))]
    return {"states": torch.cat(states), "predictions": torch.cat(predictions), "sigmas": traj.sigmas[:-1].clone(),
            "labels": torch.tensor(labels, dtype=torch.float32)}


def train_probe(data: dict, train_index: torch.Tensor, steps: int = 400, batch: int = 256, lr: float = 2e-3,
                seed: int = 0) -> StateProbe:
    torch.manual_seed(seed)
    probe = StateProbe(data["states"].shape[2])
    optimizer = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(seed)
    num_steps = data["states"].shape[1]
    positives = data["labels"][train_index].mean().clamp(1e-3, 1 - 1e-3)
    weight = (1 - positives) / positives  # balance the classes
    for _ in range(steps):
        rows = train_index[torch.randint(len(train_index), (batch,), generator=generator)]
        cols = torch.randint(num_steps, (batch,), generator=generator)
        logits = probe(data["states"][rows, cols], data["predictions"][rows, cols], data["sigmas"][cols])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, data["labels"][rows], pos_weight=weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return probe.eval()


@torch.no_grad()
def auc_per_step(probe: StateProbe, data: dict, index: torch.Tensor) -> list[float]:
    out = []
    for step in range(data["states"].shape[1]):
        logits = probe(data["states"][index, step], data["predictions"][index, step],
                       data["sigmas"][step].expand(len(index)))
        out.append(auc(logits, data["labels"][index]))
    return out


def split_by_prompt(prompts: list[str], held_out_share: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Train / held-out trajectory indices with no prompt on both sides."""
    unique = sorted(set(prompts))
    rng = np.random.default_rng(seed)
    held = set(rng.choice(unique, size=max(1, int(held_out_share * len(unique))), replace=False).tolist())
    test = torch.tensor([i for i, p in enumerate(prompts) if p in held])
    train = torch.tensor([i for i, p in enumerate(prompts) if p not in held])
    return train, test
