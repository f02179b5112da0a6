"""GPU check: a real model family's denoiser at full size (random weights, no download) through flowrl's rollout and
GRPO update in bf16 with LoRA; prints rollout and update throughput, peak GPU memory and model FLOPs utilisation.
Also what to run before a real job, to see whether a size, batch and memory setting fit a GPU.

    bash benchmarks/gpu_check.sh                                   # on a CUDA machine: SD3.5-Medium, 512 px
    python benchmarks/gpu_check.py --model flux1-dev --size 1024 --batch 4
    python benchmarks/gpu_check.py --model wan2.1-1.3b --frames 33 --batch 4
    python benchmarks/gpu_check.py --tiny [--model M]               # anywhere: the same code path on a toy model
    python benchmarks/gpu_check.py --compile --attention _flash_3   # torch.compile and an attention backend

Each model is the real diffusers pipeline class with its denoiser and VAE at the released layout; text encoders are
not built (T5-XXL alone is 4.7B parameters): prompt embeddings are random tensors of the encoders' shapes, so the
numbers are the denoiser's and the VAE decode's, which dominate RL fine-tuning. MFU counts the transformer's matmul
FLOPs (`transformer_flops`: each layer on the tokens it runs on, plus attention; the update 3x a forward, not the
checkpointed re-forward) against the GPU's dense bf16 peak (--peak-tflops); the VAE's FLOPs are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowrl.algorithms import RolloutBatch, build_algorithm  # noqa: E402
from flowrl.config import SamplerSection  # noqa: E402
from flowrl.policies import policy_for  # noqa: E402
from flowrl.policies.base import Conditioning, SampleSpec  # noqa: E402
from flowrl.policies.placement import compile_denoisers, set_attention_backend  # noqa: E402
from flowrl.rollout import rollout, sample_generators  # noqa: E402


def _sd3_pipeline(full: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = SD3Transformer2DModel(
        **(
            dict(
                sample_size=128,
                patch_size=2,
                in_channels=16,
                out_channels=16,
                num_layers=24,
                attention_head_dim=64,
                num_attention_heads=24,
                joint_attention_dim=4096,
                caption_projection_dim=1536,
                pooled_projection_dim=2048,
                pos_embed_max_size=384,
                dual_attention_layers=tuple(range(13)),
                qk_norm="rms_norm",
            )
            if full
            else dict(
                sample_size=8,
                patch_size=2,
                in_channels=16,
                out_channels=16,
                num_layers=2,
                attention_head_dim=8,
                num_attention_heads=2,
                joint_attention_dim=32,
                caption_projection_dim=16,
                pooled_projection_dim=16,
                pos_embed_max_size=16,
                dual_attention_layers=(0,),
                qk_norm="rms_norm",
            )
        )
    )
    vae = _image_vae(full, latent_channels=16, shift_factor=0.0609, scaling_factor=1.5305)
    with torch.device("cpu"):  # schedulers keep their tables on the host, as loaded pipelines do
        scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )


def _flux_pipeline(full: bool):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(
        **(
            dict(
                patch_size=1,
                in_channels=64,
                num_layers=19,
                num_single_layers=38,
                attention_head_dim=128,
                num_attention_heads=24,
                joint_attention_dim=4096,
                pooled_projection_dim=768,
                guidance_embeds=True,
                axes_dims_rope=(16, 56, 56),
            )
            if full
            else dict(
                patch_size=1,
                in_channels=64,
                num_layers=1,
                num_single_layers=1,
                attention_head_dim=8,
                num_attention_heads=2,
                joint_attention_dim=32,
                pooled_projection_dim=16,
                guidance_embeds=True,
                axes_dims_rope=(2, 2, 4),
            )
        )
    )
    with torch.device("cpu"):
        scheduler = FlowMatchEulerDiscreteScheduler(
            base_image_seq_len=256,
            base_shift=0.5,
            max_image_seq_len=4096,
            max_shift=1.15,
            shift=3.0,
            use_dynamic_shifting=True,
        )
    vae = _image_vae(full, latent_channels=16, shift_factor=0.1159, scaling_factor=0.3611)
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )


def _wan_pipeline(full: bool):
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    transformer = WanTransformer3DModel(
        **(
            dict(
                patch_size=(1, 2, 2),
                num_attention_heads=12,
                attention_head_dim=128,
                in_channels=16,
                out_channels=16,
                text_dim=4096,
                freq_dim=256,
                ffn_dim=8960,
                num_layers=30,
                cross_attn_norm=True,
                qk_norm="rms_norm_across_heads",
                eps=1e-6,
                rope_max_seq_len=1024,
            )
            if full
            else dict(
                patch_size=(1, 2, 2),
                num_attention_heads=2,
                attention_head_dim=8,
                in_channels=16,
                out_channels=16,
                text_dim=32,
                freq_dim=16,
                ffn_dim=32,
                num_layers=2,
                cross_attn_norm=True,
                qk_norm="rms_norm_across_heads",
                rope_max_seq_len=32,
            )
        )
    )
    # the released VAE's layout is the class's default
    vae = (
        AutoencoderKLWan()
        if full
        else AutoencoderKLWan(
            base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
        )
    )
    with torch.device("cpu"):
        scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=vae, scheduler=scheduler)


def _image_vae(full: bool, **config):
    from diffusers import AutoencoderKL

    blocks = (128, 256, 512, 512) if full else (8, 8, 8, 8)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks),
        block_out_channels=blocks,
        layers_per_block=2,
        norm_num_groups=32 if full else 4,
        **config,
    )


# per model: the pipeline, the prompt embeddings the encoders would give ({key: (full shape, tiny shape)} per
# sample), whether the guidance is true CFG (a second branch) or an embedding, the default size, and whether the
# text enters by cross-attention (Wan) or as tokens of one joint sequence (SD3, FLUX)
MODELS = {
    "sd3.5-medium": dict(
        build=_sd3_pipeline,
        embeds={"embeds": ((333, 4096), (12, 32)), "pooled": ((2048,), (16,))},
        cfg=True,
        size=512,
        cross=False,
    ),
    "flux1-dev": dict(
        build=_flux_pipeline,
        embeds={"embeds": ((512, 4096), (12, 32)), "pooled": ((768,), (16,))},
        cfg=False,
        size=1024,
        cross=False,
    ),
    "wan2.1-1.3b": dict(
        build=_wan_pipeline, embeds={"embeds": ((512, 4096), (12, 32))}, cfg=True, size=(480, 832), cross=True
    ),
}


# linear layers run once per sample, not per token: adaptive-norm modulations and the time / pooled-text embedders
PER_SAMPLE = ("norm", "time_text_embed", "time_embed", "timestep", "guidance_embed", "time_proj")


def transformer_flops(transformer, image_tokens: int, text_tokens: int, cross: bool) -> float:
    """Matmul FLOPs of one forward of one sample: each linear layer at 2 x in x out for every token it runs on
    (image tokens through the image stream; text tokens through the text stream: SD3's and FLUX's `context` / `add_`
    layers, Wan's text embedder and its cross-attention's keys and values; every token through FLUX's single
    blocks; PER_SAMPLE layers once), the patch-embedding convolution per image token, and QK^T and AV in every
    attention (4 Q K d: joint attention over image and text tokens, SD3.5's second attention over the image tokens,
    Wan's self-attention over the image tokens and its cross-attention (`cross`) from them to the text)."""
    joint = image_tokens + (0 if cross else text_tokens)

    def tokens_through(name: str) -> int:
        if any(part in name for part in PER_SAMPLE):
            return 1
        if "single_transformer_blocks" in name:
            return joint
        if (
            "context" in name
            or ".add_" in name
            or "to_add_out" in name
            or "text_embedder" in name
            or (cross and name.endswith(("attn2.to_k", "attn2.to_v")))
        ):
            return text_tokens
        return image_tokens

    flops = 0.0
    for name, module in transformer.named_modules():
        if isinstance(module, torch.nn.Linear):
            flops += 2 * module.in_features * module.out_features * tokens_through(name)
        elif isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d)):  # patch embedding: one output per token
            flops += 2 * module.weight.numel() * image_tokens
        elif hasattr(module, "to_q") and hasattr(module, "to_k"):  # an attention module
            if name.endswith("attn2"):
                queries, keys = image_tokens, (text_tokens if cross else image_tokens)
            else:
                queries = keys = joint
            flops += 4 * queries * keys * module.to_q.out_features
    return flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="sd3.5-medium")
    parser.add_argument("--tiny", action="store_true", help="a toy model of the family (CPU smoke test of this script)")
    parser.add_argument(
        "--size",
        type=int,
        nargs="+",
        default=None,
        help="height [width] in pixels (default: the model's training size in the anchors' examples)",
    )
    parser.add_argument("--frames", type=int, default=33, help="video models: frames per clip (1 + 4k)")
    parser.add_argument("--batch", type=int, default=8, help="samples per rollout (2 prompt groups of batch / 2)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200: 989)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--compile", action="store_true", help="torch.compile the transformer (runtime.compile)")
    parser.add_argument(
        "--attention",
        default="sdpa",
        help="sdpa or a backend of diffusers' dispatcher (pipeline.attention: native, flash, _flash_3, sage, ...)",
    )
    parser.add_argument(
        "--no-checkpointing",
        action="store_true",
        help="keep the transformer's activations (faster update, more memory)",
    )
    args = parser.parse_args()
    spec = MODELS[args.model]
    full = not args.tiny
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    with device:  # weights initialised where they run: a 12B FLUX is not built on the host first
        policy = policy_for(spec["build"](full).to(dtype=dtype))
    base_params = sum(p.numel() for p in policy.transformer.parameters())
    policy.add_lora(args.lora_rank, 2 * args.lora_rank, policy.lora_targets)
    for p in policy.trainable_parameters():
        p.data = p.data.float()
    if not args.no_checkpointing:
        policy.transformer.enable_gradient_checkpointing()
    if args.attention != "sdpa":
        set_attention_backend(policy, args.attention)
    if args.compile:
        compile_denoisers(policy)
    size = args.size or ([spec["size"]] if isinstance(spec["size"], int) else list(spec["size"]))
    height, width = (size[0], size[-1]) if full else (64, 64)
    frames = (args.frames if full else 5) if policy.modality == "video" else None
    b, guidance = args.batch, 4.5
    which = 0 if full else 1
    embeds = {key: torch.randn(b, *shapes[which], device=device, dtype=dtype) for key, shapes in spec["embeds"].items()}
    cond = Conditioning(
        embeds, {key: value * 0 for key, value in embeds.items()} if spec["cfg"] else {}, ["prompt"] * b
    )
    shape = policy.noise_shape(SampleSpec(height, width, frames))
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    algorithm = build_algorithm("grpo", {"clip_range": 1e-4}, SamplerSection(kind="flow", num_steps=args.steps))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timings = {}
    for attempt in range(2):  # the first pass warms up kernels and allocators (and compiles); the second is reported
        sync()
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype):
            traj = rollout(policy, cond, sample_generators(range(b)), shape, args.steps, "flow", 0.7, guidance)
            with torch.no_grad():
                samples = policy.decode(traj.final)
        sync()
        rolled = time.perf_counter()
        rewards = samples.float().flatten(1).mean(1).cpu()
        groups = torch.arange(b) // max(1, b // 2)
        batch = RolloutBatch(traj, rewards, groups, list(range(b)), rewards, groups, torch.arange(b), cond.prompts)
        items, _ = algorithm.prepare(batch, policy)
        for start in range(0, len(items), b):
            part = items.subset(torch.arange(start, min(start + b, len(items))))
            with torch.autocast(device.type, dtype=dtype):
                losses, _ = algorithm.loss(policy, batch, part)
            losses.sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        timings = {"rollout_s": rolled - started, "update_s": time.perf_counter() - rolled, "items": len(items)}
    latent_tokens = torch.Size(shape[1:]).numel() // 4  # every family here takes 2x2 patches of latents as tokens
    text_tokens = spec["embeds"]["embeds"][which][0]
    flops = transformer_flops(policy.transformer, latent_tokens, text_tokens, spec["cross"])
    branches = 2 if spec["cfg"] else 1
    rollout_flops = flops * branches * b * args.steps
    update_flops = flops * branches * timings["items"] * 3  # forward + backward (~2x)
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": args.model + (" (tiny)" if args.tiny else ""),
        "transformer_params_M": base_params / 1e6,
        "lora_params_M": sum(p.numel() for p in policy.trainable_parameters()) / 1e6,
        "height": height,
        "width": width,
        "frames": frames,
        "tokens": latent_tokens,
        "batch": b,
        "steps": args.steps,
        "lora_rank": args.lora_rank,
        "gradient_checkpointing": not args.no_checkpointing,
        "attention": args.attention,
        "compiled": args.compile,
        **timings,
        "rollout_samples_per_s": b / timings["rollout_s"],
        "update_items_per_s": timings["items"] / timings["update_s"],
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "rollout_mfu": rollout_flops / timings["rollout_s"] / (args.peak_tflops * 1e12),
        "update_mfu": update_flops / timings["update_s"] / (args.peak_tflops * 1e12),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
