"""Where along the sampling path a shapes-wan pipeline fails: rendered clips are noised to t with their own latents
(x_t = (1 - t) x0 + t eps) and denoised from there on the pipeline's own shifted Euler grid (the eval's 20 steps,
CFG 4.5); the video verifier judges the decoded clips. t = 1 is sampling from pure noise; small t approaches the
VAE's reconstruction ceiling. A pipeline that passes far more clips from t = 0.6 than from t = 1 refines well and
fails where the layout and shapes are decided.

    python benchmarks/wan_denoise_from_t.py --pipeline PATH/TO/shapes-wan --clips 48

Writes benchmarks/results/wan_denoise_from_t.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowrl.policies import load_pipeline, policy_for  # noqa: E402
from flowrl.sde import shifted_sigmas  # noqa: E402
from flowrl.worlds.moving_shapes.model_wan import WAN_SEQUENCE_LENGTH  # noqa: E402
from flowrl.worlds.moving_shapes.pretrain_wan import normalised_latents  # noqa: E402
from flowrl.worlds.moving_shapes.verifier import judge_clip  # noqa: E402
from flowrl.worlds.moving_shapes.world import sample_pairs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="pipelines/shapes-wan")
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--starts", default="1.0,0.8,0.6,0.4,0.2")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "wan_denoise_from_t.json"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    pipe = load_pipeline(args.pipeline)
    policy = policy_for(pipe, max_sequence_length=WAN_SEQUENCE_LENGTH)
    clips, prompts = sample_pairs(args.clips, np.random.default_rng(args.seed))
    x0 = normalised_latents(pipe.vae, clips)
    embeds, negative = pipe.encode_prompt(
        prompts,
        negative_prompt=[""] * len(prompts),
        do_classifier_free_guidance=True,
        max_sequence_length=WAN_SEQUENCE_LENGTH,
        device=torch.device("cpu"),
    )
    grid = shifted_sigmas(args.steps, pipe.scheduler.config.shift).tolist()  # the sampler's sigmas
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for start in (float(s) for s in args.starts.split(",")):
        noise = torch.randn(x0.shape, generator=generator)
        x = (1 - start) * x0 + start * noise
        path = [start] + [s for s in grid if s < start - 1e-6]
        with torch.no_grad():
            for sigma, following in zip(path[:-1], path[1:]):
                t = torch.full((len(x),), sigma * 1000)
                cond = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds, return_dict=False)[0]
                uncond = pipe.transformer(
                    hidden_states=x, timestep=t, encoder_hidden_states=negative, return_dict=False
                )[0]
                x = x + (following - sigma) * (uncond + args.guidance * (cond - uncond))
            video = policy.decode(x)
        frames = (video.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 4, 1).numpy()
        passed = float(np.mean([judge_clip(c, p)[0] for c, p in zip(frames, prompts)]))
        rows.append({"start_t": start, "steps": len(path) - 1, "pass": passed})
        print(f"from t = {start:.1f} ({len(path) - 1} steps): {passed:.3f} of {len(prompts)} clips pass")
    result = {"pipeline": args.pipeline, "clips": args.clips, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
