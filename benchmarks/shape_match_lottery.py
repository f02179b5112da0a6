"""Is a text-to-3D group's ranking about the samples or about the one solid it is scored against?

A prompt of the 3D shapes world describes a distribution of solids (sizes jittered by 10%, a small shift); an item's
solid is one draw of it. For groups of samples of the text-to-3D pipeline (training prompts, 8 samples each), this
scores every sample against several independent draws of its prompt's solid and reports
- the rank correlation (Spearman) of the group's IoUs between two draws, averaged over pairs of draws: near 1 when
  the ranking is the samples' own, near 0 when it is a lottery on the draw;
- the share of the within-group IoU variance that is the sample's own (its mean over draws), the rest being the
  sample x draw interaction.
`shape_match` with `against: prompt` scores the mean over draws, i.e. only the sample's own part.

It also reports what the held-out evaluation (volume IoU against each eval item's own solid) allows a text-to-3D
model at best: the IoU of the autoencoder's reconstruction of the eval solids (no generator through this latent space
does better), of another draw of the same prompt (a model that samples the prompt's distribution exactly), and of
the prompt's nominal solid (no jitter, centred: the best single guess a prompt allows, roughly).

    python benchmarks/shape_match_lottery.py     # ~1 min on 2 CPU cores; benchmarks/results/shape_match_lottery.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies import load_pipeline  # noqa: E402
from flowrl.prompt_source import text_seed  # noqa: E402
from flowrl.sdf import volume_iou  # noqa: E402
from flowrl.worlds.shapes3d.geometry import sdf_grid  # noqa: E402
from flowrl.worlds.shapes3d.prompts import parse_prompt, sample_solid, train_prompt_set  # noqa: E402


class _Midpoint:
    """Stands in for the grammar's random generator: every jitter at the middle of its range (the nominal solid)."""

    def uniform(self, low, high, size=None):
        return np.full(size, (low + high) / 2) if size is not None else (low + high) / 2


def eval_ceilings(autoencoder) -> dict:
    """Held-out IoU (the task's tag-mean overall) of three references against the eval items' solids."""
    from flowrl.tasks.base import tag_metrics
    from flowrl.worlds.shapes3d.conditions import eval_conditions, prompt_solids, solid_of
    from flowrl.worlds.shapes3d.pretrain import surface_samples

    items = eval_conditions()
    generator = torch.Generator().manual_seed(0)
    scores = {"autoencoder_reconstruction": [], "another_draw_of_the_prompt": [], "nominal_solid": []}
    for item in items:
        solid = solid_of(item)
        truth = sdf_grid(solid, 32)
        with torch.no_grad():
            tokens = autoencoder.encode(surface_samples(solid, 512, generator)[None])
            scores["autoencoder_reconstruction"].append(volume_iou(autoencoder.sdf_grid(tokens, 32)[0].numpy(), truth))
        draws = prompt_solids(item.prompt, 8)
        scores["another_draw_of_the_prompt"].append(np.mean([volume_iou(sdf_grid(d, 32), truth) for d in draws]))
        nominal = sample_solid(parse_prompt(item.prompt), _Midpoint())
        scores["nominal_solid"].append(volume_iou(sdf_grid(nominal, 32), truth))
    tags = [item.meta["tag"] for item in items]
    return {name: tag_metrics(values, tags)["overall"] for name, values in scores.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipeline", default=str(ROOT / "pipelines" / "shapes3d-text"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--draws", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "shape_match_lottery.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    pipe = load_pipeline(args.pipeline)
    pipe.set_progress_bar_config(disable=True)
    rng = np.random.default_rng(0)
    prompts = [p for by_tag in train_prompt_set().values() for p in by_tag]
    prompts = [prompts[i] for i in rng.permutation(len(prompts))[: args.prompts]]
    rows = []
    for k, prompt in enumerate(prompts):
        out = pipe(
            prompt=[prompt] * args.group_size,
            num_inference_steps=args.steps,
            guidance_scale=3.0,
            generator=torch.Generator().manual_seed(k),
            output_type="sdf",
        )
        spec = parse_prompt(prompt)
        # draws apart from the reward's own stream (shape_match's draws use [text_seed, j])
        truths = [
            sdf_grid(sample_solid(spec, np.random.default_rng([text_seed(prompt), 1000 + j])), 32)
            for j in range(args.draws)
        ]
        iou = np.array([[volume_iou(g.float().numpy(), t) for g in out.sdf] for t in truths])  # [draw, sample]
        pairs = [spearmanr(iou[a], iou[b])[0] for a in range(args.draws) for b in range(a + 1, args.draws)]
        interaction = iou - iou.mean(0, keepdims=True) - iou.mean(1, keepdims=True) + iou.mean()
        rows.append(
            {
                "prompt": prompt,
                "rank_correlation": float(np.nanmean(pairs)),
                "sample_variance": float(iou.mean(0).var()),
                "interaction_variance": float(interaction.var()),
                "within_group_std_one_draw": float(iou.std(1).mean()),
            }
        )
        print(f"{prompt:50s} rank correlation {rows[-1]['rank_correlation']:+.2f}", flush=True)
    own = sum(r["sample_variance"] for r in rows)
    summary = {
        "mean_rank_correlation": float(np.mean([r["rank_correlation"] for r in rows])),
        "sample_share_of_within_group_variance": own / (own + sum(r["interaction_variance"] for r in rows)),
        "pipeline": Path(args.pipeline).name,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "draws": args.draws,
    }
    summary["eval_ceilings"] = eval_ceilings(pipe.autoencoder.to(torch.float32))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
