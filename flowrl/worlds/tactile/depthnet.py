"""The embedded default's monocular depth: a small convolutional encoder-decoder trained on the world's clean pairs
to read relative depth (0 nearest, [0, 1]) from the camera image, standing in for Depth-Anything or MiDaS (which
`priors` loads for real data). Saved as `config.json` plus fp16 safetensors; `depth_estimator` opens either kind of
folder and returns one callable."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from flowrl.errors import UserError
from flowrl.schedules import cosine_decay

KIND = "flowrl-tactile-depth"


@dataclass
class DepthConfig:
    steps: int = 600
    batch: int = 32
    lr: float = 2e-3
    width: int = 16
    pool: int = 2048
    image_size: int = 32
    seed: int = 0
    threads: int = 2


class DepthNet(nn.Module):
    """Camera image [B, 3, H, W] in [0, 1] -> relative depth [B, H, W] in [0, 1]: two strided stages down, two up,
    with the full-resolution features skipped across (the relief is fine texture, so detail must not be lost)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.width = width

        def block(a, b, stride=1):
            return nn.Sequential(nn.Conv2d(a, b, 3, stride=stride, padding=1), nn.GroupNorm(4, b), nn.SiLU())

        self.stem = block(3, width)
        self.down = nn.Sequential(
            block(width, 2 * width, 2), block(2 * width, 4 * width, 2), block(4 * width, 4 * width)
        )
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2),
            block(4 * width, 2 * width),
            nn.Upsample(scale_factor=2),
            block(2 * width, width),
        )
        self.head = nn.Sequential(block(2 * width, width), nn.Conv2d(width, 1, 3, padding=1))

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        skip = self.stem(rgb * 2 - 1)
        return torch.sigmoid(self.head(torch.cat([self.up(self.down(skip)), skip], dim=1)))[:, 0]


def train_depth(cfg: DepthConfig, pool) -> tuple[DepthNet, dict]:
    """Fit a DepthNet to a `PairPool`'s camera images and depths (L1); facts include the held-out L1 error and that
    of predicting every pixel's training mean."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    start = time.time()
    model = DepthNet(cfg.width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    depth = pool.depth[:, 0]
    rng = np.random.default_rng(cfg.seed)
    bar = tqdm(range(cfg.steps), desc="pretrain tactile depth", mininterval=5)
    for step in bar:
        rows = torch.as_tensor(rng.integers(len(depth), size=cfg.batch))
        loss = (model(pool.rgb[rows]) - depth[rows]).abs().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * cosine_decay(step, cfg.steps)
        optimizer.step()
        if step % 50 == 0:
            bar.set_postfix(l1=f"{loss.item():.4f}")
    model.eval()
    from flowrl.worlds.tactile.scenes import world_pairs

    held_out = world_pairs("eval")
    truth = torch.stack([p.depth for p in held_out])
    with torch.no_grad():
        predicted = model(torch.stack([p.rgb for p in held_out]))
    facts = {
        "config": asdict(cfg),
        "final_loss": loss.item(),
        "eval_l1": (predicted - truth).abs().mean().item(),
        "eval_l1_of_the_mean": (depth.mean() - truth).abs().mean().item(),
        "minutes": (time.time() - start) / 60,
    }
    return model, facts


def save_depth(model: DepthNet, out: Path, facts: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({"kind": KIND, "width": model.width}, indent=2) + "\n")
    (out / "training_facts.json").write_text(json.dumps(facts, indent=2) + "\n")


def depth_estimator(path: str | Path):
    """A callable camera images [B, 3, H, W] in [0, 1] -> relative depth [B, H, W] (0 nearest) from a folder: the
    world's DepthNet, or any transformers depth-estimation model (Depth-Anything and others)."""
    from safetensors.torch import load_file

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(f"{path}: not a depth model folder (no config.json)")
    config = json.loads(config_file.read_text())
    if config.get("kind") != KIND:
        from flowrl.worlds.tactile.priors import DepthPrior

        return DepthPrior(path)
    model = DepthNet(config["width"])
    model.load_state_dict({k: v.float() for k, v in load_file(path / "model.safetensors").items()})
    model.eval()
    return torch.no_grad()(model)
