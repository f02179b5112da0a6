"""The shapes world's own commands: its pretraining recipes (the embedded pipelines, the learned scorer) and its
diversity evaluation suite."""

from __future__ import annotations

import json
from pathlib import Path

from flowrl.cli import TaskCommands
from flowrl.errors import UserError
from flowrl.report import finite_or_none

PRETRAIN_OUT = {
    "shapes": "pipelines/shapes-sd3",
    "shapes-sd": "pipelines/shapes-sd",
    "scorer": "pipelines/shapes-scorer",
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


def pretrain(args) -> None:
    from flowrl.worlds.shapes.pretrain_sd3 import (
        PretrainConfig,
        evaluate_and_write_card,
        pretrain_shapes_sd3,
        save_pipeline,
    )

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
    from flowrl.worlds.shapes.pretrain_sd import ShapesSDPretrainConfig, card_text, pretrain_shapes_sd
    from flowrl.worlds.shapes.pretrain_sd3 import evaluate_and_write_card, save_pipeline

    cfg = ShapesSDPretrainConfig(seed=args.seed)
    if args.flow_steps is not None:
        cfg.flow_steps = args.flow_steps
    if not args.card_only:
        from flowrl.worlds.shapes.pretrain_sd3 import source_vae

        pipe, facts = pretrain_shapes_sd(cfg, vae_from=source_vae(args.pipeline))
        save_pipeline(pipe, args.out, facts)
    print(json.dumps(evaluate_and_write_card(args.out, card_text), indent=2))


def pretrain_scorer(args) -> None:
    from flowrl.worlds.shapes.pretrain_scorer import (
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


def eval_diversity(args) -> None:
    from flowrl.worlds.shapes.diversity import evaluate_diversity_dir

    if args.samples is None:
        raise UserError("eval diversity: expected --samples DIR (a folder written by `flowrl sample`)")
    print(json.dumps(finite_or_none(evaluate_diversity_dir(args.samples)), indent=2))
    print(f"written to {Path(args.samples) / 'diversity_eval.json'}")


COMMANDS = TaskCommands(
    pretrain={
        "shapes": pretrain,
        "shapes-sd": pretrain_shapes_sd,
        "scorer": pretrain_scorer,
    },
    card_only=("shapes", "shapes-sd", "scorer"),
    pretrain_out=PRETRAIN_OUT,
    pretrain_help="shapes -> pipelines/shapes-sd3 (flow); shapes-sd -> pipelines/shapes-sd (epsilon, DDIM); "
    "scorer -> pipelines/shapes-scorer (the learned reward)",
    pretrain_arguments=pretrain_arguments,
    eval_suites={"diversity": eval_diversity},
)
