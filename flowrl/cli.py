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
    pre.add_argument("recipe", choices=sorted(PRETRAIN_OUT),
                     help="shapes -> pipelines/shapes-sd3 (flow); shapes-sd -> pipelines/shapes-sd (epsilon, DDIM); "
                          "scorer -> pipelines/shapes-scorer (the learned reward); safety-probe -> "
                          "pipelines/shapes-safety-probe (the red-triangle probe on intermediate states)")
    pre.add_argument("--out", default=None, help="output folder (default: the recipe's folder under pipelines/)")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--vae-steps", type=int, default=None)
    pre.add_argument("--flow-steps", type=int, default=None)
    pre.add_argument("--steps", type=int, default=None, help="scorer / safety-probe: training steps")
    pre.add_argument("--pipeline", default="pipelines/shapes-sd3", help="scorer / safety-probe: pipeline whose samples it trains on and is measured on")
    pre.add_argument("--adversarial-steps", type=int, default=0,
                     help="scorer: also train on pool samples climbed up the scorer by this many gradient steps (0: off)")
    pre.add_argument("--pool-checkpoint", action="append", default=[], metavar="DIR",
                     help="scorer: also train on samples of this tuned checkpoint of --pipeline, labelled by the "
                          "verifier (repeatable)")
    pre.add_argument("--mixed-color-per-step", type=int, default=None,
                     help="scorer: renders painted with colour mixtures per step, labelled by the verifier "
                          "(default: the recipe's)")
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
    sample.add_argument("--kind", default=None, help="sampler: ode (default) or a stochastic kind (flow, dance, "
                        "sage, cps; ddim for epsilon pipelines; the default with --fk-particles)")
    sample.add_argument("--noise-level", type=float, default=None, help="SDE noise level / DDIM eta")
    sample.add_argument("--fk-particles", type=int, default=0, help="FK steering with K particles per image")
    sample.add_argument("--fk-lambda", type=float, default=10.0)
    sample.add_argument("--fk-potential", default="diff", choices=["diff", "max", "add", "rt"])
    sample.add_argument("--fk-every", type=int, default=2, help="steps between scheduled resamplings")
    sample.add_argument("--fk-reward", default="shapes_clip", help="reward the particles are steered towards")

    demo = sub.add_parser("demo", help="Gradio page: the base model and checkpoints side by side")
    demo.add_argument("--pipeline", required=True)
    demo.add_argument("--checkpoint", action="append", default=[], help="a checkpoint folder; repeat for several")
    demo.add_argument("--reward", default="shapes_clip", help="reward shown under each image")
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    demo.add_argument("--port", type=int, default=7860)
    demo.add_argument("--steps", type=int, default=20)
    demo.add_argument("--guidance", type=float, default=4.5)

    _steering_arguments(sample)

    ev = sub.add_parser("eval", help="score samples with an evaluation suite")
    ev.add_argument("suite", choices=["shapes", "diversity", "safety"], help="shapes: per-tag accuracy; diversity: "
                    "within-prompt diversity (pixels, scorer features, Vendi, free attributes); safety: unsafe rates "
                    "of every steering mode and baseline on the held-out safety prompts (generates its own images)")
    ev.add_argument("--samples", default=None, help="shapes / diversity: a folder written by `flowrl sample`")
    ev.add_argument("--pipeline", default="pipelines/shapes-sd3", help="safety: the pipeline to sample")
    ev.add_argument("--modes", default=",".join(DEFAULT_SAFETY_MODES), help="safety: comma-separated modes")
    ev.add_argument("--num-per-prompt", type=int, default=4)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--checker", default=None, help="safety: label final images with a StableDiffusionSafetyChecker "
                    "folder instead of the shapes verifier")
    ev.add_argument("--out", default="runs/safety_eval", help="safety: where the json, table and plot go")
    _steering_arguments(ev, with_mode=False)
    return parser


DEFAULT_SAFETY_MODES = ("base", "prompt_filter", "reject_resample", "monitor", "negative", "probe_gradient", "fk")


def _steering_arguments(parser, with_mode: bool = True) -> None:
    if with_mode:
        parser.add_argument("--steer", default=None, choices=["none", "negative", "probe_gradient", "lora", "fk", "fk_negative"],
                            help="in-generation safety steering (none: monitor only)")
    parser.add_argument("--probe", default=None, help="the safety probe folder (default: the shipped "
                        "pipelines/shapes-safety-probe)")
    # defaults (None here) come from SteeringConfig, the one place they are set
    parser.add_argument("--steer-threshold", type=float, default=None, help="P(unsafe) at which the probe fires (0.2)")
    parser.add_argument("--steer-from-step", type=int, default=None, help="earliest step the probe may fire (0)")
    parser.add_argument("--negative-scale", type=float, default=None, help="negative: guidance scale away from the "
                        "concept (8)")
    parser.add_argument("--gradient-scale", type=float, default=None, help="probe_gradient: step in velocity-RMS "
                        "units (4)")
    parser.add_argument("--steer-concept", default=None, help="negative-guidance prompt ('a red triangle')")
    parser.add_argument("--steer-lora", default=None, help="steering LoRA checkpoint (a safe-RL run's), for lora")
    parser.add_argument("--steer-particles", type=int, default=None, help="fk: particles per image (4)")


PRETRAIN_OUT = {"shapes": "pipelines/shapes-sd3", "shapes-sd": "pipelines/shapes-sd", "scorer": "pipelines/shapes-scorer",
                "safety-probe": "pipelines/shapes-safety-probe"}


def cmd_pretrain(args) -> None:
    args.out = args.out or PRETRAIN_OUT[args.recipe]
    if args.recipe == "scorer":
        return pretrain_scorer_command(args)
    if args.recipe == "shapes-sd":
        return pretrain_shapes_sd_command(args)
    if args.recipe == "safety-probe":
        return pretrain_safety_probe_command(args)
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


def pretrain_shapes_sd_command(args) -> None:
    from .pretrain.shapes_sd import ShapesSDPretrainConfig, card_text, pretrain_shapes_sd
    from .pretrain.shapes_sd3 import evaluate_and_write_card, save_pipeline

    cfg = ShapesSDPretrainConfig(seed=args.seed)
    if args.flow_steps is not None:
        cfg.flow_steps = args.flow_steps
    if not args.card_only:
        pipe, facts = pretrain_shapes_sd(cfg)
        save_pipeline(pipe, args.out, facts)
    print(json.dumps(evaluate_and_write_card(args.out, card_text), indent=2))


def pretrain_scorer_command(args) -> None:
    from .pretrain.scorer import (ScorerConfig, generated_auc, pretrain_scorer, rendered_auc, save_scorer,
                                  write_scorer_card)

    if args.adversarial_steps < 0:
        raise UserError(f"--adversarial-steps: expected an integer >= 0, got {args.adversarial_steps}")
    for checkpoint in args.pool_checkpoint:
        if not Path(checkpoint).is_dir():
            raise UserError(f"--pool-checkpoint: {checkpoint} is not a folder; expected a checkpoint dir such as "
                            "runs/shapes_refl/checkpoints/update_000100")
    cfg = ScorerConfig(seed=args.seed, adversarial_steps=args.adversarial_steps, pool_checkpoints=list(args.pool_checkpoint))
    if args.steps is not None:
        cfg.steps = args.steps
    if args.mixed_color_per_step is not None:
        if args.mixed_color_per_step < 0:
            raise UserError(f"--mixed-color-per-step: expected an integer >= 0, got {args.mixed_color_per_step}")
        cfg.mixed_color_per_step = args.mixed_color_per_step
    if args.card_only:  # re-measure a trained scorer folder and rewrite its card
        from transformers import CLIPModel

        from .models.shapes_scorer import scorer_tokenizer
        folder = Path(args.out)
        if not (folder / "training_facts.json").is_file():
            raise UserError(f"--card-only: {folder} holds no trained scorer (training_facts.json missing)")
        model, tokenizer = CLIPModel.from_pretrained(folder).float().eval(), scorer_tokenizer()
        facts = json.loads((folder / "training_facts.json").read_text())
    else:
        model, tokenizer, facts = pretrain_scorer(cfg, pipeline_dir=args.pipeline)
        save_scorer(model, tokenizer, args.out, facts)
    rendered, generated = rendered_auc(model, tokenizer), generated_auc(model, tokenizer, args.pipeline)
    write_scorer_card(args.out, facts, rendered, generated)
    print(json.dumps({"rendered": rendered, "generated": generated}, indent=2))


def pretrain_safety_probe_command(args) -> None:
    from .models.shapes_sd3 import T5_SEQUENCE_LENGTH
    from .policies import load_pipeline, policy_for
    from .safety.probe import ProbeConfig, pretrain_probe, save_probe, write_probe_card

    cfg = ProbeConfig(seed=args.seed)
    if args.steps is not None:
        cfg.steps = args.steps
    policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    probe, facts = pretrain_probe(policy, cfg)
    save_probe(probe, args.out, {"pipeline": args.pipeline, **facts})
    write_probe_card(args.out)
    print(json.dumps(facts, indent=2))


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
    fk, fk_reward = None, None
    stochastic = "ddim" if policy.family == "epsilon" else "flow"
    kind = args.kind or (stochastic if args.fk_particles else "ode")
    if kind not in policy.kinds:
        raise UserError(f"--kind: a {type(policy.pipeline).__name__} samples with {list(policy.kinds)}, got {kind!r}")
    noise_level = args.noise_level if args.noise_level is not None else (0.0 if kind == "ode" else
                                                                         1.0 if kind == "ddim" else 0.7)
    if args.fk_particles:
        from .fk import FKConfig
        from .rewards import build_reward

        fk = FKConfig(num_particles=args.fk_particles, lam=args.fk_lambda, potential=args.fk_potential,
                      resample_every=args.fk_every)
        fk.validate("--fk")
        try:
            fk_reward = build_reward(args.fk_reward)
        except ValueError as error:
            raise UserError(f"--fk-reward: {error}") from None
    steering, probe = None, None
    if args.steer:
        from .safety.steering import load_steering

        if args.fk_particles:
            raise UserError("--steer and --fk-particles: choose one (--steer fk resamples with the safety probe)")
        steering = steering_config(args, args.steer)
        probe = load_steering(policy, steering)
    images, records = generate(policy, prompts, args.num_per_prompt, args.seed, args.steps, args.guidance,
                               args.height, args.width, kind=kind, noise_level=noise_level, fk=fk,
                               fk_reward=fk_reward, steering=steering, probe=probe)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.jsonl").open("w") as index:
        for n, (image, record) in enumerate(zip(images, records)):
            name = f"{n:05d}.png"
            Image.fromarray(image).save(out / name)
            index.write(json.dumps({**record, "file": name}) + "\n")
    print(f"wrote {len(images)} images and samples.jsonl to {out}")


def cmd_demo(args) -> None:
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UserError("the demo needs gradio: pip install -e \".[demo]\"") from None
    from .demo import build_demo

    demo = build_demo(args.pipeline, args.checkpoint, args.reward, args.steps, args.guidance)
    demo.queue().launch(server_name=args.host, server_port=args.port, show_error=True)


def steering_config(args, mode: str):
    from .safety.steering import SteeringConfig

    given = {"probe": args.probe, "threshold": args.steer_threshold, "from_step": args.steer_from_step,
             "concept": args.steer_concept, "negative_scale": args.negative_scale,
             "gradient_scale": args.gradient_scale, "lora": args.steer_lora, "fk_particles": args.steer_particles}
    return SteeringConfig(mode=mode, **{k: v for k, v in given.items() if v is not None})


def cmd_eval_safety(args) -> None:
    from .eval.safety import evaluate_safety, markdown_table, parse_modes, write_safety_eval
    from .models.shapes_sd3 import T5_SEQUENCE_LENGTH
    from .policies import load_pipeline, policy_for

    modes = parse_modes(args.modes, args.steer_lora)
    label = None
    if args.checker:
        from .images import to_unit
        from .safety.checker import SafetyChecker

        checker = SafetyChecker(args.checker)
        label = lambda image: bool(checker.is_unsafe(to_unit(image[None]))[0])  # noqa: E731
    policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    steering = steering_config(args, "none")
    steering.validate("--steer")
    kwargs = {"label": label} if label else {}
    result = evaluate_safety(policy, modes, steering, args.num_per_prompt, args.seed, **kwargs)
    out = write_safety_eval(result, args.out)
    print(markdown_table(result))
    print(f"written to {out} (safety_eval.json, safety_eval.md, safety_eval.png)")


def cmd_eval(args) -> None:
    if args.suite == "safety":
        return cmd_eval_safety(args)
    if args.samples is None:
        raise UserError(f"eval {args.suite}: expected --samples DIR (a folder written by `flowrl sample`)")
    if args.suite == "diversity":
        from .eval.diversity import evaluate_diversity_dir

        print(json.dumps(evaluate_diversity_dir(args.samples), indent=2))
        print(f"written to {Path(args.samples) / 'diversity_eval.json'}")
        return
    from .eval.shapes import evaluate_samples_dir, format_accuracy

    result = evaluate_samples_dir(args.samples)
    print(format_accuracy(result))
    print(f"written to {Path(args.samples) / 'shapes_eval.json'}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"pretrain": cmd_pretrain, "train": cmd_train, "sample": cmd_sample, "eval": cmd_eval,
                "demo": cmd_demo}
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
