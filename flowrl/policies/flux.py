"""FluxPipeline adapter: guidance as an embedding (no true CFG); the transformer sees 2x2-packed latent tokens.

Trajectories keep latents unpacked, [B, C, h, w] like every image family, and `_forward` packs them (with the
position ids of that h x w grid) on the way in and unpacks the output: a pure reshape, so the adapter carries no
state between calls (the text ids are zeros of the prompt length, as diffusers builds them).
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec
from flowrl.policies.input_images import untiled

FLUX_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


@POLICIES.register("FluxPipeline")
class FluxPolicy(FlowPolicy):
    family = "flux"
    lora_targets = FLUX_LORA_TARGETS
    text_length_tokenizer = "tokenizer_2"  # T5

    def uses_cfg(self, guidance_scale: float) -> bool:
        return False  # FLUX-dev is guidance-distilled: the scale enters as an embedding

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        kwargs = {"max_sequence_length": self.text_length()}  # __call__'s default, not encode_prompt's
        embeds, pooled, _ = self.pipeline.encode_prompt(prompts, prompts, device=self.device, **kwargs)
        return Conditioning({"embeds": embeds, "pooled": pooled}, {}, list(prompts))

    def default_spec(self) -> SampleSpec:
        size = self.pipeline.default_sample_size * self.pipeline.vae_scale_factor
        return SampleSpec(size, size)

    @property
    def size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor * 2  # latents packed in 2 x 2 patches (FLUX, Qwen-Image, Z-Image)

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        factor = self.pipeline.vae_scale_factor
        h, w = 2 * (spec.height // (factor * 2)), 2 * (spec.width // (factor * 2))
        return (self.transformer.config.in_channels // 4, h, w)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        b, c, h, w = latents.shape
        packed = self.pipeline._pack_latents(latents, b, c, h, w)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((b,), guidance_scale, device=latents.device, dtype=torch.float32)
        embeds = tensors["embeds"].to(latents.dtype)
        text_ids = torch.zeros(embeds.shape[1], 3, device=latents.device, dtype=latents.dtype)
        image_ids = self.pipeline._prepare_latent_image_ids(1, h // 2, w // 2, latents.device, latents.dtype)
        out = self.net()(
            hidden_states=packed,
            timestep=sigma.to(latents.dtype),
            guidance=guidance,
            pooled_projections=tensors["pooled"].to(latents.dtype),
            encoder_hidden_states=embeds,
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
        )[0]
        factor = self.pipeline.vae_scale_factor
        return self.pipeline._unpack_latents(out, h * factor, w * factor, factor)

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        c = scheduler.config
        tokens = (noise_shape[-2] // 2) * (noise_shape[-1] // 2)
        mu = calculate_shift(
            tokens,
            c.get("base_image_seq_len", 256),
            c.get("max_image_seq_len", 4096),
            c.get("base_shift", 0.5),
            c.get("max_shift", 1.15),
        )
        scheduler.set_timesteps(num_steps, sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        z = latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        return self.to_images(vae.decode(z, return_dict=False)[0])


@POLICIES.register("FluxKontextPipeline")
class FluxKontextPolicy(FluxPolicy):
    """FluxKontextPipeline adapter (instruction-based editing): the source image is per-sample conditioning. It is
    encoded once per distinct condition item in a call (a group's samples share one; `encode_inputs`: VAE posterior
    mode, shifted and scaled as the pipeline does) into `image_latents` of the conditioning, and every forward appends
    its packed tokens after the sample's, with position ids whose first axis is 1 (Kontext's context-image marker);
    the output keeps the sample's tokens."""

    family = "flux_kontext"
    source_input = "source_image"
    source_world = "shapes_edit"

    @torch.no_grad()
    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        """Each item's source: inputs["source_image"], meta["image"] (a file, e.g. from a .jsonl prompt file) or
        the shapes-editing world's scene for an instruction of its grammar (meta "scene_seed"); resized to the
        sample size `spec` when given. FluxKontextPipeline makes its output the size of its (resized) source; here
        the source takes the run's sample size instead, so sources of any size share a batch, memory follows the
        size a run sets, and no sample depends on its batch-mates (deviation: bicubic with antialiasing, not
        Kontext's snap to its preferred resolutions with Lanczos)."""
        found, rows = self.distinct_sources(items)  # a group repeats one item: its source is encoded once
        size = None if spec is None else (spec.height, spec.width)
        sources = self.stack_sources([self.sized_reference(source, size) for source in found])
        cond.tensors["image_latents"] = kontext_source_latents(self.pipeline.vae, sources.to(self.device))[rows]
        return cond

    def _forward(self, latents, sigma, tensors, guidance_scale):
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((latents.shape[0],), guidance_scale, device=latents.device, dtype=torch.float32)
        return kontext_velocity(
            self.pipeline,
            self.net(),
            latents,
            tensors["image_latents"],
            sigma,
            tensors["embeds"],
            tensors["pooled"],
            guidance,
        )


def kontext_source_latents(vae, images: torch.Tensor) -> torch.Tensor:
    """Source images (float [B, 3, H, W] in [0, 1]) -> the context latents FluxKontextPipeline makes of them: the
    VAE posterior's mode (untiled), shifted and scaled."""
    with untiled(vae):
        z = vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist.mode()
    return (z - vae.config.shift_factor) * vae.config.scaling_factor


def kontext_velocity(pipe, transformer, latents, source, sigma, embeds, pooled, guidance=None) -> torch.Tensor:
    """A Kontext transformer's velocity for unpacked latents [B, C, h, w] given the source's latents: the sample's
    packed tokens, then the source's with position ids whose first axis is 1 (Kontext's context-image marker); only
    the sample's tokens of the output are kept, unpacked. Shared by the policy and the editor's pretraining."""
    b, c, h, w = latents.shape
    source = source.to(latents.dtype)
    packed = pipe._pack_latents(latents, b, c, h, w)
    context = pipe._pack_latents(source, b, source.shape[1], source.shape[2], source.shape[3])
    image_ids = pipe._prepare_latent_image_ids(1, h // 2, w // 2, latents.device, latents.dtype)
    context_ids = pipe._prepare_latent_image_ids(
        1, source.shape[2] // 2, source.shape[3] // 2, latents.device, latents.dtype
    )
    context_ids[..., 0] = 1
    embeds = embeds.to(latents.dtype)
    text_ids = torch.zeros(embeds.shape[1], 3, device=latents.device, dtype=latents.dtype)
    out = transformer(
        hidden_states=torch.cat([packed, context], 1),
        timestep=sigma.to(latents.dtype),
        guidance=guidance,
        pooled_projections=pooled.to(latents.dtype),
        encoder_hidden_states=embeds,
        txt_ids=text_ids,
        img_ids=torch.cat([image_ids, context_ids]),
        return_dict=False,
    )[0]
    factor = pipe.vae_scale_factor
    return pipe._unpack_latents(out[:, : packed.shape[1]], h * factor, w * factor, factor)
