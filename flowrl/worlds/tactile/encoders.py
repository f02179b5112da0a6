"""Camera and tactile encoders trained contrastively on the world's clean pairs (a symmetric InfoNCE over a batch of
matched camera / tactile images, as SSVTP and TVL align vision and touch), saved as timm models so that curation and
scoring load them exactly as they load DINOv2 (`priors.timm_encoder`).

The tactile encoder gives the learned similarity reported beside SSIM: the cosine of its features for a generated
and a recorded tactile image (1: the encoder cannot tell them apart). SSIM rewards pixel agreement; this one rewards
agreeing on what the contact says about the material, which a pair-matching encoder has learned to read.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from flowrl.images import to_unit
from flowrl.schedules import cosine_decay

ARCHITECTURE = "test_convnext"  # timm's smallest ConvNeXt (0.2M parameters), built at the patch size
ENCODERS = ("camera", "tactile")


@dataclass
class EncoderConfig:
    steps: int = 800
    batch: int = 64
    lr: float = 2e-3
    temperature: float = 0.1
    pool: int = 2048
    image_size: int = 32
    seed: int = 0
    threads: int = 2


def build_encoder(image_size: int, seed: int) -> torch.nn.Module:
    """A fresh timm encoder (pooled features, no classifier) whose data config says the patch's size, so that
    `priors.encode` feeds it the patch unresized."""
    import timm

    torch.manual_seed(seed)
    overlay = {"input_size": (3, image_size, image_size), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    return timm.create_model(ARCHITECTURE, pretrained=False, num_classes=0, pretrained_cfg_overlay=overlay)


def info_nce(camera: torch.Tensor, tactile: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE of matched rows: row i of each [B, D] feature matrix is the same pair."""
    a = torch.nn.functional.normalize(camera, dim=1)
    b = torch.nn.functional.normalize(tactile, dim=1)
    logits = a @ b.T / temperature
    target = torch.arange(len(a))
    return (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target)) / 2


def train_encoders(cfg: EncoderConfig, pool) -> tuple[dict[str, torch.nn.Module], dict]:
    """Train the camera and tactile encoders on a `PairPool` (its camera images and tactile images); returns the
    encoders (eval mode) and facts: the final loss and the held-out pair-retrieval accuracy at chance 1/batch."""
    from flowrl.worlds.tactile.priors import encode

    torch.set_num_threads(cfg.threads)
    start = time.time()
    encoders = {name: build_encoder(cfg.image_size, cfg.seed + i) for i, name in enumerate(ENCODERS)}
    params = [p for model in encoders.values() for p in model.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.05)
    tactile = to_unit(pool.tactile)
    rng = np.random.default_rng(cfg.seed)
    bar = tqdm(range(cfg.steps), desc="pretrain tactile encoders", mininterval=5)
    for step in bar:
        rows = torch.as_tensor(rng.choice(len(tactile), size=cfg.batch, replace=False))
        camera = encode_train(encoders["camera"], pool.rgb[rows])
        touch = encode_train(encoders["tactile"], tactile[rows])
        loss = info_nce(camera, touch, cfg.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * cosine_decay(step, cfg.steps)
        optimizer.step()
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    for model in encoders.values():
        model.eval()
    facts = {"config": asdict(cfg), "final_loss": loss.item(), "minutes": (time.time() - start) / 60}
    from flowrl.worlds.tactile.scenes import world_pairs

    held_out = world_pairs("eval")
    camera = encode(encoders["camera"], torch.stack([p.rgb for p in held_out]))
    touch = encode(encoders["tactile"], torch.stack([p.tactile for p in held_out]))
    scores = torch.nn.functional.normalize(camera, dim=1) @ torch.nn.functional.normalize(touch, dim=1).T
    facts["eval_retrieval_accuracy"] = (scores.argmax(1) == torch.arange(len(held_out))).float().mean().item()
    facts["eval_pairs"] = len(held_out)
    return encoders, facts


def encode_train(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Features of images [B, 3, H, W] in [0, 1] with gradients, normalised as `priors.encode` normalises."""
    return model(images * 2 - 1)


def save_encoders(encoders: dict[str, torch.nn.Module], out: Path, facts: dict) -> None:
    """Each encoder in timm's folder format (`out/camera`, `out/tactile`, fp16 safetensors) and the facts."""
    from timm.models import save_for_hf

    for name, model in encoders.items():
        save_for_hf(model.half(), out / name, safe_serialization=True)
        model.float()
    (out / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


@torch.no_grad()
def learned_similarity(tactile_encoder: torch.nn.Module, generated: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[B] cosine similarity of the tactile encoder's features of generated and recorded images [B, 3, H, W]."""
    from flowrl.worlds.tactile.priors import encode

    a, b = encode(tactile_encoder, generated), encode(tactile_encoder, truth)
    return torch.nn.functional.cosine_similarity(a, b, dim=1)
