"""`flowrl convert-reward KIND SRC DST`: turn a published reward checkpoint into the folder its adapter loads."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    """The `convert-reward` subcommand: the kind, the published file, the new folder and the towers' settings."""
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


def cmd_convert_reward(args) -> None:
    """Convert the published checkpoint `args.src` into the folder `args.dst`."""
    from flowrl.rewards.convert import convert_reward

    convert_reward(
        args.kind, Path(args.src), Path(args.dst), Path(args.tokenizer), args.vision_head_dim, args.text_head_dim
    )
    print(f"wrote {args.dst}; use it as {{name: {args.kind}, params: {{path: {args.dst}}}}}")
