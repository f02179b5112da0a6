"""Pretraining-data regularization: a flow-matching loss on (image, prompt) pairs from the data the pipeline was
pretrained on, added to an algorithm's loss at every optimizer step.

ImageReward's ReFL (Xu et al., arXiv 2304.05977) alternates its reward loss with the pretraining loss for this reason: a
reward-gradient method climbs whatever its learned reward likes, and the data loss keeps the generator on the
distribution the reward was fitted to. The data comes from the task (`Task.data_batch`; in the shapes world the
renderer itself); the policy encodes it into its latent space (`encode_images`). Batches are drawn from
(run seed, update, optimizer step, process), so a resumed run sees the same ones.
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.errors import ConfigError
from flowrl.prompt_source import derived_seed
from flowrl.schedules import sample_noise_levels


class DataLoss:
    def __init__(self, section, policy, task, seed: int):
        if not hasattr(policy, "encode_images") or policy.prediction != "flow":
            raise ConfigError(
                f"train.data_loss: needs a flow-matching policy that encodes images into its latents "
                f"(encode_images); got a {type(policy.pipeline).__name__}"
            )
        self.section, self.policy, self.task, self.seed = section, policy, task, seed

    def batch(self, update: int, step: int, rank: int) -> tuple[np.ndarray, list[str]]:
        rng = np.random.default_rng(derived_seed(self.seed, update, step, rank, 41))
        return self.task.data_batch(self.section.batch, rng)

    def __call__(self, update: int, step: int, rank: int) -> torch.Tensor:
        """Mean squared velocity error on one data batch, at logit-normal t as in SD3 pretraining."""
        images, prompts = self.batch(update, step, rank)
        generator = torch.Generator().manual_seed(derived_seed(self.seed, update, step, rank, 43))
        policy = self.policy
        with torch.no_grad():
            x0 = policy.encode_images(images, generator).to(policy.device)
            cond = policy.encode(prompts, 1.0)
        t = sample_noise_levels("logit_normal", len(images), generator).to(policy.device)
        noise = torch.randn(x0.shape, generator=generator).to(policy.device)
        tt = t.reshape(-1, *[1] * (x0.ndim - 1))
        velocity = policy.velocity((1 - tt) * x0 + tt * noise, t, cond, 1.0)
        return (velocity - (noise - x0)).pow(2).mean()
