"""`flowrl sample`: samples (PNG, or MP4 + GIF for video) for a prompt file, drawn as the checkpoint's run evaluated
unless flags say otherwise, into a folder that a rerun resumes; steered by FK (flowrl/fk_flags.py) or a task's
steering flags where asked."""

from __future__ import annotations

from pathlib import Path

from flowrl import fk_flags
from flowrl.cli.arguments import (
    SAMPLE_BATCH_SIZE,
    SAMPLE_SEED,
    apply_memory_flags,
    check_checkpoint_folders,
    check_sampling_flags,
    fill_sampling_settings,
    sample_spec,
    sampling_arguments,
)
from flowrl.cli.extensions import TaskCommands
from flowrl.errors import UserError


def add_parser(sub, extensions: list[TaskCommands]) -> None:
    """The `sample` subcommand: what to sample and where, the sampling flags, the sampler, FK steering's flags and the
    tasks' own sampling flags."""
    sample = sub.add_parser("sample", help="generate samples (PNG, or MP4 + GIF for video) for a prompt file")
    sample.add_argument("--pipeline", required=True)
    sample.add_argument("--checkpoint", default=None, help="a run's checkpoint folder (LoRA or full weights)")
    sample.add_argument(
        "--prompts",
        required=True,
        help="a .txt file (one prompt per line) or .jsonl ('prompt' field; the other fields are kept in samples.jsonl)",
    )
    sample.add_argument(
        "--out",
        required=True,
        help="the samples folder; written as drawn, so the same command "
        "resumes an interrupted one (other settings into it are an error)",
    )
    sample.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sample k of prompt p draws from a seed derived "
        f"from this, p and k (default: the checkpoint's run's eval.seed, else {SAMPLE_SEED})",
    )
    sample.add_argument("--num-per-prompt", type=int, default=1)
    sample.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="samples per sampler call (default: the "
        "checkpoint's run's memory.rollout_microbatch, else 64; lower it for large images or long "
        "videos)",
    )
    sampling_arguments(sample)
    sample.add_argument(
        "--kind",
        default=None,
        help="sampler: ode (default) or a stochastic kind (flow, dance, "
        "sage, cps; ddim for epsilon pipelines; the default with --fk-particles)",
    )
    sample.add_argument("--noise-level", type=float, default=None, help="SDE noise level / DDIM eta")
    fk_flags.add_arguments(sample)
    for extension in extensions:
        if extension.sample_arguments is not None:
            extension.sample_arguments(sample)


def cmd_sample(args, extensions: list[TaskCommands]) -> None:
    """Draw `args.num_per_prompt` samples of every prompt of `args.prompts` into `args.out` (resuming what is there),
    with the checkpoint's weights, its run's sampling settings where no flag says otherwise, and at most one steer
    (FK, or a task's among `extensions`)."""
    from flowrl.checkpoint import load_trained_weights
    from flowrl.devices import job_processes
    from flowrl.inference import particle_sampler
    from flowrl.policies import load_pipeline, place_for_sampling, policy_for, sampling_placement
    from flowrl.resumable_sampling import check_sample_folder, draw_samples
    from flowrl.tasks.base import read_prompt_file

    conditions = read_prompt_file(args.prompts)
    check_sample_folder(Path(args.out))  # before the pipeline loads
    check_checkpoint_folders([args.checkpoint] if args.checkpoint else [])
    fill_sampling_settings(args, args.checkpoint)
    if args.batch_size is None:
        args.batch_size = SAMPLE_BATCH_SIZE
    if args.seed is None:
        args.seed = SAMPLE_SEED
    check_sampling_flags(args)
    fk_flags.check_reward(args)  # a wrong reward name or folder is said before the pipeline loads
    state = job_processes()  # under torchrun / accelerate launch: one share of the samples per process
    placement = sampling_placement(args.device, args.weight_dtype)
    # loaded in the dtype it samples in: no fp32 copy of a large model in host memory (an adapter is kept fp32)
    policy = policy_for(
        load_pipeline(args.pipeline, placement[1]),
        args.policy,
        args.policy_where,
        max_sequence_length=args.max_sequence_length,
    )
    policy.set_guidance_scale_2(args.guidance_2, "--guidance-2")
    policy.set_shift(args.shift, "--shift")
    policy.set_reference_size(args.reference_size, "--reference-size")
    if args.checkpoint:
        load_trained_weights(policy, args.checkpoint)
    steers = [s for s in (e.sample_steer(args, policy) for e in extensions if e.sample_steer) if s is not None]
    stochastic, stochastic_noise = particle_sampler(policy)
    # FK particles (--fk-particles, a task's FK steering) take a stochastic sampler unless --kind says otherwise
    particles = args.fk_particles or any(s.particles > 1 for s in steers)
    kind = args.kind or (stochastic if particles else "ode")
    if kind not in policy.kinds:
        raise UserError(f"--kind: a {type(policy.pipeline).__name__} samples with {list(policy.kinds)}, got {kind!r}")
    noise_level = (
        args.noise_level
        if args.noise_level is not None
        else (0.0 if kind == "ode" else stochastic_noise if kind == stochastic else 0.7)
    )
    fk_steer = fk_flags.steer(args, policy, placement[0])
    if fk_steer is not None:
        steers.append(fk_steer)
    if len(steers) > 1:
        raise UserError("--fk-particles and a task's steering flag: choose one kind of steering")
    precision = place_for_sampling(policy, placement, bool(args.offload_text_encoders))  # with a steer's adapter
    apply_memory_flags(policy, args)
    spec = sample_spec(args, policy)
    # what fixes the samples; not where they are made or how work is split (a resumed job may change those)
    unrecorded = ("out", "batch_size", "device", "vae_slicing", "decode_microbatch", "offload_text_encoders")
    settings = {
        k: v
        for k, v in sorted(vars(args).items())
        if k not in unrecorded and isinstance(v, (str, int, float, bool, type(None), list))
    }
    if settings.pop("vae_tiling", None):  # recorded only when on: off is the default a folder written before it had
        settings["vae_tiling"] = True
    settings.update(
        device_type=placement[0].type,
        weight_dtype=str(placement[1]).removeprefix("torch."),
        kind=kind,
        noise_level=noise_level,
        height=spec.height,
        width=spec.width,
        num_frames=spec.num_frames,
    )
    with precision():
        draw_samples(
            policy,
            conditions,
            args.num_per_prompt,
            args.seed,
            Path(args.out),
            settings,
            state,
            num_steps=args.steps,
            guidance_scale=args.guidance,
            spec=spec,
            kind=kind,
            noise_level=noise_level,
            batch_size=args.batch_size,
            steer=steers[0] if steers else None,
        )
