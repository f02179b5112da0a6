"""FluxPipeline adapter: packed 2x2 latents with position ids, guidance as an embedding (no true CFG)."""
from __future__ import annotations

import numpy as np
import torch

from .base import Conditioning, FlowPolicy

FLUX_LORA_TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                     "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"]


class FluxPolicy(FlowPolicy):
    family = "flux"
    lora_targets = FLUX_LORA_TARGETS

    def uses_cfg(self, guidance_scale: float) -> bool:
        return False  # FLUX-dev is guidance-distilled: the scale enters as an embedding

    @torch.no_grad()
    def encode(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        kwargs = {} if self.max_sequence_length is None else {"max_sequence_length": self.max_sequence_length}
        embeds, pooled, text_ids = self.pipeline.encode_prompt(prompts, prompts, device=self.device, **kwargs)
        self._text_ids = text_ids  # shared by every sample: [L, 3]
        return Conditioning({"embeds": embeds, "pooled": pooled}, {}, list(prompts))

    def noise_shape(self, height: int, width: int, **kwargs) -> tuple[int, ...]:
        factor = self.pipeline.vae_scale_factor
        h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
        self._latent_hw = (h, w)
        channels = self.transformer.config.in_channels  # already the packed 4 x latent channels
        return ((h // 2) * (w // 2), channels)

    def _image_ids(self, device, dtype):
        h, w = self._latent_hw
        return self.pipeline._prepare_latent_image_ids(1, h // 2, w // 2, device, dtype)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((latents.shape[0],), guidance_scale, device=latents.device, dtype=torch.float32)
        return self.net()(hidden_states=latents, timestep=sigma.to(latents.dtype), guidance=guidance,
                          pooled_projections=tensors["pooled"].to(latents.dtype),
                          encoder_hidden_states=tensors["embeds"].to(latents.dtype), txt_ids=self._text_ids,
                          img_ids=self._image_ids(latents.device, latents.dtype), return_dict=False)[0]

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift
        c = scheduler.config
        mu = calculate_shift(noise_shape[0], c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                             c.get("base_shift", 0.5), c.get("max_shift", 1.15))
        scheduler.set_timesteps(num_steps, sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        h, w = self._latent_hw
        factor = self.pipeline.vae_scale_factor
        z = self.pipeline._unpack_latents(latents, h * factor, w * factor, factor)
        z = z.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        return self.to_images(vae.decode(z, return_dict=False)[0])
