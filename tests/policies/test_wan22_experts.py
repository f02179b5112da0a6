"""Wan2.2's two experts both training (pipeline.experts: both): each side of the boundary trains its own expert's
adapter, checkpoints name the low-noise expert's weights apart, diffusers loads both adapters, and two processes
train as one."""

import pytest
import torch
import yaml
from run_helpers import assert_same_weights, train_and_collect, train_on_two_processes
from tiny_pipelines import tiny_wan, tiny_wan22

from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import LOW_NOISE_EXPERT, SampleSpec

PROMPTS = ["a red circle", "two squares"]
SPEC = SampleSpec(16, 16, num_frames=9)


def _both_experts_policy():
    policy = policy_for(tiny_wan22(), max_sequence_length=16)  # boundary 0.95
    policy.set_trained_experts("both", "pipeline.experts")
    policy.add_lora(4, 8, policy.lora_targets)
    with torch.no_grad():  # adapters away from zero, so switching them off shows
        for prefix, module in policy.trained_modules().items():
            for name, p in module.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(prefix)))
    return policy


def _grads(policy) -> dict[str, bool]:
    """Per expert: whether any of its trainable weights got a nonzero gradient; the gradients are then cleared."""
    out = {}
    for prefix, module in policy.trained_modules().items():
        params = [p for p in module.parameters() if p.requires_grad]
        out[prefix or "high"] = any(p.grad is not None and bool(p.grad.any()) for p in params)
        for p in params:
            p.grad = None
    return out


def test_each_side_of_the_boundary_trains_its_own_expert():
    policy = _both_experts_policy()
    pipe = policy.pipeline
    assert policy.frozen_below() is None  # every step trains
    high_params = {id(p) for p in pipe.transformer.parameters() if p.requires_grad}
    low_params = {id(p) for p in pipe.transformer_2.parameters() if p.requires_grad}
    assert high_params and low_params and {id(p) for p in policy.trainable_parameters()} == high_params | low_params
    x = torch.randn(2, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 1.0)
    sigma = torch.tensor([0.5, 0.97])  # one sample on each side of 0.95
    policy.velocity(x, sigma, cond, 1.0)[0].sum().backward()
    assert _grads(policy) == {"high": False, LOW_NOISE_EXPERT: True}
    policy.velocity(x, sigma, cond, 1.0)[1].sum().backward()
    assert _grads(policy) == {"high": True, LOW_NOISE_EXPERT: False}
    # the reference switches both adapters off: each side is its base expert
    with torch.no_grad():
        tuned = policy.velocity(x, sigma, cond, 1.0)
        with policy.reference():
            reference = policy.velocity(x, sigma, cond, 1.0)
        embeds = cond.tensors["embeds"]
        pipe.transformer.disable_adapters(), pipe.transformer_2.disable_adapters()
        low = pipe.transformer_2(
            hidden_states=x[:1], timestep=sigma[:1] * 1000, encoder_hidden_states=embeds[:1], return_dict=False
        )[0]
        high = pipe.transformer(
            hidden_states=x[1:], timestep=sigma[1:] * 1000, encoder_hidden_states=embeds[1:], return_dict=False
        )[0]
        pipe.transformer.enable_adapters(), pipe.transformer_2.enable_adapters()
    torch.testing.assert_close(reference, torch.cat([low, high]), atol=1e-5, rtol=1e-5)
    assert (tuned[0] - reference[0]).abs().max() > 1e-3 and (tuned[1] - reference[1]).abs().max() > 1e-3
    # checkpoints: the high expert's names as always, the low expert's under its prefix; they load back
    state = policy.trainable_state_dict()
    low_names = [k for k in state if k.startswith(LOW_NOISE_EXPERT)]
    assert low_names and len(low_names) == len(state) / 2
    assert set(state) - set(low_names) == {n for n, p in pipe.transformer.named_parameters() if p.requires_grad}
    fresh = _both_experts_policy()
    with torch.no_grad():
        for p in fresh.trainable_parameters():
            p.zero_()
    fresh.load_trainable_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(fresh.velocity(x, sigma, cond, 1.0), tuned, rtol=0, atol=0)


def test_the_reference_pass_restores_each_experts_adapter_state():
    """The reference switches the adapters off and back to what they were: an expert whose adapter was off (the
    demo showing a checkpoint that trained the high-noise expert only) stays off, and an expert without an adapter
    is left alone."""
    policy = _both_experts_policy()
    pipe = policy.pipeline
    x = torch.randn(1, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS[:1], 1.0)
    pipe.transformer_2.disable_adapters()
    with torch.no_grad():
        low_before = policy.velocity(x, 0.5, cond, 1.0)
        with policy.reference():
            pass
        torch.testing.assert_close(policy.velocity(x, 0.5, cond, 1.0), low_before, rtol=0, atol=0)
    bare = policy_for(tiny_wan22(), max_sequence_length=16)
    bare.set_trained_experts("both", "pipeline.experts")
    bare.transformer.add_adapter(__import__("peft").LoraConfig(r=4, lora_alpha=8, target_modules=bare.lora_targets))
    with torch.no_grad(), bare.reference():  # transformer_2 has no adapter: nothing to switch there
        bare.velocity(x, 0.5, cond, 1.0)


def test_every_call_goes_through_the_pair_and_a_distributed_one_runs_both_experts():
    """With both experts training, rollouts and evaluation (no gradient) call the experts through their one module
    too, which FSDP2 needs to gather their shards; when distributed, an expert no row needs still runs one row."""
    policy = _both_experts_policy()
    calls = {"pair": 0, "low": 0}
    policy.model.register_forward_hook(lambda *_: calls.__setitem__("pair", calls["pair"] + 1))
    policy.pipeline.transformer_2.register_forward_hook(lambda *_: calls.__setitem__("low", calls["low"] + 1))
    x = torch.randn(2, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 1.0)
    with torch.no_grad():
        alone = policy.velocity(x, 0.97, cond, 1.0)  # every row above the boundary
        assert calls == {"pair": 1, "low": 0}
        policy.distributed = True
        torch.testing.assert_close(policy.velocity(x, 0.97, cond, 1.0), alone, rtol=0, atol=0)
        assert calls == {"pair": 2, "low": 1}


def test_both_experts_needs_a_two_expert_pipeline():
    with pytest.raises(ConfigError, match=r"pipeline.experts: 'both' needs a Wan2.2 pipeline with two experts"):
        policy_for(tiny_wan(), max_sequence_length=16).set_trained_experts("both", "pipeline.experts")


def _config(path, pipeline_dir, out_dir, prompts, name: str) -> str:
    """GRPO on the tiny Wan2.2 with both experts and an SDE window over all 4 steps (step 0 above the boundary,
    steps 1-3 below), a weight-free per-frame reward."""
    data = {
        "run": {"name": name, "out_dir": str(out_dir), "seed": 0},
        "task": {"name": "prompt_file"},
        "pipeline": {
            "path": str(pipeline_dir),
            "height": 16,
            "width": 16,
            "num_frames": 5,
            "max_sequence_length": 16,
            "experts": "both",
        },
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 4, "guidance_scale": 1.0},
        "algorithm": {"name": "grpo", "params": {"clip_range": 1e-3}},
        "reward": [{"name": "per_frame", "params": {"reward": "jpeg_compressibility", "frames": 2}}],
        "prompts": {"source": str(prompts)},
        "train": {"updates": 2, "groups_per_update": 2, "group_size": 2, "checkpoint_every": 2},
        "optim": {"lr": 1e-3, "ema_decay": 0.0},
        "memory": {"microbatch_size": 3, "mixed_precision": "no", "weight_dtype": "fp32"},
        "runtime": {"threads": 1},
        "eval": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def wan22_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan22_both")
    tiny_wan22().save_pretrained(root / "wan22")
    prompts = root / "prompts.txt"
    prompts.write_text("a red apple\na cat on a table\n")
    config = _config(root / "run.yaml", root / "wan22", root / "runs", prompts, "both")
    return root, config, train_and_collect(config)


def _velocities(policy) -> torch.Tensor:
    """The policy's velocity on two fixed samples of the run's size, one on each side of the boundary."""
    x = torch.randn(2, *policy.noise_shape(SampleSpec(16, 16, 5)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return policy.velocity(x, torch.tensor([0.5, 0.97]), policy.encode(PROMPTS, 1.0), 1.0)


def test_a_run_trains_both_experts_and_diffusers_loads_both_adapters(wan22_run):
    from diffusers import WanPipeline

    from flowrl.checkpoint import load_trained_weights
    from flowrl.export import DIFFUSERS_LORA_FILE_2, export_pipeline
    from flowrl.policies import load_pipeline

    root, _, trained = wan22_run
    checkpoint = root / "runs/both/checkpoints/update_000002"
    before = _velocities(policy_for(load_pipeline(root / "wan22"), max_sequence_length=16))
    ours = policy_for(load_pipeline(root / "wan22"), max_sequence_length=16)
    load_trained_weights(ours, checkpoint)  # finds the low-noise expert's weights and trains it too
    assert set(ours.trainable_state_dict()) == set(trained)
    expected = _velocities(ours)
    assert (expected[0] - before[0]).abs().max() > 0 and (expected[1] - before[1]).abs().max() > 0  # both moved
    pipe = WanPipeline.from_pretrained(root / "wan22")
    pipe.load_lora_weights(checkpoint)
    pipe.load_lora_weights(checkpoint, weight_name=DIFFUSERS_LORA_FILE_2, load_into_transformer_2=True)
    torch.testing.assert_close(_velocities(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)
    exported = export_pipeline(root / "wan22", checkpoint, root / "tuned")  # both adapters fused
    plain = policy_for(WanPipeline.from_pretrained(exported), max_sequence_length=16)
    torch.testing.assert_close(_velocities(plain), expected, rtol=1e-4, atol=1e-5)


def test_resuming_with_other_experts_is_one_config_error(wan22_run):
    root, config, _ = wan22_run
    with pytest.raises(ConfigError, match=r"holds a run trained with other settings \(pipeline.experts\)"):
        train_and_collect(config, ["pipeline.experts=high", "train.updates=3"])  # resumed by its name
    checkpoint = root / "runs/both/checkpoints/update_000002"  # and on purpose: the weights cannot be taken
    with pytest.raises(
        ConfigError,
        match=r"run.resume: checkpoint .*update_000002 trained other weights than this "
        r"config does \(e.g. transformer_2\..* is in the checkpoint only\)",
    ):
        train_and_collect(config, ["pipeline.experts=high", "train.updates=3", f"run.resume={checkpoint}"])


def test_the_demo_switches_both_experts_adapters(wan22_run):
    from flowrl.checkpoint import load_trained_weights
    from flowrl.demo import CheckpointSet
    from flowrl.policies import load_pipeline

    root, _, _ = wan22_run
    checkpoint = root / "runs/both/checkpoints/update_000002"
    policy = policy_for(load_pipeline(root / "wan22"), max_sequence_length=16)
    base = _velocities(policy)
    tuned = policy_for(load_pipeline(root / "wan22"), max_sequence_length=16)
    load_trained_weights(tuned, checkpoint)
    checkpoints = CheckpointSet(policy, [str(checkpoint)])
    checkpoints.activate("both/update_000002")
    torch.testing.assert_close(_velocities(policy), _velocities(tuned), rtol=0, atol=0)
    checkpoints.activate("base")
    torch.testing.assert_close(_velocities(policy), base, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("fsdp2", [False, True], ids=["ddp", "fsdp2"])
def test_two_processes_train_both_experts_as_one(wan22_run, tmp_path, fsdp2):
    """Under DDP or FSDP2 both experts are one wrapped module (ExpertPair); a microbatch that leaves one expert unused
    still runs it (one row, weighted zero), so the processes' collectives (DDP's gradient buckets; FSDP2's gathers of
    each expert's shards) match and each expert's weights are one process's."""
    _, config, single = wan22_run
    double = train_on_two_processes(
        config,
        tmp_path / "two.safetensors",
        29551 + 10 * fsdp2,
        ["run.name=two", "train.checkpoint_every=0"],
        fsdp2=fsdp2,
    )
    for low in (False, True):
        assert_same_weights(single, double, [k for k in single if k.startswith(LOW_NOISE_EXPERT) == low])
