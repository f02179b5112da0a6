"""Memory controls change how work is split, not what is computed: micro-batched rollouts, decodes and rewards,
gradient checkpointing, VAE slicing, text encoders offloaded with an embedding cache; optimizers by name."""

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.errors import ConfigError
from flowrl.train import Trainer


def _one_update(path, overrides=()):
    trainer = Trainer(load_config(path, list(overrides)), log=False)
    batch, metrics = trainer.collect(0)
    items, _ = trainer.algorithm.prepare(batch, trainer.policy)
    losses, _ = trainer.algorithm.loss(trainer.policy, batch, items)
    losses.sum().backward()
    metrics["grads"] = torch.cat([p.grad.flatten() for p in trainer.policy.trainable_parameters()])
    return trainer, batch, metrics


def test_split_work_gives_the_same_rollout_rewards_and_gradients(tiny_sd3_dir, tmp_path, monkeypatch):
    # on a GPU, cuDNN's default TF32 convolutions pick kernels by batch size, so the VAE's decodes of a split batch
    # differ at 1e-4 (measured on an H200); the test is about splitting, so it asks for fp32 convolutions
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "mem", updates=1)
    # a smooth reward: the JPEG reward's rounding turns a split decode's last-bit differences (VAE slicing sums in
    # another order on some CPUs) into reward differences of ~1e-4, and the advantages and gradients with them
    smooth = ["reward=[{name: toy_rewards:Brightness}]"]
    _, whole, whole_metrics = _one_update(path, smooth)
    options = [
        "memory.rollout_microbatch=3",
        "memory.decode_microbatch=2",
        "memory.reward_microbatch=3",
        "memory.gradient_checkpointing=true",
        "pipeline.vae_slicing=true",
        "memory.offload_text_encoders=true",
        "memory.embedding_cache=true",
    ]
    trainer, split, split_metrics = _one_update(path, smooth + options)
    torch.testing.assert_close(split.trajectory.latents, whole.trajectory.latents, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split.trajectory.log_probs, whole.trajectory.log_probs, atol=1e-5, rtol=1e-5)
    assert split.trajectory.cond.prompts == whole.trajectory.cond.prompts
    assert split_metrics["reward_mean"] == pytest.approx(whole_metrics["reward_mean"], abs=1e-6)
    assert whole_metrics["grads"].abs().sum() > 0
    torch.testing.assert_close(split_metrics["grads"], whole_metrics["grads"], atol=1e-5, rtol=1e-4)
    assert all(p.device.type == "cpu" for m in trainer.policy.text_encoders() for p in m.parameters())
    cached = {k: v for k, v in trainer.policy.embedding_cache.items() if k[0] in set(split.prompts)}
    assert len(cached) == len(set(split.prompts))  # one entry per distinct prompt
    negatives = {id(t) for entry in cached.values() for t in entry.negative.values()}
    assert len(negatives) == len(next(iter(cached.values())).negative)  # the unconditional branch held once
    assert trainer.policy.transformer.is_gradient_checkpointing


def test_nfts_old_velocities_take_a_rollout_calls_items_at_a_time(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "nft", updates=1)
    nft = ["algorithm={name: nft, params: {}}", "sampler.kind=ode"]
    whole_trainer, _, whole = _one_update(path, nft)
    split_trainer, _, split = _one_update(path, nft + ["memory.rollout_microbatch=3"])
    assert (whole_trainer.algorithm.chunk, split_trainer.algorithm.chunk) == (64, 3)
    assert whole["grads"].abs().sum() > 0
    torch.testing.assert_close(split["grads"], whole["grads"], atol=1e-5, rtol=1e-4)


def test_optimizers_by_name(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "opt", updates=1)
    trainer = Trainer(load_config(path, ["optim.optimizer=sgd"]), log=False)
    assert isinstance(trainer.optimizer.optimizer, torch.optim.SGD)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="optim.optimizer: adamw_8bit needs bitsandbytes"):
            Trainer(load_config(path, ["optim.optimizer=adamw_8bit"]), log=False)
    with pytest.raises(ConfigError, match="memory.rollout_microbatch: FK"):
        Trainer(load_config(path, ["memory.rollout_microbatch=2", "sampler.fk={num_particles: 4}"]), log=False)


def test_xformers_is_refused_off_cuda(tiny_sd3_dir, tmp_path):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "x", updates=1)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for other devices")
    with pytest.raises(ConfigError, match="pipeline.attention: xformers runs on CUDA only"):
        Trainer(load_config(path, ["pipeline.attention=xformers"]), log=False)


def test_async_scoring_equals_scoring_each_chunk_in_turn(tiny_sd3_dir, tmp_path):
    """runtime.async_rewards scores chunk k in a worker thread while chunk k+1 samples: the same trajectories, rewards
    and reward info as synchronous scoring of the same chunks, exactly."""
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "async", updates=1)
    chunked = ["memory.rollout_microbatch=3", "reward=[{name: shapes, params: {dense: true}}]"]
    sync = Trainer(load_config(path, chunked), log=False).collect(0)
    overlapped = Trainer(load_config(path, chunked + ["runtime.async_rewards=true"]), log=False).collect(0)
    assert torch.equal(sync[0].trajectory.latents, overlapped[0].trajectory.latents)
    assert torch.equal(sync[0].global_rewards, overlapped[0].global_rewards)
    assert sync[1] == overlapped[1]  # every reward metric, including the verifier's accuracy
    with pytest.raises(ConfigError, match="runtime.async_rewards: overlaps"):
        Trainer(load_config(path, ["runtime.async_rewards=true"]), log=False)


def test_offloaded_text_encoders_are_never_placed_on_the_device(tiny_sd3_dir, tmp_path, monkeypatch):
    """With memory.offload_text_encoders (or --offload-text-encoders) the text encoders take the weight dtype on the
    host and are not moved to the device when the policy is placed: a 24B text encoder beside a 32B denoiser would not
    fit an 80 GB GPU even for the moment before offloading moved it back."""
    from flowrl.builders import placed_policy
    from flowrl.policies.base import FlowPolicy

    moved = []  # (module class, device) of every move to a device
    original_to = torch.nn.Module.to

    def recording_to(module, *args, **kwargs):
        device = kwargs.get("device", args[0] if args and not isinstance(args[0], torch.dtype) else None)
        if device is not None:
            moved.append((type(module).__name__, str(device)))
        return original_to(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", recording_to)
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "host", updates=1)
    placed = {}
    original_place = FlowPolicy.place

    def recording_place(self, *args, **kwargs):
        moved.clear()
        original_place(self, *args, **kwargs)
        placed.update(kwargs, moves=list(moved))

    monkeypatch.setattr(FlowPolicy, "place", recording_place)
    for offload in (False, True):
        policy = placed_policy(
            load_config(
                path,
                [
                    f"memory.offload_text_encoders={str(offload).lower()}",
                    "memory.weight_dtype=bf16",
                    "memory.mixed_precision=bf16",
                ],
            ),
            torch.device("cpu"),
        )
        encoders = {type(m).__name__ for m in policy.text_encoders()}
        assert placed["text_encoders_on_host"] is offload
        assert ("SD3Transformer2DModel", "cpu") in placed["moves"]
        assert any(name in encoders for name, _ in placed["moves"]) is not offload  # placed with the others or not
        assert all(p.dtype == torch.bfloat16 for m in policy.text_encoders() for p in m.parameters())
