"""`flowrl diagnose CONFIG [key=value ...]`: whether the config's base gives its groups signal, before training."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    """The `diagnose` subcommand: a config, its overrides, how many batches, a success threshold, the output."""
    diagnose = sub.add_parser(
        "diagnose", help="draw a few groups from the base with a config's sampler, prompts and reward: is there signal?"
    )
    diagnose.add_argument("config")
    diagnose.add_argument("overrides", nargs="*", help="key=value, e.g. train.groups_per_update=16")
    diagnose.add_argument(
        "--updates", type=int, default=1, help="batches drawn (the config's groups of one update each)"
    )
    diagnose.add_argument(
        "--success-threshold",
        type=float,
        default=None,
        help="a reward at or above this is a success (pass@1 / pass@G); default: the reward's own accuracy, if any",
    )
    diagnose.add_argument(
        "--out", type=Path, default=None, help="report folder (default: RUN.out_dir/diagnose/RUN.name)"
    )


def cmd_diagnose(args) -> None:
    """Run the diagnosis, print its figures and verdict, write its report."""
    from flowrl.cli.arguments import report_folder
    from flowrl.config import load_config
    from flowrl.diagnose import diagnose, summary_lines, write_report
    from flowrl.errors import UserError

    if args.updates < 1:
        raise UserError(f"--updates: expected a whole number >= 1, got {args.updates}")
    config = load_config(args.config, args.overrides)
    out = report_folder(args.out, config, "diagnose")
    result = diagnose(config, args.updates, args.success_threshold)
    for line in summary_lines(result):
        print(line)
    written = write_report(result, out)
    print(f"report: {', '.join(str(p) for p in written)}")
