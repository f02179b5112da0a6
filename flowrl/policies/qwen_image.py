"""QwenImagePipeline adapter (Qwen-Image text-to-image): a Qwen2.5-VL text encoder whose prompt embeddings vary in
length (with a mask), 2x2-packed latent tokens as FLUX's, true CFG with Qwen-Image's norm rescale, and a Wan-style
VAE (one-frame video latents, per-channel mean / std).

Trajectories keep latents unpacked, [B, C, h, w] as every image family; `_forward` packs them on the way in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning
from flowrl.policies.flux import FluxPolicy
from flowrl.policies.wan import wan_vae_latents

# the attention projections of both streams, as flowrl's SD3 and FLUX adapters train (Flow-Factory's Qwen-Image
# default also adapts each feed-forward's first projection: `lora.target_modules` can add "img_mlp.net.0.proj");
# the text stream's output projection is added per block by `lora_targets`
QWEN_IMAGE_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
]


@POLICIES.register("QwenImagePipeline")
class QwenImagePolicy(FluxPolicy):
    """Sizes, noise layout and the dynamically shifted sigma schedule are FLUX's (the same packing and
    calculate_shift on the scheduler's config); prompts, guidance, the transformer call and decoding are Qwen's."""

    family = "qwen_image"
    text_length_tokenizer = "tokenizer"
    negative_prompt = " "  # QwenImagePipeline guides only against a given negative prompt; its examples give " "

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        super().__init__(pipeline, max_sequence_length)
        import diffusers
        from packaging.version import Version

        if Version(diffusers.__version__) < Version("0.37"):  # older transformers ignore the text mask
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"pipeline.path: Qwen-Image needs diffusers >= 0.37 (its attention masks padded "
                f"prompt tokens); this environment has {diffusers.__version__}"
            )
        if self.transformer.config.guidance_embeds:
            from flowrl.errors import ConfigError

            raise ConfigError(
                "pipeline.path: this Qwen-Image transformer is guidance-distilled (guidance_embeds); "
                "flowrl's Qwen-Image adapter supports the released models, which use true CFG"
            )

    @property
    def lora_targets(self) -> list[str]:
        """QWEN_IMAGE_LORA_TARGETS, and the text stream's output projection (to_add_out) of every block but the last:
        the transformer drops the last block's text tokens, so an adapter there would never get a gradient, and DDP
        stops on a trainable parameter without one."""
        last = self.transformer.config.num_layers - 1
        return [*QWEN_IMAGE_LORA_TARGETS, *(f"transformer_blocks.{i}.attn.to_add_out" for i in range(last))]

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0  # true CFG (QwenImagePipeline's true_cfg_scale): not guidance-distilled

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        tensors = self._embed(list(prompts))
        negative = self._embed([self.negative_prompt] * len(prompts)) if self.uses_cfg(guidance_scale) else {}
        return Conditioning(tensors, negative, list(prompts))

    def _embed(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        length = self.text_length()
        embeds, mask = self.pipeline.encode_prompt(prompts, device=self.device, max_sequence_length=length)
        if mask is None:  # the pipeline drops a mask that is all ones
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = length - embeds.shape[1]
        return {"embeds": F.pad(embeds, (0, 0, 0, pad)), "mask": F.pad(mask.long(), (0, pad))}

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.packed_velocity(latents, sigma, tensors)

    def packed_velocity(self, latents, sigma, tensors, context: list[torch.Tensor] | None = None) -> torch.Tensor:
        """The transformer's output for unpacked latents [B, C, h, w]: packed 2x2 tokens in, the text columns no row
        uses dropped, unpacked out. `context` (an editor's images, its source first: latents [B, C, h_k, w_k] each)
        goes in as packed tokens after the sample's, each listed in img_shapes after it as the edit pipelines do;
        only the sample's come out."""
        b, c, h, w = latents.shape
        mask = tensors["mask"]
        used = int(mask.sum(1).max())  # real tokens come first in every row: the columns after are padding for all
        mask = mask[:, :used]
        tokens = self.pipeline._pack_latents(latents, b, c, h, w)
        shapes = [(1, h // 2, w // 2)]
        for image in context or []:
            image = image.to(latents.dtype)
            shapes.append((1, image.shape[-2] // 2, image.shape[-1] // 2))
            tokens = torch.cat([tokens, self.pipeline._pack_latents(image, b, *image.shape[1:])], 1)
        out = self.net()(
            hidden_states=tokens,
            timestep=sigma.to(latents.dtype),
            guidance=None,
            encoder_hidden_states=tensors["embeds"][:, :used].to(latents.dtype),
            # as the pipeline: no mask when nothing is padded (attention kernels run faster without)
            encoder_hidden_states_mask=None if bool(mask.all()) else mask,
            img_shapes=[shapes] * b,
            return_dict=False,
        )[0]
        factor = self.pipeline.vae_scale_factor
        return self.pipeline._unpack_latents(out[:, : (h // 2) * (w // 2)], h * factor, w * factor, factor)[:, :, 0]

    def combine_guidance(self, uncond, text, guidance_scale):
        """Qwen-Image's true CFG: v_u + w (v_c - v_u), rescaled so that each packed token (a 2x2 latent patch, all
        channels) keeps the conditional output's norm, as QwenImagePipeline and Flow-Factory's trainer compute it."""
        combined = uncond + guidance_scale * (text - uncond)
        return combined * (_token_norms(text) / _token_norms(combined))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        frames = vae.decode(wan_vae_latents(vae, latents[:, :, None]), return_dict=False)[0]
        return self.to_images(frames[:, :, 0])


def _token_norms(v: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> the L2 norm of each 2x2 patch over all channels (a packed token's norm), broadcast back to
    [B, 1, h, w]."""
    patch = F.avg_pool2d(v.pow(2).sum(1, keepdim=True), 2) * 4
    return F.interpolate(patch.sqrt(), scale_factor=2, mode="nearest")
