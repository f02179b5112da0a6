"""`flowrl convert-reward hpsv2|imagereward SRC DST`: the published reward checkpoints turned into the folders the
`hpsv2` and `imagereward` adapters load (learned_real.py), with nothing fetched from a hub.

- hpsv2: SRC is HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt), an open_clip ViT-H-14 state dict, bare or under
  'state_dict'. DST becomes a transformers `CLIPModel` folder (open_clip's layout mapped name by name; q, k, v split
  out of `in_proj_weight`), the CLIP tokenizer copied from --tokenizer (ViT-H-14 uses OpenAI CLIP's BPE, e.g. a saved
  laion/CLIP-ViT-H-14-laion2B-s32B-b79K folder) and a preprocessor config with OpenAI CLIP's statistics.
- imagereward: SRC is ImageReward.pt, a flat state dict with `blip.visual_encoder.*` (a timm-style ViT),
  `blip.text_encoder.*` (BLIP's BERT with cross-attention), `blip.vision_proj`, `blip.text_proj` and `mlp.layers.*`.
  DST gets `blip/` (a `BlipForImageTextRetrieval` folder; the ITM head, unused by the score, keeps its random init)
  with the BERT tokenizer from --tokenizer plus BLIP's two added tokens ([DEC] as bos, [ENC]), and `mlp.safetensors`.

Head counts are not in a state dict: they follow from the head widths (--vision-head-dim, --text-head-dim), whose
defaults are the published models' (ViT-H-14: 80 and 64; BLIP ViT-L and BERT-base: 64). Checkpoints are read with
`torch.load(weights_only=True)`: tensors only, never arbitrary pickled objects.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from flowrl.atomic import new_folder
from flowrl.errors import UserError
from flowrl.rewards.clip import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

HEAD_DIMS = {"hpsv2": (80, 64), "imagereward": (64, 64)}  # (vision, text) head widths of the published models


def read_state_dict(src: Path) -> dict[str, torch.Tensor]:
    if not src.is_file():
        raise UserError(f"{src} does not exist; expected the published checkpoint file")
    try:
        data = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(f"{src} is not a tensors-only torch checkpoint ({str(error)[:200]})") from None
    data = data.get("state_dict", data) if isinstance(data, dict) else data
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise UserError(f"{src} holds no state dict of tensors")
    return {k.removeprefix("module."): v.float() for k, v in data.items()}


def require(state: dict, key: str, src: Path, what: str) -> torch.Tensor:
    if key not in state:
        raise UserError(f"{src} has no '{key}'; is it {what}?")
    return state[key]


def layer_count(state: dict, prefix: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return max(found) + 1 if found else 0


def heads(width: int, head_dim: int, where: str) -> int:
    if width % head_dim:
        raise UserError(
            f"{where} width {width} is not a multiple of the head width {head_dim}; pass the model's head width"
        )
    return width // head_dim


# ---- HPSv2: open_clip CLIP -> transformers CLIPModel ----


def open_clip_block(state: dict, src: str, dst: str) -> dict[str, torch.Tensor]:
    """One open_clip residual block `src` (…resblocks.i.) as a transformers CLIPEncoderLayer `dst`."""
    q, k, v = state[src + "attn.in_proj_weight"].chunk(3)
    qb, kb, vb = state[src + "attn.in_proj_bias"].chunk(3)
    out = {
        dst + "self_attn.q_proj.weight": q,
        dst + "self_attn.k_proj.weight": k,
        dst + "self_attn.v_proj.weight": v,
        dst + "self_attn.q_proj.bias": qb,
        dst + "self_attn.k_proj.bias": kb,
        dst + "self_attn.v_proj.bias": vb,
    }
    for a, b in [
        ("attn.out_proj", "self_attn.out_proj"),
        ("ln_1", "layer_norm1"),
        ("ln_2", "layer_norm2"),
        ("mlp.c_fc", "mlp.fc1"),
        ("mlp.c_proj", "mlp.fc2"),
    ]:
        out[dst + b + ".weight"], out[dst + b + ".bias"] = state[f"{src}{a}.weight"], state[f"{src}{a}.bias"]
    return out


def open_clip_to_transformers(state: dict) -> dict[str, torch.Tensor]:
    out = {
        "logit_scale": state["logit_scale"],
        "text_model.embeddings.token_embedding.weight": state["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": state["positional_embedding"],
        "text_model.final_layer_norm.weight": state["ln_final.weight"],
        "text_model.final_layer_norm.bias": state["ln_final.bias"],
        "text_projection.weight": state["text_projection"].t(),
        "vision_model.embeddings.class_embedding": state["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": state["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": state["visual.ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": state["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": state["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": state["visual.ln_post.bias"],
        "visual_projection.weight": state["visual.proj"].t(),
    }
    for i in range(layer_count(state, "transformer.resblocks.")):
        out.update(open_clip_block(state, f"transformer.resblocks.{i}.", f"text_model.encoder.layers.{i}."))
    for i in range(layer_count(state, "visual.transformer.resblocks.")):
        out.update(open_clip_block(state, f"visual.transformer.resblocks.{i}.", f"vision_model.encoder.layers.{i}."))
    return out


def convert_hpsv2(
    src: Path, dst: Path, tokenizer_dir: Path, vision_head_dim: int = 80, text_head_dim: int = 64
) -> None:
    from transformers import CLIPConfig, CLIPModel

    state = read_state_dict(src)
    patch = require(state, "visual.conv1.weight", src, "an open_clip CLIP (HPSv2) checkpoint")
    text_width = require(state, "token_embedding.weight", src, "an open_clip CLIP (HPSv2) checkpoint").shape[1]
    vision_width, patch_size = patch.shape[0], patch.shape[-1]
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    tokenizer = load_tokenizer(tokenizer_dir)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=state["token_embedding.weight"].shape[0],
            hidden_size=text_width,
            intermediate_size=state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
            num_hidden_layers=layer_count(state, "transformer.resblocks."),
            num_attention_heads=heads(text_width, text_head_dim, "text"),
            max_position_embeddings=state["positional_embedding"].shape[0],
            hidden_act="gelu",
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=dict(
            hidden_size=vision_width,
            image_size=grid * patch_size,
            patch_size=patch_size,
            intermediate_size=state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
            num_hidden_layers=layer_count(state, "visual.transformer.resblocks."),
            num_attention_heads=heads(vision_width, vision_head_dim, "vision"),
            hidden_act="gelu",
        ),
        projection_dim=state["visual.proj"].shape[1],
    )
    model = CLIPModel(config)
    load_exactly(model, open_clip_to_transformers(state), src)
    model.save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    save_image_processor(dst, config.vision_config.image_size)


# ---- ImageReward: BLIP (timm ViT + BERT with cross-attention) -> transformers BlipForImageTextRetrieval ----

VIT_BLOCK = [
    ("norm1", "layer_norm1"),
    ("attn.qkv", "self_attn.qkv"),
    ("attn.proj", "self_attn.projection"),
    ("norm2", "layer_norm2"),
    ("mlp.fc1", "mlp.fc1"),
    ("mlp.fc2", "mlp.fc2"),
]


def blip_to_transformers(state: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(BlipForImageTextRetrieval state, score MLP state) from ImageReward's flat state dict."""
    vit, out = "blip.visual_encoder.", {}
    out["vision_model.embeddings.class_embedding"] = state[vit + "cls_token"]
    out["vision_model.embeddings.position_embedding"] = state[vit + "pos_embed"]
    out["vision_model.embeddings.patch_embedding.weight"] = state[vit + "patch_embed.proj.weight"]
    out["vision_model.embeddings.patch_embedding.bias"] = state[vit + "patch_embed.proj.bias"]
    out["vision_model.post_layernorm.weight"], out["vision_model.post_layernorm.bias"] = (
        state[vit + "norm.weight"],
        state[vit + "norm.bias"],
    )
    for i in range(layer_count(state, vit + "blocks.")):
        for a, b in VIT_BLOCK:
            for p in ("weight", "bias"):
                out[f"vision_model.encoder.layers.{i}.{b}.{p}"] = state[f"{vit}blocks.{i}.{a}.{p}"]
    for key, value in state.items():  # BLIP's BERT already uses transformers' BERT names
        if key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out[key.removeprefix("blip.")] = value
        elif key.startswith(("blip.vision_proj.", "blip.text_proj.")):
            out[key.removeprefix("blip.")] = value
    mlp = {k.removeprefix("mlp."): v for k, v in state.items() if k.startswith("mlp.")}
    return out, mlp


def convert_imagereward(
    src: Path, dst: Path, tokenizer_dir: Path, vision_head_dim: int = 64, text_head_dim: int = 64
) -> None:
    from safetensors.torch import save_file
    from transformers import BlipConfig, BlipForImageTextRetrieval

    state = read_state_dict(src)
    what = "ImageReward.pt (BLIP + score MLP)"
    cls = require(state, "blip.visual_encoder.cls_token", src, what)
    words = require(state, "blip.text_encoder.embeddings.word_embeddings.weight", src, what)
    require(state, "mlp.layers.0.weight", src, what)
    patch = state["blip.visual_encoder.patch_embed.proj.weight"]
    vision_width, text_width, patch_size = cls.shape[-1], words.shape[1], patch.shape[-1]
    grid = round((state["blip.visual_encoder.pos_embed"].shape[1] - 1) ** 0.5)
    tokenizer = load_tokenizer(tokenizer_dir)
    if len(tokenizer) == words.shape[0] - 2:  # BLIP adds [DEC] (its bos) and [ENC] to BERT's vocabulary
        tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    if len(tokenizer) != words.shape[0]:
        raise UserError(
            f"the tokenizer in {tokenizer_dir} has {len(tokenizer)} tokens, the "
            f"checkpoint's text encoder {words.shape[0]}; pass BLIP's BERT tokenizer (bert-base-uncased)"
        )
    text_layer = "blip.text_encoder.encoder.layer.0."
    config = BlipConfig(
        vision_config=dict(
            hidden_size=vision_width,
            image_size=grid * patch_size,
            patch_size=patch_size,
            intermediate_size=state["blip.visual_encoder.blocks.0.mlp.fc1.weight"].shape[0],
            num_hidden_layers=layer_count(state, "blip.visual_encoder.blocks."),
            num_attention_heads=heads(vision_width, vision_head_dim, "vision"),
            layer_norm_eps=1e-6,
        ),  # BLIP's ViT (timm) uses eps 1e-6, not transformers' 1e-5
        text_config=dict(
            vocab_size=words.shape[0],
            hidden_size=text_width,
            intermediate_size=state[text_layer + "intermediate.dense.weight"].shape[0],
            num_hidden_layers=layer_count(state, "blip.text_encoder.encoder.layer."),
            num_attention_heads=heads(text_width, text_head_dim, "text"),
            max_position_embeddings=state["blip.text_encoder.embeddings.position_embeddings.weight"].shape[0],
            encoder_hidden_size=state[text_layer + "crossattention.self.key.weight"].shape[1],
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            sep_token_id=tokenizer.sep_token_id or tokenizer.eos_token_id,
        ),
        image_text_hidden_size=state["blip.vision_proj.weight"].shape[0],
    )
    model = BlipForImageTextRetrieval(config)
    blip_state, mlp_state = blip_to_transformers(state)
    keep = {k: v for k, v in model.state_dict().items() if k.startswith("itm_head.")}  # not in ImageReward.pt
    load_exactly(model, {**blip_state, **keep}, src)
    (dst / "blip").mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst / "blip")
    tokenizer.save_pretrained(dst / "blip")
    save_image_processor(dst / "blip", config.vision_config.image_size)
    save_file({k: v.contiguous() for k, v in mlp_state.items()}, dst / "mlp.safetensors")


# ---- shared ----


def save_image_processor(folder: Path, size: int) -> None:
    """The preprocessor config the adapters read: a size x size input with OpenAI CLIP's statistics (both published
    models use them)."""
    from transformers import CLIPImageProcessor

    CLIPImageProcessor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
    ).save_pretrained(folder)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not folder.is_dir():
        raise UserError(f"--tokenizer: {folder} does not exist; expected a saved tokenizer folder")
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as error:
        raise UserError(f"--tokenizer: {folder} holds no tokenizer ({str(error)[:200]})") from None


def load_exactly(model: torch.nn.Module, state: dict, src: Path) -> None:
    """Every parameter of `model` from `state` and nothing left over (buffers such as position ids excepted)."""
    expected = {k for k in model.state_dict() if not k.endswith("position_ids")}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise UserError(f"{src} does not map onto the target model: missing {missing[:5]}, unexpected {extra[:5]}")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise UserError(f"{src}: {str(error)[:300]}") from None


CONVERTERS = {"hpsv2": convert_hpsv2, "imagereward": convert_imagereward}


def convert_reward(
    kind: str,
    src: Path,
    dst: Path,
    tokenizer_dir: Path,
    vision_head_dim: int | None = None,
    text_head_dim: int | None = None,
) -> None:
    if kind not in CONVERTERS:
        raise UserError(f"expected one of {sorted(CONVERTERS)}, got {kind!r}")
    vision, text = HEAD_DIMS[kind]
    with new_folder(dst, "DST") as work:  # DST appears whole or not
        CONVERTERS[kind](src, work, tokenizer_dir, vision_head_dim or vision, text_head_dim or text)
        (work / "flowrl_conversion.json").write_text(json.dumps({"from": str(src), "kind": kind}, indent=2))
