"""GPU check: an SD3.5-Medium-sized transformer (random weights, no download) through flowrl's rollout and GRPO update
at 512 px in bf16 with LoRA; prints rollout and update throughput, peak GPU memory and model FLOPs utilisation.

    bash benchmarks/gpu_check.sh            # on a CUDA machine: the full-size check (a few minutes)
    python benchmarks/gpu_check.py --tiny   # anywhere: the same code path on a toy model (what the test suite runs)

Text encoders are not built (T5-XXL alone is 4.7B parameters): prompt embeddings are random tensors of SD3's shapes
(333 joint tokens of width 4096, pooled 2048), so the numbers are the denoiser's, which dominates RL fine-tuning.
The VAE decode is included (SD3.5's VAE layout, random weights). MFU counts the transformer's matmul FLOPs
(2 x parameters x tokens per forward, plus attention) against the GPU's dense bf16 peak given by --peak-tflops.
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
from flowrl.policies.base import Conditioning, SampleSpec  # noqa: E402
from flowrl.policies.sd3 import SD3_LORA_TARGETS, SD3Policy  # noqa: E402
from flowrl.rollout import rollout, sample_generators  # noqa: E402

FULL = {"transformer": dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                            attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                            caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
                            dual_attention_layers=tuple(range(13)), qk_norm="rms_norm"),
        "vae": dict(block_out_channels=(128, 256, 512, 512), latent_channels=16, norm_num_groups=32),
        "size": 512, "text_tokens": 333, "text_dim": 4096, "pooled_dim": 2048}
TINY = {"transformer": dict(sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
                            attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                            caption_projection_dim=16, pooled_projection_dim=16, pos_embed_max_size=16,
                            dual_attention_layers=(0,), qk_norm="rms_norm"),
        "vae": dict(block_out_channels=(8, 8, 8, 8), latent_channels=16, norm_num_groups=4),
        "size": 64, "text_tokens": 12, "text_dim": 32, "pooled_dim": 16}


class _Pipeline:
    """The parts of a StableDiffusion3Pipeline the policy touches, without text encoders."""

    def __init__(self, spec: dict, device, dtype):
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

        self.transformer = SD3Transformer2DModel(**spec["transformer"]).to(device, dtype)
        blocks = len(spec["vae"]["block_out_channels"])
        self.vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * blocks,
                                 up_block_types=("UpDecoderBlock2D",) * blocks, layers_per_block=2,
                                 shift_factor=0.0609, scaling_factor=1.5305, **spec["vae"]).to(device, dtype)
        self.vae_scale_factor = 2 ** (blocks - 1)
        self.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
        self.components = {"transformer": self.transformer, "vae": self.vae}


def transformer_flops(transformer, tokens: int) -> float:
    """Matmul FLOPs of one forward: 2 x weights x tokens, plus QK^T and AV in every attention (4 T^2 d)."""
    config = transformer.config
    width = config.num_attention_heads * config.attention_head_dim
    weights = sum(p.numel() for p in transformer.parameters() if p.ndim == 2)
    attentions = config.num_layers + len(config.dual_attention_layers)
    return 2 * weights * tokens + attentions * 4 * tokens**2 * width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a toy model (CPU smoke test of this script)")
    parser.add_argument("--batch", type=int, default=8, help="samples per rollout (2 prompt groups of batch / 2)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200: 989)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--no-checkpointing", action="store_true",
                        help="keep the transformer's activations (faster update, more memory)")
    args = parser.parse_args()
    spec = TINY if args.tiny else FULL
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16
    torch.manual_seed(0)
    policy = SD3Policy(_Pipeline(spec, device, dtype))
    policy.add_lora(32, 64, SD3_LORA_TARGETS)
    for p in policy.trainable_parameters():
        p.data = p.data.float()
    if not args.no_checkpointing:
        policy.transformer.enable_gradient_checkpointing()
    b, guidance = args.batch, 4.5
    embeds = torch.randn(b, spec["text_tokens"], spec["text_dim"], device=device, dtype=dtype)
    pooled = torch.randn(b, spec["pooled_dim"], device=device, dtype=dtype)
    cond = Conditioning({"embeds": embeds, "pooled": pooled}, {"embeds": embeds * 0, "pooled": pooled * 0},
                        ["prompt"] * b)
    shape = policy.noise_shape(SampleSpec(spec["size"], spec["size"]))
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-4)
    algorithm = build_algorithm("grpo", {"clip_range": 1e-4}, SamplerSection(kind="flow", num_steps=args.steps))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timings = {}
    for attempt in range(2):  # the first pass warms up kernels and allocators; the second is reported
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype):
            traj = rollout(policy, cond, sample_generators(range(b)), shape, args.steps, "flow", 0.7, guidance)
            with torch.no_grad():
                samples = policy.decode(traj.final)
        sync()
        rolled = time.perf_counter()
        rewards = samples.float().mean(dim=(1, 2, 3)).cpu()
        groups = torch.arange(b) // (b // 2)
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
    tokens = (shape[-1] // 2) * (shape[-2] // 2) + spec["text_tokens"]
    flops = transformer_flops(policy.transformer, tokens)
    rollout_flops = flops * 2 * b * args.steps  # CFG doubles the batch
    # CFG x (forward + backward ~2x, + the checkpointed re-forward): the model's FLOPs, not the recomputation's
    update_flops = flops * 2 * timings["items"] * 3
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu", "model": "tiny" if args.tiny else "SD3.5-Medium-size",
        "transformer_params_M": sum(p.numel() for p in policy.transformer.parameters()) / 1e6,
        "resolution": spec["size"], "batch": b, "steps": args.steps,
        "gradient_checkpointing": not args.no_checkpointing, **timings,
        "rollout_samples_per_s": b / timings["rollout_s"], "update_items_per_s": timings["items"] / timings["update_s"],
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "rollout_mfu": rollout_flops / timings["rollout_s"] / (args.peak_tflops * 1e12),
        "update_mfu": update_flops / timings["update_s"] / (args.peak_tflops * 1e12),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
