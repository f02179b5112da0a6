"""`flowrl eval vbench`: VBench's flags on the eval command (`add_arguments`) and its handler (`cmd_eval_vbench`):
score clips with the real vbench package in its own environment (flowrl/eval/vbench.py), aggregate a results
file, or create that environment."""

from __future__ import annotations

from pathlib import Path

from flowrl.errors import UserError


def add_arguments(parser) -> None:
    """Add VBench's flags to the eval command's parser (its --device is the command's own, shared with rewards)."""
    parser.add_argument("--dimensions", default="temporal_flickering", help="vbench: comma-separated VBench dimensions")
    parser.add_argument(
        "--python", default=None, help="vbench: the python of a VBench environment (default: $FLOWRL_VBENCH_PYTHON)"
    )
    parser.add_argument(
        "--vbench-cache",
        default=None,
        help="vbench: folder of VBench's model weights (default: $VBENCH_CACHE_DIR or ~/.cache/vbench)",
    )
    parser.add_argument(
        "--make-env", default=None, metavar="DIR", help="vbench: create VBench's own environment in DIR"
    )
    parser.add_argument(
        "--results",
        default=None,
        metavar="FILE",
        help="vbench: aggregate an existing VBench or "
        "VBench-2.0 *_eval_results.json (Quality / Semantic / Total, or the five category means)",
    )


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
