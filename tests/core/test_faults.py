"""Faults with nothing lost: rewards that return NaN or raise for some samples, too many failures, corrupt and
torn checkpoints, a full disk while saving."""

import math
from pathlib import Path

import pytest
import torch
from run_helpers import tiny_run_config

from flowrl.config import load_config
from flowrl.errors import UserError
from flowrl.rewards import Reward, RewardOutput
from flowrl.train import Trainer


def _trainer(tiny_sd3_dir, tmp_path, reward, *overrides, updates=2):
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "faults", updates=updates)
    return Trainer(load_config(path, [f"reward=[{{name: toy_rewards:{reward}}}]", *overrides]), log=False)


def test_failed_samples_skip_their_groups_and_the_run_goes_on(tiny_sd3_dir, tmp_path):
    trainer = _trainer(
        tiny_sd3_dir, tmp_path, "NaNForSomeSeeds", "train.max_failed_reward_share=0.9", "train.groups_per_update=4"
    )
    batch, metrics = trainer.collect(0)
    assert all(s % 5 for s in batch.seeds)  # every kept sample has a finite reward...
    kept_groups = set(batch.group_ids.tolist())
    assert 0 < len(kept_groups) < 4  # ...and whole groups went: those holding a failed sample
    assert metrics["reward_failed_groups"] == 4 - len(kept_groups) and metrics["reward_failed_samples"] >= 1
    assert torch.isfinite(batch.global_rewards).all() and math.isfinite(metrics["reward_mean"])
    rows = []
    trainer.run(lambda update, m: rows.append(m))
    assert len(rows) == 2 and any("loss" in r for r in rows)
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)  # an update with no group left trains nothing


@pytest.mark.slow
def test_a_process_whose_every_group_failed_skips_the_update_with_the_others(tiny_sd3_dir, tmp_path):
    """2 gloo processes, one group each: where one process's group has a failed sample and the other's has none, the
    first would hold no sample to train while the other waits in the gradient all-reduce (a crash on one, a hang on
    the other): every process skips that update, and the run goes on."""
    import csv

    from run_helpers import torchrun

    from flowrl.prompt_source import derived_seed

    modulus, updates = 15, 3
    path = tiny_run_config(
        tmp_path / "c.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "two",
        updates=updates,
        groups_per_update=2,
        checkpoint_every=0,
        ema_decay=0.0,
    )
    reward = f"reward=[{{name: toy_rewards:NaNForSomeSeeds, params: {{modulus: {modulus}}}}}]"
    result = torchrun(["-m", "flowrl", "train", path, reward, "train.max_failed_reward_share=0.9"], port=29537)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = [
        [any(derived_seed(0, u, i) % modulus == 0 for i in range(4 * g, 4 * g + 4)) for g in range(2)]
        for u in range(updates)
    ]
    expected = [any(f) for f in failed]
    assert expected.count(True) == 1 and failed.count([True, False]) == 1  # this seed: process 0's group, once
    rows = list(csv.DictReader((tmp_path / "runs/two/metrics.csv").open()))
    assert [bool(r.get("update_skipped")) for r in rows] == expected
    assert all(bool(r.get("loss")) != skipped for r, skipped in zip(rows, expected))  # the others trained


@pytest.mark.slow
def test_a_process_whose_reward_is_down_logs_the_same_metrics_as_the_others(tiny_sd3_dir, tmp_path):
    """One of 2 gloo processes scores nothing (its reward unavailable): it holds no scorer info keys, the other does.
    Gathering per key would pair one process's extra gather with the other's next collective (a hang); every
    process gathers the agreed keys, the updates are skipped, the run ends and logs the other's keys."""
    import csv

    from run_helpers import torchrun

    path = tiny_run_config(
        tmp_path / "c.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "down",
        updates=2,
        groups_per_update=2,
        checkpoint_every=0,
        ema_decay=0.0,
    )
    result = torchrun(
        [
            "-m",
            "flowrl",
            "train",
            path,
            "reward=[{name: toy_rewards:UnavailableOnProcessOne}]",
            "train.max_failed_reward_share=0.9",
            "runtime.collective_timeout_minutes=4",
        ],
        port=29541,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "runs/down/metrics.csv").open()))
    assert len(rows) == 2 and all(r.get("update_skipped") for r in rows)
    assert all(float(r["reward/unavailable_on_one/darkness"]) > 0 for r in rows)


def test_a_command_among_other_processes_leaves_with_its_status_once_its_group_is_destroyed(tmp_path, monkeypatch):
    """Under torchrun, `flowrl` destroys its process group and, with other processes, leaves through os._exit with
    the command's status (2 here: a missing config), not through the interpreter's shutdown, where gloo's threads
    (kept alive by DDP's reducer) can abort a process that finished its work. Alone in its group it only destroys
    it, and returns."""
    import os

    import torch.distributed as dist

    from flowrl.cli import main

    events = []

    class Left(Exception):
        pass

    def leave(status):
        events.append(("os._exit", status))
        raise Left

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: events.append("destroyed"))
    monkeypatch.setattr(os, "_exit", leave)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    with pytest.raises(Left):
        main(["train", str(tmp_path / "missing.yaml")])
    assert events == ["destroyed", ("os._exit", 2)]
    events.clear()
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert events == ["destroyed"]


@pytest.mark.slow
def test_under_fsdp2_failed_groups_that_leave_unequal_shares_skip_the_update(tiny_sd3_dir, tmp_path):
    """FSDP2, DiffusionNFT (whose preparation runs no-grad passes over each process's samples, a rollout batch at a
    time), 2 processes with 2 groups each: where one process loses a group to a failed reward and the other none,
    the two would run unequal numbers of passes through the sharded denoiser (gathers that cannot pair: measured to
    stop the run without the rule); every process skips that update instead, and the run ends."""
    from run_helpers import train_on_two_processes

    from flowrl.prompt_source import derived_seed

    modulus = 7
    path = tiny_run_config(
        tmp_path / "c.yaml",
        tiny_sd3_dir,
        tmp_path / "runs",
        "nft",
        updates=3,
        group_size=2,
        groups_per_update=4,
        rollout_microbatch=2,
        checkpoint_every=0,
    )
    failed = [
        [any(derived_seed(0, u, i) % modulus == 0 for i in range(2 * g, 2 * g + 2)) for g in range(4)] for u in range(3)
    ]
    assert any(sum(f[:2]) != sum(f[2:]) for f in failed) and all(sum(f[:2]) < 2 and sum(f[2:]) < 2 for f in failed)
    weights = train_on_two_processes(
        path,
        tmp_path / "w.safetensors",
        29539,
        [
            "algorithm={name: nft, params: {}}",
            "sampler.kind=ode",
            "train.max_failed_reward_share=0.9",
            f"reward=[{{name: toy_rewards:NaNForSomeSeeds, params: {{modulus: {modulus}}}}}]",
        ],
        fsdp2=True,
    )
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_a_raising_reward_is_scored_sample_by_sample_and_too_many_failures_stop_cleanly(tiny_sd3_dir, tmp_path):
    from flowrl.prompt_source import derived_seed

    trainer = _trainer(
        tiny_sd3_dir, tmp_path, "RaisesOnSomeSeeds", "train.max_failed_reward_share=0.9", "train.groups_per_update=4"
    )
    batch, metrics = trainer.collect(0)
    raising = sum(derived_seed(0, 0, i) % 7 == 0 for i in range(16))
    assert raising >= 1 and metrics["reward_failed_samples"] == raising  # only those failed, one by one
    assert all(s % 7 for s in batch.seeds) and len(batch.seeds) >= 4  # and the other groups were kept
    (tmp_path / "strict").mkdir()
    strict = _trainer(tiny_sd3_dir, tmp_path / "strict", "NaNForSomeSeeds", "train.max_failed_reward_share=0.0")
    with pytest.raises(
        UserError,
        match="reward toy_rewards:NaNForSomeSeeds: .* no finite reward.*stopped with a checkpoint at update 0",
    ):
        strict.run()
    assert (strict.checkpoint_dir / "update_000000" / "state.json").is_file()


def test_a_corrupt_newest_checkpoint_is_reported_and_the_one_before_it_resumes_exactly(tiny_sd3_dir, tmp_path):
    from run_helpers import train_and_collect

    from flowrl.checkpoint import list_checkpoints

    path = tiny_run_config(
        tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "corrupt", updates=3, keep_checkpoints=3
    )
    expected = train_and_collect(path, ["run.name=whole"])
    train_and_collect(path, ["train.updates=2"])  # checkpoints at updates 1 and 2
    newest = tmp_path / "runs" / "corrupt" / "checkpoints" / "update_000002" / "trainable.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])  # a torn write
    trainer = Trainer(load_config(path), log=False)
    trainer.run()
    assert trainer.resumed_from.name == "update_000001"
    folder = trainer.checkpoint_dir  # the corrupt one is set aside, so pruning and later resumes never pick it
    assert (folder / "corrupt_update_000002").is_dir()
    assert [p.name for p in list_checkpoints(folder)] == ["update_000001", "update_000002", "update_000003"]
    resumed = {k: v.cpu() for k, v in trainer.policy.trainable_state_dict().items()}
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)


@pytest.mark.slow
def test_two_processes_resume_past_a_corrupt_checkpoint(tiny_sd3_dir, tmp_path):
    """Every process finds the newest checkpoint corrupt; the main one alone sets it aside, and both resume from the
    one before it (before, both renamed it, or one read it while the other moved it: the run stopped)."""
    from run_helpers import train_on_two_processes

    path = tiny_run_config(
        tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "corrupt2", updates=3, keep_checkpoints=3
    )
    train_on_two_processes(path, tmp_path / "a.safetensors", 29538, ["train.updates=2"])
    folder = tmp_path / "runs" / "corrupt2" / "checkpoints"
    newest = folder / "update_000002" / "trainable.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])
    train_on_two_processes(path, tmp_path / "b.safetensors", 29538)
    assert (folder / "corrupt_update_000002").is_dir() and not (folder / "corrupt_update_000001").exists()
    assert sorted(p.name for p in folder.glob("update_*")) == ["update_000001", "update_000002", "update_000003"]


def test_a_full_disk_while_saving_is_one_clear_error_and_the_previous_checkpoint_survives(
    tiny_sd3_dir, tmp_path, monkeypatch
):
    import flowrl.checkpoint as checkpoint

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "full", updates=2)
    trainer = Trainer(load_config(path), log=False)
    real_save = checkpoint.save_file
    calls = []

    def save_until_full(tensors, file, *args, **kwargs):
        calls.append(file)
        if "update_000002" in str(file):
            raise OSError(28, "No space left on device")
        return real_save(tensors, file, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", save_until_full)
    with pytest.raises(
        UserError,
        match=r"could not write checkpoint .*update_000002 .*No space left on device.*"
        "previous checkpoints are intact",
    ):
        trainer.run()
    folder = trainer.checkpoint_dir
    assert [p.name for p in checkpoint.list_checkpoints(folder)] == ["update_000001"]
    assert not list(folder.glob(".tmp_*"))  # the half-written one is gone
    checkpoint.load_checkpoint(folder / "update_000001")  # and the previous one reads back whole


@pytest.mark.slow
def test_kill_9_at_five_points_then_resume_gives_the_uninterrupted_weights(tiny_sd3_dir, tmp_path):
    """SIGKILL during a rollout, during an update and during a checkpoint write (between the files and state.json),
    five times in one run dir; each restart resumes from the newest whole checkpoint, and the final weights equal
    an uninterrupted run's, bit for bit."""
    import os
    import subprocess
    import sys

    from conftest import REPO
    from safetensors.torch import load_file

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "killed", updates=4)

    def train(name, kill_at=None):
        env = {k: v for k, v in os.environ.items() if k != "FLOWRL_KILL_AT"}
        if kill_at:
            env["FLOWRL_KILL_AT"] = kill_at
        return subprocess.run(
            [sys.executable, "-m", "flowrl", "train", str(path), f"run.name={name}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    assert train("whole").returncode == 0
    for kill_at in ["rollout@0", "update@1", "checkpoint@2", "rollout@2", "checkpoint@3"]:
        done = train("killed", kill_at)
        assert done.returncode == -9, (kill_at, done.stderr[-2000:])
    assert train("killed").returncode == 0
    runs = tmp_path / "runs"
    for file in ["trainable.safetensors", "ema.safetensors"]:
        expected = load_file(runs / "whole" / "checkpoints" / "update_000004" / file)
        resumed = load_file(runs / "killed" / "checkpoints" / "update_000004" / file)
        assert expected.keys() == resumed.keys() and all(torch.equal(expected[k], resumed[k]) for k in expected)
    metrics = (runs / "killed" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 5  # one row per update, none lost or repeated


def test_a_reward_failing_in_an_evaluation_stops_the_run_with_one_clear_error(tiny_sd3_dir, tmp_path):
    """The in-run evaluation of a prompt-file task scores the run's reward on every process; this one cannot score
    evaluation calls (they carry no seeds), so the run stops with an error naming the process, not a traceback or a
    process left waiting for the others."""
    from flowrl.experiment import run_experiment

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "eval_fault", updates=1)
    config = load_config(
        path,
        [
            "reward=[{name: toy_rewards:RaisesOnSomeSeeds}]",
            "task.name=prompt_file",
            f"prompts.source={prompts}",
            "eval.enabled=true",
            f"eval.prompts={prompts}",
            "eval.num_per_prompt=1",
            "eval.num_steps=2",
        ],
    )
    with pytest.raises(UserError, match="evaluation: the reward failed on process 0: KeyError"):
        run_experiment(config)


@pytest.mark.parametrize("when", ["before_the_steps", "after_a_step", "after_the_update"])
def test_ctrl_c_saves_only_at_an_update_boundary(tiny_sd3_dir, tmp_path, when):
    """Ctrl-C before an update's first optimizer step saves the run at that update (nothing of it applied yet);
    after it, weights, Adam's moments and EMA hold part of the update, which a checkpoint at that number would
    apply again on resume: none is written, the last periodic one stands. Once the update is done (an evaluation
    after it, say), the run saves at the next number."""
    trainer = _trainer(
        tiny_sd3_dir,
        tmp_path,
        "NaNForSomeSeeds",
        "train.optimizer_steps_per_update=2",
        "train.checkpoint_every=0",
        "train.max_failed_reward_share=0.9",
    )
    on_update = None
    if when == "after_the_update":

        def on_update(update, metrics):
            if update == 1:
                raise KeyboardInterrupt
    elif when == "after_a_step":
        step = trainer.optimizer.step

        def interrupted_step(*args, **kwargs):
            step(*args, **kwargs)
            if trainer.state.update == 1:
                raise KeyboardInterrupt

        trainer.optimizer.step = interrupted_step
    else:
        optimize = trainer.optimize

        def interrupted_optimize(batch, items, update, progress=None):
            if update == 1:
                raise KeyboardInterrupt
            return optimize(batch, items, update, progress)

        trainer.optimize = interrupted_optimize
    with pytest.raises(KeyboardInterrupt):
        trainer.run(on_update)
    saved = sorted(p.name for p in (tmp_path / "runs/faults/checkpoints").glob("update_*"))
    assert saved == ([] if when == "after_a_step" else ["update_000001"])


def test_an_interrupted_pretrain_leaves_the_previous_folder_whole(tmp_path):
    """A recipe rebuilding a folder (the shipped pipelines/ ones by default) writes beside it and takes its place
    only once done: interrupted, the previous weights and card stay as they were, with only the recipe's saved
    progress beside them; done, the folder holds the new files only, and the progress is gone."""
    from argparse import Namespace

    from flowrl.cli import TaskCommands
    from flowrl.cli.pretrain import cmd_pretrain

    def recipe(args):
        out = Path(args.out)
        args.progress.mkdir(exist_ok=True)
        (args.progress / "stage.pt").write_text("saved")  # as a recipe that saves its stages does
        (out / "weights.bin").write_text("new")
        if args.seed == 1:
            raise KeyboardInterrupt  # before the card is written
        (out / "README.md").write_text("new card")

    extension = TaskCommands(pretrain={"toy": recipe}, pretrain_out={"toy": str(tmp_path / "pipelines" / "toy")})
    folder = tmp_path / "pipelines" / "toy"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_text("old")
    (folder / "README.md").write_text("old card")
    (folder / "training_facts.json").write_text("{}")  # an earlier recipe's output: it may be replaced
    with pytest.raises(KeyboardInterrupt):
        cmd_pretrain(Namespace(recipe="toy", out=None, seed=1), [extension])
    assert {p.name: p.read_text() for p in folder.iterdir()} == {
        "weights.bin": "old",
        "README.md": "old card",
        "training_facts.json": "{}",
    }
    assert sorted(p.name for p in (tmp_path / "pipelines").iterdir()) == [".toy.progress", "toy"]
    cmd_pretrain(Namespace(recipe="toy", out=None, seed=0), [extension])
    assert {p.name: p.read_text() for p in folder.iterdir()} == {"weights.bin": "new", "README.md": "new card"}
    assert [p.name for p in (tmp_path / "pipelines").iterdir()] == ["toy"]


def test_a_pretrain_refuses_to_replace_a_folder_no_recipe_wrote(tmp_path):
    """`--out pipelines` (a typo) would have replaced every shipped pipeline once the recipe finished."""
    from argparse import Namespace

    from flowrl.cli import TaskCommands
    from flowrl.cli.pretrain import cmd_pretrain
    from flowrl.errors import UserError

    trained = []
    extension = TaskCommands(pretrain={"toy": lambda args: trained.append(args.out)}, pretrain_out={"toy": None})
    (tmp_path / "shapes-sd3").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="--out .* not empty and holds no earlier recipe output"):
        cmd_pretrain(Namespace(recipe="toy", out=str(tmp_path), seed=0), [extension])
    assert trained == [] and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "shapes-sd3"]
    cmd_pretrain(Namespace(recipe="toy", out=str(tmp_path / "new"), seed=0), [extension])  # a new folder is fine
    assert len(trained) == 1


@pytest.mark.parametrize("recipe", ["shapes-sd", "shapes-kontext"])
def test_a_recipe_reusing_shapes_sd3s_vae_names_a_missing_one(recipe, tmp_path, capsys):
    """Run from outside the checkout, the default pipelines/shapes-sd3 is not there: one error, before training, and
    nothing written."""
    from flowrl.cli import main

    assert main(["pretrain", recipe, "--pipeline", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no vae/ folder there" in err and "Traceback" not in err and not (tmp_path / "out").exists()
    assert main(["pretrain", recipe, "--card-only", "--out", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert f"--card-only: {tmp_path / 'missing'} holds no trained {recipe} output" in err and "Traceback" not in err


def test_a_failed_intermediate_reward_skips_its_group_under_incremental_credit(tiny_sd3_dir, tmp_path):
    """One NaN step reward once made the global std of its step NaN: every sample's advantage at that step NaN."""
    trainer = _trainer(
        tiny_sd3_dir,
        tmp_path,
        "NaNMidway",
        "algorithm.params={credit: incremental}",
        "train.groups_per_update=4",
        "train.max_failed_reward_share=0.9",
    )
    batch, metrics = trainer.collect(0)
    assert metrics["reward_failed_groups"] == 1 and 0 not in batch.group_ids.tolist()
    assert torch.isfinite(batch.global_step_rewards).all()
    items, _ = trainer.algorithm.prepare(batch, trainer.policy)
    losses, _ = trainer.algorithm.loss(trainer.policy, batch, items)
    assert len(losses) and torch.isfinite(losses).all()


def test_an_intermediate_reward_that_raises_fails_its_samples_instead_of_the_rollout(tiny_sd3_dir, tmp_path):
    """It once escaped the rollout as the reward's own exception, past the loop's clean stop (RewardFailure)."""
    from flowrl.collect import RewardFailure

    trainer = _trainer(tiny_sd3_dir, tmp_path, "RaisesMidway", "algorithm.params={credit: incremental}")
    with pytest.raises(RewardFailure, match="100% of update 0's samples got no finite reward"):
        trainer.collect(0)


def test_after_a_raise_a_group_scoring_reward_is_asked_one_group_at_a_time():
    """The fallback once scored one sample per call: a group rubric then built one-sample rubrics inside a group."""
    from flowrl.rewards.base import score_robustly
    from flowrl.tasks.base import Condition

    class GroupRubricLike(Reward):
        scores_groups = True
        calls = []

        def __call__(self, samples, prompts, meta=None):
            self.calls.append(list(prompts))
            if "bad" in prompts:
                raise RuntimeError("cannot audit this group")
            return RewardOutput(torch.full((len(prompts),), float(len(prompts))))

    items = [Condition(p) for p in ["a", "a", "bad", "bad", "c", "c"]]
    out, error = score_robustly(
        GroupRubricLike(), torch.zeros(6, 3, 4, 4), [i.prompt for i in items], {"conditions": items}
    )
    assert error.startswith("RuntimeError") and GroupRubricLike.calls[1:] == [["a", "a"], ["bad", "bad"], ["c", "c"]]
    assert out.scores[[0, 1, 4, 5]].tolist() == [2.0] * 4 and torch.isnan(out.scores[2:4]).all()
