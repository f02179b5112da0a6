"""StableDiffusion3Pipeline adapter: joint text/image transformer, three text encoders, optional CFG."""

from __future__ import annotations

import torch

from flowrl.images import to_unit
from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec

SD3_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


@torch.no_grad()
def encode_images(vae, images, generator: torch.Generator | None = None) -> torch.Tensor:
    """uint8 [B, H, W, 3] images -> latents in an SD3 transformer's space (a draw from the VAE posterior, shifted
    and scaled as the pipeline does): what pretraining and the data loss regress on."""
    pixels = (to_unit(images) * 2 - 1).to(vae.device, vae.dtype)
    z = vae.encode(pixels).latent_dist.sample(generator).float()
    return (z - vae.config.shift_factor) * vae.config.scaling_factor


@POLICIES.register("StableDiffusion3Pipeline")
class SD3Policy(FlowPolicy):
    family = "sd3"
    lora_targets = SD3_LORA_TARGETS
    text_length_tokenizer = "tokenizer_3"  # T5

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cfg = self.uses_cfg(guidance_scale)
        kwargs = {"max_sequence_length": self.text_length()}  # __call__'s default, not encode_prompt's
        embeds, neg, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompts,
            prompts,
            prompts,
            device=self.device,
            do_classifier_free_guidance=cfg,
            negative_prompt=[""] * len(prompts) if cfg else None,
            **kwargs,
        )
        negative = {"embeds": neg, "pooled": neg_pooled} if cfg else {}
        return Conditioning({"embeds": embeds, "pooled": pooled}, negative, list(prompts))

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.net()(
            hidden_states=latents,
            encoder_hidden_states=tensors["embeds"].to(latents.dtype),
            pooled_projections=tensors["pooled"].to(latents.dtype),
            timestep=sigma * 1000,
            return_dict=False,
        )[0]

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        factor = self.pipeline.vae_scale_factor
        return (self.transformer.config.in_channels, spec.height // factor, spec.width // factor)

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        mu = None
        if scheduler.config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            patch, c = self.transformer.config.patch_size, scheduler.config
            # the scheduler config's bounds, with StableDiffusion3Pipeline's own defaults (max_shift 1.16)
            mu = calculate_shift(
                noise_shape[-1] * noise_shape[-2] // patch**2,
                c.get("base_image_seq_len", 256),
                c.get("max_image_seq_len", 4096),
                c.get("base_shift", 0.5),
                c.get("max_shift", 1.16),
            )
        scheduler.set_timesteps(num_steps, mu=mu)

    def encode_images(self, images, generator: torch.Generator | None = None) -> torch.Tensor:
        return encode_images(self.pipeline.vae, images, generator)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        z = latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        return self.to_images(vae.decode(z, return_dict=False)[0])
