"""A figure of the visuo-tactile pipeline on held-out materials, one row per pair: the camera image | the depth
network's estimate | the describer's description (and the true one) | the generator's tactile image from that
description and estimate | the sensor's image, with the SSIM of the generated image.

    python benchmarks/tactile_examples.py     # ~1 min; benchmarks/results/tactile_table/examples.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.worlds.tactile import recipes  # noqa: E402
from flowrl.worlds.tactile.depthnet import depth_estimator  # noqa: E402
from flowrl.worlds.tactile.describer import describe, load_describer  # noqa: E402
from flowrl.worlds.tactile.metrics import draw_tactile, ssim  # noqa: E402
from flowrl.worlds.tactile.scenes import world_pairs  # noqa: E402


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from diffusers import StableDiffusionXLControlNetPipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--describer", default=recipes.DESCRIBER, help="a describer folder (e.g. a GTPO-refined one)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tactile_table/examples.png"))
    args = parser.parse_args()
    pairs = world_pairs("eval")[:: max(1, 64 // args.pairs)][: args.pairs]
    rgb = torch.stack([p.rgb for p in pairs])
    depth = depth_estimator(recipes.DEPTH)(rgb)
    model, processor = load_describer(args.describer)
    texts = describe(model, processor, rgb)
    pipe = StableDiffusionXLControlNetPipeline.from_pretrained(recipes.GENERATOR).to(torch.float32)
    generated = draw_tactile(pipe, pairs, texts, depth=depth, seed=0)
    truth = torch.stack([p.tactile for p in pairs])
    scores = ssim(generated, truth)
    figure, axes = plt.subplots(len(pairs), 5, figsize=(11, 2.1 * len(pairs)))
    titles = ("camera", "estimated depth", "description", "generated", "sensor")
    for row, pair in enumerate(pairs):
        panels = (rgb[row], depth[row][None].expand(3, -1, -1), None, generated[row], truth[row])
        for col, (panel, title) in enumerate(zip(panels, titles)):
            axis = axes[row, col]
            axis.set_xticks([]), axis.set_yticks([])
            if row == 0:
                axis.set_title(title, fontsize=9)
            if panel is None:
                axis.axis("off")
                axis.text(0, 0.65, "written: " + texts[row].replace(", ", ",\n  "), fontsize=6.5, va="center")
                axis.text(0, 0.05, "true: " + pair.description, fontsize=5.5, va="center", wrap=True)
                continue
            axis.imshow(panel.permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
            if col == 3:
                axis.set_xlabel(f"SSIM {scores[row]:.2f}", fontsize=8)
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
