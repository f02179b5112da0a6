"""LTXPipeline adapter (LTX-Video text to video), and LTXImageToVideoPipeline (image to video).

Trajectories hold unpacked latents [B, C, F, H, W] (LTX's VAE: 8x in time, 32x in space, per-channel statistics);
`_forward` packs them into the transformer's tokens with the pipeline's rope interpolation scale (VAE compression
over the frame rate), and unpacks its output. Like the pipeline, it assumes transformer patch sizes of 1 (every
released LTX-Video's). T5 prompts padded to
max_sequence_length (default 128) with a mask; true CFG against "" (the pipeline's guidance_rescale, off by default,
is not offered); sigmas as the pipeline spaces them: linspace(1, 1/N, N) shifted by mu from the video's token count.
Decoding is the pipeline's default: statistics undone, and a timestep-conditioned VAE decodes at timestep 0 with no
added noise (the pipeline's decode_timestep / decode_noise_scale, for decoding with noise mixed in, are not
offered).
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec
from flowrl.policies.first_frame import FirstFrameHeld, hold_first_frame
from flowrl.policies.lora import SELF_CROSS_ATTENTION_TARGETS


@POLICIES.register("LTXPipeline")
class LTXVideoPolicy(FlowPolicy):
    family = "ltx"
    modality = "video"
    fps = 25  # LTXPipeline's frame_rate default, which its rope scale assumes (diffusers' example exports at 24)
    lora_targets = SELF_CROSS_ATTENTION_TARGETS

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cfg = self.uses_cfg(guidance_scale)
        embeds, mask, neg, neg_mask = self.pipeline.encode_prompt(
            list(prompts),
            negative_prompt=[""] * len(prompts) if cfg else None,
            do_classifier_free_guidance=cfg,
            device=self.device,
            max_sequence_length=self.text_length(),
        )
        negative = {"embeds": neg, "mask": neg_mask} if cfg else {}
        return Conditioning({"embeds": embeds, "mask": mask}, negative, list(prompts))

    def default_spec(self) -> SampleSpec:
        return SampleSpec(512, 704, 161)  # LTXPipeline.__call__'s defaults

    @property
    def size_multiple(self) -> int:
        return self.pipeline.vae_spatial_compression_ratio * self.transformer.config.patch_size  # check_inputs: 32

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        return self.video_noise_shape(
            spec, self.pipeline.vae_temporal_compression_ratio, self.pipeline.vae_spatial_compression_ratio
        )

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift

        config = scheduler.config
        mu = calculate_shift(
            int(np.prod(noise_shape[-3:])),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        scheduler.set_timesteps(num_steps, sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        b = latents.shape[0]
        timestep = (torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1) * 1000).expand(b)
        return self.packed_velocity(latents, timestep, tensors)

    def packed_velocity(self, latents, timestep, tensors) -> torch.Tensor:
        """The transformer's output for unpacked latents, through its packed tokens (`timestep`: [B], or [B, tokens]
        for a timestep per token)."""
        pipe = self.pipeline
        _, _, f, h, w = latents.shape
        p, pt = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        scale = (
            pipe.vae_temporal_compression_ratio / self.fps,
            pipe.vae_spatial_compression_ratio,
            pipe.vae_spatial_compression_ratio,
        )
        out = self.net()(
            hidden_states=pipe._pack_latents(latents, p, pt),
            encoder_hidden_states=tensors["embeds"].to(latents.dtype),
            timestep=timestep,
            encoder_attention_mask=tensors["mask"],
            num_frames=f,
            height=h,
            width=w,  # as the pipeline
            rope_interpolation_scale=scale,
            return_dict=False,
        )[0]
        return pipe._unpack_latents(out, f // pt, h // p, w // p, p, pt)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Video in [0, 1], [B, 3, F, H, W]."""
        vae = self.pipeline.vae
        z = self.pipeline._denormalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        timestep = None
        if vae.config.timestep_conditioning:  # the pipeline's default decode_timestep 0, with no noise mixed in
            timestep = torch.zeros(len(z), device=z.device, dtype=z.dtype)
        return self.to_images(vae.decode(z.to(vae.dtype), timestep, return_dict=False)[0])


@POLICIES.register("LTXImageToVideoPipeline")
class LTXImageToVideoPolicy(FirstFrameHeld, LTXVideoPolicy):
    """LTX-Video image to video. Each sample's first frame (found like an editor's source: `inputs["source_image"]`,
    or a .jsonl line's `image`) at the sample size is encoded by the VAE and normalised by its statistics; as in
    LTXImageToVideoPipeline, it is the video's first latent frame, seen at time 0 (a timestep per token: zero on its
    tokens) in both CFG branches, and every step ends with it in place (flowrl/policies/first_frame.py). Deviations:
    the VAE's posterior mode where the pipeline draws from it; the frame resized bicubically with antialiasing."""

    family = "ltx_i2v"
    source_input = "source_image"  # the first frame
    source_needed_by = "an image-to-video pipeline"

    @torch.no_grad()
    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        z, rows = self.encode_first_frames(items, spec or self.default_spec())  # one encoding per distinct item
        vae = self.pipeline.vae
        condition = self.pipeline._normalize_latents(z, vae.latents_mean, vae.latents_std)  # [B, C, 1, h, w]
        cond.add_inputs({"condition": condition[rows]})
        return cond

    def _forward(self, latents, sigma, tensors, guidance_scale):
        first = tensors["condition"][:, :, 0]
        held = latents.clone()
        held[:, :, 0] = first.to(
            latents.dtype
        )  # the transformer sees the frame there, as the pipeline's latents hold it
        b, _, f, h, w = latents.shape
        timestep = (torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1) * 1000).expand(b)
        per_token = timestep[:, None].expand(-1, f * h * w).clone()  # one token per latent pixel (patch size 1)
        per_token[:, : h * w] = 0  # the first frame's tokens (frame-major packing) at time 0
        return hold_first_frame(self.packed_velocity(held, per_token, tensors), latents, first, sigma)
