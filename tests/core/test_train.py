"""The training loop: exact resume, multi-process equivalence, interruption, learning on a tiny budget."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from run_helpers import (
    SMOOTH_REWARD,
    assert_same_weights,
    assert_two_processes_train_as_one,
    run_flowrl,
    tiny_run_config,
    torchrun,
    train_and_collect,
    train_on_two_processes,
)


def test_resume_is_exact(tiny_sd3_dir, tmp_path):
    straight = tiny_run_config(tmp_path / "a.yaml", tiny_sd3_dir, tmp_path / "runs", "straight", updates=4)
    expected = train_and_collect(straight)
    split = tiny_run_config(tmp_path / "b.yaml", tiny_sd3_dir, tmp_path / "runs", "split", updates=4)
    train_and_collect(split, ["train.updates=2"])  # stops after 2 updates, checkpoint written
    checkpoints = sorted((tmp_path / "runs/split/checkpoints").glob("update_*"))
    assert checkpoints[-1].name == "update_000002"
    kept = shutil.copytree(checkpoints[-1], tmp_path / "kept_update_2")  # the resumed run prunes old ones
    resumed = train_and_collect(split)  # picks up the newest checkpoint of the run dir
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
    # and from an explicit path
    explicit = train_and_collect(split, ["run.name=other", f"run.resume={kept}"])
    for name in expected:
        assert torch.equal(expected[name], explicit[name]), name


def test_run_dir_holds_config_metrics_and_checkpoints(tiny_sd3_dir, tmp_path):
    config = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "files", updates=2)
    result = run_flowrl("train", str(config), "eval.enabled=true", "eval.num_per_prompt=1", "eval.num_steps=2")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tmp_path / "runs/files"
    for name in ["config.yaml", "metrics.csv", "eval.json", "reward_curve.png", "before_after.png", "report.html"]:
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert [e.step for e in events.Images("eval/samples")] == [0, 2]  # the eval grids, base and tuned
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and "reward_mean" in rows[0] and "clip_frac" in rows[0]
    assert "overall" in (run / "report.html").read_text()


@pytest.mark.slow
def test_two_processes_match_one(tiny_sd3_dir, tmp_path):
    """Two processes under DDP, computing with kernels that round otherwise, train as one: the same rollouts,
    rewards, advantages, gradients and weights at every step, within float rounding."""
    config = tiny_run_config(
        tmp_path / "d.yaml", tiny_sd3_dir, tmp_path / "runs", "dist", updates=2, checkpoint_every=0
    )
    assert_two_processes_train_as_one(config, tmp_path / "two.safetensors", 29531, [SMOOTH_REWARD])


@pytest.mark.slow
def test_fsdp2_trains_checkpoints_and_resumes_as_one_process(tiny_sd3_dir, tmp_path):
    """The denoiser sharded by FSDP2 over 2 gloo processes: the same weights and EMA as one process, checkpoints of
    whole tensors (the shards gathered), and a resume that cuts them back into shards (weights, EMA, Adam's moments)
    and trains on as one process that never stopped. The reward is smooth (mean brightness: the JPEG reward turns
    rounding into other rewards, so 1 and 2 processes part by ~7e-4 over 4 updates, DDP or FSDP2 alike)."""
    from safetensors.torch import load_file

    config = tiny_run_config(
        tmp_path / "f.yaml", tiny_sd3_dir, tmp_path / "runs", "fsdp", updates=4, keep_checkpoints=4
    )
    smooth = "reward=[{name: toy_rewards:NaNForSomeSeeds, params: {modulus: 1000000007}}]"  # no seed is a multiple
    single = train_and_collect(config, ["run.name=single", smooth])
    train_on_two_processes(config, tmp_path / "half.safetensors", 29536, ["train.updates=2", smooth], fsdp2=True)
    for name in ["trainable", "ema"]:  # whole tensors, as one process writes them
        assert_same_weights(
            load_file(tmp_path / f"runs/single/checkpoints/update_000002/{name}.safetensors"),
            load_file(tmp_path / f"runs/fsdp/checkpoints/update_000002/{name}.safetensors"),
        )
    resumed = train_on_two_processes(config, tmp_path / "resumed.safetensors", 29536, [smooth], fsdp2=True)
    assert not list((tmp_path / "runs/fsdp/checkpoints").glob("corrupt_*"))  # resumed from update 2, not set aside
    assert_same_weights(single, resumed, tolerance=1e-5)
    assert_same_weights(
        load_file(tmp_path / "runs/single/checkpoints/update_000004/ema.safetensors"),
        load_file(tmp_path / "runs/fsdp/checkpoints/update_000004/ema.safetensors"),
        tolerance=1e-5,
    )


def test_eval_shares_cover_the_set_in_order_with_one_length_on_every_process():
    from flowrl.experiment import eval_share

    for count, world in [(4, 2), (3, 2), (7, 3), (1, 4), (0, 2), (9, 8), (57, 8)]:
        shares = [eval_share(count, rank, world) for rank in range(world)]
        assert len({len(indices) for indices, _ in shares}) == 1  # the same number of forward passes everywhere
        assert [i for indices, own in shares for i in indices[:own]] == list(range(count))
        assert all(set(indices) <= set(range(max(count, 1))) for indices, _ in shares)
        assert max(own for _, own in shares) - min(own for _, own in shares) <= 1  # nobody waits long for the rest
    assert eval_share(3, 1, 2) == ([2, 2], 1)


def test_reward_batches_keep_each_conditions_samples_together():
    from flowrl.experiment import group_spans
    from flowrl.tasks.base import Condition

    items = [
        Condition(p, meta={"tag": t})
        for p, t, n in [("a", "x", 3), ("b", "x", 2), ("b", "y", 2), ("c", "x", 4)]
        for _ in range(n)
    ]
    assert group_spans(items, 4) == [(0, 3), (3, 7), (7, 11)]  # a alone (a + b would be 5), b's two conditions, c
    assert group_spans(items, 2) == [(0, 3), (3, 5), (5, 7), (7, 11)]  # a run longer than the batch stays whole
    assert group_spans(items, 100) == [(0, 11)] and group_spans([], 4) == []
    assert group_spans(items, 4, keep_groups=False) == [(0, 4), (4, 8), (8, 11)]  # a reward that scores one by one


def test_tasks_with_their_own_evaluation_are_told_from_those_that_report_the_reward():
    from flowrl.tasks.base import build_task

    assert build_task("shapes").judges_samples() and build_task("shapes_edit").judges_samples()
    assert not build_task("prompt_file").judges_samples()  # its runs' evaluations score the reward on every process


@pytest.mark.slow
def test_a_two_process_run_shares_its_evaluations_and_judges_them_as_one_process_does(tiny_sd3_dir, tmp_path):
    """`flowrl train` under torchrun with its evaluations on: each process samples half of the eval set, the main one
    gathers and judges them, and the base evaluation equals a one-process run's for every tag (each eval prompt its
    own tag, so a sample with the wrong seed or in the wrong place changes a number)."""
    import json

    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    (tmp_path / "train.txt").write_text("a red circle\na blue square\n")
    (tmp_path / "eval.jsonl").write_text(
        "".join(
            json.dumps({"prompt": p, "tag": p}) + "\n" for p in ["a red circle", "a green triangle", "a blue square"]
        )
    )
    config = tiny_run_config(
        tmp_path / "e.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "dist_eval",
        updates=2,
        checkpoint_every=0,
        rollout_microbatch=2,
    )
    # 3 prompts x 2 samples: process 0 draws prompts 0 and 1, process 1 prompt 2 and a padding repeat of it; batches
    # of 2 in both runs, so the same samples share a forward pass and the numbers match to the last digit
    overrides = [
        "task.name=prompt_file",
        f"prompts.source={tmp_path / 'train.txt'}",
        "eval.enabled=true",
        f"eval.prompts={tmp_path / 'eval.jsonl'}",
        "eval.every=1",
        "eval.num_per_prompt=2",
        "eval.num_steps=2",
    ]
    result = torchrun(["-m", "flowrl", "train", config, *overrides], port=29532)
    assert result.returncode == 0, result.stderr[-3000:]
    evals = json.loads((tmp_path / "runs" / "dist_eval" / "eval.json").read_text())
    assert sorted(evals, key=int) == ["0", "1", "2"] and all(len(e["tags"]) == 3 for e in evals.values())
    assert (tmp_path / "runs" / "dist_eval" / "before_after.png").is_file()
    one = run_experiment(load_config(config, [*overrides, "run.name=one", "train.updates=1"]))
    alone = json.loads((one / "eval.json").read_text())["0"]
    assert evals["0"]["tags"] == alone["tags"] and len(set(alone["tags"].values())) > 1, (evals["0"], alone)


def test_wandb_logs_offline_beside_csv_and_tensorboard(tiny_sd3_dir, tmp_path):
    pytest.importorskip("wandb")  # the test extra installs it; a plain install runs without it
    config = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "wb", updates=1)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowrl",
            "train",
            str(config),
            "run.wandb=true",
            "eval.enabled=true",
            "eval.num_per_prompt=1",
            "eval.num_steps=2",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    runs = list((tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))  # the offline run file, syncable with `wandb sync`


def test_steps_below_the_lora_gate_train_without_error_and_leave_the_adapter_unchanged(
    tiny_sd3_dir, tmp_path, monkeypatch
):
    """A window of low-noise steps under lora.active_from_sigma: every trained item sits where the adapter is off.
    The start-up check stops such a config; past it (a window across the gate gives microbatches like these), the
    loop still runs each backward (DDP counts them) and the adapter's output stays the base's (lora_B zero)."""
    from flowrl import preflight
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    config = tiny_run_config(tmp_path / "g.yaml", tiny_sd3_dir, tmp_path / "runs", "gated", updates=2)
    low_window = ["sampler.sde_window_size=1", "sampler.sde_window_range=[2, 4]"]  # sigma 0.5 or 0.25
    with pytest.raises(
        ConfigError,
        match=r"every SDE step \(\[2, 3\]\) sits at sigma < 0.9, where "
        "lora.active_from_sigma switches the adapter off",
    ):
        train_and_collect(config, ["lora.active_from_sigma=0.9", *low_window])
    monkeypatch.setattr(preflight, "check_trained_steps", lambda *args: None)
    trained = train_and_collect(config, ["lora.active_from_sigma=0.9", *low_window])
    up = [name for name in trained if "lora_B" in name]
    assert up and all(not trained[name].any() for name in up)
    # the same window without the gate does train the adapter
    ungated = train_and_collect(config, ["run.name=ungated", *low_window])
    assert any(ungated[name].any() for name in up)
    # a window across the gate: a warning on one process or under DDP, an error under FSDP2, whose gradient reduction
    # a microbatch of untrained steps would skip on its process alone
    monkeypatch.undo()
    from flowrl.config import load_config

    across = Trainer(
        load_config(
            config,
            [
                "run.name=across",
                "lora.active_from_sigma=0.9",
                "sampler.sde_window_size=2",
                "sampler.sde_window_range=[0, 1]",
            ],
        ),
        log=False,
    )
    with pytest.raises(ConfigError, match=r"SDE steps \[1\] sit at sigma < 0.9.*under FSDP2 every SDE step must train"):
        preflight.check_trained_steps(across.config, across.algorithm, across.policy, across.spec, fsdp2=True)


def test_collectives_wait_as_long_as_the_config_says(tiny_sd3_dir, tmp_path):
    """The main process evaluates alone while the others wait in a collective, so the trainer hands accelerate the
    config's timeout for the process group (checked here as the handler passed; one process starts no group)."""
    from datetime import timedelta

    from flowrl.config import load_config
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "wait", updates=1)
    trainer = Trainer(load_config(path, ["runtime.collective_timeout_minutes=45"]), log=False)
    assert trainer.accelerator.init_handler.timeout == timedelta(minutes=45)


@pytest.mark.parametrize("lora", [True, False])
def test_a_resumed_run_ends_with_its_before_after_grid(tiny_sd3_dir, tmp_path, lora):
    """Resumed with its evaluations on: a LoRA run draws the base samples again (adapter off) for the grid, a full
    fine-tune (its base weights gone) shows the tuned samples alone, where it used to stop with a traceback."""
    import json

    import yaml
    from PIL import Image

    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    (tmp_path / "eval.txt").write_text("a red circle\ntwo squares\n")
    path = tiny_run_config(tmp_path / "r.yaml", tiny_sd3_dir, tmp_path / "runs", "resumed", updates=2)
    if not lora:
        data = yaml.safe_load(path.read_text())
        data["lora"], data["optim"]["lr"] = None, 1e-4
        path.write_text(yaml.safe_dump(data))
    overrides = [
        "eval.enabled=true",
        f"eval.prompts={tmp_path / 'eval.txt'}",
        "eval.num_per_prompt=1",
        "eval.num_steps=2",
    ]
    run_experiment(load_config(path, [*overrides, "train.updates=1"]))
    run_dir = run_experiment(load_config(path, overrides))  # resumes at update 1
    assert sorted(json.loads((run_dir / "eval.json").read_text()), key=int) == ["0", "1", "2"]
    straight = run_experiment(load_config(path, [*overrides, "run.name=straight"]))  # base | tuned, not resumed
    width, full_width = (Image.open(d / "before_after.png").size[0] for d in (run_dir, straight))
    assert width == full_width if lora else width < full_width


def test_a_run_resumed_from_an_earlier_checkpoint_drops_the_abandoned_attempts_evaluations(tiny_sd3_dir, tmp_path):
    """Resumed from update 1 of a run that had evaluated at 1, 2 and 3, with 2 updates this time: eval.json (and
    its curve) holds 0, 1 and the new 2, not the abandoned 3, as metrics.csv drops the abandoned rows."""
    import csv
    import json

    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    (tmp_path / "eval.txt").write_text("a red circle\n")
    path = tiny_run_config(
        tmp_path / "r.yaml", tiny_sd3_dir, tmp_path / "runs", "again", updates=3, checkpoint_every=1, keep_checkpoints=3
    )
    overrides = [
        "eval.enabled=true",
        f"eval.prompts={tmp_path / 'eval.txt'}",
        "eval.num_per_prompt=1",
        "eval.num_steps=2",
        "eval.every=1",
    ]
    run_dir = run_experiment(load_config(path, overrides))
    assert sorted(json.loads((run_dir / "eval.json").read_text()), key=int) == ["0", "1", "2", "3"]
    checkpoint = run_dir / "checkpoints" / "update_000001"
    run_experiment(load_config(path, [*overrides, "train.updates=2", f"run.resume={checkpoint}"]))
    assert sorted(json.loads((run_dir / "eval.json").read_text()), key=int) == ["0", "1", "2"]
    assert [int(float(r["update"])) for r in csv.DictReader((run_dir / "metrics.csv").open())] == [1, 2]


def test_report_tags_are_escaped_and_a_run_without_evaluations_links_no_grid(tmp_path):
    from flowrl.report import write_report

    result = {"overall": 0.5, "tags": {"a<b>&c": 0.5}}
    page = write_report(tmp_path, "x: 1", result, result, [], grid=False).read_text(encoding="utf-8")
    assert "a&lt;b&gt;&amp;c" in page and "<b>&c" not in page and "before_after.png" not in page


def test_a_deterministic_run_turns_on_deterministic_kernels_and_trains_as_a_default_one(
    tiny_sd3_dir, tmp_path, monkeypatch
):
    """`run.deterministic` is for GPUs (CPU kernels repeat either way): it must switch PyTorch to deterministic
    kernels before the run's first GPU op, and no op of the training loop may lack one (PyTorch would stop the run)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the test's end restores the variable's absence
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    config = tiny_run_config(tmp_path / "d.yaml", tiny_sd3_dir, tmp_path / "runs", "det", updates=2, checkpoint_every=0)
    default = train_and_collect(config, ["run.name=default"])
    assert not torch.are_deterministic_algorithms_enabled()
    benchmark, deterministic = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        strict = train_and_collect(config, ["run.name=strict", "run.deterministic=true"])
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:  # process-wide switches: leave the next test in this worker as it found them
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic, benchmark
    assert_same_weights(default, strict)


def test_a_checkpoint_carries_the_gpus_generator_when_a_gpu_is_in_use(tmp_path, monkeypatch):
    """Dropout in a trained model draws from the GPU's generator, so exact resume needs its state too (written only
    once the GPU is in use; a checkpoint without it, from a CPU run or an older flowrl, still loads)."""
    from flowrl.checkpoint import load_checkpoint, save_checkpoint

    weights = {"w": torch.ones(2)}
    plain = save_checkpoint(tmp_path / "cpu", 1, weights, {}, None)
    gpu_state = torch.arange(16, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: gpu_state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    with_gpu = save_checkpoint(tmp_path / "gpu", 1, weights, {}, None)
    load_checkpoint(plain)
    assert restored == []
    load_checkpoint(with_gpu)
    assert len(restored) == 1 and torch.equal(restored[0], gpu_state)


def test_a_checkpoint_restores_numpys_generator_where_it_stood(tmp_path):
    """numpy's global generator (third-party reward code draws from it) comes back at the saved position, not only
    with the saved key: the draws after a resume are those after the save."""
    import numpy as np

    from flowrl.checkpoint import load_checkpoint, save_checkpoint

    np.random.seed(3)
    np.random.random(5)
    np.random.standard_normal()  # numpy caches the second gaussian of a pair: part of the state too
    path = save_checkpoint(tmp_path, 1, {"w": torch.ones(2)}, {}, None)
    expected = (np.random.random(3), np.random.standard_normal())
    np.random.random(1000)
    load_checkpoint(path)
    again = (np.random.random(3), np.random.standard_normal())
    assert np.array_equal(expected[0], again[0]) and expected[1] == again[1]


def test_resume_restores_the_loss_scale_and_starts_an_ema_from_the_restored_weights(tiny_sd3_dir, tmp_path):
    """fp16's loss scale resumes where it stood (a fresh 65536 would overflow and skip the first steps); a run with
    an EMA resumed from a checkpoint saved without one starts its EMA from the restored weights, not the base's."""
    from flowrl.config import load_config
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "scale", updates=1, ema_decay=0.0)
    first = Trainer(load_config(path), log=False)
    first.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=50)
    first.run()
    later = Trainer(
        load_config(
            path,
            [
                "train.updates=2",
                "optim.ema_decay=0.9",  # continued on purpose with an EMA
                f"run.resume={tmp_path / 'runs/scale/checkpoints/update_000001'}",
            ],
        ),
        log=False,
    )
    later.accelerator.scaler = torch.amp.GradScaler("cpu")  # 65536, as a new run's
    later.resume()
    assert later.accelerator.scaler.get_scale() == 256.0
    assert later.accelerator.scaler.state_dict()["growth_interval"] == 50
    trained = [p.detach() for p in later.policy.named_trainable_parameters().values()]
    assert any(p.abs().max() > 0 for p in trained if p.ndim == 2)  # (LoRA B moved off zero: weights were trained)
    assert all(torch.equal(e, p) for e, p in zip(later.state.ema, trained))


def test_a_deepspeed_launch_is_one_clear_error(tiny_sd3_dir, tmp_path):
    """accelerate's DeepSpeed backward would step the optimizer once per microbatch: refused before anything loads."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "ds", updates=1)
    with pytest.raises(ConfigError, match="DeepSpeed is not supported.*ddp.yaml.*fsdp2.yaml"):
        Trainer(load_config(path), accelerator=SimpleNamespace(distributed_type=DistributedType.DEEPSPEED), log=False)


def test_ddp_processes_running_unequal_forwards_do_not_pair_a_broadcast_with_a_reduction():
    """A gated LoRA runs one or two passes per microbatch by its items' noise levels, so processes differ in forward
    counts: DDP's buffer broadcast before each forward would then pair with another process's gradient all-reduce
    (measured: the collective timeout without `without_buffer_broadcast`)."""
    from conftest import REPO

    result = torchrun([REPO / "tests" / "support" / "ddp_buffers_worker.py"], port=29731, timeout=400)
    # the workers' own lines come first in stderr, torchrun's summary last: both are kept
    assert result.returncode == 0, (result.stdout, result.stderr[:3000], result.stderr[-1500:])
    assert result.stdout.count("ok") == 2


def test_fsdp2_under_bf16_reduces_in_fp32_and_leaves_the_inputs_uncast():
    """accelerate's FSDP2 policy reduces (and accumulates no-sync microbatches) in the compute dtype and casts every
    float input, the timestep included; the trainer's keeps gradients in fp32 and the inputs as the policy made them.
    Left alone: no mixed precision, or no FSDP2."""
    from types import SimpleNamespace

    from flowrl.builders import fsdp2_precision

    def accelerator(mixed_precision, fsdp2=True):
        return SimpleNamespace(
            state=SimpleNamespace(fsdp_plugin=SimpleNamespace(mixed_precision_policy=None)),
            mixed_precision=mixed_precision,
            is_fsdp2=fsdp2,
        )

    bf16 = accelerator("bf16")
    fsdp2_precision(bf16)
    policy = bf16.state.fsdp_plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (
        torch.bfloat16,
        torch.float32,
        False,
    )
    for untouched in (accelerator("no"), accelerator("bf16", fsdp2=False)):
        fsdp2_precision(untouched)
        assert untouched.state.fsdp_plugin.mixed_precision_policy is None


@pytest.mark.usefixtures("fresh_accelerator_state")
def test_evaluations_run_in_the_runs_mixed_precision_as_its_rollouts_do(tiny_sd3_dir, tmp_path):
    """On several processes the wrapped denoiser autocasts every call (accelerate's prepare), evaluations included;
    one process autocasts its rollouts explicitly and must do so for evaluations too, or one checkpoint scores
    differently on 1 GPU and on N."""
    from flowrl.config import load_config
    from flowrl.experiment import evaluate
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "bf16", updates=1)
    trainer = Trainer(
        load_config(path, ["memory.mixed_precision=bf16", "eval.num_per_prompt=1", "eval.num_steps=2"]), log=False
    )
    seen, forward = [], trainer.policy._forward

    def recording(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return forward(*args, **kwargs)

    trainer.policy._forward = recording
    evaluate(trainer, "eval", judge=False)
    assert seen and all(seen)


def test_a_prompt_file_is_drawn_without_repeats_within_an_update(tmp_path):
    """As Flow-GRPO's sampler: an update's groups take distinct prompts (a fresh permutation each update); more
    groups than prompts take every prompt once before any twice. Tagged sets keep their tag-first draw."""
    from flowrl.prompt_source import PromptSource
    from flowrl.tasks import build_task

    words = [f"prompt {w}" for w in "abcdefgh"]
    (tmp_path / "p.txt").write_text("\n".join(words) + "\n")
    source = PromptSource(build_task("shapes", {}), str(tmp_path / "p.txt"))
    for update in range(20):
        drawn = [c.prompt for c in source.draw(8, 0, update)]
        assert sorted(drawn) == words
        twelve = [c.prompt for c in source.draw(12, 0, update)]
        assert sorted(twelve[:8]) == words and len(set(twelve[8:])) == 4
    assert [c.prompt for c in source.draw(8, 0, 1)] != [c.prompt for c in source.draw(8, 0, 2)]
    tagged = PromptSource(build_task("shapes", {}), "train")
    tag_of = {c.prompt: tag for tag, items in tagged.set.by_tag.items() for c in items}
    drawn = [tag_of[c.prompt] for c in tagged.draw(600, 0, 0)]
    assert len(set(drawn)) == 6 and all(0.1 < drawn.count(t) / 600 < 0.24 for t in set(drawn))  # each about 1/6


def test_a_run_name_holding_another_configs_run_is_refused_and_a_rewind_sets_the_newer_checkpoints_aside(
    tiny_sd3_dir, tmp_path
):
    """Rerun under the same run.name with another reward: refused before training (it carried on from the old run's
    weights, the report showing the old model under the new config); a longer run of the same config resumes. An
    explicit run.resume to an older checkpoint takes the config's optimizer settings and moves the newer checkpoints
    aside (a later auto resume picked the abandoned line's newest)."""
    from flowrl.checkpoint import list_checkpoints
    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    path = tiny_run_config(tmp_path / "s.yaml", tiny_sd3_dir, tmp_path / "runs", "same", updates=2, keep_checkpoints=3)
    train_and_collect(path)
    with pytest.raises(ConfigError, match=r"holds a run trained with other settings \(reward\)"):
        train_and_collect(path, ["reward=[{name: jpeg_compressibility, weight: 2.0}]"])
    train_and_collect(path, ["train.updates=3"])
    checkpoints = tmp_path / "runs" / "same" / "checkpoints"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["update_000001", "update_000002", "update_000003"]
    trainer = Trainer(
        load_config(path, ["train.updates=3", "optim.weight_decay=0.5", f"run.resume={checkpoints / 'update_000001'}"]),
        log=False,
    )
    trainer.resume()
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.5 and trainer.state.update == 1
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "abandoned_update_000002",
        "abandoned_update_000003",
        "update_000001",
    ]
    trainer.run()  # 2 and 3 again; a second rewind keeps the first one's abandoned checkpoints too
    Trainer(load_config(path, ["train.updates=3", f"run.resume={checkpoints / 'update_000001'}"]), log=False).resume()
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "abandoned1_update_000002",
        "abandoned1_update_000003",
        "abandoned_update_000002",
        "abandoned_update_000003",
        "update_000001",
    ]
