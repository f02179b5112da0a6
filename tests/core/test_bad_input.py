"""Bad input, in a table: each bad config, prompt file or samples folder gives one message naming the field or file
and what was expected, exit status 2, no traceback, and writes nothing."""

from pathlib import Path

import pytest
from conftest import REPO

from flowrl.cli import main

GRPO = str(REPO / "configs" / "shapes_grpo.yaml")


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


CONFIG_CASES = [  # (overrides, expected text)
    (["optim.lr=fast"], "optim.lr: expected a finite number, got 'fast'"),
    (["train.updates=2.5"], "train.updates: expected an integer, got 2.5"),
    (["train.group_size=1"], "train.group_size: expected an integer >= 2"),
    (["train.lrr=1"], "train.lrr: unknown field; known fields:"),
    (["trian.lr=1"], "trian: unknown field"),
    (["sampler.kind=langevin"], "sampler.kind: expected one of"),
    (["lora.rank=100000"], "lora.rank: expected at most"),  # larger than any adapted layer: refused before peft
    (["sampler.noise_level=-1"], "sampler.noise_level: expected a number >= 0"),
    (["sampler.sde_window_size=9"], "sampler.sde_window_size: a window of 9 steps"),
    (["memory.mixed_precision=fp8"], "memory.mixed_precision: expected one of ['no', 'fp16', 'bf16']"),
    (["memory.weight_dtype=bf16"], "memory.weight_dtype: bf16 weights run under autocast"),
    (["reward=[]"], "reward: expected at least one reward term"),
    (["reward=[{name: shapez}]"], "reward[0].name: unknown reward 'shapez'"),
    (["reward=[{name: shapes, params: {dense: true, sharpness: 2}}]"], "reward[0].params:"),
    (["algorithm.name=ppo"], "algorithm.name: unknown algorithm 'ppo'"),
    (["runtime.collective_timeout_minutes=0"], "runtime.collective_timeout_minutes: expected an integer >= 1, got 0"),
    (["run.seed=-1"], "run.seed: expected an integer >= 0, got -1"),
    (["optim.grad_clip=0"], "optim.grad_clip: expected a positive gradient norm, got 0"),
    (["eval.num_steps=0"], "eval.num_steps: expected an integer >= 1, got 0"),
    (["eval.num_per_prompt=0"], "eval.num_per_prompt: expected an integer >= 1, got 0"),
    (["eval.seed=-3"], "eval.seed: expected an integer >= 0, got -3"),
    (["eval.seed=0"], "eval.seed: 0 is run.seed too"),
    (
        ["algorithm.name=tvrl", "algorithm.params.credit_batch=0"],
        "algorithm.params.credit_batch: expected an integer >= 1, got 0",
    ),
    (["algorithm.params.clip=0.1"], "algorithm.params.clip: unknown field"),
    (["algorithm.params.timestep_fraction=2"], "algorithm.params.timestep_fraction: expected a number in (0, 1]"),
    (["task.name=worlds"], "task.name: unknown task 'worlds'"),
    (["task.name=no_such_package:Task"], "task.name: cannot import module 'no_such_package'"),
    (["prompts.source=/nonexistent/prompts.txt"], "prompts.source: '/nonexistent/prompts.txt' is not a set"),
    (["eval.prompts=holdout"], "eval.prompts: 'holdout' is not a set of task 'shapes'"),
    (["pipeline.height=0"], "pipeline.height: expected a positive integer"),
    (["lora.rank=[1]"], "lora.rank: expected an integer"),
    (["memory.rollout_microbatch=-1"], "memory.rollout_microbatch: expected an integer >= 0"),
    (
        ["sampler.fk={num_particles: 3}"],
        "sampler.fk.num_particles: the FK particles of a prompt are its training group",
    ),
    (["optim.lr"], "override 'optim.lr': expected key=value"),
    (["run.name.first=x"], "override 'run.name.first=x': name is not a section"),
    (["train.data_loss={weight: -1}"], "train.data_loss: expected weight >= 0"),
    (["task.params.steering={mode: bogus}"], "task.params: task 'shapes' takes no parameters"),
]


@pytest.mark.parametrize("overrides,expected", CONFIG_CASES, ids=[c[1][:40] for c in CONFIG_CASES])
def test_bad_config_fields(overrides, expected, tmp_path, capsys):
    out = tmp_path / "runs"
    code = main(["train", GRPO, f"run.out_dir={out}", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("flowrl")]
    assert len(errors) == 1 and expected in errors[0], errors
    assert not out.exists()  # nothing written


def _samples_folder(tmp_path, lines, files=()):
    folder = tmp_path / "samples"
    folder.mkdir()
    (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")
    from PIL import Image

    for name in files:
        Image.new("RGB", (32, 32)).save(folder / name)
    return str(folder)


FILE_CASES = {
    "missing config": (lambda t: ["train", str(t / "missing.yaml")], "config file"),
    "config not YAML": (lambda t: ["train", _write(t, "b.yaml", "train: [unclosed\n")], "is not valid YAML"),
    "config not a mapping": (lambda t: ["train", _write(t, "l.yaml", "- a\n- b\n")], "expected a mapping of sections"),
    "missing samples folder": (
        lambda t: ["eval", "shapes", "--samples", str(t / "none")],
        "samples.jsonl does not exist",
    ),
    "samples.jsonl not JSON": (
        lambda t: ["eval", "shapes", "--samples", _samples_folder(t, ["{nope"])],
        "is not readable as JSON lines",
    ),
    "record without file": (
        lambda t: ["eval", "shapes", "--samples", _samples_folder(t, ['{"prompt": "a circle"}'])],
        "expected a JSON object with a 'file' field",
    ),
    "sample file missing": (
        lambda t: ["eval", "shapes", "--samples", _samples_folder(t, ['{"prompt": "a circle", "file": "0.png"}'])],
        "cannot read sample file",
    ),
    "prompt outside the grammar": (
        lambda t: [
            "eval",
            "shapes",
            "--samples",
            _samples_folder(t, ['{"prompt": "a purple circle", "file": "0.png"}'], ["0.png"]),
        ],
        "line 1",
    ),
    "record without prompt": (
        lambda t: ["eval", "shapes", "--samples", _samples_folder(t, ['{"file": "0.png"}'], ["0.png"])],
        "expected a 'prompt' string",
    ),
    "eval rewards without --reward": (
        lambda t: ["eval", "rewards", "--samples", _samples_folder(t, ['{"prompt": "a", "file": "0.png"}'], ["0.png"])],
        "expected --reward NAME",
    ),
    "reward params not an object": (
        lambda t: [
            "eval",
            "rewards",
            "--reward",
            "jpeg_compressibility",
            "--reward-params",
            "[1]",
            "--samples",
            str(t),
        ],
        "--reward-params",
    ),
    "unknown eval suite": (lambda t: ["eval", "geneval", "--samples", str(t)], "unknown suite 'geneval'"),
    "sample: missing prompt file": (
        lambda t: ["sample", "--pipeline", "p", "--prompts", str(t / "none.txt"), "--out", str(t / "o")],
        "prompt file",
    ),
    "sample: empty prompt file": (
        lambda t: ["sample", "--pipeline", "p", "--prompts", _write(t, "e.txt", "# only\n"), "--out", str(t / "o")],
        "has no prompts",
    ),
    "sample: jsonl without prompt": (
        lambda t: [
            "sample",
            "--pipeline",
            "p",
            "--prompts",
            _write(t, "p.jsonl", '{"text": "a cat"}\n'),
            "--out",
            str(t / "o"),
        ],
        "line 1: expected a JSON object with a 'prompt' string",
    ),
    "sample: zero per prompt": (
        lambda t: [
            "sample",
            "--pipeline",
            "p",
            "--prompts",
            _write(t, "p.txt", "a cat\n"),
            "--out",
            str(t / "o"),
            "--num-per-prompt",
            "0",
        ],
        "--num-per-prompt",
    ),
    "sample: missing pipeline": (
        lambda t: [
            "sample",
            "--pipeline",
            str(t / "nope"),
            "--prompts",
            _write(t, "p.txt", "a cat\n"),
            "--out",
            str(t / "o"),
        ],
        "has no model_index.json",
    ),
    "sample: --out under a file": (
        lambda t: [
            "sample",
            "--pipeline",
            "p",
            "--prompts",
            _write(t, "p.txt", "a cat\n"),
            "--out",
            str(Path(_write(t, "taken", "a file\n")) / "o"),
        ],
        "cannot be created",
    ),
    "train: run.out_dir a file": (
        lambda t: ["train", GRPO, f"run.out_dir={_write(t, 'taken', 'a file')}"],
        "run.out_dir: expected a folder to hold the run folders, got the file",
    ),
    "train: run.out_dir under a file": (
        lambda t: ["train", GRPO, f"run.out_dir={Path(_write(t, 'taken', 'a file')) / 'runs'}"],
        "runs cannot be created, ",
    ),
    "train: run folder a file": (
        lambda t: ["train", GRPO, f"run.out_dir={t}", f"run.name={Path(_write(t, 'taken', 'a file')).name}"],
        "run.name: expected a run folder at out_dir/name, got the file",
    ),
    "serve-reward: no body limit": (
        lambda t: ["serve-reward", "jpeg_compressibility", "--max-body-mb", "0"],
        "--max-body-mb: expected a positive number of MB",
    ),
    "sample: pipeline newer than diffusers": (
        lambda t: [
            "sample",
            "--pipeline",
            str(Path(_write(t / "future", "model_index.json", '{"_class_name": "Flux9Pipeline"}\n')).parent),
            "--prompts",
            _write(t, "p.txt", "a cat\n"),
            "--out",
            str(t / "o"),
        ],
        "holds a Flux9Pipeline, which diffusers",
    ),
    "export: missing checkpoint": (
        lambda t: [
            "export",
            "--pipeline",
            str(REPO / "pipelines" / "shapes-sd3"),
            "--checkpoint",
            str(t / "none"),
            "--out",
            str(t / "o"),
        ],
        "has no trainable.safetensors",
    ),
}


@pytest.mark.parametrize("case", FILE_CASES)
def test_bad_files_and_folders(case, tmp_path, capsys):
    argv, expected = FILE_CASES[case]
    code = main(argv(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("flowrl")]
    assert len(errors) == 1 and expected in errors[0], errors
    assert not (tmp_path / "o").exists()


def test_the_table_is_at_least_thirty_cases():
    assert len(CONFIG_CASES) + len(FILE_CASES) >= 30


def test_two_reward_terms_of_one_name_are_refused(tiny_sd3_dir, tmp_path):
    """Each term's scores are logged and normalised under its name: two remote terms, both named 'remote' by
    default, would overwrite each other (the second server's scores used for both under normalize_rewards)."""
    from run_helpers import tiny_run_config

    from flowrl.builders import build_rewards
    from flowrl.config import load_config
    from flowrl.errors import ConfigError

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "twice")
    twice = "reward=[{name: jpeg_compressibility}, {name: jpeg_compressibility, weight: 0.5}]"
    with pytest.raises(ConfigError, match=r"reward\[1\]: a second term named 'jpeg_compressibility'"):
        build_rewards(load_config(path, [twice]))


def test_a_policy_without_default_lora_targets_asks_for_them(tiny_sd3_dir, tmp_path, monkeypatch):
    """A plugin adapter that names no lora_targets, with the default LoRA section: one error naming the setting
    (an AttributeError on lora_targets before)."""
    from run_helpers import tiny_run_config

    from flowrl.builders import build_policy
    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.policies.sd3 import SD3Policy

    monkeypatch.setattr(SD3Policy, "lora_targets", None)
    config = load_config(tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "plugin"))
    with pytest.raises(ConfigError, match="lora.target_modules: SD3Policy names no default LoRA targets"):
        build_policy(config)
    assert build_policy(load_config(tmp_path / "c.yaml", ["lora.target_modules=[attn.to_q]"])).has_lora


def test_a_sample_folder_the_file_system_refuses_is_one_error(tmp_path, monkeypatch):
    """What the early check cannot foresee (a read-only file system; root passes every access check) is still one
    error naming --out, not a traceback after the pipeline has loaded."""
    from types import SimpleNamespace

    from flowrl.errors import UserError
    from flowrl.resumable_sampling import draw_samples
    from flowrl.tasks.base import Condition

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(UserError, match=r"--out .*o cannot be created: Read-only file system"):
        draw_samples(None, [Condition("a cat")], 1, 0, tmp_path / "o", {}, SimpleNamespace(is_main_process=True))
