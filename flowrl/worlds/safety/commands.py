"""The safety world's own commands: the safety-probe recipe (it trains on samples of the shapes pipeline named by
the shapes recipes' --pipeline and --steps), the `safety` evaluation suite and `flowrl sample --steer`."""

from __future__ import annotations

import json

from flowrl.cli import TaskCommands

DEFAULT_SAFETY_MODES = ("base", "prompt_filter", "reject_resample", "monitor", "negative", "probe_gradient", "fk")
PRETRAIN_OUT = {"safety-probe": "pipelines/shapes-safety-probe"}


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
    from flowrl.worlds.safety.steering import SteeringConfig

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
    from flowrl.worlds.safety.steering import SafetySteer, load_steering

    steering = steering_config(args, args.steer)
    return SafetySteer(load_steering(policy, steering), steering)


def pretrain_safety_probe(args) -> None:
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.worlds.safety.probe import ProbeConfig, pretrain_probe, save_probe, write_probe_card
    from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH

    cfg = ProbeConfig(seed=args.seed)
    if args.steps is not None:
        cfg.steps = args.steps
    policy = policy_for(load_pipeline(args.pipeline), max_sequence_length=T5_SEQUENCE_LENGTH)
    probe, facts = pretrain_probe(policy, cfg)
    save_probe(probe, args.out, {"pipeline": args.pipeline, **facts})
    write_probe_card(args.out)
    print(json.dumps(facts, indent=2))


def eval_safety(args) -> None:
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.worlds.safety.evaluation import evaluate_safety, markdown_table, parse_modes, write_safety_eval
    from flowrl.worlds.shapes.model_sd3 import T5_SEQUENCE_LENGTH

    modes = parse_modes(args.modes, args.steer_lora)
    label = None
    if args.checker:
        from flowrl.images import to_unit
        from flowrl.rewards.safety_checker import SafetyChecker

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
    pretrain={"safety-probe": pretrain_safety_probe},
    pretrain_out=PRETRAIN_OUT,
    pretrain_help="safety-probe -> pipelines/shapes-safety-probe (the red-triangle probe on intermediate states)",
    eval_suites={"safety": eval_safety},
    eval_arguments=eval_arguments,
    sample_arguments=steering_arguments,
    sample_steer=sample_steer,
)
