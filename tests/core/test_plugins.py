"""Plug-ins: a package outside flowrl registers nothing in flowrl, yet its reward, algorithm and task train from
YAML by dotted path; and importing the loop loads no task or safety code."""

import csv
import json
import os
import subprocess
import sys

import yaml
from conftest import REPO
from run_helpers import run_flowrl

PLUGINS = REPO / "tests" / "support" / "plugins"


def test_a_plugin_reward_algorithm_and_task_train_from_yaml(tiny_sd3_dir, tmp_path, monkeypatch):
    config = {
        "run": {"name": "plugin", "out_dir": str(tmp_path / "runs"), "seed": 0},
        "task": {"name": "toy_plugin:Colours"},  # its defaults bring the reward toy_plugin:Redness
        "pipeline": {"path": str(tiny_sd3_dir), "height": 32, "width": 32, "max_sequence_length": 16},
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 3, "guidance_scale": 2.0},
        "algorithm": {"name": "toy_plugin:Reinforce", "params": {"adv_clip_max": 3.0}},
        "train": {"updates": 2, "groups_per_update": 2, "group_size": 2},
        "memory": {"microbatch_size": 8},
        "runtime": {"threads": 1},
        "eval": {"num_per_prompt": 2, "num_steps": 3},
    }
    path = tmp_path / "plugin.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "flowrl", "train", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "plugin"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert len(rows) == 2 and all("log_prob" in r and "reward/redness" in r for r in rows)
    evals = json.loads((run / "eval.json").read_text())
    assert set(evals) == {"0", "2"} and set(evals["0"]["tags"]) == {"red", "green"}  # the task's eval set
    assert "dominant colour" in (run / "report.html").read_text()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["reward"][0]["name"] == "toy_plugin:Redness"  # the task's default reward was used

    monkeypatch.syspath_prepend(str(PLUGINS))  # the bad names need no process of their own
    bad = run_flowrl("train", str(path), "algorithm.name=toy_plugin:Nope")
    assert bad.returncode == 2 and "algorithm.name: module 'toy_plugin' has no attribute 'Nope'" in bad.stderr
    missing = run_flowrl("train", str(path), "task.name=not_installed:Task")
    assert missing.returncode == 2 and "task.name: cannot import module 'not_installed'" in missing.stderr


def test_the_loop_loads_no_task_or_safety_code():
    code = (
        "import sys; import flowrl.train, flowrl.experiment, flowrl.cli; from flowrl.config import SamplerSection; "
        "from flowrl.algorithms import build_algorithm; build_algorithm('grpo', {}, SamplerSection()); "
        "print(sorted(m for m in sys.modules if m.startswith("
        "('flowrl.worlds.safety', 'flowrl.worlds.shapes', 'flowrl.tasks.'))"
        " and m != 'flowrl.tasks.base'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_plugin_task_evaluates_a_samples_folder(tmp_path, monkeypatch):
    import torch

    from flowrl.sample_io import ImageSamples, write_samples

    images = torch.zeros(3, 3, 8, 8)
    images[0, 0], images[1, 1], images[2, 0] = 1.0, 1.0, 1.0  # red, green, red
    records = [
        {"prompt": "a red square", "tag": "red"},
        {"prompt": "a green square", "tag": "green"},
        {"prompt": "a green square", "tag": "green"},
    ]
    write_samples(tmp_path, ImageSamples(images), records)
    monkeypatch.syspath_prepend(str(PLUGINS))  # (the plugin trains from YAML through `python -m flowrl` above)
    done = run_flowrl("eval", "toy_plugin:Colours", "--samples", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "colours_eval.json").read_text())
    assert result["tags"] == {"green": 0.5, "red": 1.0} and result["overall"] == 0.75
    rewards = run_flowrl("eval", "rewards", "--samples", str(tmp_path), "--reward", "toy_plugin:Redness")
    assert rewards.returncode == 0, rewards.stderr[-2000:]
    scored = json.loads((tmp_path / "rewards_eval.json").read_text())
    assert scored["tags"] == {"green": 0.0, "red": 1.0}  # mean red minus green per tag: (-1 + 1) / 2 and 1
    # read and scored two files at a time (batches [red, green], [green]): the same per-tag means
    paired = run_flowrl(
        "eval", "rewards", "--samples", str(tmp_path), "--reward", "toy_plugin:Redness", "--batch-size", "2"
    )
    assert paired.returncode == 0, paired.stderr[-2000:]
    assert json.loads((tmp_path / "rewards_eval.json").read_text())["tags"] == scored["tags"]
