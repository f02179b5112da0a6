"""The `flowrl` command: train, sample, eval, demo, and the tasks' own commands (pretraining recipes, evaluation
suites, sampling options), which each task contributes through `Task.commands()`.

Bad input (a config field, a missing file, a malformed flag) prints one line naming it and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flowrl.errors import UserError


@dataclass
class TaskCommands:
    """What a task adds to the CLI. Handlers take the parsed arguments."""

    pretrain: dict[str, Callable] = field(default_factory=dict)  # recipe name -> handler
    card_only: tuple[str, ...] = ()  # the recipes that honour --card-only (re-measure a folder, no training)
    pretrain_out: dict[str, str] = field(default_factory=dict)  # recipe name -> its --out default
    pretrain_help: str = ""
    pretrain_arguments: Callable | None = None  # (parser) -> None
    eval_suites: dict[str, Callable] = field(default_factory=dict)  # suite name -> handler
    eval_arguments: Callable | None = None
    sample_arguments: Callable | None = None
    sample_steer: Callable | None = None  # (args, policy) -> a generate.Steer, or None when its flags are unset


def task_commands() -> list[TaskCommands]:
    """The commands of every registered task (each set once, however many tasks share it)."""
    from flowrl.tasks.base import TASKS

    found: list[TaskCommands] = []
    for name in TASKS.names():
        commands = TASKS.get(name, "task").commands()
        if commands is not None and all(commands is not other for other in found):
            found.append(commands)
    return found


def _parser(extensions: list[TaskCommands]) -> argparse.ArgumentParser:
    from flowrl.tasks.base import TASKS

    parser = argparse.ArgumentParser(prog="flowrl", description="RL fine-tuning of diffusers flow pipelines")
    sub = parser.add_subparsers(dest="command", required=True)

    recipes = sorted(r for e in extensions for r in e.pretrain)
    pre = sub.add_parser("pretrain", help="train an embedded default pipeline (or scorer, probe) with a task's recipe")
    pre.add_argument("recipe", choices=recipes, help="; ".join(e.pretrain_help for e in extensions if e.pretrain_help))
    pre.add_argument("--out", default=None, help="output folder (default: the recipe's folder under pipelines/)")
    pre.add_argument("--seed", type=int, default=0)

    train = sub.add_parser("train", help="run an experiment config")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="key=value, e.g. train.updates=10 resume=PATH")

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
        "checkpoint's run's train.rollout_microbatch, else 64; lower it for large images or long "
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
    sample.add_argument("--fk-particles", type=int, default=0, help="FK steering with K particles per sample")
    sample.add_argument("--fk-lambda", type=float, default=10.0)
    sample.add_argument("--fk-potential", default="diff", choices=["diff", "max", "add", "rt"])
    sample.add_argument("--fk-every", type=int, default=2, help="steps between scheduled resamplings")
    sample.add_argument("--fk-reward", default="shapes_clip", help="reward the particles are steered towards")
    sample.add_argument(
        "--fk-reward-params",
        default="{}",
        help='the FK reward\'s parameters as JSON (e.g. \'{"path": "models/PickScore_v1"}\')',
    )

    export = sub.add_parser("export", help="write a checkpoint's model as a plain diffusers pipeline folder")
    export.add_argument("--pipeline", required=True, help="the pipeline folder the run trained")
    export.add_argument("--checkpoint", required=True, help="a run's checkpoint folder (LoRA or full weights)")
    export.add_argument("--out", required=True, help="the new pipeline folder (save_pretrained layout)")
    export.add_argument(
        "--dtype",
        default=None,
        choices=["fp32", "fp16", "bf16"],
        help="the written weights' "
        "precision, and the one it loads in (each weight gets the fp32 LoRA update, rounded once); "
        "default: the one the pipeline folder stores its denoiser in (bf16 for released models: "
        "fp32 would double their folder and host memory)",
    )

    serve = sub.add_parser("serve-reward", help="serve a registered reward over HTTP (for the `remote` reward)")
    serve.add_argument("name", help="a registered reward or package.module:Name")
    serve.add_argument("--params", default="{}", help="the reward's parameters as JSON")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument(
        "--device",
        default=None,
        help="where the reward's models run (default: the GPU of LOCAL_RANK when there is one, else cpu)",
    )
    serve.add_argument(
        "--token",
        default=os.environ.get("FLOWRL_REWARD_TOKEN"),
        help="require `Authorization: Bearer TOKEN` on every request (default: $FLOWRL_REWARD_TOKEN, "
        "which keeps it out of the process list)",
    )

    convert = sub.add_parser(
        "convert-reward",
        help="turn a published reward checkpoint into the folder its "
        "adapter loads (hpsv2: HPS_v2.1_compressed.pt; imagereward: "
        "ImageReward.pt)",
    )
    convert.add_argument("kind", choices=["hpsv2", "imagereward"])
    convert.add_argument("src", help="the published checkpoint file")
    convert.add_argument("dst", help="the new folder (params.path of the reward)")
    convert.add_argument(
        "--tokenizer",
        required=True,
        help="a saved tokenizer folder: OpenAI CLIP's BPE for hpsv2, bert-base-uncased for imagereward",
    )
    convert.add_argument(
        "--vision-head-dim",
        type=int,
        default=None,
        help="head width of the image tower (default: the published model's)",
    )
    convert.add_argument("--text-head-dim", type=int, default=None, help="head width of the text tower")

    demo = sub.add_parser("demo", help="Gradio page: the base model and checkpoints side by side")
    demo.add_argument("--pipeline", required=True)
    demo.add_argument("--checkpoint", action="append", default=[], help="a checkpoint folder; repeat for several")
    demo.add_argument(
        "--reward",
        default=None,
        help="reward shown under each sample (default: shapes_clip; "
        "silhouette_iou for 3D pipelines, shapes_edit for editing ones, frame_consistency for video)",
    )
    demo.add_argument("--reward-params", default="{}", help="the reward's parameters as JSON")
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1: this machine only)")
    demo.add_argument("--port", type=int, default=7860)
    sampling_arguments(demo)

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
    ev.add_argument("--dimensions", default="temporal_flickering", help="vbench: comma-separated VBench dimensions")
    ev.add_argument(
        "--python", default=None, help="vbench: the python of a VBench environment (default: $FLOWRL_VBENCH_PYTHON)"
    )
    ev.add_argument(
        "--vbench-cache",
        default=None,
        help="vbench: folder of VBench's model weights (default: $VBENCH_CACHE_DIR or ~/.cache/vbench)",
    )
    ev.add_argument(
        "--device",
        default=None,
        help="rewards, vbench: where the models run, cpu, cuda or cuda:N "
        "(default: cuda:LOCAL_RANK when there is a GPU)",
    )
    ev.add_argument("--batch-size", type=int, default=32, help="rewards: samples read and scored at a time")
    ev.add_argument("--make-env", default=None, metavar="DIR", help="vbench: create VBench's own environment in DIR")
    ev.add_argument(
        "--results",
        default=None,
        metavar="FILE",
        help="vbench: aggregate an existing VBench or "
        "VBench-2.0 *_eval_results.json (Quality / Semantic / Total, or the five category means)",
    )

    for extension in extensions:
        for hook, target in (
            (extension.pretrain_arguments, pre),
            (extension.eval_arguments, ev),
            (extension.sample_arguments, sample),
        ):
            if hook is not None:
                hook(target)
    return parser


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
    from flowrl.atomic import replaced_folder

    out = args.out
    refuse_foreign_folder(Path(out))
    with replaced_folder(Path(out)) as work:  # an interrupted recipe leaves the previous folder whole
        args.out = str(work)
        extension.pretrain[args.recipe](args)
    print(f"written to {out}")


def cmd_train(args) -> None:
    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    # `resume=PATH` is short for `run.resume=PATH`
    overrides = ["run." + o if o.startswith("resume=") else o for o in args.overrides]
    config = load_config(args.config, overrides)
    run_dir = run_experiment(config)
    print(f"run written to {run_dir} (report: {run_dir / 'report.html'})")


def cmd_sample(args, extensions: list[TaskCommands]) -> None:
    from flowrl.checkpoint import load_trained_weights
    from flowrl.devices import job_processes
    from flowrl.generate import particle_sampler
    from flowrl.policies import load_pipeline, place_for_sampling, policy_for, sampling_placement
    from flowrl.sample_job import check_sample_folder, draw_samples
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
    if args.fk_particles:  # a wrong reward name or folder is said before the pipeline loads
        from flowrl.rewards import check_reward

        check_reward(args.fk_reward, json_object(args.fk_reward_params, "--fk-reward-params"), "--fk-reward")
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
    if args.fk_particles:
        from flowrl.fk import FKConfig, FKSteer
        from flowrl.rewards import build_reward

        fk = FKConfig(
            num_particles=args.fk_particles,
            lam=args.fk_lambda,
            potential=args.fk_potential,
            resample_every=args.fk_every,
        )
        fk.validate("--fk")
        params = json_object(args.fk_reward_params, "--fk-reward-params")
        fk_reward = build_reward(args.fk_reward, where="--fk-reward", **params).to(placement[0])
        fk_reward.bind_policy(policy)
        steers.append(FKSteer(fk, fk_reward))
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


def cmd_export(args) -> None:
    from flowrl.export import export_pipeline

    out = export_pipeline(args.pipeline, args.checkpoint, args.out, args.dtype)
    print(f"wrote the tuned pipeline to {out} (load it with DiffusionPipeline.from_pretrained)")


def cmd_convert_reward(args) -> None:
    from flowrl.rewards.convert import convert_reward

    convert_reward(
        args.kind, Path(args.src), Path(args.dst), Path(args.tokenizer), args.vision_head_dim, args.text_head_dim
    )
    print(f"wrote {args.dst}; use it as {{name: {args.kind}, params: {{path: {args.dst}}}}}")


def json_object(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: expected a JSON object, got {text!r}")
    return value


def cmd_serve_reward(args) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError('serve-reward needs fastapi and uvicorn: pip install -e ".[serve]"') from None
    from flowrl.rewards.remote import serve_reward

    check_port(args.port)
    serve_reward(args.name, json_object(args.params, "--params"), args.host, args.port, args.token, args.device)


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise UserError(f"--port: expected a TCP port in 0..65535, got {port}")


def size_arguments(parser) -> None:
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
        "sampler call's (default: the checkpoint's run's train.decode_microbatch, else 0)",
    )
    parser.add_argument(
        "--offload-text-encoders",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep the text encoders on the CPU except while encoding " + memory.format("train.offload_text_encoders"),
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU when there is one)")
    parser.add_argument(
        "--weight-dtype",
        default=None,
        choices=["fp32", "fp16", "bf16"],
        help="frozen weights' precision (default: the checkpoint's run's train.weight_dtype, else "
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


def cmd_demo(args) -> None:
    try:
        import gradio  # noqa: F401
    except ImportError:
        raise UserError('the demo needs gradio: pip install -e ".[demo]"') from None
    from flowrl.demo import build_demo

    check_port(args.port)
    check_checkpoint_folders(args.checkpoint)
    fill_sampling_settings(args, args.checkpoint[0] if args.checkpoint else None)
    check_sampling_flags(args)
    demo = build_demo(
        args.pipeline,
        args.checkpoint,
        args.reward,
        args.steps,
        args.guidance,
        args.max_sequence_length,
        (args.height, args.width, args.num_frames),
        args.device,
        args.weight_dtype,
        json_object(args.reward_params, "--reward-params"),
        args.guidance_2,
        args.policy,
        args.policy_where,
        args.shift,
        args.reference_size,
        lambda policy: apply_memory_flags(policy, args),
        bool(args.offload_text_encoders),
    )
    # a server stopped by SIGTERM (a service manager, `kill`) exits as after Ctrl-C, so its files are cleaned up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    demo.queue().launch(server_name=args.host, server_port=args.port, show_error=True)


# fields a samples.jsonl line gives the sample itself (its seed, files, size, resume key and a steer's per-sample
# record), not its condition
SAMPLE_FIELDS = (
    "prompt",
    "seed",
    "file",
    "extra_files",
    "modality",
    "height",
    "width",
    "fps",
    "plan",
    "fk_reward",
    "probe_fired_at",
)


def read_conditions(folder: str, records: list[dict]) -> list:
    """The condition item of every sample record: its prompt, and the record's other fields but the sample's own
    (seed, files, size) as metadata, so the samples of one prompt-file line share one condition."""
    from flowrl.tasks.base import Condition

    items = []
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("prompt"), str):
            raise UserError(f"{Path(folder) / 'samples.jsonl'} line {number}: expected a 'prompt' string")
        items.append(Condition(record["prompt"], meta={k: v for k, v in record.items() if k not in SAMPLE_FIELDS}))
    return items


def cmd_eval_task(args) -> None:
    """`flowrl eval TASK --samples DIR`: the task's evaluation of a samples folder, to DIR/TASK_eval.json."""
    from flowrl.report import save_json
    from flowrl.samples import read_samples
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

    from flowrl.sample_job import SETTINGS_FILE

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
    from flowrl.generate import contiguous_share
    from flowrl.report import save_json
    from flowrl.rewards import build_reward
    from flowrl.samples import load_samples, read_records
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


def cmd_eval_vbench(args) -> None:
    """`flowrl eval vbench`: score clips with the real vbench package in its own environment, aggregate a results
    file, or create that environment."""
    from flowrl.eval import vbench
    from flowrl.report import save_json

    if args.make_env:
        python = vbench.make_environment(args.make_env)
        print(f"VBench environment ready: pass --python {python} (or export FLOWRL_VBENCH_PYTHON={python})")
        return
    if args.results:
        result = vbench.parse_results(Path(args.results))
        out = Path(args.results).with_name("vbench_eval.json")
    else:
        if args.samples is None:
            raise UserError(
                "eval vbench: expected --samples DIR (clips written by `flowrl sample`), --results FILE "
                "or --make-env DIR"
            )
        dimensions = [d.strip() for d in args.dimensions.split(",") if d.strip()]
        from flowrl.devices import chosen_device

        result = vbench.run_vbench(
            args.samples, dimensions, args.python, args.vbench_cache, str(chosen_device(args.device))
        )
        out = Path(args.samples) / "vbench_eval.json"
    save_json(out, result)  # (a NaN interval as null)
    print(vbench.format_scores(result))
    print(f"written to {out}")


def cmd_eval(args, extensions: list[TaskCommands]) -> None:
    from flowrl.tasks.base import TASKS

    # `safety` names a task and a suite: with --samples it is the task's evaluation of that folder
    samples_of_a_task = args.samples is not None and args.suite in TASKS.names()
    for extension in extensions:
        if args.suite in extension.eval_suites and not samples_of_a_task:
            return extension.eval_suites[args.suite](args)

    if args.suite == "vbench":
        return cmd_eval_vbench(args)
    known = sorted(set(TASKS.names() + ["rewards", "vbench"] + [s for e in extensions for s in e.eval_suites]))
    if args.suite not in known and ":" not in args.suite:
        raise UserError(f"eval: unknown suite {args.suite!r}; expected one of {known} or a task's dotted path")
    if args.samples is None:
        raise UserError(f"eval {args.suite}: expected --samples DIR (a folder written by `flowrl sample`)")
    if args.suite == "rewards":
        return cmd_eval_rewards(args)
    return cmd_eval_task(args)


def main(argv: list[str] | None = None) -> int:
    try:
        extensions = task_commands()
    except UserError as error:
        print(f"flowrl: error: {error}", file=sys.stderr)
        return 2
    args = _parser(extensions).parse_args(argv)
    commands = {
        "pretrain": lambda a: cmd_pretrain(a, extensions),
        "train": cmd_train,
        "sample": lambda a: cmd_sample(a, extensions),
        "eval": lambda a: cmd_eval(a, extensions),
        "demo": cmd_demo,
        "export": cmd_export,
        "serve-reward": cmd_serve_reward,
        "convert-reward": cmd_convert_reward,
    }
    try:
        commands[args.command](args)
    except UserError as error:
        print(f"flowrl {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flowrl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
