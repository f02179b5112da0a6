"""`flowrl serve-reward NAME`: serve a registered reward over HTTP (for the `remote` reward)."""

from __future__ import annotations

import os

from flowrl.cli.arguments import check_port, json_object
from flowrl.errors import UserError


def add_parser(sub) -> None:
    """The `serve-reward` subcommand: the reward, its parameters, where to listen and the bearer token."""
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
        "--max-body-mb",
        type=float,
        default=None,
        help="refuse request bodies larger than this (default: 256; 64 images of 512x512 are 192 MB in fp32)",
    )
    serve.add_argument(
        "--token",
        default=os.environ.get("FLOWRL_REWARD_TOKEN"),
        help="require `Authorization: Bearer TOKEN` on every request (default: $FLOWRL_REWARD_TOKEN, "
        "which keeps it out of the process list)",
    )


def cmd_serve_reward(args) -> None:
    """Serve the reward `args.name` on `args.host`:`args.port` until interrupted."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError('serve-reward needs fastapi and uvicorn: pip install -e ".[serve]"') from None
    from flowrl.rewards.remote import serve_reward

    check_port(args.port)
    if args.max_body_mb is not None and not args.max_body_mb > 0:
        raise UserError(f"--max-body-mb: expected a positive number of MB, got {args.max_body_mb}")
    limit = {} if args.max_body_mb is None else {"max_body_mb": args.max_body_mb}
    serve_reward(
        args.name, json_object(args.params, "--params"), args.host, args.port, args.token, args.device, **limit
    )
