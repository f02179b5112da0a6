"""FLUX.2 adapters: Flux2KleinPipeline (FLUX.2 [klein]: the distilled 4-step models and the undistilled base models)
and Flux2Pipeline (FLUX.2 [dev]), each also as an editor with reference images.

What they share with FLUX.1 is little: a text encoder whose hidden states at three layers are stacked per token
(klein: Qwen3, layers 9 / 18 / 27; dev: Mistral Small 3.1 with FLUX.2's system message, layers 10 / 20 / 30; every
prompt padded to max_sequence_length and attended whole, as the pipelines do: no mask), a VAE whose latents are
patchified 2x2 and normalised by the VAE's batch-norm statistics, 4-D position ids (time, row, column, layer), and a
schedule whose shift depends on the step count (compute_empirical_mu). Trajectories hold the patchified, normalised
latents [B, 4C, h/2, w/2] the transformer denoises (the pipelines draw their noise in that space too), and `_forward`
turns them into tokens and back. Guidance: klein's base models take true CFG against ""; its distilled models take
none; dev is guidance-distilled, so the scale goes in as an embedding (as FLUX.1-dev's) and there is no CFG branch.
"""

from __future__ import annotations

import numpy as np
import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec
from flowrl.policies.input_images import untiled

# the attention projections of both stream blocks: double blocks (image and text streams) and single blocks (the
# fused qkv / MLP input projection; their output projections are added per block by `lora_targets`)
FLUX2_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "attn.to_qkv_mlp_proj",
]


@POLICIES.register("Flux2Pipeline")
@POLICIES.register("Flux2KleinPipeline")
class Flux2Policy(FlowPolicy):
    """Both pipelines: they differ in the text encoder (which `pipeline.encode_prompt` calls) and in guidance."""

    family = "flux2"
    text_length_tokenizer = "tokenizer"  # klein's Qwen3 tokenizer (dev's is a processor, declaring no length)

    @property
    def lora_targets(self) -> list[str]:
        """FLUX2_LORA_TARGETS and each single block's output projection (named per block: a double block's
        `attn.to_out` is a list, which peft cannot adapt)."""
        singles = len(self.transformer.single_transformer_blocks)
        return [*FLUX2_LORA_TARGETS, *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(singles))]

    @property
    def embedded_guidance(self) -> bool:
        """Whether the scale goes in as the guidance embedding: Flux2Pipeline (dev) hands it over, Flux2KleinPipeline
        never does (whatever its transformer's config says)."""
        return type(self.pipeline).__name__ == "Flux2Pipeline"

    def uses_cfg(self, guidance_scale: float) -> bool:
        """As the pipelines decide: klein's distilled models take no CFG, dev's scale is an embedding."""
        if self.embedded_guidance or self.pipeline.config.get("is_distilled", False):
            return False
        return guidance_scale > 1.0

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        length = self.text_length()
        embeds, _ = self.pipeline.encode_prompt(list(prompts), device=self.device, max_sequence_length=length)
        negative = {}
        if self.uses_cfg(guidance_scale):
            negative = {
                "embeds": self.pipeline.encode_prompt(
                    [""] * len(prompts), device=self.device, max_sequence_length=length
                )[0]
            }
        return Conditioning({"embeds": embeds}, negative, list(prompts))

    def default_spec(self) -> SampleSpec:
        size = self.pipeline.default_sample_size * self.pipeline.vae_scale_factor
        return SampleSpec(size, size)

    @property
    def size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor * 2  # latents patchified 2 x 2

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        factor = self.size_multiple
        return (self.transformer.config.in_channels, spec.height // factor, spec.width // factor)

    def _raw_sigmas(self, scheduler, num_steps, noise_shape):
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

        mu = compute_empirical_mu(noise_shape[-2] * noise_shape[-1], num_steps)
        sigmas = None if scheduler.config.get("use_flow_sigmas") else np.linspace(1.0, 1 / num_steps, num_steps)
        scheduler.set_timesteps(num_steps, sigmas=sigmas, mu=mu)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.token_velocity(latents, sigma, tensors, guidance_scale)

    def token_velocity(self, latents, sigma, tensors, guidance_scale: float) -> torch.Tensor:
        """The transformer's output for latents [B, 4C, h, w]: row-major tokens in with FLUX.2's position ids, and
        back. A guidance-distilled transformer (dev) gets the scale as its guidance embedding."""
        return self.call_transformer(
            self.transformer_inputs(latents, sigma, tensors["embeds"], guidance_scale), latents.shape
        )

    def transformer_inputs(
        self, latents, sigma, embeds, guidance_scale: float, references: list[torch.Tensor] | None = None
    ) -> dict:
        """The transformer's keyword inputs for latents [B, 4C, h, w]; `references` (an editor's source and further
        reference images: each [B, 4C, h_k, w_k], one size per image for every row) go in as tokens after the
        sample's with time coordinates 10, 20, ... (the pipelines' reference images in order)."""
        b = latents.shape[0]
        guidance = None
        if self.embedded_guidance:  # fp32, as the pipeline makes it
            guidance = torch.full((b,), guidance_scale, device=latents.device, dtype=torch.float32)
        embeds = embeds.to(latents.dtype)
        pipe = self.pipeline
        tokens, ids = pipe._pack_latents(latents), pipe._prepare_latent_ids(latents)
        if references:
            images = [image.to(latents.dtype) for image in references]
            tokens = torch.cat([tokens, *(pipe._pack_latents(image) for image in images)], 1)
            ids = torch.cat([ids, pipe._prepare_image_ids([image[:1] for image in images]).expand(b, -1, -1)], 1)
        return {
            "hidden_states": tokens,
            "timestep": sigma.to(latents.dtype),
            "guidance": guidance,
            "encoder_hidden_states": embeds,
            "txt_ids": pipe._prepare_text_ids(embeds).to(latents.device),
            "img_ids": ids.to(latents.device),
        }

    def call_transformer(self, inputs: dict, shape: torch.Size) -> torch.Tensor:
        """The transformer's output on `inputs`, cut back to the sample's tokens and shaped as its latents."""
        b, c, h, w = shape
        out = self.net()(**inputs, return_dict=False)[0]
        return out[:, : h * w].permute(0, 2, 1).reshape(b, c, h, w)  # row-major tokens, as _pack_latents made them

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipeline.vae
        mean, std = _bn_statistics(vae, latents.device)
        z = self.pipeline._unpatchify_latents(latents.to(vae.dtype) * std + mean)
        return self.to_images(vae.decode(z, return_dict=False)[0])


@POLICIES.register("Flux2Edit")
@POLICIES.register("Flux2KleinEdit")
class Flux2EditPolicy(Flux2Policy):
    """FLUX.2 editing with reference images (the pipelines' `image`, one or a list), chosen with `pipeline.policy:
    Flux2KleinEdit` or `Flux2Edit` (one adapter under two names; the pipeline class is the text-to-image one). Each
    sample's images are per-sample conditioning, found as the other editors find a source (several: a list in
    inputs["source_image"] or a .jsonl line's `image`; the first is the source rewards and grids show). Their VAE
    latents (posterior mode, patchified, batch-norm normalised) go in as tokens after the sample's, with time
    coordinates 10, 20, ... in order, in both CFG branches; only the sample's tokens come out. Rows with different
    numbers or sizes of images take one transformer call per layout (a step's calls share the weights: two gloo
    processes train as one under DDP or FSDP2, tests/policies/test_reference_images.py; `by_reference_layout`).

    Image sizes: by default every image takes the run's sample size (bicubic, antialiased), as Kontext's source does,
    so the pipeline's defaults are a deviation: it shrinks an image over 1024x1024 pixels to about that area (its
    aspect ratio kept) and centre-crops it to whole 16-pixel patches. `pipeline.reference_size: N` does what the
    pipeline does for an N x N area (1024: the pipeline's; Flow-Factory's condition_image_size), so references keep
    their aspect ratio. Not done either way:
    the pipeline's check for images of at least 64 px and at most 8:1, and its output at the first image's size when
    no size is given (a run always gives one)."""

    family = "flux2_edit"
    source_input = "source_image"
    source_world = "shapes_edit"
    max_references = None  # the pipelines take any number

    @torch.no_grad()
    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        """Each image at the size the sample's latents cover (the sample size rounded down to whole 2x2 latent
        patches, 16 px on the released models, as the sample itself is), or as the pipeline sizes it with
        pipeline.reference_size; its latents (posterior mode, patchified, normalised) in `pack_references`' tensors."""
        _, h, w = self.noise_shape(spec or self.default_spec())
        pixels = self.pipeline.vae_scale_factor * 2
        found, rows = self.distinct_references(items)  # a group repeats one item: its images are encoded once
        sized = [[self.sized_reference(image, (h * pixels, w * pixels)) for image in images] for images in found]
        vae, pipe = self.pipeline.vae, self.pipeline
        mean, std = _bn_statistics(vae, self.device)

        def encode(images):
            with untiled(vae):
                z = pipe._patchify_latents(vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist.mode())
            return (z - mean) / std

        packed = self.pack_references(sized, encode)
        cond.add_inputs({name: tensor[rows] for name, tensor in packed.items()})
        return cond

    def pipeline_sized(self, image: torch.Tensor) -> torch.Tensor:
        """As the FLUX.2 pipelines take an image (for an area of reference_size squared in place of their 1024 x
        1024): shrunk to about that area if larger (Lanczos, aspect ratio kept), then centre-cropped to whole
        16-pixel patches (the pipeline's image processor, resize_mode "crop")."""
        from flowrl.images import to_pil

        processor = self.pipeline.image_processor
        shown = to_pil(image)
        area = self.reference_size**2
        if shown.width * shown.height > area:
            shown = processor._resize_to_target_area(shown, area)
        multiple = self.pipeline.vae_scale_factor * 2
        width, height = (max(multiple, side // multiple * multiple) for side in shown.size)
        return (processor.preprocess(shown, height=height, width=width, resize_mode="crop")[0].float() + 1) / 2

    def _forward(self, latents, sigma, tensors, guidance_scale):
        def call(rows, sigma, references):
            inputs = self.transformer_inputs(latents[rows], sigma, tensors["embeds"][rows], guidance_scale, references)
            return self.call_transformer(inputs, latents[rows].shape)

        return self.by_reference_layout(latents, sigma, tensors, call)


def _bn_statistics(vae, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The FLUX.2 VAE's batch-norm mean and std, [1, C, 1, 1]: what normalises the patchified latents."""
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(device, vae.dtype)
    return mean, torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(device, vae.dtype)
