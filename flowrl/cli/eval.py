"""`flowrl eval SUITE`: score a samples folder with a task's evaluation (`flowrl eval TASK --samples DIR`) or a reward
(`flowrl eval rewards`), run a task's own suite, or VBench (flowrl/eval/vbench_command.py)."""

from __future__ import annotations

import json
from pathlib import Path

from flowrl.cli.arguments import json_object
from flowrl.cli.extensions import TaskCommands
from flowrl.errors import UserError
from flowrl.eval import vbench_command


def add_parser(sub, extensions: list[TaskCommands]) -> None:
    """The `eval` subcommand: the suite, the samples folder, the rewards' flags, VBench's and the tasks' own."""
    from flowrl.tasks.base import TASKS

    suites = sorted(s for e in extensions for s in e.eval_suites)
    ev = sub.add_parser(
        "eval", help="score a samples folder with a task's evaluation or a reward, or run a task's own suite"
    )
    ev.add_argument(
        "suite",
        help=f"a task ({', '.join(TASKS.names())}, or package.module:Class): its evaluation "
        f"of --samples; rewards: the mean of --reward per tag; vbench: the real VBench package on clips; or a "
        f"task's suite ({', '.join(suites)})",
    )
    ev.add_argument("--samples", default=None, help="a folder written by `flowrl sample`")
    ev.add_argument("--reward", default=None, help="rewards: a registered reward or package.module:Name")
    ev.add_argument("--reward-params", default="{}", help="rewards: the reward's parameters as JSON")
    ev.add_argument(
        "--device",
        default=None,
        help="rewards, vbench: where the models run, cpu, cuda or cuda:N "
        "(default: cuda:LOCAL_RANK when there is a GPU)",
    )
    ev.add_argument("--batch-size", type=int, default=32, help="rewards: samples read and scored at a time")
    vbench_command.add_arguments(ev)
    for extension in extensions:
        if extension.eval_arguments is not None:
            extension.eval_arguments(ev)


def cmd_eval_task(args) -> None:
    """`flowrl eval TASK --samples DIR`: the task's evaluation of a samples folder, to DIR/TASK_eval.json."""
    from flowrl.report import save_json
    from flowrl.sample_io import read_conditions, read_samples
    from flowrl.tasks.base import build_task, format_metrics

    task = build_task(args.suite)
    samples, records = read_samples(args.samples)
    items = read_conditions(args.samples, records)
    for number, item in enumerate(items, start=1):
        try:
            task.check(item)
        except ValueError as error:
            raise UserError(f"{Path(args.samples) / 'samples.jsonl'} line {number}: {error}") from None
    result = task.evaluate(samples, items)
    if result is None:
        raise UserError(
            f"eval {args.suite}: the task has no evaluation of its own; use "
            "`flowrl eval rewards --samples DIR --reward NAME`"
        )
    out = Path(args.samples) / f"{task.name}_eval.json"
    save_json(out, result)  # (a NaN interval as null)
    print(format_metrics(result))
    print(f"written to {out}")


def sampled_policy_facts(folder: Path):
    """What a reward bound to the sampling policy needs of it (`Reward.bind_policy`), from a samples folder's
    sampling.json: the editor's reference size (its sources taken at their own aspect or at the sample size)."""
    from types import SimpleNamespace

    from flowrl.resumable_sampling import SETTINGS_FILE

    settings = folder / SETTINGS_FILE
    sampled = json.loads(settings.read_text()) if settings.is_file() else {}
    return SimpleNamespace(reference_size=sampled.get("reference_size"))


def cmd_eval_rewards(args) -> None:
    """`flowrl eval rewards --samples DIR --reward NAME`: the mean reward per tag, to DIR/rewards_eval.json. Under
    torchrun / accelerate launch every process scores a contiguous share of the batches on its own GPU, and the main
    process writes the result."""
    from tqdm import tqdm

    from flowrl.devices import JOB_TIMEOUT_MINUTES, chosen_device, job_processes
    from flowrl.experiment import gathered_on_main, group_spans, reward_scores, tag_metrics_of
    from flowrl.inference import contiguous_share
    from flowrl.report import save_json
    from flowrl.rewards import build_reward
    from flowrl.sample_io import load_samples, read_conditions, read_records
    from flowrl.tasks.base import format_metrics

    if args.reward is None:
        raise UserError("eval rewards: expected --reward NAME (a registered reward or package.module:Name)")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: expected an integer >= 1, got {args.batch_size}")
    params = json_object(args.reward_params, "--reward-params")
    state = job_processes()
    device = chosen_device(args.device)
    reward = build_reward(args.reward, where="--reward", **params).to(device)
    reward.bind_policy(sampled_policy_facts(Path(args.samples)))
    records = read_records(args.samples)
    items = read_conditions(args.samples, records)
    # a batch of files at a time (a large folder of 1024 px images or of clips never sits in memory whole); for a
    # reward that scores groups (a group rubric), with whole runs of one condition's samples
    spans = group_spans(items, args.batch_size, reward.scores_groups)
    spans = [spans[i] for i in contiguous_share(len(spans), state.process_index, state.num_processes)]
    if state.num_processes > 1:
        print(
            f"process {state.process_index} of {state.num_processes}: scoring {sum(b - a for a, b in spans)} samples",
            flush=True,
        )
    batches = ((load_samples(args.samples, records[a:b]), items[a:b]) for a, b in spans)
    scores = reward_scores(
        reward, tqdm(batches, total=len(spans), desc="scoring", mininterval=2, disable=not state.is_main_process)
    )
    parts = gathered_on_main(scores, state.num_processes, JOB_TIMEOUT_MINUTES)  # each process's list, in order
    state.wait_for_everyone()  # nobody exits while its share may still be in flight
    if not state.is_main_process:
        return
    scores = [s for part in parts for s in part]
    result = {"reward": args.reward, **tag_metrics_of(scores, items)}
    out = Path(args.samples) / "rewards_eval.json"
    save_json(out, result)  # (a NaN interval as null)
    print(format_metrics(result))
    print(f"written to {out}")


def cmd_eval(args, extensions: list[TaskCommands]) -> None:
    """`flowrl eval SUITE`: a task's own suite, VBench, the rewards' mean, or a task's evaluation of --samples."""
    from flowrl.tasks.base import TASKS

    # `safety` names a task and a suite: with --samples it is the task's evaluation of that folder
    samples_of_a_task = args.samples is not None and args.suite in TASKS.names()
    for extension in extensions:
        if args.suite in extension.eval_suites and not samples_of_a_task:
            return extension.eval_suites[args.suite](args)

    if args.suite == "vbench":
        return vbench_command.cmd_eval_vbench(args)
    known = sorted(set(TASKS.names() + ["rewards", "vbench"] + [s for e in extensions for s in e.eval_suites]))
    if args.suite not in known and ":" not in args.suite:
        raise UserError(f"eval: unknown suite {args.suite!r}; expected one of {known} or a task's dotted path")
    if args.samples is None:
        raise UserError(f"eval {args.suite}: expected --samples DIR (a folder written by `flowrl sample`)")
    if args.suite == "rewards":
        return cmd_eval_rewards(args)
    return cmd_eval_task(args)
