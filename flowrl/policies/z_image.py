"""ZImagePipeline adapter (Z-Image, Z-Image-Turbo: a single-stream DiT with a Qwen3 text encoder).

What differs from FLUX, whose sizes, sigma schedule (linspace(1, 1/N) with the resolution's mu, which a config with
a static shift, as Z-Image-Turbo's, ignores) and VAE decoding it shares:
- the transformer takes one latent [C, 1, h, w] and one prompt embedding [L, D] per sample, as lists, with each
  prompt at its own length. flowrl keeps every prompt's embeddings padded, with a mask, to one length (so rows encoded
  apart stack) and hands the transformer each row cut back to its own tokens: what the pipeline gives it;
- it sees the time as 1 - sigma and predicts x0 - eps: the velocity (eps - x0, flowrl's and the scheduler's
  convention) is its output negated, as ZImagePipeline negates it;
- guidance: ZImagePipeline computes pos + w (pos - neg), which is v_u + (w + 1)(v_c - v_u). flowrl's
  `sampler.guidance_scale` keeps its one meaning across families (v_u + s (v_c - v_u), 1 = no guidance), so
  ZImagePipeline's guidance_scale w is s = w + 1 here: its default 5.0 is 6.0 in a flowrl config. The pipeline's
  cfg_normalization and cfg_truncation are off by default there and not offered here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.policies.flux import FluxPolicy

# the attention projections of every block (the main layers and the noise / context refiners)
Z_IMAGE_LORA_TARGETS = ["attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0"]


@POLICIES.register("ZImagePipeline")
class ZImagePolicy(FluxPolicy):
    family = "z_image"
    lora_targets = Z_IMAGE_LORA_TARGETS
    text_length_tokenizer = "tokenizer"  # Qwen3's

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0  # true CFG (the pipeline's guidance_scale > 0)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        tensors = self._embed(list(prompts))
        negative = self._embed([""] * len(prompts)) if self.uses_cfg(guidance_scale) else {}
        return Conditioning(tensors, negative, list(prompts))

    def _embed(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        length = self.text_length()
        rows = self.pipeline._encode_prompt(list(prompts), device=self.device, max_sequence_length=length)
        embeds = torch.stack([F.pad(row, (0, 0, 0, length - row.shape[0])) for row in rows])
        mask = torch.stack([(torch.arange(length, device=embeds.device) < row.shape[0]).long() for row in rows])
        return {"embeds": embeds, "mask": mask}

    def default_spec(self) -> SampleSpec:
        return SampleSpec(1024, 1024)  # ZImagePipeline's default size

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        factor = self.pipeline.vae_scale_factor
        h, w = 2 * (spec.height // (factor * 2)), 2 * (spec.width // (factor * 2))
        return (self.transformer.config.in_channels, h, w)  # patchified inside the transformer

    def _forward(self, latents, sigma, tensors, guidance_scale):
        lengths = tensors["mask"].sum(1).tolist()
        embeds = tensors["embeds"].to(latents.dtype)
        # the time stays fp32, as ZImagePipeline gives it (its latents are fp32): bf16 would round 1 - sigma by up to
        # 2 of the transformer's 1000 time units
        out = self.net()(
            list(latents[:, :, None].unbind(0)),
            (1 - sigma).float(),
            [row[:n] for row, n in zip(embeds, lengths)],
            return_dict=False,
        )[0]
        return -torch.stack(out)[:, :, 0]
