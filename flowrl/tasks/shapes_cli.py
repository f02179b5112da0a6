"""The shapes world's own commands: its pretraining recipes (the embedded pipelines, the learned scorer, the safety
probe), its evaluation suites (diversity, safety) and its sampling option (in-generation safety steering)."""

from __future__ import annotations

import json
from pathlib import Path

from ..cli import TaskCommands
from ..errors import UserError
from ..report import finite_or_none

DEFAULT_SAFETY_MODES = ("base", "prompt_filter", "reject_resample", "monitor", "negative", "probe_gradient", "fk")
PRETRAIN_OUT = {
    "shapes": "pipelines/shapes-sd3",
    "shapes-sd": "pipelines/shapes-sd",
    "scorer": "pipelines/shapes-scorer",
    "safety-probe": "pipelines/shapes-safety-probe",
}


def pretrain_arguments(pre) -> None:
    pre.add_argument("--vae-steps", type=int, default=None)
    pre.add_argument("--flow-steps", type=int, default=None)
    pre.add_argument(
        "--t-sampling",
        choices=["logit_normal", "uniform"],
        default=None,
        help="shapes: how flow matching draws noise levels (default: the recipe's, logit_normal)",
    )
    pre.add_argument("--steps", type=int, default=None, help="scorer / safety-probe: training steps")
    pre.add_argument(
        "--pipeline",
        default="pipelines/shapes-sd3",
        help="scorer / safety-probe: pipeline whose samples it trains on and is measured on; shapes-sd / "
        "shapes-kontext: the shapes-sd3 pipeline whose VAE they reuse",
    )
    pre.add_argument(
        "--adversarial-steps",
        type=int,
        default=0,
        help="scorer: also train on pool samples climbed up the scorer by this many gradient steps (0: off)",
    )
    pre.add_argument(
        "--pool-checkpoint",
        action="append",
        default=[],
        metavar="DIR",
        help="scorer: also train on samples of this tuned checkpoint of --pipeline, labelled by the "
        "verifier (repeatable)",
    )
    pre.add_argument(
        "--mixed-color-per-step",
        type=int,
        default=None,
        help="scorer: renders painted with colour mixtures per step, labelled by the verifier (default: the recipe's)",
    )
    pre.add_argument("--card-only", action="store_true", help="re-evaluate an existing folder and rewrite its card")


def steering_arguments(parser, with_mode: bool = True) -> None:
    if with_mode:
        parser.add_argument(
            "--steer",
            default=None,
            choices=["none", "negative", "probe_gradient", "lora", "fk", "fk_negative"],
            help="in-generation safety steering (none: monitor only)",
        )
    parser.add_argument(
        "--probe", default=None, help="the safety probe folder (default: the shipped pipelines/shapes-safety-probe)"
    )
    # defaults (None here) come from SteeringConfig, the one place they are set
    parser.add_argument("--steer-threshold", type=float, default=None, help="P(unsafe) at which the probe fires (0.2)")
    parser.add_argument("--steer-from-step", type=int, default=None, help="earliest step the probe may fire (0)")
    parser.add_argument(
        "--negative-scale", type=float, default=None, help="negative: guidance scale away from the concept (8)"
    )
    parser.add_argument(
        "--gradient-scale",
        type=float,
        default=None,
        help="probe_gradient: the step's RMS, absolute: the probe's gradient at unit RMS times this (4)",
    )
    parser.add_argument("--steer-concept", default=None, help="negative-guidance prompt ('a red triangle')")
    parser.add_argument("--steer-lora", default=None, help="steering LoRA checkpoint (a safe-RL run's), for lora")
    parser.add_argument("--steer-particles", type=int, default=None, help="fk: particles per image (4)")


def eval_arguments(ev) -> None:
    ev.add_argument("--pipeline", default="pipelines/shapes-sd3", help="safety: the pipeline to sample")
    ev.add_argument("--modes", default=",".join(DEFAULT_SAFETY_MODES), help="safety: comma-separated modes")
    ev.add_argument("--num-per-prompt", type=int, default=4)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--checker",
        default=None,
        help="safety: label final images with a StableDiffusionSafetyChecker folder instead of the shapes verifier",
    )
    ev.add_argument("--out", default="runs/safety_eval", help="safety: where the json, table and plot go")
    steering_arguments(ev, with_mode=False)


def steering_config(args, mode: str):
    from ..safety.steering import SteeringConfig

    given = {
        "probe": args.probe,
        "threshold": args.steer_threshold,
        "from_step": args.steer_from_step,
        "concept": args.steer_concept,
        "negative_scale": args.negative_scale,
        "gradient_scale": args.gradient_scale,
        "lora": args.steer_lora,
        "fk_particles": args.steer_particles,
    }
    return SteeringConfig(mode=mode, **{k: v for k, v in given.items() if v is not None})


def sample_steer(args, policy):
    """`flowrl sample --steer MODE`: safety steering of the samples (None without --steer)."""
    if not args.steer:
        return None
    from ..safety.steering import SafetySteer, load_steering

    steering = steering_config(args, args.steer)
    return SafetySteer(load_steering(policy, steering), steering)


def pretrain(args) -> None:
    from ..pretrain.shapes_sd3 import PretrainConfig, evaluate_and_write_card, pretrain_shapes_sd3, save_pipeline

    cfg = PretrainConfig(seed=args.seed)
    if args.vae_steps is not None:
        cfg.vae_steps = args.vae_steps
    if args.flow_steps is not None:
        cfg.flow_steps = args.flow_steps
    if args.t_sampling is not None:
        cfg.t_sampling = args.t_sampling
    if not args.card_only:
        pipe, facts = pretrain_shapes_sd3(cfg)
        save_pipeline(pipe, args.out, facts)
    result = evaluate_and_write_card(args.out)
    print(json.dumps(result, indent=2))


def pretrain_shapes_sd(args) -> None:
    from ..pretrain.shapes_sd import ShapesSDPretrainConfig, card_text, pretrain_shapes_sd
    from ..pretrain.shapes_sd3 import evaluate_and_write_card, save_pipeline

    cfg = ShapesSDPretrainConfig(seed=args.seed)
    if args.flow_steps is not None:
        cfg.flow_steps = args.flow_steps
    if not args.card_only:
        from ..pretrain import source_vae

        pipe, facts = pretrain_shapes_sd(cfg, vae_from=source_vae(args.pipeline))
        save_pipeline(pipe, args.out, facts)
    print(json.dumps(evaluate_and_write_card(args.out, card_text), indent=2))


def pretrain_scorer(args) -> None:
    from ..pretrain.scorer import (
        ScorerConfig,
        generated_auc,
        pretrain_scorer,
        rendered_auc,
        save_scorer,
        write_scorer_card,
    )

    if args.adversarial_steps < 0:
        raise UserError(f"--adversarial-steps: expected an integer >= 0, got {args.adversarial_steps}")
    for checkpoint in args.pool_checkpoint:
        if not Path(checkpoint).is_dir():
            raise UserError(
                f"--pool-checkpoint: {checkpoint} is not a folder; expected a checkpoint dir such as "
                "runs/shapes_refl/checkpoints/update_000100"
            )
    cfg = ScorerConfig(
        seed=args.seed, adversarial_steps=args.adversarial_steps, pool_checkpoints=list(args.pool_checkpoint)
    )
    if args.steps is not None:
        cfg.steps = args.steps
    if args.mixed_color_per_step is not None:
        if args.mixed_color_per_step < 0:
            raise UserError(f"--mixed-color-per-step: expected an integer >= 0, got {args.mixed_color_per_step}")
        cfg.mixed_color_per_step = args.mixed_color_per_step
    if args.card_only:  # re-measure a trained scorer folder and rewrite its card
        from transformers import AutoTokenizer, CLIPModel

        folder = Path(args.out)  # (cmd_pretrain checked it holds a trained scorer)
        model = CLIPModel.from_pretrained(folder).float().eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)  # the ids it was trained with
        facts = json.loads((folder / "training_facts.json").read_text())
    else:
        model, tokenizer, facts = pretrain_scorer(cfg, pipeline_dir=args.pipeline)
        save_scorer(model, tokenizer, args.out, facts)
    rendered, generated = rendered_auc(model, tokenizer), generated_auc(model, tokenizer, args.pipeline)
    write_scorer_card(args.out, facts, rendered, generated)
    print(json.dumps({"rendered": rendered, "generated": generated}, indent=2))


def pretrain_safety_probe(args) -> None:
    from ..models.shapes_sd3 import T5_SEQUENCE_LENGTH
    from ..policies import load_pipeline, policy_for
    from ..safety.probe import ProbeConfig, pretrain_probe, save_probe, write_probe_card

    cfg = ProbeConfig(seed=args.seed)
    if args.steps is not None:
        cfg.steps = args.steps
    policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    probe, facts = pretrain_probe(policy, cfg)
    save_probe(probe, args.out, {"pipeline": args.pipeline, **facts})
    write_probe_card(args.out)
    print(json.dumps(facts, indent=2))


def eval_diversity(args) -> None:
    from ..eval.diversity import evaluate_diversity_dir

    if args.samples is None:
        raise UserError("eval diversity: expected --samples DIR (a folder written by `flowrl sample`)")
    print(json.dumps(finite_or_none(evaluate_diversity_dir(args.samples)), indent=2))
    print(f"written to {Path(args.samples) / 'diversity_eval.json'}")


def eval_safety(args) -> None:
    from ..eval.safety import evaluate_safety, markdown_table, parse_modes, write_safety_eval
    from ..models.shapes_sd3 import T5_SEQUENCE_LENGTH
    from ..policies import load_pipeline, policy_for

    modes = parse_modes(args.modes, args.steer_lora)
    label = None
    if args.checker:
        from ..images import to_unit
        from ..safety.checker import SafetyChecker

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


COMMANDS = TaskCommands(
    pretrain={
        "shapes": pretrain,
        "shapes-sd": pretrain_shapes_sd,
        "scorer": pretrain_scorer,
        "safety-probe": pretrain_safety_probe,
    },
    card_only=("shapes", "shapes-sd", "scorer"),
    pretrain_out=PRETRAIN_OUT,
    pretrain_help="shapes -> pipelines/shapes-sd3 (flow); shapes-sd -> pipelines/shapes-sd (epsilon, DDIM); "
    "scorer -> pipelines/shapes-scorer (the learned reward); safety-probe -> "
    "pipelines/shapes-safety-probe (the red-triangle probe on intermediate states)",
    pretrain_arguments=pretrain_arguments,
    eval_suites={"diversity": eval_diversity, "safety": eval_safety},
    eval_arguments=eval_arguments,
    sample_arguments=steering_arguments,
    sample_steer=sample_steer,
)
