"""HunyuanVideoPipeline adapter (HunyuanVideo text to video, DanceGRPO's video model), and
HunyuanSkyreelsImageToVideoPipeline (SkyReels-V1 image to video, DanceGRPO's image-to-video model).

5-D latents [B, C, F, H, W] (the causal VAE: 4x in time, 8x in space, one scaling factor); prompts read by a Llama
(the second-to-last-but-one hidden states after the pipeline's system template, cut at its crop, padded to
max_sequence_length with a mask) and CLIP (pooled); guidance-distilled: the scale goes in as the transformer's
guidance embedding (x 1000, as the pipeline), so there is no CFG branch. The pipeline's optional true CFG
(`true_cfg_scale` with a negative prompt, off by default) is not offered. Sigmas as the pipeline spaces them:
linspace(1, 0, N + 1) without its last, through the scheduler's shift (the release's 7.0; DanceGRPO samples with 5).
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec

# the attention projections of the dual-stream blocks (image and text), the single-stream blocks' q / k / v and
# the text refiner's attention, as Flow-GRPO-style LoRAs target them
HUNYUAN_VIDEO_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


@POLICIES.register("HunyuanVideoPipeline")
class HunyuanVideoPolicy(FlowPolicy):
    family = "hunyuan_video"
    modality = "video"
    # HunyuanVideo and SkyReels-V1 generate 24 frames a second (their reference samplers save at 24; diffusers'
    # doc examples export at 15, which would play clips 1.6x slow and move VBench's frame intervals)
    fps = 24
    lora_targets = HUNYUAN_VIDEO_LORA_TARGETS
    text_length_tokenizer = "tokenizer"  # the Llama's (its length counts after the template's crop)

    def uses_cfg(self, guidance_scale: float) -> bool:
        return False  # guidance-distilled: the scale is an embedding

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        embeds, pooled, mask = self.pipeline.encode_prompt(
            prompt=list(prompts), device=self.device, max_sequence_length=self.text_length()
        )
        return Conditioning({"embeds": embeds, "pooled": pooled, "mask": mask}, {}, list(prompts))

    def default_spec(self) -> SampleSpec:
        return SampleSpec(720, 1280, 129)  # HunyuanVideoPipeline.__call__'s defaults

    @property
    def size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor_spatial * self.transformer.config.patch_size

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        return self.video_noise_shape(
            spec, self.pipeline.vae_scale_factor_temporal, self.pipeline.vae_scale_factor_spatial
        )

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        scheduler.set_timesteps(num_steps, sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1])

    def embedded_guidance(self, guidance_scale: float) -> float:
        """The scale the guidance embedding gets: HunyuanVideo's is the sampler's scale (guidance-distilled)."""
        return guidance_scale

    def _forward(self, latents, sigma, tensors, guidance_scale):
        dtype = self.transformer.dtype  # the pipeline hands the embeddings, mask and guidance over in it
        b = latents.shape[0]
        # fp32, as the pipeline's (its latents are fp32): the latents here are in the weights' dtype, where bf16
        # would round a timestep of ~990 by up to 2
        timestep = (torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1) * 1000).expand(b)
        guidance = torch.full((b,), self.embedded_guidance(guidance_scale), dtype=dtype, device=latents.device) * 1000.0
        if "image_latents" in tensors:  # image to video: the first frame's latents on the channel axis
            latents = torch.cat([latents, tensors["image_latents"].to(latents.dtype)], 1)
        return self.net()(
            hidden_states=latents,
            timestep=timestep,
            encoder_hidden_states=tensors["embeds"].to(dtype),
            encoder_attention_mask=tensors["mask"].to(dtype),
            pooled_projections=tensors["pooled"].to(dtype),
            guidance=guidance,
            return_dict=False,
        )[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Video in [0, 1], [B, 3, F, H, W]."""
        vae = self.pipeline.vae
        return self.to_images(vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0])


@POLICIES.register("HunyuanSkyreelsImageToVideoPipeline")
class HunyuanSkyreelsImageToVideoPolicy(HunyuanVideoPolicy):
    """SkyReels-V1 image to video on HunyuanVideo's transformer. Each sample starts from its own first frame, found
    like an editor's source (`inputs["source_image"]`, or a .jsonl line's `image`). As the pipeline builds it: the
    frame at the sample size is encoded by the VAE (times its scaling factor), followed by zero latent frames, and
    concatenated to the noisy latents on the channel axis at every call, in both CFG branches. Unlike HunyuanVideo,
    SkyReels takes true CFG (`sampler.guidance_scale` is the pipeline's true_cfg_scale, against the negative prompt
    ""), while its guidance embedding keeps the pipeline's guidance_scale, 1.0. Deviations: the VAE's posterior mode
    where the pipeline draws from the posterior (flowrl's conditioning is deterministic, as Wan image to video's);
    the frame is resized bicubically with antialiasing (the pipeline resizes with PIL)."""

    family = "hunyuan_skyreels_i2v"
    source_input = "source_image"  # the first frame
    source_needed_by = "an image-to-video pipeline"
    embedded_scale = 1.0  # HunyuanSkyreelsImageToVideoPipeline's guidance_scale default

    def default_spec(self) -> SampleSpec:
        return SampleSpec(544, 960, 97)  # HunyuanSkyreelsImageToVideoPipeline.__call__'s defaults

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0

    def embedded_guidance(self, guidance_scale: float) -> float:
        return self.embedded_scale

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cond = super().encode_prompts(prompts, guidance_scale)
        if self.uses_cfg(guidance_scale):  # the pipeline guides only against a given negative prompt: "" here
            embeds, pooled, mask = self.pipeline.encode_prompt(
                prompt=[""] * len(prompts), device=self.device, max_sequence_length=self.text_length()
            )
            cond.negative = {"embeds": embeds, "pooled": pooled, "mask": mask}
        return cond

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        shape = super().noise_shape(spec)  # the transformer's in_channels count the frame's latents too
        return (shape[0] // 2, *shape[1:])

    @torch.no_grad()
    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        spec = spec or self.default_spec()
        z, rows = self.encode_first_frames(items, spec)  # one encoding per distinct item
        z = z * self.pipeline.vae.config.scaling_factor
        frames_count = self.noise_shape(spec)[1]  # latent frames: the frame's, then zeros, as the pipeline pads
        latents = torch.cat([z, z.new_zeros(z.shape[0], z.shape[1], frames_count - 1, *z.shape[3:])], 2)
        cond.add_inputs({"image_latents": latents[rows]})
        return cond
