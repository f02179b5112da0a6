"""Why a shapes-wan pipeline's clips fail the verifier: per tag, how often each of the prompt's constraints holds
(the first is always "the named object is tracked in 70% of frames"); how often the named object is tracked, by the
shape the prompt names; and the silhouettes the detector reads shapes from (fill of the bounding box: a square 1.0,
a circle ~0.8, a triangle ~0.6; the detector calls >= 0.9 a square), for the pipeline's samples, for rendered clips
and for its VAE's reconstructions of them. Samples: the eval split's single-object prompts (and every prompt for the
constraint table) under one eval seed, the card's protocol (ODE, 20 steps, CFG 4.5). Last, how far the text
encoder's output at each position moves when one word of "a red circle" changes (colour or shape).

    python benchmarks/wan_shape_diagnosis.py --pipeline PATH/TO/shapes-wan --out result.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import ndimage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.inference import generate_samples  # noqa: E402
from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.policies.base import SampleSpec  # noqa: E402
from flowrl.worlds.moving_shapes.model_wan import FRAMES, SIZE, WAN_SEQUENCE_LENGTH  # noqa: E402
from flowrl.worlds.moving_shapes.pretrain_wan import clips_to_tensor  # noqa: E402
from flowrl.worlds.moving_shapes.prompts import eval_prompt_set, parse_prompt  # noqa: E402
from flowrl.worlds.moving_shapes.verifier import PRESENT_SHARE, constraints, detections, track  # noqa: E402
from flowrl.worlds.moving_shapes.world import render_clip, sample_clip  # noqa: E402
from flowrl.worlds.shapes.verifier import BACKGROUND_MAX, MIN_AREA  # noqa: E402

SINGLE = ("object", "static", "motion")


def silhouette_fills(clip: np.ndarray) -> list[float]:
    """Fill of the bounding box of every bright component of every frame (the detector's shape cue)."""
    fills = []
    for frame in clip:
        labels, _ = ndimage.label(frame.max(-1) >= BACKGROUND_MAX)
        for i, box in enumerate(ndimage.find_objects(labels), 1):
            mask = labels[box] == i
            if mask.sum() >= MIN_AREA:
                fills.append(float(mask.mean()))
    return fills


def fills_by_shape(clips: np.ndarray, prompts: list[str]) -> dict:
    by = collections.defaultdict(list)
    for clip, prompt in zip(clips, prompts):
        by[parse_prompt(prompt).movers[0].shape] += silhouette_fills(clip)
    return {
        shape: {
            "components": len(v),
            "median": float(np.median(v)),
            "q25": float(np.quantile(v, 0.25)),
            "q75": float(np.quantile(v, 0.75)),
        }
        for shape, v in sorted(by.items())
    }


def text_sensitivity(pipe) -> dict:
    """Per-position distance between the text encoder's outputs for "a red circle" and a prompt one word away."""

    def encode(prompt):
        return pipe.encode_prompt(
            [prompt],
            do_classifier_free_guidance=False,
            max_sequence_length=WAN_SEQUENCE_LENGTH,
            device=torch.device("cpu"),
        )[0][0].float()

    with torch.no_grad():
        base = encode("a red circle")
        tokens = len(pipe.tokenizer("a red circle").input_ids)
        moved = {
            other: (encode(other) - base).norm(dim=-1)[:tokens].round(decimals=2).tolist()
            for other in ("a blue circle", "a green circle", "a red square", "a red triangle")
        }
    return {
        "positions": pipe.tokenizer.convert_ids_to_tokens(pipe.tokenizer("a red circle").input_ids),
        "output_norm": base.norm(dim=-1)[:tokens].round(decimals=2).tolist(),
        "distance": moved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="pipelines/shapes-wan")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--num-per-prompt", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    pipe = load_pipeline(args.pipeline)
    policy = policy_for(pipe, max_sequence_length=WAN_SEQUENCE_LENGTH)
    prompts = eval_prompt_set()
    samples, records = generate_samples(
        policy, prompts, args.num_per_prompt, args.seed, 20, 4.5, SampleSpec(SIZE, SIZE, FRAMES), desc="diagnosis"
    )
    clips, asked = samples.to_uint8(), [r["prompt"] for r in records]

    checks, tracked = collections.defaultdict(list), collections.defaultdict(list)
    for clip, prompt in zip(clips, asked):
        spec, found = parse_prompt(prompt), detections(clip)
        checks[spec.tag].append(constraints(spec, found))
        for mover in spec.movers:
            tracked[mover.shape].append(track(mover, found).share >= PRESENT_SHARE)
    single = [i for i, p in enumerate(asked) if parse_prompt(p).tag in SINGLE]
    rng = np.random.default_rng(args.seed)
    rendered = np.stack([render_clip(sample_clip(parse_prompt(asked[i]), rng)) for i in single])
    with torch.no_grad():
        vae = pipe.vae.float()
        decoded = vae.decode(vae.encode(clips_to_tensor(rendered)).latent_dist.mode()).sample
    reconstructed = ((decoded.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 4, 1).numpy()
    single_prompts = [asked[i] for i in single]
    result = {
        "pipeline": args.pipeline,
        "seed": args.seed,
        "clips": len(asked),
        "constraints_by_tag": {
            tag: {
                "clips": len(rows),
                "each_holds": np.mean(rows, 0).round(3).tolist(),
                "all_hold": float(np.mean([all(r) for r in rows])),
            }
            for tag, rows in checks.items()
        },
        "tracked_by_named_shape": {
            shape: {"objects": len(v), "share": float(np.mean(v))} for shape, v in sorted(tracked.items())
        },
        "silhouette_fill": {
            "generated": fills_by_shape(clips[single], single_prompts),
            "rendered": fills_by_shape(rendered, single_prompts),
            "vae_reconstructed": fills_by_shape(reconstructed, single_prompts),
        },
        "text_sensitivity": text_sensitivity(pipe),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for tag, row in result["constraints_by_tag"].items():
        print(f"{tag:18s} {row['clips']:3d} clips, each constraint {row['each_holds']}, all {row['all_hold']:.2f}")
    print("tracked by named shape", {s: round(v["share"], 2) for s, v in result["tracked_by_named_shape"].items()})
    for source, by in result["silhouette_fill"].items():
        print(f"fill, {source:17s}", {s: round(v["median"], 2) for s, v in by.items()})
    moved = result["text_sensitivity"]
    print("text encoder, distance from 'a red circle' by position", moved["positions"], moved["distance"])


if __name__ == "__main__":
    main()
