"""Pretrain the embedded visual-to-tactile generator on the world's clean training pairs.

1. Autoencoder: the tactile images (the shapes recipe's `train_vae`: L1 plus a small KL), its latent scale set from
   encodings; SDXL pipelines decode latents / scaling_factor with no shift, so the shift is dropped.
2. UNet, both ControlNets and both text encoders together: epsilon prediction at uniform DDPM timesteps, the
   ControlNets reading the camera image and the relative depth (3 channels, [0, 1], as the pipeline's control
   processor gives them), SDXL's size ids fixed at the training size, 10% of descriptions dropped (CFG's
   unconditional branch), EMA weights kept (the shapes recipe's `train_denoiser`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from flowrl.images import to_uint8
from flowrl.worlds.shapes.pretrain_sd3 import PretrainConfig, images_to_tensor, train_denoiser, train_vae
from flowrl.worlds.tactile.pipeline import TactileSize, build_pipeline
from flowrl.worlds.tactile.scenes import make_pairs


@dataclass
class TactilePretrainConfig(PretrainConfig):
    vae_steps: int = 400
    vae_batch: int = 32
    flow_steps: int = 1200  # denoiser steps (the field name is shared with the flow recipes)
    flow_batch: int = 32
    flow_lr: float = 5e-4
    warmup_steps: int = 100
    pool: int = 2048  # training pairs rendered once, drawn from with replacement
    image_size: int = 32
    faults: float = 0.0  # the share of the pool planted with each fault (misaligned, duplicate, mismatched)
    curate: bool = False  # drop what `curation.curate` finds before training
    use_depth: bool = True  # False: the depth ControlNet is weighed 0 (trained and sampled without depth)


class PairPool:
    """Training pairs rendered once: tactile images (uint8 [N, H, W, 3]), camera images and depth ([0, 1],
    [N, 3, H, W] each, depth repeated over 3 channels) and descriptions. `faults` plants each of the world's faults
    in that share of the pairs; `curate` then drops what curation finds (features: the tactile pixels)."""

    def __init__(self, count: int, size: int, seed: int, faults: float = 0.0, curate: bool = False):
        from flowrl.worlds.tactile.curation import curate as find_faults

        pairs = make_pairs(count, size, seed, "train", misaligned=faults, duplicates=faults, mismatched=faults)
        self.removed: dict[str, int] = {}
        if curate:
            report = find_faults(pairs, torch.stack([p.tactile for p in pairs]).flatten(1))
            self.removed = report.counts()
            pairs = [pairs[i] for i in report.kept]
        self.tactile = to_uint8(torch.stack([p.tactile for p in pairs]))
        self.rgb = torch.stack([p.rgb for p in pairs])
        self.depth = torch.stack([p.depth.expand(3, -1, -1) for p in pairs])
        self.descriptions = [p.description for p in pairs]
        self.faults = {kind: sum(p.fault == kind for p in pairs) for kind in ("misaligned", "duplicate", "mismatched")}

    def tactile_images(self, n: int, rng: np.random.Generator):
        rows = rng.integers(len(self.descriptions), size=n)
        return self.tactile[rows], [self.descriptions[i] for i in rows]

    def batch(self, n: int, rng: np.random.Generator):
        rows = rng.integers(len(self.descriptions), size=n)
        controls = {"tactile": self.tactile[rows], "rgb": self.rgb[rows], "depth": self.depth[rows]}
        return controls, [self.descriptions[i] for i in rows]


def denoiser_loss(
    pipe, batch: dict, prompts: list[str], generator: torch.Generator, depth_scale: float = 1.0
) -> torch.Tensor:
    """Epsilon-prediction loss of the UNet with both ControlNets' residuals (the depth one weighed `depth_scale`),
    text through both encoders (with gradients) and SDXL's micro-conditioning at the images' own size."""
    vae, alphas = pipe.vae, pipe.scheduler.alphas_cumprod.float()
    with torch.no_grad():
        x0 = vae.encode(images_to_tensor(batch["tactile"])).latent_dist.sample(generator) * vae.config.scaling_factor
    t = torch.randint(0, len(alphas), (len(x0),), generator=generator)
    noise = torch.randn(x0.shape, generator=generator)
    a = alphas[t].view(-1, 1, 1, 1)
    xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
    embeds, _, pooled, _ = pipe.encode_prompt(prompts, device=x0.device, do_classifier_free_guidance=False)
    size = batch["tactile"].shape[1]
    time_ids = torch.tensor([[size, size, 0, 0, size, size]], dtype=embeds.dtype).expand(len(x0), -1)
    extra = {"text_embeds": pooled, "time_ids": time_ids}
    down, mid = pipe.controlnet(
        xt,
        t,
        encoder_hidden_states=embeds,
        controlnet_cond=[batch["rgb"], batch["depth"]],
        conditioning_scale=[1.0, depth_scale],
        added_cond_kwargs=extra,
        return_dict=False,
    )
    predicted = pipe.unet(
        xt,
        t,
        encoder_hidden_states=embeds,
        added_cond_kwargs=extra,
        down_block_additional_residuals=down,
        mid_block_additional_residual=mid,
    ).sample
    return (predicted - noise).pow(2).mean()


def pretrain_tactile(cfg: TactilePretrainConfig, size: TactileSize | None = None, vae=None):
    """Train the generator from scratch (or, given a trained `vae`, its denoiser only, on that autoencoder); returns
    (the pipeline in fp16, facts for its card)."""
    torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    size = size or TactileSize()
    start = time.time()
    pool = PairPool(cfg.pool, cfg.image_size, cfg.seed, cfg.faults, cfg.curate)
    pipe = build_pipeline(size, seed=cfg.seed)
    pipe.vae.to(torch.float32)
    if vae is not None:
        pipe.vae.load_state_dict({k: v.float() for k, v in vae.state_dict().items()})
        pipe.vae.register_to_config(scaling_factor=vae.config.scaling_factor)
        vae_facts = {"vae": "given"}
    else:
        vae_facts = train_vae(pipe.vae, cfg, rng, pool.tactile_images) if cfg.vae_steps else {}
    pipe.vae.register_to_config(shift_factor=None)
    pipe.vae.requires_grad_(False)
    modules = [pipe.unet, pipe.controlnet, pipe.text_encoder, pipe.text_encoder_2]
    loss = train_denoiser(
        modules,
        lambda batch, prompts: denoiser_loss(pipe, batch, prompts, generator, float(cfg.use_depth)),
        cfg,
        rng,
        "pretrain unet + controlnets",
        pairs=pool.batch,
    )
    facts = {
        "config": asdict(cfg),
        "size": asdict(size),
        "pool_faults": pool.faults,
        "curation_removed": pool.removed,
        **vae_facts,
        "denoiser_final_loss": loss,
        "total_minutes": (time.time() - start) / 60,
    }
    pipe.to(torch.float16)
    return copy.deepcopy(pipe), facts
