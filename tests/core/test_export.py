"""Checkpoints people load without flowrl: a LoRA run's checkpoint loads with diffusers' `load_lora_weights` and
peft's `PeftModel.from_pretrained` and gives flowrl's model exactly (scale included)."""

import json

import pytest
import torch
from run_helpers import run_flowrl, tiny_run_config, train_and_collect

from flowrl.checkpoint import load_trained_weights
from flowrl.policies import load_pipeline, policy_for
from flowrl.policies.base import SampleSpec


def _velocity(policy, seed=0):
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return policy.velocity(x, 0.6, policy.encode(["a red circle", "two squares"], 2.0), 2.0)


def test_lora_checkpoint_loads_with_diffusers_and_peft(tiny_sd3_dir, tmp_path):
    from peft import PeftModel

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "export", updates=2, lr=3e-2)
    train_and_collect(path)
    checkpoint = tmp_path / "runs" / "export" / "checkpoints" / "update_000002"
    flowrl_policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    base = _velocity(flowrl_policy)
    load_trained_weights(flowrl_policy, checkpoint)  # the EMA weights, as flowrl samples
    expected = _velocity(flowrl_policy)
    assert (expected - base).abs().max() > 1e-3  # training moved the model, so the check can fail

    pipe = load_pipeline(tiny_sd3_dir)
    pipe.load_lora_weights(checkpoint)  # no weight_name: diffusers picks pytorch_lora_weights.safetensors
    torch.testing.assert_close(_velocity(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)

    pipe = load_pipeline(tiny_sd3_dir)
    pipe.transformer = PeftModel.from_pretrained(pipe.transformer, checkpoint).base_model.model
    torch.testing.assert_close(_velocity(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)


def test_a_gated_lora_samples_in_diffusers_as_in_flowrl_with_the_gate_callback(tiny_sd3_dir, tmp_path):
    """A checkpoint trained with lora.sample_from_sigma (the main job's 0.6), loaded with `load_lora_weights`, acts at
    every step; with `lora_gate_callback` as the pipeline's callback_on_step_end it samples as flowrl does."""
    from flowrl.export import lora_gate_callback
    from flowrl.rollout import rollout, sample_generators

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "gated", updates=2, lr=3e-2)
    train_and_collect(path, ["lora.sample_from_sigma=0.6"])
    checkpoint = tmp_path / "runs" / "gated" / "checkpoints" / "update_000002"
    policy = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    load_trained_weights(policy, checkpoint)
    assert policy.lora_active_from_sigma == 0.6
    prompts, spec = ["a red circle", "two squares"], SampleSpec(32, 32)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = rollout(
            policy,
            policy.encode(prompts, 2.0, spec),
            sample_generators([1, 2]),
            shape,
            4,
            "ode",
            0.0,
            2.0,
            initial_noise=noise,
        ).final
    pipe = load_pipeline(tiny_sd3_dir)
    pipe.load_lora_weights(checkpoint)

    def sample(callback):
        pipe.enable_lora()
        return pipe(
            prompt=prompts,
            negative_prompt=[""] * 2,
            num_inference_steps=4,
            guidance_scale=2.0,
            latents=noise,
            output_type="latent",
            height=32,
            width=32,
            max_sequence_length=16,
            callback_on_step_end=callback,
        ).images

    torch.testing.assert_close(sample(lora_gate_callback(0.6)), ours, atol=1e-5, rtol=1e-5)
    assert (sample(None) - ours).abs().max() > 1e-4  # ungated, it is another model
    # the checkpoint says so beside its LoRA files (an ungated run's does not)
    assert json.loads((checkpoint / "lora_gate.json").read_text())["sample_from_sigma"] == 0.6
    train_and_collect(tiny_run_config(tmp_path / "u.yaml", tiny_sd3_dir, tmp_path / "runs", "ungated", updates=1))
    assert not (tmp_path / "runs" / "ungated" / "checkpoints" / "update_000001" / "lora_gate.json").exists()


@pytest.mark.parametrize("model", ["sd3.5-medium", "flux1-dev", "wan2.1-1.3b"])
def test_gpu_check_script_runs_its_code_path_on_a_toy_model(tmp_path, model, monkeypatch):
    """benchmarks/gpu_check.py is meant for a GPU machine; its --tiny mode runs the same rollout, update and
    accounting anywhere, for each family it sizes (the real pipeline classes without text encoders), so the script
    cannot rot between GPU sessions. Run as __main__ in this process (a new interpreter's imports cost more than
    the toy model's work)."""
    import json
    import runpy
    import sys

    from conftest import REPO

    out = tmp_path / "gpu_check.json"
    script = REPO / "benchmarks" / "gpu_check.py"
    monkeypatch.setattr(
        "sys.argv", [str(script), "--tiny", "--model", model, "--batch", "4", "--steps", "3", "--out", str(out)]
    )
    monkeypatch.setattr("sys.path", list(sys.path))  # the script puts the repository first; restored after
    runpy.run_path(str(script), run_name="__main__")
    result = json.loads(out.read_text())
    assert result["items"] == 4 * 3 and result["rollout_samples_per_s"] > 0 and result["update_mfu"] > 0
    # 64 x 64 px: 8 x 8 latents (8x VAEs) in 2x2 patches; the video model's 5 frames are 2 latent frames
    assert result["model"] == f"{model} (tiny)" and result["lora_params_M"] > 0
    assert result["tokens"] == {"sd3.5-medium": 16, "flux1-dev": 16, "wan2.1-1.3b": 32}[model]


@pytest.mark.parametrize("lora", [True, False])
def test_flowrl_export_writes_a_plain_pipeline_folder(tiny_sd3_dir, tmp_path, lora):
    overrides = {} if lora else {"lr": 1e-3}
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "full", updates=1, **overrides)
    if not lora:
        import yaml

        data = yaml.safe_load(path.read_text())
        data["lora"] = None
        path.write_text(yaml.safe_dump(data))
    train_and_collect(path)
    checkpoint = tmp_path / "runs" / "full" / "checkpoints" / "update_000001"
    ours = policy_for(load_pipeline(tiny_sd3_dir), max_sequence_length=16)
    base = _velocity(ours)
    load_trained_weights(ours, checkpoint)
    expected = _velocity(ours)
    assert (expected - base).abs().max() > 1e-5  # the checkpoint moved the model
    done = run_flowrl(
        "export", "--pipeline", str(tiny_sd3_dir), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "tuned")
    )
    assert done.returncode == 0, done.stderr[-2000:]
    exported = policy_for(load_pipeline(tmp_path / "tuned"), max_sequence_length=16)
    assert not exported.has_lora
    torch.testing.assert_close(_velocity(exported), expected, atol=1e-5, rtol=1e-4)
    if lora:  # the same fused weights written in bf16: half the folder, loading as the same model to bf16 rounding
        from safetensors import safe_open

        from flowrl.export import export_pipeline

        export_pipeline(tiny_sd3_dir, checkpoint, tmp_path / "half", "bf16")
        weights = next((tmp_path / "half" / "transformer").glob("*.safetensors"))
        with safe_open(weights, "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        half = policy_for(load_pipeline(tmp_path / "half"), max_sequence_length=16)
        torch.testing.assert_close(_velocity(half), expected, atol=0.05, rtol=0.05)


def test_a_half_precision_export_loads_in_half_precision_and_fuses_as_fp32_would(tiny_sd3_dir, tmp_path):
    """export in bf16 loads the pipeline in bf16 (half a real model's host memory): for base weights bf16 holds
    exactly, the fused weights equal fusing in fp32 and rounding once. A folder stored in bf16, as models are
    released, exports in bf16 without being asked (an fp32 one in fp32)."""
    from flowrl.export import export_pipeline, stored_dtype

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "half", updates=1, lr=3e-2)
    train_and_collect(path)
    checkpoint = tmp_path / "runs" / "half" / "checkpoints" / "update_000001"
    load_pipeline(tiny_sd3_dir, torch.bfloat16).save_pretrained(tmp_path / "bf16_base")  # bf16 weights, as released
    assert (stored_dtype(tiny_sd3_dir), stored_dtype(tmp_path / "bf16_base")) == ("fp32", "bf16")
    export_pipeline(tmp_path / "bf16_base", checkpoint, tmp_path / "half")  # the folder's precision: bf16
    reference = policy_for(load_pipeline(tmp_path / "bf16_base"))  # the fp32 route: load, fuse, round
    load_trained_weights(reference, checkpoint)
    reference.transformer.fuse_lora(lora_scale=1.0)
    reference.transformer.unload_lora()
    expected = {k: v.to(torch.bfloat16) for k, v in reference.transformer.state_dict().items()}
    exported = load_pipeline(tmp_path / "half", torch.bfloat16).transformer.state_dict()
    assert exported.keys() == expected.keys()
    moved = [k for k in expected if not torch.equal(exported[k], expected[k])]
    assert not moved, moved[:5]
    base = load_pipeline(tmp_path / "bf16_base", torch.bfloat16).transformer.state_dict()
    assert any(not torch.equal(base[k], exported[k]) for k in base)  # the LoRA was fused in


@pytest.mark.parametrize("model", ["sd3.5-medium", "flux1-dev", "wan2.1-1.3b"])
def test_gpu_checks_flop_count_equals_what_a_forward_runs(model, monkeypatch):
    """benchmarks/gpu_check.py's MFU divides by transformer_flops: the count, layer by layer on the tokens each runs
    on, equals the matmul FLOPs one forward of a toy model of each family actually runs, counted from every linear
    layer's and convolution's inputs (hooks) and every attention call's query and key lengths."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    from flowrl.policies import policy_for
    from flowrl.policies.base import Conditioning, SampleSpec

    spec = gpu_check.MODELS[model]
    policy = policy_for(spec["build"](False))
    counted = []
    for module in policy.transformer.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(
                lambda m, args, out: counted.append(
                    2 * m.in_features * m.out_features * (args[0].numel() // m.in_features)
                )
            )
        elif isinstance(module, (torch.nn.Conv2d, torch.nn.Conv3d)):
            module.register_forward_hook(
                lambda m, args, out: counted.append(2 * m.weight.numel() * (out.numel() // m.out_channels))
            )
    attention = torch.nn.functional.scaled_dot_product_attention

    def counting_attention(query, key, value, *args, **kwargs):  # [batch, heads, length, head dim]
        counted.append(4 * query.shape[0] * query.shape[-2] * key.shape[-2] * query.shape[1] * query.shape[-1])
        return attention(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_attention)
    frames = 5 if policy.modality == "video" else None
    shape = policy.noise_shape(SampleSpec(64, 64, frames))
    embeds = {key: torch.randn(1, *shapes[1]) for key, shapes in spec["embeds"].items()}
    with torch.no_grad():
        policy.velocity(torch.randn(1, *shape), torch.tensor([0.5]), Conditioning(embeds, {}, ["p"]), 1.0)
    tokens = torch.Size(shape[1:]).numel() // 4
    expected = gpu_check.transformer_flops(policy.transformer, tokens, spec["embeds"]["embeds"][1][0], spec["cross"])
    assert counted and sum(counted) == expected


def test_export_never_writes_into_a_folder_that_holds_files(tiny_sd3_dir, tmp_path):
    """--out equal to the pipeline folder would overwrite the base model in place, and one equal to an earlier export
    would mix two exports' files: both are refused before anything loads, and nothing in them changes."""
    from flowrl.errors import UserError
    from flowrl.export import export_pipeline

    checkpoint = tmp_path / "update_000001"
    checkpoint.mkdir()
    (checkpoint / "trainable.safetensors").write_bytes(b"")  # never read: the folder checks come first
    before = sorted((p.relative_to(tiny_sd3_dir), p.stat().st_mtime_ns) for p in tiny_sd3_dir.rglob("*"))
    with pytest.raises(UserError, match=rf"--out {tiny_sd3_dir} exists and is not empty"):
        export_pipeline(tiny_sd3_dir, checkpoint, tiny_sd3_dir)
    assert sorted((p.relative_to(tiny_sd3_dir), p.stat().st_mtime_ns) for p in tiny_sd3_dir.rglob("*")) == before
    with pytest.raises(UserError, match="has no trainable.safetensors"):
        export_pipeline(tiny_sd3_dir, tmp_path / "typo", tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_the_stored_precision_is_the_file_loaded_without_a_variant(tmp_path):
    """SD 1.5 folders ship diffusion_pytorch_model.fp16.safetensors beside the fp32 file from_pretrained loads; the
    variant sorts first and made an fp32 folder export in fp16."""
    from safetensors.torch import save_file

    from flowrl.export import stored_dtype

    (tmp_path / "unet").mkdir()
    save_file({"w": torch.zeros(2)}, tmp_path / "unet" / "diffusion_pytorch_model.safetensors")
    save_file(
        {"w": torch.zeros(2, dtype=torch.float16)}, tmp_path / "unet" / "diffusion_pytorch_model.fp16.safetensors"
    )
    assert stored_dtype(tmp_path) == "fp32"
    (tmp_path / "unet" / "diffusion_pytorch_model.safetensors").unlink()  # only the variant: it is what there is
    assert stored_dtype(tmp_path) == "fp16"


def test_components_training_left_alone_are_exported_as_stored(tiny_sd3_dir, tmp_path):
    """A released folder may keep its VAE in fp32 beside a bf16 transformer (Wan's): exporting in bf16 rounds the
    trained network only; the VAE and text encoders are the folder's own files."""
    from safetensors import safe_open
    from tiny_pipelines import random_lora_checkpoint

    from flowrl.export import export_pipeline

    mixed = load_pipeline(tiny_sd3_dir)
    mixed.transformer.to(torch.bfloat16)
    mixed.save_pretrained(tmp_path / "mixed")  # bf16 transformer, fp32 VAE and text encoders
    checkpoint = random_lora_checkpoint(tmp_path / "mixed", tmp_path / "run")
    export_pipeline(tmp_path / "mixed", checkpoint, tmp_path / "tuned")  # the denoiser's precision: bf16
    for name in ("vae", "text_encoder", "text_encoder_3"):
        for source in (tmp_path / "mixed" / name).iterdir():
            assert (tmp_path / "tuned" / name / source.name).read_bytes() == source.read_bytes(), source
    [weights] = (tmp_path / "tuned" / "transformer").glob("*.safetensors")
    with safe_open(weights, "pt") as stored:
        assert stored.get_slice(next(iter(stored.keys()))).get_dtype() == "BF16"
