"""WanPipeline adapter (text-to-video): 5-D latents [B, C, F, H, W], UMT5/T5 text, true CFG; Wan2.2's two experts
(a high-noise `transformer` and a low-noise `transformer_2` split at the pipeline's boundary_ratio)."""

from __future__ import annotations

import torch

from flowrl.policies import POLICIES
from flowrl.policies.base import LOW_NOISE_EXPERT, Conditioning, FlowPolicy, SampleSpec
from flowrl.policies.input_images import untiled
from flowrl.policies.lora import SELF_CROSS_ATTENTION_TARGETS
from flowrl.policies.wan_vae import frame_convolutions


@POLICIES.register("WanPipeline")
class WanPolicy(FlowPolicy):
    family = "wan"
    modality = "video"
    fps = 16  # Wan2.1 and Wan2.2 A14B generate 16 frames a second (diffusers' Wan examples export at 16); TI2V-5B: 24
    lora_targets = SELF_CROSS_ATTENTION_TARGETS

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        super().__init__(pipeline, max_sequence_length)
        # Wan2.2 A14B: `transformer` (trained here, LoRA or full) denoises where t >= boundary_ratio x the
        # scheduler's training steps, `transformer_2` below (frozen unless pipeline.experts is both); a pipeline
        # without a boundary uses only `transformer`, as WanPipeline does
        expert = getattr(pipeline, "transformer_2", None)
        ratio = getattr(pipeline.config, "boundary_ratio", None)
        self.low_noise_expert = expert if ratio is not None else None
        self.boundary_timestep = None
        self.guidance_scale_2 = None  # the low-noise expert's CFG scale (None: the one scale); set_guidance_scale_2
        if getattr(pipeline.config, "expand_timesteps", False):  # Wan2.2 TI2V-5B: 24 frames a second (121 in 5 s;
            self.fps = 24  # Wan's and diffusers' 5B examples export at 24), which VBench's frame intervals read
        if self.low_noise_expert is not None:
            self.low_noise_expert.requires_grad_(False)
            self.boundary_timestep = ratio * pipeline.scheduler.config.num_train_timesteps

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cfg = self.uses_cfg(guidance_scale)
        kwargs = {"max_sequence_length": self.text_length()}  # __call__'s default, not encode_prompt's
        embeds, neg = self.pipeline.encode_prompt(
            prompts,
            negative_prompt=[""] * len(prompts) if cfg else None,
            do_classifier_free_guidance=cfg,
            device=self.device,
            **kwargs,
        )
        return Conditioning({"embeds": embeds}, {"embeds": neg} if cfg else {}, list(prompts))

    def set_trained_experts(self, experts: str, where: str) -> None:
        """pipeline.experts: "both" trains the low-noise expert too (its parameters named "transformer_2." in
        checkpoints), so steps below the boundary train as well; call before the adapter is added."""
        if experts == "both" and self.low_noise_expert is not None:
            self.extra_trained = {LOW_NOISE_EXPERT: self.low_noise_expert}
            self.model = ExpertPair(self.transformer, self.low_noise_expert)
            return
        self.extra_trained, self.model = {}, self.transformer
        super().set_trained_experts(experts, where)

    def distributed_module(self) -> torch.nn.Module:
        return self.model if self.extra_trained else self.transformer  # (before wrapping: the ExpertPair)

    def set_guidance_scale_2(self, value: float | None, where: str) -> None:
        """WanPipeline's guidance_scale_2: the CFG scale below the boundary (the low-noise expert's); `where` names
        the setting in the error a pipeline without two experts gives."""
        if value is not None and self.boundary_timestep is None:
            from flowrl.errors import ConfigError

            raise ConfigError(
                f"{where}: only a Wan2.2 pipeline with two experts (transformer_2 and a boundary_ratio) "
                f"takes a second guidance scale; {type(self.pipeline).__name__} here has one"
            )
        self.guidance_scale_2 = value

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0 or (self.guidance_scale_2 is not None and self.guidance_scale_2 > 1.0)

    def guidance_scales(self, latents, sigma, guidance_scale):
        if self.guidance_scale_2 is None:
            return guidance_scale
        # per sample, as WanPipeline: guidance_scale where the high-noise expert acts, guidance_scale_2 below
        s = torch.as_tensor(sigma, dtype=torch.float32, device=latents.device).reshape(-1).expand(latents.shape[0])
        high = (s * 1000 >= self.boundary_timestep).reshape(-1, *[1] * (latents.ndim - 1))
        return torch.where(high, guidance_scale, self.guidance_scale_2)

    def frozen_below(self) -> tuple[float, str] | None:
        gate = super().frozen_below()
        if self.boundary_timestep is None or self.extra_trained:
            return gate
        boundary = self.boundary_timestep / 1000  # in sigma, as _forward compares sigma x 1000
        if gate is not None and gate[0] >= boundary:
            return gate
        return boundary, "Wan2.2's frozen low-noise expert (transformer_2) denoises (pipeline.experts: both trains it)"

    def default_spec(self) -> SampleSpec:
        return SampleSpec(480, 832, 81)  # WanPipeline.__call__'s defaults

    @property
    def size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor_spatial * self.transformer.config.patch_size[1]

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        return self.video_noise_shape(
            spec, self.pipeline.vae_scale_factor_temporal, self.pipeline.vae_scale_factor_spatial
        )

    def _forward(self, latents, sigma, tensors, guidance_scale):
        timestep = sigma * 1000
        inputs = self.transformer_inputs(latents, tensors, timestep)

        if self.boundary_timestep is None:
            return self.net()(**inputs, return_dict=False)[0]
        high = timestep >= self.boundary_timestep  # per sample: a training batch mixes steps
        # a distributed module must run its forward on every process, needed or not, so collectives match (FSDP2
        # gathers shards in every forward, with or without gradients; under DDP the extra row is one row)
        if self.extra_trained:  # both experts train: always through their one module, so FSDP2 gathers them
            return self.model(high, inputs, self.distributed)
        return route_experts(self.net(), self.low_noise_expert, inputs, high, keep_high=self.distributed)

    def transformer_inputs(self, latents: torch.Tensor, tensors: dict, timestep: torch.Tensor) -> dict:
        """The transformer's batch-first inputs (image-to-video adds its condition, and TI2V a timestep per token)."""
        return {
            "hidden_states": latents,
            "timestep": timestep,
            "encoder_hidden_states": tensors["embeds"].to(latents.dtype),
        }

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Video in [0, 1], [B, 3, F, H, W]."""
        vae = self.pipeline.vae
        with frame_convolutions(vae):  # the same decode, faster, when the VAE's frames do not interact
            return self.to_images(vae.decode(wan_vae_latents(vae, latents), return_dict=False)[0])


class ExpertPair(torch.nn.Module):
    """Wan2.2's two experts as one module, for training both (pipeline.experts: both): a distributed wrapper then
    holds both in one reducer, which orders the gradient collectives alike on every process (two wrappers' hooks
    fire in the order each process's graph finishes, and the experts' same-shaped buckets would pair up crosswise)."""

    def __init__(self, high: torch.nn.Module, low: torch.nn.Module):
        super().__init__()
        self.high, self.low = high, low
        # FSDP2's auto wrap shards the experts' blocks one by one (the wrapper reads this off the wrapped module)
        self._no_split_modules = getattr(high, "_no_split_modules", None)

    def forward(self, high: torch.Tensor, inputs: dict, synced: bool = False) -> torch.Tensor:
        return route_experts(self.high, self.low, inputs, high, keep_high=synced, keep_low=synced)


def route_experts(
    high_net, low_net, inputs: dict, high: torch.Tensor, keep_high: bool = False, keep_low: bool = False
) -> torch.Tensor:
    """Each row through the expert its timestep picks (`high`: the high-noise one), as WanPipeline does. An expert
    no row needs still runs one row, weighted zero, where it is kept (`keep_high`, `keep_low`): a distributed
    wrapper's collectives need its forward, and every trained parameter in the backward, on every process."""

    def call(net, rows):
        return net(**{k: v[rows] for k, v in inputs.items()}, return_dict=False)[0]

    if bool(high.all()) or not bool(high.any()):
        used, unused, keep = (high_net, low_net, keep_low) if bool(high.all()) else (low_net, high_net, keep_high)
        out = call(used, slice(None))
        if keep:
            out = out + 0.0 * call(unused, slice(0, 1)).sum()
        return out
    order = torch.cat([high.nonzero()[:, 0], (~high).nonzero()[:, 0]])
    out = torch.cat([call(high_net, high), call(low_net, ~high)])
    return out[order.argsort()]


def wan_vae_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """A denoiser's latents [B, C, F, H, W] -> what a Wan-style VAE (AutoencoderKLWan, AutoencoderKLQwenImage)
    decodes: un-normalised by the VAE's per-channel latents_mean / latents_std, in the VAE's dtype."""
    mean, std = _latent_statistics(vae, latents.device)
    return latents.to(vae.dtype) / (1.0 / std) + mean  # the pipelines' own form, to the last bit


def wan_vae_encode(vae, videos: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Videos float [B, 3, F, H, W] in [0, 1] -> a denoiser's latents: the Wan-style VAE posterior's mode, normalised
    by the per-channel latents_mean / latents_std in `dtype` (None: the VAE's) — what the Qwen-Image-Edit (VAE dtype)
    and Wan image-to-video (fp32) pipelines make of a condition image. Never tiled, as the pipelines encode it."""
    with untiled(vae):
        z = vae.encode((videos * 2 - 1).to(vae.dtype)).latent_dist.mode()
    z = z if dtype is None else z.to(dtype)
    mean, std = _latent_statistics(vae, z.device, z.dtype)
    return (z - mean) / std


def _latent_statistics(vae, device, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents mean and std, [1, C, 1, 1, 1], in `dtype` (None: the VAE's)."""
    z_dim = vae.config.z_dim
    dtype = dtype or vae.dtype
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1).to(device, dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1).to(device, dtype)
    return mean, std
