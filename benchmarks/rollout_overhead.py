"""Cost of a flowrl SDE rollout with per-step log-probs against a plain `pipeline(...)` call.

Same model, prompts, steps, CFG and batch; both include prompt encoding and VAE decoding. The two are timed
alternately in one process (this machine is shared and noisy) and the ratio of medians is printed.

    python benchmarks/rollout_overhead.py [--pipeline pipelines/shapes-sd3] [--batch 16] [--steps 10] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flowrl.policies import load_pipeline, policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipeline", default="pipelines/shapes-sd3")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--kind", default="flow")
    args = parser.parse_args()
    torch.set_num_threads(2)
    pipe = load_pipeline(args.pipeline)
    policy = policy_for(pipe, max_sequence_length=T5_SEQUENCE_LENGTH)
    prompts = ["a red circle left of a blue square"] * args.batch
    shape = policy.noise_shape(SampleSpec(32, 32))

    def plain():
        pipe(
            prompts,
            negative_prompt=[""] * len(prompts),
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            height=32,
            width=32,
            max_sequence_length=T5_SEQUENCE_LENGTH,
            output_type="pt",
            generator=torch.Generator().manual_seed(0),
        )

    def flowrl():
        cond = policy.encode(prompts, args.guidance)
        traj = rollout(
            policy, cond, sample_generators(range(len(prompts))), shape, args.steps, args.kind, 0.7, args.guidance
        )
        with torch.no_grad():
            policy.decode(traj.final)
        assert traj.log_probs.shape == (args.steps, len(prompts))

    for warm in (plain, flowrl):
        warm()
    times = {"pipeline": [], "flowrl": []}
    for _ in range(args.repeats):
        for name, fn in (("pipeline", plain), ("flowrl", flowrl)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base, ours = statistics.median(times["pipeline"]), statistics.median(times["flowrl"])
    print(
        f"pipeline(...) median {base * 1000:.1f} ms; flowrl {args.kind} rollout with log-probs median "
        f"{ours * 1000:.1f} ms ({args.batch} prompts, {args.steps} steps, CFG {args.guidance}, "
        f"{args.repeats} runs each)"
    )
    print(f"ratio flowrl / pipeline = {ours / base:.3f}")


if __name__ == "__main__":
    main()
