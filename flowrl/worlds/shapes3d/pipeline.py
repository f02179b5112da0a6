"""The embedded image-to-3D flow pipeline's models, shaped like the real ones (3DShape2VecSet / Hunyuan3D-2 style):

- `ShapeAutoencoder`: surface points -> a set of latent tokens (learned queries cross-attend to Fourier-embedded
  points) -> an SDF decoder queried at any points (query points cross-attend to the tokens after a few
  self-attention blocks). Deterministic, with per-channel latent statistics kept in its config for normalisation.
- `ShapeFlowTransformer`: rectified-flow velocity over the latent tokens, conditioned on the condition image
  (patch tokens, cross-attention) or on a prompt's words (a text-to-3D model), and on t (adaptive layer norm); an
  all-zero image or the empty prompt is the unconditional branch.
- `Shapes3DFlowPipeline`: a diffusers `DiffusionPipeline` (image or prompt -> tokens -> SDF grid -> meshes).

All three are diffusers `ModelMixin` / `ConfigMixin` / `DiffusionPipeline` subclasses, saved in diffusers format.
`import flowrl.worlds.shapes3d.pipeline` registers the pipeline class with diffusers, so
`DiffusionPipeline.from_pretrained` loads the folder (diffusers looks pipeline classes up in its own namespace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.loaders import CogView4LoraLoaderMixin, PeftAdapterMixin
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from flowrl.images import as_image_batch


def fourier_features(points: torch.Tensor, bands: int) -> torch.Tensor:
    """[..., 3] -> [..., 3 + 6 bands]: the points and sin / cos at octave frequencies, in fp32 whatever the points'
    dtype (angles reach 32 pi: bf16's spacing there, 0.5 rad, would scramble the features of a half-precision
    model; callers cast the result to their weights' dtype)."""
    points = points.float()
    freqs = (2.0 ** torch.arange(bands, dtype=torch.float32, device=points.device)) * math.pi
    angles = points[..., None] * freqs  # [..., 3, bands]
    return torch.cat([points, angles.sin().flatten(-2), angles.cos().flatten(-2)], -1)


class Block(nn.Module):
    """Pre-norm transformer block: self-attention, optional cross-attention, MLP; optional adaLN (scale, shift,
    gate per sub-layer) from a conditioning vector."""

    def __init__(self, width: int, heads: int, cross: bool = False, adaptive: bool = False):
        super().__init__()
        self.norm1, self.norm3 = nn.LayerNorm(width, elementwise_affine=not adaptive), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.cross = nn.MultiheadAttention(width, heads, batch_first=True) if cross else None
        self.norm2 = nn.LayerNorm(width) if cross else None
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.modulation = nn.Linear(width, 6 * width) if adaptive else None
        if adaptive:  # start as the identity: gates at zero
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)

    def forward(self, x, context=None, cond=None):
        if self.modulation is not None:
            s1, b1, g1, s2, b2, g2 = self.modulation(cond)[:, None].chunk(6, -1)
        else:
            s1 = b1 = s2 = b2 = 0.0
            g1 = g2 = 1.0
        h = self.norm1(x) * (1 + s1) + b1
        x = x + g1 * self.attn(h, h, h, need_weights=False)[0]
        if self.cross is not None:
            h = self.norm2(x)
            x = x + self.cross(h, context, context, need_weights=False)[0]
        h = self.norm3(x) * (1 + s2) + b2
        return x + g2 * self.mlp(h)


class ShapeAutoencoder(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(
        self,
        num_tokens: int = 16,
        latent_channels: int = 8,
        width: int = 64,
        heads: int = 4,
        decoder_layers: int = 2,
        fourier_bands: int = 6,
        latents_mean: list | None = None,
        latents_std: list | None = None,
    ):
        super().__init__()
        embed = 3 + 6 * fourier_bands
        self.point_in = nn.Linear(embed, width)
        self.queries = nn.Parameter(torch.randn(num_tokens, width) * 0.02)
        self.encode_block = Block(width, heads, cross=True)
        self.to_latent = nn.Linear(width, latent_channels)
        self.from_latent = nn.Linear(latent_channels, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(decoder_layers))
        self.query_in = nn.Linear(embed, width)
        self.query_attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))

    def encode(self, points: torch.Tensor) -> torch.Tensor:
        """Surface points [B, N, 3] -> latent tokens [B, K, C] (unnormalised)."""
        context = self.point_in(fourier_features(points, self.config.fourier_bands).to(self.dtype))
        tokens = self.queries.expand(len(points), -1, -1)
        return self.to_latent(self.encode_block(tokens, context))

    def decode(self, latents: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """SDF [B, M] at query points [B, M, 3] of the shapes with latent tokens [B, K, C] (unnormalised)."""
        tokens = self.from_latent(latents.to(self.dtype))
        for block in self.blocks:
            tokens = block(tokens)
        q = self.query_in(fourier_features(queries, self.config.fourier_bands).to(self.dtype))
        q = q + self.query_attn(q, tokens, tokens, need_weights=False)[0]
        return self.head(q)[..., 0]

    def normalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return (latents - mean) / std

    def denormalise(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return latents * std + mean

    def _stats(self, like: torch.Tensor):
        c = self.config.latent_channels
        mean = torch.tensor(self.config.latents_mean or [0.0] * c, dtype=like.dtype, device=like.device)
        std = torch.tensor(self.config.latents_std or [1.0] * c, dtype=like.dtype, device=like.device)
        return mean, std

    @torch.no_grad()
    def sdf_grid(self, latents: torch.Tensor, resolution: int = 32, chunk: int = 8192) -> torch.Tensor:
        """[B, R, R, R] SDF on the grid of flowrl.sdf.grid_points of unnormalised latents."""
        from flowrl.sdf import grid_points

        points = grid_points(resolution).to(latents.device)  # fp32: positions to 1/R of the cube
        values = [
            self.decode(latents, points[i : i + chunk].expand(len(latents), -1, -1))
            for i in range(0, len(points), chunk)
        ]
        return torch.cat(values, 1).reshape(len(latents), resolution, resolution, resolution)


class ShapeFlowTransformer(ModelMixin, ConfigMixin, PeftAdapterMixin):
    """Rectified-flow velocity over shape latent tokens, conditioned on t (adaLN) and, by cross-attention, on either
    a condition image (its 4x4 patches: image-to-3D) or, when `vocabulary` is given, a prompt's words (text-to-3D:
    word embeddings with positions through one self-attention block; no image layers then). Word id 0 is padding, so
    the empty prompt (all padding) is the unconditional branch of CFG, as the all-zero image is for images.
    (PeftAdapterMixin: LoRA adapters through diffusers' add_adapter, as the real transformers take them.)"""

    @register_to_config
    def __init__(
        self,
        num_tokens: int = 16,
        latent_channels: int = 8,
        width: int = 96,
        heads: int = 4,
        layers: int = 4,
        image_size: int = 32,
        image_patch: int = 4,
        vocabulary: list | None = None,
        max_words: int = 12,
    ):
        super().__init__()
        self.latent_in = nn.Linear(latent_channels, width)
        self.token_position = nn.Parameter(torch.randn(num_tokens, width) * 0.02)
        if vocabulary:
            self.word_in = nn.Embedding(len(vocabulary) + 1, width)
            self.word_position = nn.Parameter(torch.randn(max_words, width) * 0.02)
            self.text_block = Block(width, heads)
        else:
            self.image_in = nn.Conv2d(3, width, image_patch, stride=image_patch)
            self.image_position = nn.Parameter(torch.randn((image_size // image_patch) ** 2, width) * 0.02)
        self.time = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(Block(width, heads, cross=True, adaptive=True) for _ in range(layers))
        self.out_norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, latent_channels)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    @property
    def condition(self) -> str:
        """What conditions the velocity: "text" (a text-to-3D model) or "image"."""
        return "text" if self.config.vocabulary else "image"

    def time_embedding(self, timestep: torch.Tensor) -> torch.Tensor:
        half = self.config.width // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=timestep.device) / half)
        angles = timestep.float()[:, None] * freqs  # fp32 (t x 1000 in half precision would round by up to 4)
        return self.time(torch.cat([angles.sin(), angles.cos()], -1).to(self.dtype))

    def encode_image(self, image: torch.Tensor) -> torch.Tensor:
        """Condition images [B, 3, H, W] in [0, 1] -> patch tokens [B, P, width]."""
        return self.image_in(image * 2 - 1).flatten(2).transpose(1, 2) + self.image_position

    def encode_words(self, words: torch.Tensor) -> torch.Tensor:
        """Word ids [B, max_words] (0: padding) -> context tokens [B, max_words, width]."""
        return self.text_block(self.word_in(words) + self.word_position)

    def word_ids(self, prompts: list[str]) -> torch.Tensor:
        """[B, max_words] ids of the prompts' lower-cased words (1-based in `vocabulary`), padded with 0; "" is all
        padding. ValueError naming a word outside the vocabulary or a prompt longer than max_words."""
        index = {word: i + 1 for i, word in enumerate(self.config.vocabulary)}
        ids = torch.zeros(len(prompts), self.config.max_words, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            words = prompt.lower().split()
            unknown = [w for w in words if w not in index]
            if unknown:
                raise ValueError(f"prompt {prompt!r}: the word {unknown[0]!r} is not in this model's vocabulary")
            if len(words) > self.config.max_words:
                raise ValueError(f"prompt {prompt!r} has {len(words)} words; this model reads {self.config.max_words}")
            ids[row, : len(words)] = torch.tensor([index[w] for w in words], dtype=torch.long)
        return ids

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        image: torch.Tensor | None = None,
        words: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Velocity [B, K, C] at latent tokens [B, K, C], timestep [B] in [0, 1000] (t = timestep / 1000), given
        the condition image [B, 3, H, W] of an image model or the word ids [B, max_words] of a text model."""
        x = self.latent_in(hidden_states) + self.token_position
        context = self.encode_words(words) if self.condition == "text" else self.encode_image(image)
        cond = self.time_embedding(timestep)
        for block in self.blocks:
            x = block(x, context, cond)
        return self.out(self.out_norm(x))


@dataclass
class Shapes3DOutput(BaseOutput):
    meshes: list  # trimesh.Trimesh or None per condition
    sdf: torch.Tensor  # [B, R, R, R]
    latents: torch.Tensor  # [B, K, C] normalised


class Shapes3DFlowPipeline(DiffusionPipeline, CogView4LoraLoaderMixin):
    """Condition image (or prompt, for a text-to-3D transformer) -> shape latent tokens (Euler ODE with CFG against
    an all-zero image or the empty prompt) -> SDF grid -> meshes.

    LoRA files load with `pipe.load_lora_weights(folder)`: CogView4's mixin is diffusers' plain transformer-only
    LoRA loader (no key conversions), which is all this pipeline needs."""

    model_cpu_offload_seq = "transformer->autoencoder"

    def __init__(
        self,
        autoencoder: ShapeAutoencoder,
        transformer: ShapeFlowTransformer,
        scheduler: FlowMatchEulerDiscreteScheduler,
    ):
        super().__init__()
        self.register_modules(autoencoder=autoencoder, transformer=transformer, scheduler=scheduler)

    def velocity(self, latents, t, condition: dict, guidance_scale: float) -> torch.Tensor:
        """The (guided) velocity given `condition`: {"image": images} or {"words": word ids}, whichever the
        transformer takes; its unconditional branch is the all-zero image or the empty prompt (all padding)."""
        timestep = t * 1000
        if guidance_scale <= 1.0:  # as diffusers' pipelines and flowrl's policies decide it: CFG above 1 only
            return self.transformer(latents, timestep, **condition)
        both = self.transformer(
            torch.cat([latents, latents]),
            torch.cat([timestep, timestep]),
            **{key: torch.cat([torch.zeros_like(value), value]) for key, value in condition.items()},
        )
        uncond, cond = both.chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    @torch.no_grad()
    def __call__(
        self,
        image=None,
        num_inference_steps: int = 20,
        guidance_scale: float = 3.0,
        generator=None,
        resolution: int = 32,
        output_type: str = "mesh",
        latents: torch.Tensor | None = None,
        prompt: str | list[str] | None = None,
    ):
        """Shapes from condition images (an image-to-3D model) or from prompts (a text-to-3D model: one whose
        transformer has a vocabulary); ValueError when the one the model takes is missing."""
        from flowrl.sdf import mesh_from_grid

        device = self._execution_device
        dtype = self.transformer.dtype
        if self.transformer.condition == "text":
            if prompt is None:
                raise ValueError("this pipeline is text-to-3D: give prompt=, not an image")
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            condition = {"words": self.transformer.word_ids(prompts).to(device)}
        else:
            if image is None:
                raise ValueError("this pipeline is image-to-3D: give a condition image")
            condition = {"image": as_image_batch(image).to(device, dtype)}
        count = len(next(iter(condition.values())))
        shape = (count, self.transformer.config.num_tokens, self.transformer.config.latent_channels)
        # drawn on the generator's device (a CUDA generator, as diffusers' pipelines take, cannot draw on the CPU)
        x = (
            randn_tensor(shape, generator=generator, device=device, dtype=torch.float32).to(dtype)
            if latents is None
            else latents.to(device, dtype)
        )
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        sigmas = self.scheduler.sigmas.to(device)
        for i in self.progress_bar(range(num_inference_steps)):
            t = sigmas[i].expand(len(x))  # fp32: the time embedding takes it so
            x = x + (sigmas[i + 1] - sigmas[i]).to(dtype) * self.velocity(x, t, condition, guidance_scale)
        if output_type == "latent":
            return Shapes3DOutput(meshes=[], sdf=torch.empty(0), latents=x)
        grid = self.autoencoder.sdf_grid(
            self.autoencoder.denormalise(x.float() if dtype != torch.float32 else x), resolution
        ).float()
        meshes = [mesh_from_grid(g.cpu().numpy()) for g in grid] if output_type == "mesh" else []
        return Shapes3DOutput(meshes=meshes, sdf=grid, latents=x)


def _register_with_diffusers() -> None:
    import diffusers

    if not hasattr(diffusers, Shapes3DFlowPipeline.__name__):
        setattr(diffusers, Shapes3DFlowPipeline.__name__, Shapes3DFlowPipeline)


_register_with_diffusers()
