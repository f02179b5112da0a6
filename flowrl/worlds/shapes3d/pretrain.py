"""Pretrain `pipelines/shapes3d-flow` from scratch on solids of the 3D shapes world (training prompts only).

1. Shape autoencoder: surface points of a solid (uniform points pulled onto its zero level set along the analytic
   SDF's gradient) -> latent tokens -> SDF at query points (half uniform in the cube, half near the surface);
   L1 against the true SDF truncated to +-TRUNCATION (the sign near the surface is what meshing needs). Per-channel
   latent statistics go into the autoencoder's config.
2. Flow transformer: rectified flow on normalised latent tokens conditioned on the condition render (or, with
   `condition="text"`, on the prompt: a text-to-3D model), logit-normal t, 10% of conditions replaced by the all-zero
   image or the empty prompt (the unconditional branch of CFG), EMA weights saved.

`autoencoder` names a saved pipeline whose autoencoder is reused (stage 1 skipped): models trained so share one latent
space.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from tqdm import tqdm

from flowrl.pretrain_progress import GeneratorState, NumpyRngState
from flowrl.schedules import cosine_decay, sample_noise_levels
from flowrl.sdf import render
from flowrl.worlds.shapes.pretrain_sd3 import train_denoiser
from flowrl.worlds.shapes3d.pipeline import ShapeAutoencoder, ShapeFlowTransformer, Shapes3DFlowPipeline
from flowrl.worlds.shapes3d.prompts import parse_prompt, sample_solid, train_prompt_set, vocabulary

TRUNCATION = 0.2


@dataclass
class Shapes3DPretrainConfig:
    seed: int = 0
    ae_steps: int = 2000
    ae_batch: int = 32
    ae_lr: float = 1e-3
    surface_points: int = 512
    query_points: int = 1024
    flow_steps: int = 6000
    flow_batch: int = 64
    flow_lr: float = 1e-3
    flow_pool: int = 8192  # (latent, render) pairs made once, drawn from with replacement
    warmup_steps: int = 100
    caption_dropout: float = 0.1  # share of conditions replaced by the all-zero image (or the empty prompt)
    ema_decay: float = 0.995
    threads: int = 2
    condition: str = "image"  # "image": image-to-3D; "text": text-to-3D (the prompt's words)
    autoencoder: str | None = None  # a saved pipeline whose autoencoder is reused instead of trained


@dataclass
class Shapes3DSize:
    num_tokens: int = 16
    latent_channels: int = 8
    ae_width: int = 64
    ae_heads: int = 4
    ae_decoder_layers: int = 2
    fourier_bands: int = 6
    width: int = 96
    heads: int = 4
    layers: int = 4


def training_solids(count: int, rng: np.random.Generator):
    """`count` (prompt, solid) pairs, tags drawn equally often, prompts within a tag uniformly."""
    by_tag = train_prompt_set()
    tags = list(by_tag)
    prompts = []
    for _ in range(count):
        tag = tags[rng.integers(len(tags))]
        prompts.append(by_tag[tag][rng.integers(len(by_tag[tag]))])
    return prompts, [sample_solid(parse_prompt(p), rng) for p in prompts]


def surface_samples(solid, count: int, generator: torch.Generator) -> torch.Tensor:
    """[count, 3] points on the solid's surface: uniform points near it, pulled along the SDF's gradient twice."""
    candidates = torch.rand(count * 8, 3, generator=generator) * 2 - 1
    with torch.no_grad():
        near = candidates[solid.sdf(candidates).abs() < 0.3]
    while len(near) < count:  # small solids: draw more
        more = torch.rand(count * 8, 3, generator=generator) * 2 - 1
        with torch.no_grad():
            near = torch.cat([near, more[solid.sdf(more).abs() < 0.3]])
    points = near[:count].clone()
    with torch.enable_grad():  # callers may sit under no_grad
        for _ in range(2):
            points.requires_grad_(True)
            d = solid.sdf(points)
            (grad,) = torch.autograd.grad(d.sum(), points)
            points = (points - d[:, None] * grad / grad.norm(dim=-1, keepdim=True).clamp(min=1e-6)).detach()
    return points


def autoencoder_batch(solids, cfg: Shapes3DPretrainConfig, generator: torch.Generator):
    surface = torch.stack([surface_samples(s, cfg.surface_points, generator) for s in solids])
    half = cfg.query_points // 2
    uniform = torch.rand(len(solids), half, 3, generator=generator) * 2 - 1
    near = surface[:, torch.randint(cfg.surface_points, (cfg.query_points - half,), generator=generator)]
    near = near + 0.05 * torch.randn(near.shape, generator=generator)
    queries = torch.cat([uniform, near], 1)
    with torch.no_grad():
        target = torch.stack([s.sdf(q) for s, q in zip(solids, queries)]).clamp(-TRUNCATION, TRUNCATION)
    return surface, queries, target


def train_autoencoder(ae: ShapeAutoencoder, cfg, rng, generator) -> dict:
    optimizer = torch.optim.AdamW(ae.parameters(), lr=cfg.ae_lr, weight_decay=0.0)
    ae.train()
    bar = tqdm(range(cfg.ae_steps), desc="pretrain shape autoencoder", mininterval=5)
    for step in bar:
        _, solids = training_solids(cfg.ae_batch, rng)
        surface, queries, target = autoencoder_batch(solids, cfg, generator)
        pred = ae.decode(ae.encode(surface), queries)
        loss = (pred - target).abs().mean()
        sign = ((pred < 0) == (target < 0)).float().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.ae_lr * min(1.0, (step + 1) / 50) * cosine_decay(step, cfg.ae_steps)
        optimizer.step()
        if step % 20 == 0:
            bar.set_postfix(l1=f"{loss.item():.4f}", sign=f"{sign.item():.3f}")
    ae.eval()
    with torch.no_grad():
        _, solids = training_solids(256, rng)
        surface = torch.stack([surface_samples(s, cfg.surface_points, generator) for s in solids])
        z = torch.cat([ae.encode(surface[i : i + 64]) for i in range(0, 256, 64)])
    channels = z.flatten(0, 1)
    ae.register_to_config(latents_mean=channels.mean(0).tolist(), latents_std=channels.std(0).tolist())
    return {"ae_final_l1": loss.item(), "ae_sign_accuracy": sign.item()}


def flow_pool(ae: ShapeAutoencoder, cfg, rng, generator):
    """(normalised latents [P, K, C], conditions) of training solids: their renders [P, 3, 32, 32] in [0, 1], or
    with `cfg.condition == "text"` their prompts."""
    prompts, solids = training_solids(cfg.flow_pool, rng)
    latents, images = [], []
    with torch.no_grad():
        for i in range(0, len(solids), 64):
            part = solids[i : i + 64]
            surface = torch.stack([surface_samples(s, cfg.surface_points, generator) for s in part])
            latents.append(ae.normalise(ae.encode(surface)))
            if cfg.condition == "image":
                images += [torch.from_numpy(render(s.sdf, 32)[0]).permute(2, 0, 1).float() / 255 for s in part]
    return torch.cat(latents), (torch.stack(images) if cfg.condition == "image" else prompts)


def train_flow(transformer: ShapeFlowTransformer, latents, conditions, cfg, rng, generator, progress=None) -> dict:
    """Rectified flow on the pool through the shared pretraining loop (pretrain_sd3.train_denoiser of the shapes
    world): its caption dropout turns a dropped condition into "", which becomes the all-zero image or, for a text
    model, the empty prompt (the unconditional branch). `progress`: the loop saves into it (with `generator`, which
    draws the noise levels and the noise) and continues from it."""

    def pairs(count, rng):
        index = rng.integers(len(latents), size=count)
        return latents[torch.from_numpy(index)], [conditions[i] for i in index]

    def batch_loss(x0, given):
        if transformer.condition == "text":
            condition = {"words": transformer.word_ids(given)}
        else:
            zero = torch.zeros_like(conditions[0])
            condition = {"image": torch.stack([zero if isinstance(c, str) else c for c in given])}
        t = sample_noise_levels("logit_normal", len(x0), generator)
        noise = torch.randn(x0.shape, generator=generator)
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * noise
        return (transformer(xt, t * 1000, **condition) - (noise - x0)).pow(2).mean()

    loss = train_denoiser(
        [transformer],
        batch_loss,
        cfg,
        rng,
        "pretrain 3D flow",
        pairs=pairs,
        progress=progress,
        streams={"generator": GeneratorState(generator)},
    )
    return {"flow_final_loss": loss}


def pretrain_shapes3d(cfg: Shapes3DPretrainConfig, size: Shapes3DSize | None = None, progress=None):
    """Train a shapes3d-flow pipeline from scratch; returns (pipeline, training facts for the model card). `progress`
    (a PretrainProgress): each stage saves into it, and a run given the same progress continues where it stopped, to
    the weights an uninterrupted run gives."""
    torch.set_num_threads(cfg.threads)
    size = size or Shapes3DSize()
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.autoencoder:
        ae = ShapeAutoencoder.from_pretrained(cfg.autoencoder, subfolder="autoencoder", torch_dtype=torch.float32)
    else:
        ae = ShapeAutoencoder(
            num_tokens=size.num_tokens,
            latent_channels=size.latent_channels,
            width=size.ae_width,
            heads=size.ae_heads,
            decoder_layers=size.ae_decoder_layers,
            fourier_bands=size.fourier_bands,
        )
    transformer = ShapeFlowTransformer(
        num_tokens=ae.config.num_tokens,
        latent_channels=ae.config.latent_channels,
        width=size.width,
        heads=size.heads,
        layers=size.layers,
        vocabulary=vocabulary() if cfg.condition == "text" else None,
    )
    facts = {"config": asdict(cfg), "size": asdict(size)}
    started = time.monotonic()
    clock = progress.seconds if progress is not None else lambda: time.monotonic() - started
    if cfg.autoencoder:
        ae.eval()
        facts["ae_minutes"] = 0.0
    else:

        def ae_stage() -> dict:
            ae_facts = train_autoencoder(ae, cfg, rng, generator)
            stats = {key: ae.config[key] for key in ("latents_mean", "latents_std")}
            return {**ae_facts, "ae_minutes": clock() / 60, "latent_statistics": stats}

        # the streams go with the stage: the pool and the flow stage draw on from where it left them
        streams = [ae, NumpyRngState(rng), GeneratorState(generator)]
        facts.update(progress.stage("shape autoencoder", streams, ae_stage) if progress is not None else ae_stage())
        # they live in the autoencoder's config, not its weights: a stage loaded from progress needs them set
        ae.register_to_config(**facts.pop("latent_statistics"))
        ae.eval()
    begun = clock()
    latents, conditions = flow_pool(ae, cfg, rng, generator)
    facts["pool_minutes"] = (clock() - begun) / 60
    begun = clock()
    facts.update(train_flow(transformer, latents, conditions, cfg, rng, generator, progress))
    facts["flow_minutes"] = (clock() - begun) / 60
    facts["total_minutes"] = clock() / 60
    pipe = Shapes3DFlowPipeline(ae, transformer, FlowMatchEulerDiscreteScheduler(shift=1.0))
    pipe.to(torch.float16)
    return copy.deepcopy(pipe), facts


CARD_NUM_PER_PROMPT = 4
CARD_SEED = 2024


def evaluate_3d(
    pipe,
    prompts: list[str],
    num_per_prompt: int = CARD_NUM_PER_PROMPT,
    seed: int = CARD_SEED,
    num_steps: int = 20,
    guidance_scale: float = 3.0,
    resolution: int = 32,
) -> dict:
    """Per tag and overall means of IoU, Chamfer, F-score and validity of the pipeline's shapes against the solids
    whose renders (or prompts, for a text-to-3D model) condition them (one solid per prompt and draw, fixed seeds)."""
    from flowrl.worlds.shapes3d.metrics import evaluate_fields

    rng = np.random.default_rng(seed)
    solids = [sample_solid(parse_prompt(p), rng) for p in prompts for _ in range(num_per_prompt)]
    tags = [parse_prompt(p).tag for p in prompts for _ in range(num_per_prompt)]
    if pipe.transformer.condition == "text":
        given = {"prompt": [p for p in prompts for _ in range(num_per_prompt)]}
    else:
        images = [torch.from_numpy(render(s.sdf, 32)[0]).permute(2, 0, 1).float() / 255 for s in solids]
        given = {"image": torch.stack(images).to(pipe.transformer.dtype)}
    grids = []
    for i in range(0, len(solids), 32):
        out = pipe(
            **{key: value[i : i + 32] for key, value in given.items()},
            num_inference_steps=num_steps,
            guidance_scale=guidance_scale,
            generator=torch.Generator().manual_seed(seed + i),
            resolution=resolution,
            output_type="sdf",
        )
        grids += list(out.sdf.float().numpy())
    result = evaluate_fields(grids, solids, tags)
    result.pop("rows")  # per-solid rows stay out of eval.json and the card
    return result
