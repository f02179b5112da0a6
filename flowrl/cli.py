"""The `flowrl` command: pretrain, train, sample, eval.

Bad input (a config field, a missing file, a malformed flag) prints one line naming it and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import UserError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrl", description="RL fine-tuning of diffusers flow pipelines")
    sub = parser.add_subparsers(dest="command", required=True)

    pre = sub.add_parser("pretrain", help="train an embedded default pipeline from the renderer's data")
    pre.add_argument("recipe", choices=["shapes"], help="which default: shapes -> pipelines/shapes-sd3")
    pre.add_argument("--out", default="pipelines/shapes-sd3")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--vae-steps", type=int, default=None)
    pre.add_argument("--flow-steps", type=int, default=None)
    pre.add_argument("--card-only", action="store_true", help="re-evaluate an existing folder and rewrite its card")

    train = sub.add_parser("train", help="run an experiment config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="key=value, e.g. train.updates=10 resume=PATH")

    sample = sub.add_parser("sample", help="generate images for a prompt file")
    sample.add_argument("--pipeline", required=True)
    sample.add_argument("--checkpoint", default=None, help="a run's checkpoint folder (LoRA or full weights)")
    sample.add_argument("--prompts", required=True, help="text file, one prompt per line")
    sample.add_argument("--out", required=True)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--num-per-prompt", type=int, default=1)
    sample.add_argument("--steps", type=int, default=20)
    sample.add_argument("--guidance", type=float, default=4.5)
    sample.add_argument("--height", type=int, default=32)
    sample.add_argument("--width", type=int, default=32)
    sample.add_argument("--max-sequence-length", type=int, default=16)

    ev = sub.add_parser("eval", help="score samples with an evaluation suite")
    ev.add_argument("suite", choices=["shapes"])
    ev.add_argument("--samples", required=True, help="a folder written by `flowrl sample`")
    return parser


def cmd_pretrain(args) -> None:
    from .pretrain.shapes_sd3 import PretrainConfig, evaluate_and_write_card, pretrain_shapes_sd3, save_pipeline

    cfg = PretrainConfig(seed=args.seed)
    if args.vae_steps is not None:
        cfg.vae_steps = args.vae_steps
    if args.flow_steps is not None:
        cfg.flow_steps = args.flow_steps
    if not args.card_only:
        pipe, facts = pretrain_shapes_sd3(cfg)
        save_pipeline(pipe, args.out, facts)
    result = evaluate_and_write_card(args.out)
    print(json.dumps(result, indent=2))


def cmd_train(args) -> None:
    from .config import load_config
    from .experiment import run_experiment

    # `resume=PATH` is short for `run.resume=PATH`
    overrides = ["run." + o if o.startswith("resume=") else o for o in args.overrides]
    config = load_config(args.config, overrides)
    run_dir = run_experiment(config)
    print(f"run written to {run_dir} (report: {run_dir / 'report.html'})")


def cmd_sample(args) -> None:
    from PIL import Image

    from .checkpoint import load_trained_weights
    from .generate import generate
    from .policies import load_pipeline, policy_for
    from .prompt_source import read_prompt_file

    if args.num_per_prompt < 1:
        raise UserError(f"--num-per-prompt: expected an integer >= 1, got {args.num_per_prompt}")
    prompts = read_prompt_file(args.prompts)
    policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=args.max_sequence_length)
    if args.checkpoint:
        load_trained_weights(policy, args.checkpoint)
    images, records = generate(policy, prompts, args.num_per_prompt, args.seed, args.steps, args.guidance,
                               args.height, args.width)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.jsonl").open("w") as index:
        for n, (image, record) in enumerate(zip(images, records)):
            name = f"{n:05d}.png"
            Image.fromarray(image).save(out / name)
            index.write(json.dumps({**record, "file": name}) + "\n")
    print(f"wrote {len(images)} images and samples.jsonl to {out}")


def cmd_eval(args) -> None:
    from .eval.shapes import evaluate_samples_dir, format_accuracy

    result = evaluate_samples_dir(args.samples)
    print(format_accuracy(result))
    print(f"written to {Path(args.samples) / 'shapes_eval.json'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"pretrain": cmd_pretrain, "train": cmd_train, "sample": cmd_sample, "eval": cmd_eval}
    try:
        commands[args.command](args)
    except UserError as error:
        print(f"flowrl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flowrl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
