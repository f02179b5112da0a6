"""The `flowrl` command: train, diagnose, doctor, sample, export, eval, demo, the reward tools, and the tasks' own
commands (pretraining recipes, evaluation suites, sampling options), which each task contributes through
`Task.commands()`.

One module per command (`add_parser` and its handler); the sampling commands' shared flags in `arguments`; flags
that belong to a feature are registered by it (FK steering's in flowrl/fk_flags.py, VBench's in
flowrl/eval/vbench_command.py). Bad input (a config field, a missing file, a malformed flag) prints one line naming
it and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys

from flowrl.cli import convert_reward, demo, diagnose, doctor, export, pretrain, sample, serve_reward, train
from flowrl.cli import eval as evaluate
from flowrl.cli.extensions import TaskCommands, task_commands
from flowrl.errors import UserError

__all__ = ["TaskCommands", "main", "task_commands"]


def _parser(extensions: list[TaskCommands]) -> argparse.ArgumentParser:
    """The parser of every command, with the flags `extensions` (the tasks' commands) add."""
    parser = argparse.ArgumentParser(prog="flowrl", description="RL fine-tuning of diffusers flow pipelines")
    sub = parser.add_subparsers(dest="command", required=True)
    pretrain.add_parser(sub, extensions)
    train.add_parser(sub)
    diagnose.add_parser(sub)
    doctor.add_parser(sub)
    sample.add_parser(sub, extensions)
    export.add_parser(sub)
    serve_reward.add_parser(sub)
    convert_reward.add_parser(sub)
    demo.add_parser(sub)
    evaluate.add_parser(sub, extensions)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `flowrl ARGV` (None: the command line); returns the exit status: 0, 2 for bad input, 130 when
    interrupted. Under torchrun / accelerate launch with other processes the process ends here with that status
    instead (devices.end_processes)."""
    try:
        extensions = task_commands()
    except UserError as error:
        print(f"flowrl: error: {error}", file=sys.stderr)
        return 2
    args = _parser(extensions).parse_args(argv)
    commands = {
        "pretrain": lambda a: pretrain.cmd_pretrain(a, extensions),
        "train": train.cmd_train,
        "diagnose": diagnose.cmd_diagnose,
        "doctor": doctor.cmd_doctor,
        "sample": lambda a: sample.cmd_sample(a, extensions),
        "eval": lambda a: evaluate.cmd_eval(a, extensions),
        "demo": demo.cmd_demo,
        "export": export.cmd_export,
        "serve-reward": serve_reward.cmd_serve_reward,
        "convert-reward": convert_reward.cmd_convert_reward,
    }
    status = 0
    try:
        commands[args.command](args)
    except UserError as error:
        print(f"flowrl {args.command}: error: {error}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        print(f"flowrl {args.command}: interrupted", file=sys.stderr)
        status = 130
    if "torch.distributed" in sys.modules:  # (a command that never loaded torch made no process group)
        from flowrl.devices import end_processes

        end_processes(status)  # under torchrun / accelerate launch: the process leaves here, with this status
    return status
