"""Argument helpers the commands share: JSON and port flags, report and checkpoint folders, and the sampling
commands' flags (`sample`, `demo`): their registration, defaults filled from the checkpoint's run, checks, memory
options and sample size."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flowrl.errors import UserError


def json_object(text: str, flag: str) -> dict:
    """`text` parsed as a JSON object; a UserError naming `flag` for anything else."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: expected a JSON object, got {text!r}")
    return value


def report_folder(out: Path | None, config, command: str) -> Path:
    """A config command's report folder, made: `out`, or RUN.out_dir/COMMAND/RUN.name; a UserError naming --out when
    it cannot be made."""
    out = out or Path(config.run.out_dir) / command / config.run.name
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"--out: cannot create the folder {out} ({error.strerror})") from None
    return out


def check_port(port: int) -> None:
    """A UserError for a --port outside 0..65535."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port: expected a TCP port in 0..65535, got {port}")


def size_arguments(parser) -> None:
    """Add --height, --width and --num-frames (None: the run's or the pipeline's own) to `parser`."""
    run_or_own = "the checkpoint's run's pipeline section, else the pipeline's own"
    parser.add_argument("--height", type=int, default=None, help=f"default: {run_or_own}")
    parser.add_argument("--width", type=int, default=None, help=f"default: {run_or_own}")
    parser.add_argument("--num-frames", type=int, default=None, help=f"video pipelines (default: {run_or_own})")


SAMPLING_DEFAULTS = {"steps": 20, "guidance": 4.5}  # where neither the command line nor a run's config says
SAMPLE_SEED = 0  # flowrl sample's --seed where neither the command line nor a run's eval.seed says
SAMPLE_BATCH_SIZE = 64  # flowrl sample's samples per sampler call, where neither --batch-size nor a run says


# the sampling commands' counting flags and the least each takes
LEAST_VALUES = {
    "seed": 0,
    "num_per_prompt": 1,
    "batch_size": 1,
    "steps": 1,
    "noise_level": 0,
    "decode_microbatch": 0,
    "height": 1,
    "width": 1,
    "num_frames": 1,
    "max_sequence_length": 1,
    "reference_size": 1,
}


def check_sampling_flags(args) -> None:
    """One error naming the first flag below its least value (LEAST_VALUES), before any weights load; call after
    `fill_sampling_settings`, so a run's own settings are checked too."""
    for name, least in LEAST_VALUES.items():
        value = getattr(args, name, None)
        if value is not None and value < least:
            raise UserError(f"--{name.replace('_', '-')}: expected a number >= {least}, got {value}")
    if getattr(args, "shift", None) is not None and args.shift <= 0:  # sigma' = s sigma / (1 + (s - 1) sigma)
        raise UserError(f"--shift: expected a positive number, got {args.shift}")


def apply_memory_flags(policy, args) -> None:
    """The sampling commands' memory flags (given, or the checkpoint's run's) on a placed policy."""
    policy.set_memory_options(
        vae_slicing=bool(args.vae_slicing),
        vae_tiling=bool(args.vae_tiling),
        offload_text_encoders=bool(args.offload_text_encoders),
        decode_microbatch=args.decode_microbatch or 0,
    )


def sampling_arguments(parser) -> None:
    """How a sampling command (`sample`, `demo`) draws: given flags win, then what the checkpoint's run evaluated
    with (its config.yaml), then SAMPLING_DEFAULTS and the pipeline's own; placed as a run would place the model."""
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"sampler steps (default: the checkpoint's run's eval.num_steps, else {SAMPLING_DEFAULTS['steps']})",
    )
    parser.add_argument(
        "--guidance",
        type=float,
        default=None,
        help=f"CFG scale (default: the checkpoint's run's eval.guidance_scale, else {SAMPLING_DEFAULTS['guidance']})",
    )
    parser.add_argument(
        "--guidance-2",
        type=float,
        default=None,
        help="Wan2.2's two experts: the low-noise one's "
        "CFG scale (default: the checkpoint's run's pipeline.guidance_scale_2, else --guidance)",
    )
    parser.add_argument(
        "--shift",
        type=float,
        default=None,
        help="the flow schedule's shift (default: the "
        "checkpoint's run's pipeline.shift, else the pipeline folder's scheduler config)",
    )
    parser.add_argument(
        "--reference-size",
        type=int,
        default=None,
        help="editors with reference images (FLUX.2, "
        "Qwen-Image-Edit): size each as the pipeline does for an N x N area (1024: the pipeline's "
        "own; default: the checkpoint's run's pipeline.reference_size, else the sample size)",
    )
    size_arguments(parser)
    parser.add_argument(
        "--max-sequence-length",
        type=int,
        default=None,
        help="text tokens (default: the "
        "checkpoint's run's pipeline.max_sequence_length, else the pipeline's own or the shorter "
        "length its tokenizers declare: 16 for the embedded ones)",
    )
    memory = "(default: the checkpoint's run's {}, else off)"
    parser.add_argument(
        "--vae-tiling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode in overlapping tiles (large images, long videos) " + memory.format("pipeline.vae_tiling"),
    )
    parser.add_argument(
        "--vae-slicing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode one sample at a time inside the VAE " + memory.format("pipeline.vae_slicing"),
    )
    parser.add_argument(
        "--decode-microbatch",
        type=int,
        default=None,
        help="samples per VAE decode, 0: all of a "
        "sampler call's (default: the checkpoint's run's memory.decode_microbatch, else 0)",
    )
    parser.add_argument(
        "--offload-text-encoders",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the text encoders on the CPU except while encoding " + memory.format("memory.offload_text_encoders"),
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
    parser.add_argument(
        "--weight-dtype",
        default=None,
        choices=["fp32", "fp16", "bf16"],
        help="frozen weights' precision (default: the checkpoint's run's memory.weight_dtype, else "
        "bf16 on a GPU, fp32 on the CPU)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="the adapter: a registered name (e.g. a pipeline class) or "
        "package.module:Class (default: the checkpoint's run's pipeline.policy, else the one "
        "registered for the pipeline's class)",
    )


def check_checkpoint_folders(checkpoints: list[str]) -> None:
    """One error for a --checkpoint without trained weights, before any setting is read or model loaded."""
    from flowrl.checkpoint import trained_weights_file

    for checkpoint in checkpoints:
        trained_weights_file(Path(checkpoint))


def fill_sampling_settings(args, checkpoint: str | None) -> None:
    """Fill the sampling flags not given: from the checkpoint's run (said on stdout), then SAMPLING_DEFAULTS. Sets
    `args.policy_where`, what an error about the adapter names: --policy, or the run's config."""
    from flowrl.checkpoint import RUN_CONFIG, run_sampling_settings

    settings, source = run_sampling_settings(checkpoint)
    if checkpoint and source is None:
        print(
            f"checkpoint {checkpoint}: no run config found (its {RUN_CONFIG}, or the run dir's config.yaml two "
            "folders up): sampling with flowrl's defaults and the pipeline's own settings, which may not be what the "
            "run evaluated with"
        )
    taken = {k: v for k, v in settings.items() if hasattr(args, k) and getattr(args, k) is None}
    args.policy_where = f"pipeline.policy in {source}" if "policy" in taken else "--policy"
    for key, value in {**SAMPLING_DEFAULTS, **taken}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if taken:
        flags = ", ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in taken.items())
        print(f"sampling as the run evaluated ({source}): {flags}")


def sample_spec(args, policy):
    """The sample size from --height / --width / --num-frames, each defaulting to the pipeline's own."""
    return policy.sample_spec(args.height, args.width, args.num_frames, ("--height", "--width"))
