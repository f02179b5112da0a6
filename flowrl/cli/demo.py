"""`flowrl demo`: the Gradio page (flowrl/demo.py) with the base model and checkpoints side by side, sampling as
`flowrl sample` does."""

from __future__ import annotations

import signal
import sys

from flowrl.cli.arguments import (
    apply_memory_flags,
    check_checkpoint_folders,
    check_port,
    check_sampling_flags,
    fill_sampling_settings,
    json_object,
    sampling_arguments,
)
from flowrl.errors import UserError


def add_parser(sub) -> None:
    """The `demo` subcommand: --pipeline, --checkpoint (repeatable), the shown reward, where to serve, and the
    sampling flags."""
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


def cmd_demo(args) -> None:
    """Check the flags, fill the sampling settings from the first checkpoint's run, build the page and serve it until
    interrupted (or SIGTERM)."""
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
