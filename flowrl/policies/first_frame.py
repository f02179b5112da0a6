"""Image to video where the given frame is the video's first latent frame (Wan2.2-TI2V-5B, LTX-Video image to
video): the transformer sees it there at time 0, and every step ends with it in place, as the pipelines' outputs do.

The frame's velocity is the one that carries the sample there (v = (x - x0) / sigma with x0 the condition), so no
weight moves it and its log-prob terms are equal under any policy; computed in fp32 (in bf16 the frame's x0
prediction would miss the condition by ~0.02).
"""

from __future__ import annotations

import torch


def hold_first_frame(out: torch.Tensor, latents: torch.Tensor, first: torch.Tensor, sigma) -> torch.Tensor:
    """`out` (velocities [B, C, F, H, W]) with its first latent frame's replaced by the one carrying `latents`' first
    frame to `first` ([B, C, H, W]); zero at sigma 0."""
    s = torch.as_tensor(sigma, dtype=torch.float32, device=out.device).reshape(-1).expand(len(out))
    s = s.reshape(-1, 1, 1, 1)
    out = out.float()
    out[:, :, 0] = torch.where(s > 0, (latents[:, :, 0].float() - first.float()) / s.clamp_min(1e-12), 0.0)
    return out


class FirstFrameHeld:
    """A policy mixin: `step` ends every step with the first latent frame on the condition's
    (`cond.tensors["condition"][:, :, 0]`), also under SDE noise; the log-prob is that of the sample kept, so a stored
    step scores as it was drawn. `holds_first_frame` says whether the policy conditions this way."""

    holds_first_frame = True

    def step(
        self, kind, x, sigma, sigma_next, cond, guidance_scale, noise_level, noise=None, prev_sample=None, guide=None
    ):
        from flowrl.sde import gaussian_log_prob

        out = super().step(kind, x, sigma, sigma_next, cond, guidance_scale, noise_level, noise, prev_sample, guide)
        if not self.holds_first_frame or prev_sample is not None:
            return out
        kept, mean, std, _, x0 = out
        kept = kept.clone()
        kept[:, :, 0] = cond.tensors["condition"][:, :, 0].to(kept.dtype)
        return kept, mean, std, gaussian_log_prob(kept, mean, std), x0
