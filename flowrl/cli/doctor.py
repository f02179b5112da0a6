"""`flowrl doctor CONFIG [key=value ...]`: does the config's training reward rise on a few prompts with signal, and
if not, which figure says why?"""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    """The `doctor` subcommand: a config, its overrides, how long and on how many prompts, the output."""
    doctor = sub.add_parser(
        "doctor",
        help="train a config briefly on a few of its prompts with signal: does the reward rise, and if not, why?",
    )
    doctor.add_argument("config")
    doctor.add_argument("overrides", nargs="*", help="key=value, e.g. optim.lr=1e-3")
    doctor.add_argument("--updates", type=int, default=40, help="updates trained (default 40)")
    doctor.add_argument("--prompts", type=int, default=4, help="prompts trained, chosen for signal (default 4)")
    doctor.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="train this prompt of the config's prompt set instead of screened ones (repeat for more)",
    )
    doctor.add_argument(
        "--noise-draws",
        type=int,
        default=4,
        help="initial noises per prompt, and redraws of the later noise per initial noise, for the noise share "
        "(default 4; 0 skips it)",
    )
    doctor.add_argument(
        "--probe-every", type=int, default=10, help="measure the gradient signal-to-noise every N updates (0: never)"
    )
    doctor.add_argument("--out", type=Path, default=None, help="report folder (default: RUN.out_dir/doctor/RUN.name)")


def cmd_doctor(args) -> None:
    """Run the doctor, print its verdict and figures, write its report."""
    from flowrl.cli.arguments import report_folder
    from flowrl.config import load_config
    from flowrl.doctor import doctor, summary_lines, write_report
    from flowrl.errors import UserError

    for flag, value, least in (("--updates", args.updates, 2), ("--prompts", args.prompts, 1)):
        if value < least:
            raise UserError(f"{flag}: expected a whole number >= {least}, got {value}")
    for flag, value in (("--noise-draws", args.noise_draws), ("--probe-every", args.probe_every)):
        if value < 0:
            raise UserError(f"{flag}: expected a whole number >= 0, got {value}")
    if args.noise_draws == 1:
        raise UserError("--noise-draws: expected 0 (skip) or at least 2 (a variance needs two draws), got 1")
    config = load_config(args.config, args.overrides)
    out = report_folder(args.out, config, "doctor")
    draws, prompts = args.noise_draws, len(args.prompt) if args.prompt else args.prompts
    result = doctor(config, args.updates, prompts, draws, draws, args.probe_every, only=args.prompt)
    for line in summary_lines(result):
        print(line)
    written = write_report(result, out)
    print(f"report: {', '.join(str(p) for p in written)}")
