"""`flowrl pretrain RECIPE`: train an embedded default pipeline (or scorer, probe) with a task's recipe, into a folder
replaced whole only once the recipe has finished."""

from __future__ import annotations

from pathlib import Path

from flowrl.cli.extensions import TaskCommands
from flowrl.errors import UserError


def add_parser(sub, extensions: list[TaskCommands]) -> None:
    """The `pretrain` subcommand: a recipe of any task's, --out, --seed and the recipes' own flags."""
    recipes = sorted(r for e in extensions for r in e.pretrain)
    pre = sub.add_parser("pretrain", help="train an embedded default pipeline (or scorer, probe) with a task's recipe")
    pre.add_argument("recipe", choices=recipes, help="; ".join(e.pretrain_help for e in extensions if e.pretrain_help))
    pre.add_argument("--out", default=None, help="output folder (default: the recipe's folder under pipelines/)")
    pre.add_argument("--seed", type=int, default=0)
    for extension in extensions:
        if extension.pretrain_arguments is not None:
            extension.pretrain_arguments(pre)


RECIPE_OUTPUT_MARKERS = ("training_facts.json", "probe.json")  # what every pretrain recipe writes into its folder


def refuse_foreign_folder(out: Path) -> None:
    """A recipe replaces its --out folder whole: one that an earlier recipe wrote may go, anything else (a typo'd
    `--out pipelines`, a user's own folder) is refused before training rather than deleted after it."""
    if out.is_dir() and any(out.iterdir()) and not any((out / marker).is_file() for marker in RECIPE_OUTPUT_MARKERS):
        raise UserError(
            f"--out {out} is not empty and holds no earlier recipe output ({' or '.join(RECIPE_OUTPUT_MARKERS)}"
            f" missing); the recipe would replace the whole folder: pick a new or empty folder"
        )


def cmd_pretrain(args, extensions: list[TaskCommands]) -> None:
    """Run the recipe `args.recipe` of whichever of `extensions` has it: its flags checked, its --out folder
    replaced only once it has finished (or, with --card-only, its card rewritten in place)."""
    extension = next(e for e in extensions if args.recipe in e.pretrain)
    for name in ("vae_steps", "flow_steps", "steps"):  # an untrained model would replace the recipe's folder
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')}: expected a number >= 1, got {value}")
    if getattr(args, "card_only", False) and args.recipe not in extension.card_only:
        # a recipe that ignored the flag would train anew and overwrite the folder it was asked to re-measure
        honoured = sorted(r for e in extensions for r in e.card_only)
        raise UserError(
            f"--card-only: the {args.recipe} recipe cannot re-measure a folder without training; "
            f"recipes that can: {', '.join(honoured)}"
        )
    args.out = args.out or extension.pretrain_out.get(args.recipe)
    if getattr(args, "card_only", False):  # a card rewritten in place (small files), of a folder a recipe wrote
        if not any((Path(args.out) / marker).is_file() for marker in RECIPE_OUTPUT_MARKERS):
            raise UserError(
                f"--card-only: {args.out} holds no trained {args.recipe} output "
                f"({' or '.join(RECIPE_OUTPUT_MARKERS)} missing)"
            )
        extension.pretrain[args.recipe](args)
        return
    if args.out is None:
        extension.pretrain[args.recipe](args)
        return
    import shutil

    from flowrl.atomic import replaced_folder

    out = Path(args.out)
    refuse_foreign_folder(out)
    # a recipe that saves its stages (shapes-wan, shapes3d, shapes3d-text) keeps them here until its folder is in
    # place: the same command run again after an interruption continues from them
    args.progress = out.parent / f".{out.name}.progress"
    with replaced_folder(out) as work:  # an interrupted recipe leaves the previous folder whole
        args.out = str(work)
        extension.pretrain[args.recipe](args)
    shutil.rmtree(args.progress, ignore_errors=True)
    print(f"written to {out}")
