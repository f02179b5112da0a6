"""WanImageToVideoPipeline adapter (Wan2.1-I2V-14B, and Wan2.2-I2V-A14B with its two experts): a text-to-video Wan
policy whose every sample starts from its own first frame.

The first frame is per-sample conditioning, found like an editor's source (`inputs["source_image"]` or a .jsonl
line's `image`). As WanImageToVideoPipeline builds it: the frame, followed by mid-grey frames (zeros in the VAE's
[-1, 1]), is encoded by the VAE (posterior mode, normalised per channel); a mask marking the first latent frame
(vae_scale_factor_temporal channels) goes before it; both are concatenated to the noisy latents on the channel axis
at every call. Wan2.1-I2V also reads the frame with its CLIP image encoder (second-to-last hidden states), given to
the transformer in both CFG branches. Deviation, as for the editors: the frame is resized to the sample size
bicubically with antialiasing (the pipeline's video processor uses PIL); CLIP reads the original frame, as in the
pipeline. Wan2.2-TI2V-5B (expanded timesteps) takes no mask or CLIP: the frame's latents are the first latent frame,
seen at time 0 (a timestep per token), and every step ends with that frame in place, as the pipeline's output does.
Not supported: a last frame (first-last-frame models).
"""

from __future__ import annotations

import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.policies.first_frame import FirstFrameHeld, hold_first_frame
from flowrl.policies.wan import WanPolicy, wan_vae_encode


@POLICIES.register("WanImageToVideoPipeline")
class WanImageToVideoPolicy(FirstFrameHeld, WanPolicy):
    family = "wan_i2v"
    source_input = "source_image"  # the first frame
    source_needed_by = "an image-to-video pipeline"

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        super().__init__(pipeline, max_sequence_length)
        # Wan2.2-TI2V-5B: the first latent frame is the frame's own latents, at time 0 (a timestep per token)
        self.expand_timesteps = bool(getattr(pipeline.config, "expand_timesteps", False))
        self.holds_first_frame = self.expand_timesteps
        if self.expand_timesteps and self.transformer.config.patch_size[0] != 1:
            from flowrl.errors import ConfigError

            raise ConfigError(
                "pipeline.path: a Wan image-to-video transformer with expanded timesteps and a temporal "
                f"patch size of {self.transformer.config.patch_size[0]} (TI2V-5B's is 1) is not "
                "supported"
            )
        encoder = getattr(pipeline, "image_encoder", None)
        if encoder is not None:
            encoder.requires_grad_(False)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        out = super()._forward(latents, sigma, tensors, guidance_scale)
        if not self.expand_timesteps:
            return out
        # TI2V's first latent frame is the given frame's (flowrl/policies/first_frame.py)
        return hold_first_frame(out, latents, tensors["condition"][:, :, 0], sigma)

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        shape = super().noise_shape(spec)  # the transformer's in_channels count the condition's too
        return (self.pipeline.vae.config.z_dim, *shape[1:])

    @torch.no_grad()
    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        from flowrl.images import resized

        spec = spec or self.default_spec()
        frames, rows = self.distinct_sources(items)  # one frame, one encoding, per distinct item
        first = torch.stack([resized(frame, spec.height, spec.width) for frame in frames]).to(self.device)
        if self.expand_timesteps:  # TI2V: the frame alone, which becomes the first latent frame
            added = {"condition": wan_vae_encode(self.pipeline.vae, first[:, :, None], torch.float32)[rows]}
        else:
            video = torch.cat(
                [first[:, :, None], first.new_full((*first.shape[:2], spec.num_frames - 1, *first.shape[2:]), 0.5)], 2
            )  # 0.5: 0 in [-1, 1]
            latents = wan_vae_encode(self.pipeline.vae, video, torch.float32)  # normalised in fp32, as the pipeline
            mask = torch.zeros(
                len(frames),
                self.pipeline.vae_scale_factor_temporal,
                *latents.shape[2:],
                dtype=latents.dtype,
                device=latents.device,
            )
            mask[:, :, 0] = 1  # the latent frame the given frame decodes to
            added = {"condition": torch.cat([mask, latents], 1)[rows]}
        if self.transformer.config.image_dim is not None:  # Wan2.1-I2V: CLIP reads the original frames, in one call
            added["image_embeds"] = self._clip(frames)[rows]
        cond.add_inputs(added)
        return cond

    def _clip(self, frames: list[torch.Tensor]) -> torch.Tensor:
        """CLIP's features of each frame (the image encoder stays on the device: about 0.6B parameters for Wan's
        ViT-H, where offloading moves the text encoder, umT5-XXL)."""
        from flowrl.images import to_pil

        return self.pipeline.encode_image([to_pil(frame) for frame in frames], self.device)

    def transformer_inputs(self, latents: torch.Tensor, tensors: dict, timestep: torch.Tensor) -> dict:
        inputs = super().transformer_inputs(latents, tensors, timestep)
        condition = tensors["condition"].to(latents.dtype)
        if self.expand_timesteps:  # as the pipeline: the first latent frame is the frame's, at time 0
            inputs["hidden_states"] = torch.cat([condition, latents[:, :, 1:]], 2)
            p = self.transformer.config.patch_size
            tokens = latents.shape[2] * (latents.shape[3] // p[1]) * (latents.shape[4] // p[2])
            first = tokens // latents.shape[2]  # the first frame's tokens come first
            per_token = timestep[:, None].expand(-1, tokens).clone()
            per_token[:, :first] = 0
            inputs["timestep"] = per_token
            return inputs
        inputs["hidden_states"] = torch.cat([latents, condition], 1)
        if "image_embeds" in tensors:
            inputs["encoder_hidden_states_image"] = tensors["image_embeds"].to(latents.dtype)
        return inputs
