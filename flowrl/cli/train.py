"""`flowrl train CONFIG [key=value ...]`: run an experiment config."""

from __future__ import annotations


def add_parser(sub) -> None:
    """The `train` subcommand: a config file and its overrides."""
    train = sub.add_parser("train", help="run an experiment config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="key=value, e.g. train.updates=10 resume=PATH")


def cmd_train(args) -> None:
    """Run the experiment `args.config` with `args.overrides` and say where its run dir and report are."""
    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    # `resume=PATH` is short for `run.resume=PATH`
    overrides = ["run." + o if o.startswith("resume=") else o for o in args.overrides]
    config = load_config(args.config, overrides)
    run_dir = run_experiment(config)
    print(f"run written to {run_dir} (report: {run_dir / 'report.html'})")
