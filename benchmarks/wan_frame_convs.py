"""The frame-independent Wan VAE as per-frame 2-D convolutions (flowrl/policies/wan_vae.py) against diffusers' causal
3-D path, side by side in one run: a stage-1 training step (64 frames, forward + backward), encoding 32 clips and
decoding 32 clips (what the policy does after every rollout), on shapes-wan's VAE size. Interleaved repeats; the
median of each and the ratio.

    python benchmarks/wan_frame_convs.py --repeats 5

Writes benchmarks/results/wan_frame_convs.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies.wan_vae import frame_convolutions  # noqa: E402
from flowrl.report import cpu_model  # noqa: E402
from flowrl.worlds.moving_shapes.model_wan import ShapesWanSize, build_vae  # noqa: E402
from flowrl.worlds.moving_shapes.pretrain_wan import clips_to_tensor, decode_unclamped, inflate_causal_convs  # noqa: E402
from flowrl.worlds.moving_shapes.world import sample_pairs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "wan_frame_convs.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vae = build_vae(ShapesWanSize(), seed=0)
    inflate_causal_convs(vae)
    clips = clips_to_tensor(sample_pairs(32, np.random.default_rng(0))[0])
    frames = clips.transpose(1, 2).flatten(0, 1)[:64, :, None]
    with torch.no_grad():
        latents = vae.encode(clips).latent_dist.mode()

    def train_step():
        vae.zero_grad(set_to_none=True)
        (decode_unclamped(vae, vae.encode(frames).latent_dist.mode()) - frames).abs().mean().backward()

    @torch.no_grad()
    def encode():
        vae.encode(clips)

    @torch.no_grad()
    def decode():
        vae.decode(latents)

    work = {"train step (64 frames)": train_step, "encode (32 clips)": encode, "decode (32 clips)": decode}
    paths = {"causal 3-D": contextlib.nullcontext, "per-frame 2-D": lambda: frame_convolutions(vae)}
    seconds = {(w, p): [] for w in work for p in paths}
    for _ in range(args.repeats + 1):  # the first round warms up and is dropped
        for w, fn in work.items():
            for p, context in paths.items():
                start = time.perf_counter()
                with context():
                    fn()
                seconds[(w, p)].append(time.perf_counter() - start)
    rows = []
    for w in work:
        slow, fast = (statistics.median(seconds[(w, p)][1:]) for p in paths)
        rows.append({"work": w, "causal_3d_s": slow, "per_frame_2d_s": fast, "speedup": slow / fast})
        print(f"{w:24s} causal 3-D {slow:.3f} s   per-frame 2-D {fast:.3f} s   {slow / fast:.2f}x")
    result = {"cpu": cpu_model(), "threads": args.threads, "repeats": args.repeats, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['cpu']}, {args.threads} threads; wrote {args.out}")


if __name__ == "__main__":
    main()
