"""`flowrl export`: write a checkpoint's model as a plain diffusers pipeline folder."""

from __future__ import annotations


def add_parser(sub) -> None:
    """The `export` subcommand: --pipeline, --checkpoint, --out and --dtype."""
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


def cmd_export(args) -> None:
    """Write `args.checkpoint`'s model on `args.pipeline` as a diffusers pipeline folder `args.out`."""
    from flowrl.export import export_pipeline

    out = export_pipeline(args.pipeline, args.checkpoint, args.out, args.dtype)
    print(f"wrote the tuned pipeline to {out} (load it with DiffusionPipeline.from_pretrained)")
