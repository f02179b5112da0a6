"""Configs load into typed dataclasses; bad input gets one clear line and exit status 2."""

import subprocess
import sys

import pytest
from conftest import REPO
from run_helpers import run_flowrl

from flowrl.config import load_config
from flowrl.errors import ConfigError

SHIPPED = sorted((REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path):
    from flowrl.algorithms import build_algorithm
    from flowrl.builders import build_rewards

    config = load_config(path)
    build_algorithm(config.algorithm.name, config.algorithm.params, config.sampler)
    build_rewards(config)


def test_overrides_are_typed(tmp_path):
    config = load_config(
        REPO / "configs/shapes_grpo.yaml",
        ["optim.lr=1e-3", "sampler.kind=dance", "lora=null", "algorithm.params.kl_beta=0.04"],
    )
    assert config.optim.lr == 1e-3 and config.sampler.kind == "dance" and config.lora is None
    assert config.algorithm.params["kl_beta"] == 0.04
    # YAML 1.1 reads a bare `no` as false: `mixed_precision: no` still means "no"
    assert load_config(REPO / "configs/shapes_grpo.yaml", ["memory.mixed_precision=no"]).memory.mixed_precision == "no"


@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.lr=fast", "optim.lr: expected a finite number, got 'fast'"),
        ("optim.lr=nan", "optim.lr: expected a finite number, got 'nan'"),  # `lr <= 0` let NaN through
        ("eval.guidance_scale=.inf", "eval.guidance_scale: expected a finite number, got inf"),
        ("train.group_size=1", "train.group_size: expected an integer >= 2"),
        ("sampler.kind=langevin", "sampler.kind: expected one of"),
        ("train.lrr=1", "train.lrr: unknown field"),
        ("train.updates=2.5", "train.updates: expected an integer, got 2.5"),
        ("memory.mixed_precision=fp8", "memory.mixed_precision: expected one of ['no', 'fp16', 'bf16']"),
        ("lora.rank=[1]", "lora.rank: expected an integer"),
        ("sampler.sde_window_size=9", "sampler.sde_window_size"),
        ("task.name=worlds", "task.name: unknown task 'worlds'"),
        ("reward=[]", "reward: expected at least one reward term"),
        ("pipeline.height=0", "pipeline.height: expected a positive integer"),
        ("prompts.source=nowhere", "nowhere"),
        ("lora.active_from_sigma=1.5", "lora.active_from_sigma: expected a noise level in (0, 1], got 1.5"),
        ("lora.active_from_sigma=0", "lora.active_from_sigma: expected a noise level in (0, 1]"),
        ("sampler.kind=ddim lora.active_from_sigma=0.5", "lora.active_from_sigma: flow samplers only"),
        ("lora.sample_from_sigma=2", "lora.sample_from_sigma: expected a noise level in (0, 1], got 2"),
        # each once crashed after the model loaded (peft, torch's AdamW, set_num_threads) or meant something else
        ("lora.rank=0", "lora.rank: expected an integer >= 1, got 0"),
        ("optim.adam_betas=[0.9]", "optim.adam_betas: expected two numbers in [0, 1), got [0.9]"),
        ("runtime.threads=-1", "runtime.threads: expected an integer >= 0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay: expected a number >= 0"),
        ("pipeline.max_sequence_length=0", "pipeline.max_sequence_length: expected a positive integer"),
        ('reward=[{"name":"shapes","batch_size":-1}]', "reward[0].batch_size: expected an integer >= 0"),
        ('sampler.fk={"num_particles":8} sampler.kind=ode', "sampler.fk: FK particles need a stochastic sampler"),
        ('sampler.fk={"num_particles":8,"resample_range":[5,2]}', "sampler.fk.resample_range: expected [start, end]"),
        ("run.resume=/nowhere/update_000010", "run.resume: /nowhere/update_000010 is not a folder"),
        ("task.name=5", "task.name: expected a registered task's name or package.module:Class, got 5"),
    ],
)
def test_bad_fields_are_named(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(REPO / "configs/shapes_grpo.yaml", override.split(" "))
    assert message in str(error.value)


def _flowrl(*args, cwd=REPO):
    """The entry point itself, `python -m flowrl`, in a process of its own (other CLI tests use run_flowrl)."""
    return subprocess.run([sys.executable, "-m", "flowrl", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_bad_config_exits_2_with_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: fast\nrun:\n  out_dir: " + str(tmp_path / "runs") + "\n")
    result = _flowrl("train", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["flowrl train: error: optim.lr: expected a finite number, got 'fast'"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "missing.yaml"], "config file missing.yaml does not exist"),
        (
            ["train", "configs/shapes_grpo.yaml", "pipeline.path=/nonexistent"],
            "pipeline folder /nonexistent has no model_index.json",
        ),
        (["eval", "shapes", "--samples", "/nonexistent"], "/nonexistent/samples.jsonl does not exist"),
        (
            ["sample", "--pipeline", "pipelines/shapes-sd3", "--prompts", "/nonexistent.txt", "--out", "/tmp/x"],
            "prompt file /nonexistent.txt does not exist",
        ),
        (
            [
                "sample",
                "--pipeline",
                "pipelines/shapes-sd3",
                "--prompts",
                "assets/shapes/eval_prompts.txt",
                "--out",
                "/tmp/never_written",
                "--batch-size",
                "0",
            ],
            "--batch-size: expected a number >= 1, got 0",
        ),
        (
            [
                "sample",
                "--pipeline",
                "pipelines/shapes-sd3",
                "--prompts",
                "assets/shapes/eval_prompts.txt",
                "--out",
                "/tmp/never_written",
                "--seed",
                "-1",
            ],
            "--seed: expected a number >= 0, got -1",
        ),
        (
            ["eval", "rewards", "--samples", "/nonexistent", "--reward", "jpeg_compressibility", "--device", "gpu"],
            "--device: expected cpu, cuda or cuda:N, got 'gpu'",
        ),
        (
            [
                "sample",
                "--pipeline",
                "pipelines/shapes-sd3",
                "--prompts",
                "assets/shapes/eval_prompts.txt",
                "--out",
                "/tmp/never_written",
                "--decode-microbatch",
                "-1",
            ],
            "--decode-microbatch: expected a number >= 0",
        ),
        (
            [
                "sample",
                "--pipeline",
                "/nonexistent",
                "--prompts",
                "assets/shapes/eval_prompts.txt",
                "--out",
                "/tmp/never_written",
                "--fk-particles",
                "2",
                "--fk-reward",
                "pickscore",
                "--fk-reward-params",
                '{"path": "/nowhere/ps"}',
            ],
            "--fk-reward.params.path: /nowhere/ps does not exist",
        ),
        (
            ["pretrain", "shapes", "--flow-steps", "0", "--out", "/tmp/never_written"],
            "--flow-steps: expected a number >= 1",
        ),
        (
            ["pretrain", "shapes3d", "--card-only", "--out", "/tmp/never_written"],
            "--card-only: the shapes3d recipe cannot re-measure a folder without training",
        ),
    ],
)
def test_cli_bad_inputs_are_named(args, message):
    result = run_flowrl(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_cli_bad_yaml_is_named(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("train: [unclosed\n")
    result = run_flowrl("train", str(bad))
    assert result.returncode == 2 and "is not valid YAML" in result.stderr


def test_task_shorthand_takes_param_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        (REPO / "configs" / "shapes_safe_grpo.yaml").read_text().replace("task: {name: safety}", "task: safety")
    )
    config = load_config(path, ["task.params.steering={mode: negative}"])
    assert config.task.name == "safety" and config.task.params == {"steering": {"mode": "negative"}}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["reward=[{name: pickscore, params: {path: /nowhere/PickScore_v1}}]"], "/nowhere/PickScore_v1"),
        (["task.name=shapes", "eval.prompts={tmp}/cats.txt"], "eval.prompts: .*a photo of a cat"),
        (["prompts.source=/nowhere/train.txt"], "/nowhere/train.txt"),
    ],
)
def test_a_wrong_reward_folder_or_eval_set_stops_the_run_before_the_model_loads(
    tiny_sd3_dir, tmp_path, monkeypatch, overrides, message
):
    """What a run needs besides the model is read first: a real pipeline takes minutes to load, a wrong reward
    folder or an eval set the task cannot judge should not (the shapes verifier cannot judge a cat)."""
    from run_helpers import tiny_run_config

    from flowrl.errors import UserError
    from flowrl.experiment import run_experiment

    def no_loading(*args, **kwargs):
        raise AssertionError("the pipeline loaded before the error")

    monkeypatch.setattr("flowrl.builders.load_pipeline", no_loading)
    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "early", updates=1)
    prompts = REPO / "assets/prompts/eval_prompts.txt"
    (tmp_path / "cats.txt").write_text("a photo of a cat\n")
    with pytest.raises((ConfigError, UserError), match=message):  # (prompt files: checked as the config loads)
        run_experiment(
            load_config(
                path,
                [
                    "task.name=prompt_file",
                    f"prompts.source={prompts}",
                    "eval.enabled=true",
                    f"eval.prompts={prompts}",
                    *(o.replace("{tmp}", str(tmp_path)) for o in overrides),
                ],
            )
        )


def test_only_flowrls_own_rewards_have_their_paths_checked_early(monkeypatch):
    """A built-in reward's `path` is a local folder, checked before the model loads; a plug-in's parameters mean what
    the plug-in says (a hub id, an output file), so they are left to it."""
    from flowrl.preflight import check_reward_terms

    monkeypatch.syspath_prepend(str(REPO / "tests" / "support" / "plugins"))
    plugin = load_config(
        REPO / "configs/shapes_grpo.yaml",
        ["reward=[{name: 'toy_plugin:Redness', params: {path: some-org/some-model}}]"],
    )
    check_reward_terms(plugin)
    builtin = load_config(
        REPO / "configs/shapes_grpo.yaml",
        ["reward=[{name: per_frame, params: {reward: pickscore, params: {path: /nowhere/ps}}}]"],
    )
    with pytest.raises(ConfigError, match=r"reward\[0\]\.params\.params\.path: /nowhere/ps does not exist"):
        check_reward_terms(builtin)


def test_the_demo_names_a_wrong_reward_folder_before_the_pipeline_loads(monkeypatch, capsys):
    """`flowrl demo --reward pickscore --reward-params '{"path": ...}'` with a folder that does not exist: one line,
    exit status 2, before any pipeline loads."""
    pytest.importorskip("gradio")
    from flowrl.cli import main

    monkeypatch.setattr("flowrl.policies.load_pipeline", lambda *a, **k: pytest.fail("the pipeline loaded first"))
    assert (
        main(
            [
                "demo",
                "--pipeline",
                "pipelines/shapes-sd3",
                "--reward",
                "pickscore",
                "--reward-params",
                '{"path": "/nowhere/PickScore_v1"}',
            ]
        )
        == 2
    )
    assert "--reward.params.path: /nowhere/PickScore_v1 does not exist" in capsys.readouterr().err


def test_bad_files_and_flags_are_named_before_anything_loads(tmp_path):
    """Each once gave a traceback (exit 1), was read as something else, or was named only after the pipeline loaded
    (a wrong --checkpoint printed 'no run config found ... sampling with flowrl's defaults' first)."""
    import json

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"a red caf\xe9 sign\n")
    as_json = tmp_path / "prompts.json"
    as_json.write_text(json.dumps({"prompt": "a red circle", "tag": "colors"}) + "\n")
    bad_yaml = tmp_path / "config.yaml"
    bad_yaml.write_bytes(b"run: {name: caf\xe9}\n")
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "trainable.safetensors").write_bytes(b"")
    listed = tmp_path / "full_info.json"
    listed.write_text("[]")
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "samples.jsonl").write_text(json.dumps({"prompt": "a circle", "seed": 0, "file": "00000.mp4"}) + "\n")
    sample = ["sample", "--pipeline", "pipelines/shapes-sd3", "--out", str(tmp_path / "never")]
    cases = [
        (
            sample + ["--prompts", "assets/shapes/eval_prompts.txt", "--checkpoint", str(tmp_path)],
            f"checkpoint {tmp_path} has no trainable.safetensors",
        ),
        (sample + ["--prompts", str(latin1)], f"prompt file {latin1} is not UTF-8 text"),
        (sample + ["--prompts", str(as_json)], f"prompt file {as_json}: expected a .jsonl file"),
        (sample + ["--prompts", "assets/shapes/eval_prompts.txt", "--shift", "-1"], "--shift: expected a positive"),
        (["train", str(bad_yaml)], f"config file {bad_yaml} is not UTF-8 text"),
        (
            ["export", "--pipeline", "pipelines/shapes-sd3", "--checkpoint", str(cut), "--out", str(tmp_path / "e")],
            "trainable.safetensors cannot be read as safetensors",
        ),
        (["serve-reward", "shapes", "--port", "99999"], "--port: expected a TCP port in 0..65535, got 99999"),
        (["eval", "vbench", "--results", str(listed)], "expected VBench's results JSON"),
        (["eval", "diversity", "--samples", str(videos)], "a video sample (00000.mp4); the shapes suite judges images"),
    ]
    for args, message in cases:
        result = run_flowrl(*args)
        assert result.returncode == 2, (args, result.stderr[-1500:])
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr[-1500:])
        assert "no run config found" not in result.stdout


def test_the_old_train_section_is_told_where_each_field_went_and_old_run_folders_still_read(tmp_path):
    """The train section was split by concern (train, optim, memory, runtime): a config that sets a moved field under
    train is told its new place; a run folder saved before the split still gives `flowrl sample --checkpoint` its
    settings and a resume its comparison, read in the new layout."""
    import yaml

    from flowrl.checkpoint import RUN_CONFIG, changed_settings, run_sampling_settings
    from flowrl.config import config_to_dict, upgraded
    from flowrl.loop_config import MOVED_FROM_TRAIN as MOVED

    with pytest.raises(ConfigError, match=r"train.lr: moved to optim.lr"):
        load_config(REPO / "configs/shapes_grpo.yaml", ["train.lr=1e-3"])
    overrides = ["memory.weight_dtype=bf16", "memory.mixed_precision=bf16", "memory.rollout_microbatch=4"]
    config = config_to_dict(load_config(REPO / "configs/shapes_grpo.yaml", overrides))
    old = {key: value for key, value in config.items() if key not in ("optim", "memory", "runtime")}
    moved = {k: v for section in ("optim", "memory", "runtime") for k, v in config[section].items() if k in MOVED}
    old["train"] = {**config["train"], **moved}  # (fields added to the sections since the split never sat in train)
    in_old_layout = {
        key: {k: v for k, v in value.items() if k in MOVED} if key in ("optim", "memory", "runtime") else value
        for key, value in config.items()
    }
    assert upgraded(old) == in_old_layout and upgraded(config) is config
    checkpoint = tmp_path / "update_000001"
    checkpoint.mkdir()
    (checkpoint / RUN_CONFIG).write_text(yaml.safe_dump(old))
    settings, _ = run_sampling_settings(str(checkpoint))
    assert settings["weight_dtype"] == "bf16" and settings["batch_size"] == 4
    assert changed_settings(checkpoint, config) == []
    assert changed_settings(checkpoint, {**config, "optim": {**config["optim"], "lr": 0.5}}) == ["optim.lr"]
