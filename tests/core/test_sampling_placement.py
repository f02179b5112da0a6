"""Sampling commands (`flowrl sample`, the demo) draw as a run does: with the checkpoint's run's eval settings, the
text length the tokenizers declare, the device and the frozen weights' precision (policies.sampling_placement)."""

from argparse import Namespace

import pytest
import torch
import yaml
from tiny_pipelines import tiny_shapes_sd3

from flowrl.cli.arguments import fill_sampling_settings
from flowrl.errors import UserError
from flowrl.inference import generate_samples
from flowrl.policies import place_for_sampling, policy_for, sampling_placement


def test_the_text_length_defaults_to_what_the_tokenizers_declare():
    pipe = tiny_shapes_sd3()  # its tokenizers declare 16 tokens, as the embedded pipelines' do
    policy = policy_for(pipe)
    assert policy.max_sequence_length == 16
    default = policy.encode(["a red circle"], 1.0).tensors["embeds"]
    explicit = policy_for(pipe, max_sequence_length=16).encode(["a red circle"], 1.0).tensors["embeds"]
    assert torch.equal(default, explicit)
    assert policy_for(pipe, max_sequence_length=8).max_sequence_length == 8  # a given length wins
    pipe.tokenizer_3.model_max_length = 512  # a real T5's: above SD3's 256, so the pipeline's own stands
    assert policy_for(pipe).max_sequence_length is None
    pipe.tokenizer_3 = None  # SD3 without T5: the CLIP tokenizers' 16 do not govern the T5 padding length
    assert policy_for(pipe).max_sequence_length is None


def test_a_wan_prompt_is_padded_to_the_pipelines_default_not_encode_prompts():
    """WanPipeline.__call__ pads prompts to 512 tokens, its encode_prompt to 226 by default; Wan's cross-attention
    has no mask, so the padding length changes every velocity: sampling must pad as the pipeline does."""
    from tiny_pipelines import tiny_wan

    pipe = tiny_wan()
    pipe.tokenizer.model_max_length = 512  # umT5's: not below the pipeline's 512, so that default stands
    policy = policy_for(pipe)
    assert policy.max_sequence_length is None
    assert policy.encode(["a red circle"], 1.0).tensors["embeds"].shape[1] == 512
    assert policy_for(pipe, max_sequence_length=226).encode(["a red circle"], 1.0).tensors["embeds"].shape[1] == 226


def test_an_adapter_on_a_half_precision_base_is_fp32():
    """peft makes an adapter in its base's dtype; a checkpoint's fp32 weights must load into it exactly."""
    policy = policy_for(tiny_shapes_sd3().to(torch.bfloat16))
    policy.add_lora(4, 8, policy.lora_targets)
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}


def test_half_precision_sampling_keeps_the_lora_fp32_and_draws_what_fp32_draws():
    def sample(weight_dtype):
        policy = policy_for(tiny_shapes_sd3())
        policy.add_lora(4, 8, policy.lora_targets)
        for param in policy.trainable_parameters():  # a trained-looking adapter, the same in both runs
            param.data = torch.linspace(-0.05, 0.05, param.numel()).reshape(param.shape)
        precision = place_for_sampling(policy, sampling_placement("cpu", weight_dtype))
        with precision():
            images = generate_samples(policy, ["a red circle", "two squares"], 2, 0, 4, 2.0, desc=None)[0].decoded()
        return policy, images

    half, half_images = sample("bf16")
    full, full_images = sample("fp32")
    frozen = [p for p in half.transformer.parameters() if not p.requires_grad]
    assert {p.dtype for p in frozen} == {torch.bfloat16}
    assert {p.dtype for p in half.trainable_parameters()} == {torch.float32}
    assert {p.dtype for p in full.transformer.parameters()} == {torch.float32}
    assert torch.isfinite(half_images).all()
    base = policy_for(tiny_shapes_sd3())  # no adapter: the whole denoiser is frozen, so all of it in bf16
    place_for_sampling(base, sampling_placement("cpu", "bf16"))
    assert {p.dtype for p in base.transformer.parameters()} == {torch.bfloat16}
    assert (half_images.float() - full_images).abs().mean() < 0.02  # pixels in [0, 1]


@pytest.mark.parametrize(
    "device,dtype,message",
    [
        ("gpu0", None, "--device: expected cpu, cuda or cuda:N, got 'gpu0'"),
        ("cpu", "int8", "--weight-dtype: expected one of"),
    ],
)
def test_a_bad_placement_is_named(device, dtype, message):
    with pytest.raises(UserError, match=message):
        sampling_placement(device, dtype)


def test_the_default_placement_is_the_gpu_in_bf16_when_there_is_one():
    device, dtype = sampling_placement()
    if torch.cuda.is_available():
        assert (device.type, dtype) == ("cuda", torch.bfloat16)
    else:
        assert (device.type, dtype) == ("cpu", torch.float32)
        with pytest.raises(UserError, match="0 CUDA devices"):
            sampling_placement("cuda")


def test_a_runs_checkpoint_samples_with_the_runs_eval_settings_unless_flags_say_otherwise(tmp_path, capsys):
    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "update_000010").mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "pipeline": {
                    "path": "p",
                    "height": 48,
                    "width": 64,
                    "num_frames": None,
                    "max_sequence_length": 128,
                    "guidance_scale_2": 2.5,
                    "policy": "Flux2KleinEdit",
                    "shift": 5.0,
                    "reference_size": 512,
                    "vae_tiling": True,
                },
                "eval": {"num_steps": 40, "guidance_scale": 3.5, "seed": 2024},
                "memory": {
                    "rollout_microbatch": 4,
                    "decode_microbatch": 2,
                    "offload_text_encoders": False,
                    "weight_dtype": "fp16",
                },
            }
        )
    )
    given = Namespace(
        steps=None,
        guidance=1.0,
        height=None,
        width=None,
        num_frames=None,
        max_sequence_length=None,
        guidance_2=None,
        policy=None,
        shift=None,
        reference_size=None,
        batch_size=None,
        vae_tiling=None,
        vae_slicing=None,
        decode_microbatch=None,
        offload_text_encoders=None,
        seed=None,
        weight_dtype=None,
    )
    fill_sampling_settings(given, str(run / "checkpoints" / "update_000010"))
    assert vars(given) == {
        "steps": 40,
        "guidance": 1.0,
        "height": 48,
        "width": 64,
        "num_frames": None,
        "max_sequence_length": 128,
        "guidance_2": 2.5,
        "policy": "Flux2KleinEdit",
        "shift": 5.0,
        "reference_size": 512,
        "batch_size": 4,
        "vae_tiling": True,
        "vae_slicing": None,
        "decode_microbatch": 2,
        "offload_text_encoders": None,
        "seed": 2024,
        "weight_dtype": "fp16",
        "policy_where": f"pipeline.policy in {run / 'config.yaml'}",
    }  # a given flag wins
    assert (
        "--steps 40, --seed 2024, --weight-dtype fp16, --height 48, --width 64, --max-sequence-length 128, "
        "--guidance-2 2.5, --shift 5.0, "
        "--reference-size 512, --batch-size 4, --vae-tiling, --decode-microbatch 2, --policy Flux2KleinEdit"
        in capsys.readouterr().out
    )  # (settings that are off stay unsaid)
    outside = Namespace(
        steps=None, guidance=None, height=None, width=None, num_frames=None, max_sequence_length=None, policy=None
    )
    fill_sampling_settings(outside, str(tmp_path))  # a folder outside a run: the built-in defaults
    assert (outside.steps, outside.guidance, outside.height, outside.max_sequence_length) == (20, 4.5, None, None)
    assert (outside.policy, outside.policy_where) == (None, "--policy")


def test_a_smaller_batch_draws_the_same_samples():
    """Each sample's noise comes from its own seed, so `--batch-size` (and an eval's memory.rollout_microbatch) only
    trades memory for time."""
    policy = policy_for(tiny_shapes_sd3())
    prompts = ["a red circle", "two squares", "a blue triangle"]
    whole = generate_samples(policy, prompts, 2, 0, 4, 2.0, desc=None)[0].decoded()
    pieces = generate_samples(policy, prompts, 2, 0, 4, 2.0, batch_size=4, desc=None)[0].decoded()
    torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-5)
