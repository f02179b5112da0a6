"""`flowrl sample` and `flowrl eval shapes` end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import run_helpers
from conftest import REPO
from PIL import Image
from run_helpers import gloo_env, run_flowrl

from flowrl.worlds.shapes.scenes import sample_pairs


def test_sample_writes_pngs_and_index(tiny_sd3_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n\ntwo squares\n")
    out = tmp_path / "samples"
    result = run_flowrl(
        "sample",
        "--pipeline",
        str(tiny_sd3_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--num-per-prompt",
        "2",
        "--seed",
        "7",
        "--steps",
        "3",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red circle"] * 2 + ["two squares"] * 2
    assert len({r["seed"] for r in records}) == 4
    for r in records:
        assert np.asarray(Image.open(out / r["file"])).shape == (32, 32, 3)


def _write_samples_dir(folder, images, prompts):
    """A folder laid out as `flowrl sample` writes it."""
    with (folder / "samples.jsonl").open("w") as index:
        for n, (image, prompt) in enumerate(zip(images, prompts)):
            Image.fromarray(image).save(folder / f"{n}.png")
            index.write(json.dumps({"prompt": prompt, "seed": n, "file": f"{n}.png"}) + "\n")


def test_eval_safety_with_samples_is_the_tasks_evaluation_not_the_suite(tmp_path):
    """`safety` names a task and a benchmark suite; given --samples it scores that folder (the suite would sample
    the shapes pipeline for 14 minutes and ignore the folder)."""
    images, prompts = sample_pairs(6, np.random.default_rng(5))
    _write_samples_dir(tmp_path, images, prompts)
    result = run_flowrl("eval", "safety", "--samples", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "safety_eval.json").read_text())["overall"] == 1.0


def test_eval_shapes_scores_a_samples_folder(tmp_path):
    images, prompts = sample_pairs(24, np.random.default_rng(3))
    _write_samples_dir(tmp_path, images, prompts)
    result = run_flowrl("eval", "shapes", "--samples", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((tmp_path / "shapes_eval.json").read_text())
    assert scores["overall"] == 1.0 and scores["exact"]["overall"] == 1.0
    assert "overall" in result.stdout and "exact" in result.stdout
    (tmp_path / "samples.jsonl").write_text('{"prompt": "a purple circle", "file": "0.png"}\n')
    bad = run_flowrl("eval", "shapes", "--samples", str(tmp_path))
    assert bad.returncode == 2 and "line 1" in bad.stderr and "a purple circle" in bad.stderr


def test_eval_shapes_reports_clutter_under_the_exact_verdict(tmp_path):
    from flowrl.worlds.shapes.evaluation import evaluate_samples_dir
    from flowrl.worlds.shapes.world import ShapeObject, render

    clutter = render([ShapeObject("circle", "red", 2, 2, 9), ShapeObject("square", "blue", 18, 18, 9)])
    single = render([ShapeObject("circle", "red", 2, 2, 9)])
    _write_samples_dir(tmp_path, [clutter, single], ["a circle", "a circle"])
    result = evaluate_samples_dir(tmp_path)
    assert result["tags"]["single_object"] == 1.0  # GenEval's rule: a circle is there
    assert result["exact"]["tags"]["single_object"] == 0.5  # the exact verdict refuses the extra square


def test_sample_with_fk_steering_records_each_images_reward(tiny_sd3_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    out = tmp_path / "fk"
    result = run_flowrl(
        "sample",
        "--pipeline",
        str(tiny_sd3_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--steps",
        "4",
        "--fk-particles",
        "3",
        "--fk-reward",
        "shapes",
        "--fk-every",
        "1",
        "--fk-lambda",
        "5",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red circle", "two squares"]
    import torch

    from flowrl.rewards import build_reward

    for r in records:  # the recorded reward is the saved image's (up to PNG quantisation, which the verifier ignores)
        image = torch.from_numpy(np.array(Image.open(out / r["file"]))).permute(2, 0, 1)[None].float() / 255
        assert build_reward("shapes")(image, [r["prompt"]]).scores.item() == r["fk_reward"]
    bad = run_flowrl(
        "sample",
        "--pipeline",
        str(tiny_sd3_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--fk-particles",
        "2",
        "--fk-reward",
        "nope",
    )
    assert bad.returncode == 2 and "--fk-reward" in bad.stderr and "Traceback" not in bad.stderr


def test_eval_diversity_of_a_samples_folder(tmp_path):
    images, _ = sample_pairs(6, np.random.default_rng(4))
    prompts = ["a circle"] * 3 + ["two squares"] * 3
    _write_samples_dir(tmp_path, images, prompts)
    result = run_flowrl("eval", "diversity", "--samples", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads((tmp_path / "diversity_eval.json").read_text())
    assert written["samples_per_prompt"] == 3 and written["prompts"] == 2
    assert 0 < written["pixel_distance"] < 1 and 1 <= written["vendi"] <= 3
    _write_samples_dir(tmp_path, images, ["a red circle"] * 3 + ["a blue square"] * 3)  # no colour left open
    coloured = run_flowrl("eval", "diversity", "--samples", str(tmp_path))
    assert coloured.returncode == 0, coloured.stderr[-2000:]
    text = (tmp_path / "diversity_eval.json").read_text()  # strict JSON: NaN is written as null
    assert "NaN" not in text and "NaN" not in coloured.stdout and json.loads(text)["colour_entropy"] is None
    (tmp_path / "samples.jsonl").write_text(json.dumps({"prompt": "a circle", "seed": 0, "file": "0.png"}) + "\n")
    bad = run_flowrl("eval", "diversity", "--samples", str(tmp_path))
    assert bad.returncode == 2 and "samples per prompt" in bad.stderr


def test_sample_writes_video_batches_from_a_wan_pipeline(tiny_wan_dir, tmp_path):
    """`flowrl sample` on a text-to-video pipeline: one MP4 (plus a GIF) per sample and samples.jsonl, readable
    back as a video batch with the requested frames."""
    from flowrl.sample_io import VideoSamples, read_samples

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red circle moving left", "tag": "motion"}\n{"prompt": "a still square"}\n')
    out = tmp_path / "video"
    result = run_flowrl(
        "sample",
        "--pipeline",
        str(tiny_wan_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--steps",
        "2",
        "--guidance",
        "5",
        "--height",
        "16",
        "--width",
        "16",
        "--num-frames",
        "5",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["file"] for r in records] == ["00000.mp4", "00001.mp4"]
    assert all(r["modality"] == "video" and (out / r["extra_files"][0]).is_file() for r in records)
    assert records[0]["tag"] == "motion"  # a .jsonl prompt's fields are kept with its samples
    samples, _ = read_samples(out)
    assert isinstance(samples, VideoSamples) and tuple(samples.tensor.shape) == (2, 5, 3, 16, 16)
    assert samples.fps == 16 and all(r["fps"] == 16 for r in records)  # Wan's own frame rate, not the default 8


def test_a_prompt_files_relative_image_paths_are_taken_from_its_folder(tmp_path, monkeypatch):
    from flowrl.tasks.base import read_prompt_file

    folder = tmp_path / "edits"
    folder.mkdir()
    (folder / "edits.jsonl").write_text(
        '{"prompt": "make the red circle blue", "image": "sources/a.png"}\n'
        f'{{"prompt": "remove the square", "image": "{tmp_path / "b.png"}"}}\n'
    )
    monkeypatch.chdir(tmp_path)  # another working directory than the file's
    relative, absolute = read_prompt_file("edits/edits.jsonl")
    assert Path(relative.meta["image"]).is_absolute()  # a reward server in another directory finds it too
    assert Path(relative.meta["image"]).resolve() == (folder / "sources" / "a.png").resolve()
    assert absolute.meta["image"] == str(tmp_path / "b.png")


def _sample_args(pipeline, prompts, out, *flags) -> list[str]:
    return [
        "sample",
        "--pipeline",
        str(pipeline),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--num-per-prompt",
        "2",
        "--seed",
        "3",
        "--steps",
        "2",
        "--batch-size",
        "1",
        *flags,
    ]


def _sample(pipeline, prompts, out, *flags, env=None, torchrun=False):
    """`flowrl sample` in processes of its own: killed by FLOWRL_KILL_AT, under torchrun, or compared bit for bit."""
    args = ["-m", "flowrl", *_sample_args(pipeline, prompts, out, *flags)]
    if torchrun:
        return run_helpers.torchrun(args, port=29533, timeout=300, **(env or {}))
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=gloo_env(**(env or {}))
    )


def _pixels(folder):
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    return records, [np.asarray(Image.open(folder / r["file"])) for r in records]


def test_sample_killed_midway_resumes_without_redrawing_and_refuses_other_settings(tiny_sd3_dir, tmp_path):
    """Samples reach the disk batch by batch: after a SIGKILL past the second batch, the same command draws only the
    rest, and the folder equals an uninterrupted run's; other settings into the same folder are an error."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    straight = _sample(tiny_sd3_dir, prompts, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    out = tmp_path / "resumed"
    killed = _sample(tiny_sd3_dir, prompts, out, env={"FLOWRL_KILL_AT": "sample@2"})
    assert killed.returncode == -9 and not (out / "samples.jsonl").exists()
    first = (out / "00000.png").stat().st_mtime_ns
    resumed = _sample(tiny_sd3_dir, prompts, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "2 of 4 samples already" in resumed.stdout
    assert (out / "00000.png").stat().st_mtime_ns == first  # kept, not drawn again
    assert not list(out.glob(".progress-*"))
    (expected, want), (records, got) = _pixels(tmp_path / "straight"), _pixels(out)
    assert records == expected and all(np.array_equal(a, b) for a, b in zip(want, got))
    other = run_flowrl(*_sample_args(tiny_sd3_dir, prompts, out, "--guidance", "2.5"))
    assert other.returncode == 2 and "guidance" in other.stderr and "Traceback" not in other.stderr


def test_a_finished_folder_redrawing_an_edited_prompt_never_indexes_new_files_with_old_prompts(tiny_sd3_dir, tmp_path):
    """An edited prompt-file line is drawn again into the same file names; while it is (and after an interruption),
    no samples.jsonl pairs a redrawn file with its old prompt: the old index's still-valid lines wait in a progress
    file, and the finished index holds the new prompt."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    out = tmp_path / "out"
    assert run_flowrl(*_sample_args(tiny_sd3_dir, prompts, out)).returncode == 0
    kept = (out / "00000.png").stat().st_mtime_ns
    prompts.write_text("a red circle\nthree squares\n")
    killed = _sample(tiny_sd3_dir, prompts, out, env={"FLOWRL_KILL_AT": "sample@1"})
    assert killed.returncode == -9 and not (out / "samples.jsonl").exists()
    assert run_flowrl(*_sample_args(tiny_sd3_dir, prompts, out)).returncode == 0
    records, _ = _pixels(out)
    assert [r["prompt"] for r in records] == ["a red circle"] * 2 + ["three squares"] * 2
    assert (out / "00000.png").stat().st_mtime_ns == kept and not list(out.glob(".progress-*"))


@pytest.mark.slow
def test_sample_under_torchrun_shares_the_prompts_and_writes_one_index(tiny_sd3_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    one = _sample(tiny_sd3_dir, prompts, tmp_path / "one")
    two = _sample(tiny_sd3_dir, prompts, tmp_path / "two", torchrun=True)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    (expected, want), (records, got) = _pixels(tmp_path / "one"), _pixels(tmp_path / "two")
    assert records == expected and all(np.array_equal(a, b) for a, b in zip(want, got))
    assert "process 0 of 2: drawing 2 samples" in two.stdout and "process 1 of 2: drawing 2 samples" in two.stdout
    assert two.stdout.count("wrote 4 image samples") == 1  # the main process writes the index
    # scoring the folder on two processes (two batches each) gives the one-process result
    score = [
        "-m",
        "flowrl",
        "eval",
        "rewards",
        "--samples",
        str(tmp_path / "two"),
        "--reward",
        "jpeg_compressibility",
        "--batch-size",
        "1",
    ]
    alone = subprocess.run(
        [sys.executable, *score], cwd=REPO, capture_output=True, text=True, timeout=300, env=gloo_env()
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    expected = json.loads((tmp_path / "two" / "rewards_eval.json").read_text())
    (tmp_path / "two" / "rewards_eval.json").unlink()
    shared = run_helpers.torchrun(score, port=29534, timeout=300)
    assert shared.returncode == 0, shared.stderr[-2000:]
    assert json.loads((tmp_path / "two" / "rewards_eval.json").read_text()) == expected
    assert "process 0 of 2: scoring 2 samples" in shared.stdout and "process 1 of 2: scoring 2 samples" in shared.stdout
    assert shared.stdout.count("written to") == 1  # the main process writes the result


def test_eval_rewards_reads_a_folder_a_batch_at_a_time(tmp_path, monkeypatch):
    import torch

    import flowrl.sample_io
    from flowrl.cli import main
    from flowrl.sample_io import ImageSamples, write_samples

    images = torch.rand(5, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    write_samples(tmp_path, ImageSamples(images), [{"prompt": f"p{i}", "tag": "ab"[i % 2]} for i in range(5)])
    loaded, load = [], flowrl.sample_io.load_samples
    monkeypatch.setattr(
        flowrl.sample_io, "load_samples", lambda folder, records: loaded.append(len(records)) or load(folder, records)
    )
    assert (
        main(
            [
                "eval",
                "rewards",
                "--samples",
                str(tmp_path),
                "--reward",
                "jpeg_compressibility",
                "--batch-size",
                "2",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert loaded == [2, 2, 1]
    batched = json.loads((tmp_path / "rewards_eval.json").read_text())
    assert main(["eval", "rewards", "--samples", str(tmp_path), "--reward", "jpeg_compressibility"]) == 0
    assert loaded[3:] == [5] and json.loads((tmp_path / "rewards_eval.json").read_text()) == batched


class MarkedPolicy:
    """A stand-in adapter override (a run's pipeline.policy): the SD3 adapter, counted."""

    made = []

    def __new__(cls, pipeline, **kwargs):
        from flowrl.policies.sd3 import SD3Policy

        cls.made.append(type(pipeline).__name__)
        return SD3Policy(pipeline, **kwargs)


def test_sample_takes_the_adapter_override_of_the_checkpoints_run(tiny_sd3_dir, tmp_path, capsys):
    """A run trained with pipeline.policy samples with the same adapter from its checkpoint (before, `flowrl sample`
    and the demo took the pipeline class's own); --policy overrides it, and an unknown one is named."""
    import yaml
    from tiny_pipelines import random_lora_checkpoint

    from flowrl.cli import main

    checkpoint = random_lora_checkpoint(tiny_sd3_dir, tmp_path / "run")
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"pipeline": {"policy": f"{__name__}:MarkedPolicy"}}))
    (tmp_path / "prompts.txt").write_text("a red circle\n")
    MarkedPolicy.made.clear()
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tiny_sd3_dir),
                "--checkpoint",
                str(checkpoint),
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--out",
                str(tmp_path / "out"),
                "--steps",
                "2",
            ]
        )
        == 0
    )
    assert MarkedPolicy.made == ["StableDiffusion3Pipeline"]
    assert f"--policy {__name__}:MarkedPolicy" in capsys.readouterr().out  # said, with the run's other settings
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tiny_sd3_dir),
                "--checkpoint",
                str(checkpoint),
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--out",
                str(tmp_path / "out2"),
                "--steps",
                "2",
                "--policy",
                "NoSuchPipeline",
            ]
        )
        == 2
    )
    assert "--policy: unknown policy 'NoSuchPipeline'" in capsys.readouterr().err


def test_the_demo_and_export_take_the_adapter_override_of_the_checkpoints_run(tiny_sd3_dir, tmp_path, monkeypatch):
    import yaml
    from tiny_pipelines import random_lora_checkpoint

    import flowrl.demo
    from flowrl.cli import main

    checkpoint = random_lora_checkpoint(tiny_sd3_dir, tmp_path / "run")
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"pipeline": {"policy": f"{__name__}:MarkedPolicy"}}))
    MarkedPolicy.made.clear()
    assert (
        main(
            [
                "export",
                "--pipeline",
                str(tiny_sd3_dir),
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(tmp_path / "tuned"),
            ]
        )
        == 0
    )
    assert MarkedPolicy.made == ["StableDiffusion3Pipeline"]

    pytest.importorskip("gradio")
    built = {}

    class Page:  # what build_demo returns, served by nothing
        def queue(self):
            return self

        def launch(self, **kwargs):
            pass

    monkeypatch.setattr(flowrl.demo, "build_demo", lambda *args: built.update(args=args) or Page())
    monkeypatch.setattr("flowrl.cli.demo.signal.signal", lambda *args: None)
    assert main(["demo", "--pipeline", str(tiny_sd3_dir), "--checkpoint", str(checkpoint)]) == 0
    assert built["args"][-6:-2] == (
        f"{__name__}:MarkedPolicy",
        f"pipeline.policy in {tmp_path / 'run' / 'config.yaml'}",
        None,
        None,
    )  # (the run's pipeline.shift and reference_size: none; then memory,
    assert built["args"][-1] is False  # and whether the text encoders stay on the host: the run did not offload)


def test_sample_fits_in_memory_as_the_checkpoints_run_did(tiny_sd3_dir, tmp_path, capsys, monkeypatch):
    """A run's memory settings (its rollout batch, VAE tiling, decode split, text encoders kept on the host) carry to
    `flowrl sample` from its checkpoint, said on one line: a large model that trained does not run out of memory
    sampling. Flags override them; the samples are the same as without them."""
    import yaml
    from tiny_pipelines import random_lora_checkpoint

    from flowrl.cli import main
    from flowrl.policies.base import FlowPolicy

    checkpoint = random_lora_checkpoint(tiny_sd3_dir, tmp_path / "run")
    (tmp_path / "run" / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "pipeline": {"vae_tiling": True},
                "memory": {"rollout_microbatch": 2, "decode_microbatch": 1, "offload_text_encoders": True},
            }
        )
    )
    (tmp_path / "prompts.txt").write_text("a red circle\ntwo squares\n")
    applied, placed = [], []
    original = FlowPolicy.set_memory_options
    monkeypatch.setattr(
        FlowPolicy, "set_memory_options", lambda self, *a, **k: applied.append(k) or original(self, *a, **k)
    )
    original_place = FlowPolicy.place
    monkeypatch.setattr(FlowPolicy, "place", lambda self, *a: placed.append(a[2:]) or original_place(self, *a))
    common = [
        "sample",
        "--pipeline",
        str(tiny_sd3_dir),
        "--checkpoint",
        str(checkpoint),
        "--prompts",
        str(tmp_path / "prompts.txt"),
        "--steps",
        "2",
        "--num-per-prompt",
        "2",
        "--device",
        "cpu",
    ]
    assert main([*common, "--out", str(tmp_path / "as_run")]) == 0
    assert "--batch-size 2, --vae-tiling, --decode-microbatch 1, --offload-text-encoders" in capsys.readouterr().out
    assert applied[-1] == {
        "vae_slicing": False,
        "vae_tiling": True,
        "offload_text_encoders": True,
        "decode_microbatch": 1,
    }
    assert placed[-1] == (True,)  # the text encoders stayed on the host when the model was placed
    assert (
        main(
            [
                *common,
                "--out",
                str(tmp_path / "plain"),
                "--no-vae-tiling",
                "--decode-microbatch",
                "4",
                "--no-offload-text-encoders",
                "--batch-size",
                "4",
            ]
        )
        == 0
    )
    assert applied[-1] == {
        "vae_slicing": False,
        "vae_tiling": False,
        "offload_text_encoders": False,
        "decode_microbatch": 4,
    }
    assert placed[-1] == (False,)
    (_, a), (_, b) = _pixels(tmp_path / "as_run"), _pixels(tmp_path / "plain")
    assert all(np.abs(x.astype(int) - y.astype(int)).max() <= 1 for x, y in zip(a, b))
    # how work is split is not part of a folder's settings, tiling (it changes pixels) is: a rerun with other splits
    # resumes; tiling turned off in a tiled folder is refused, naming it
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "plain"), "--no-vae-tiling", "--decode-microbatch", "0"]) == 0
    assert "4 of 4 samples already" in capsys.readouterr().out
    assert main([*common, "--out", str(tmp_path / "as_run"), "--no-vae-tiling"]) == 2
    assert "vae_tiling" in capsys.readouterr().err


def test_a_copied_checkpoint_still_samples_as_its_run_did(tiny_sd3_dir, tmp_path, capsys):
    """Each checkpoint keeps its run's config (run_config.yaml), so one copied out of its run dir (kept as the best,
    shared) still samples with the run's steps, guidance and sizes; a checkpoint without any run config is said."""
    import shutil
    from argparse import Namespace

    from run_helpers import tiny_run_config, train_and_collect

    from flowrl.checkpoint import run_sampling_settings
    from flowrl.cli.arguments import SAMPLING_DEFAULTS, fill_sampling_settings

    config = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "kept", updates=1)
    # the run trains at 32 px and evaluates at 64 x 48: sampling from it takes the evaluations' size
    train_and_collect(config, ["eval.num_steps=3", "eval.guidance_scale=3.5", "eval.height=64", "eval.width=48"])
    inside = tmp_path / "runs/kept/checkpoints/update_000001"
    copied = shutil.copytree(inside, tmp_path / "best")
    settings, source = run_sampling_settings(str(copied))
    assert source == copied / "run_config.yaml"
    assert settings == run_sampling_settings(str(inside))[0]
    assert (settings["steps"], settings["guidance"], settings["height"], settings["width"]) == (3, 3.5, 64, 48)
    (copied / "run_config.yaml").unlink()
    args = Namespace(**{key: None for key in SAMPLING_DEFAULTS}, policy=None)
    fill_sampling_settings(args, str(copied))
    assert args.steps == SAMPLING_DEFAULTS["steps"]
    assert "no run config found" in capsys.readouterr().out


def test_a_checkpoint_of_another_model_is_one_error_in_sample_and_export(tiny_sd3_dir, tmp_path, capsys):
    from tiny_pipelines import random_lora_checkpoint, tiny_flux

    from flowrl.cli import main

    tiny_flux().save_pretrained(tmp_path / "flux")
    checkpoint = random_lora_checkpoint(tmp_path / "flux", tmp_path / "run")
    (tmp_path / "prompts.txt").write_text("a red circle\n")
    assert (
        main(
            [
                "export",
                "--pipeline",
                str(tiny_sd3_dir),
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(tmp_path / "tuned"),
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tiny_sd3_dir),
                "--checkpoint",
                str(checkpoint),
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--out",
                str(tmp_path / "out"),
                "--steps",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("a checkpoint of another model?") == 2 and "Traceback" not in err


def test_sample_refuses_an_out_it_did_not_write(tiny_sd3_dir, tmp_path, capsys):
    """A file, or a folder of someone's own samples (no sampling.json): refused before the pipeline loads, nothing
    touched (a hand-made folder's index and images were replaced)."""
    from flowrl.cli import main

    (tmp_path / "prompts.txt").write_text("a red circle\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "samples.jsonl").write_text('{"file": "00000.png", "prompt": "a cat"}\n')
    (mine / "00000.png").write_bytes(b"mine")
    (tmp_path / "a_file").write_text("x")
    for out in (mine, tmp_path / "a_file"):
        assert (
            main(
                [
                    "sample",
                    "--pipeline",
                    str(tiny_sd3_dir),
                    "--prompts",
                    str(tmp_path / "prompts.txt"),
                    "--out",
                    str(out),
                    "--steps",
                    "1",
                ]
            )
            == 2
        )
    err = capsys.readouterr().err
    assert "holds no sampling.json" in err and "is a file" in err and "Traceback" not in err
    assert (mine / "00000.png").read_bytes() == b"mine" and len(list(mine.iterdir())) == 2
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tiny_sd3_dir),
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--out",
                str(tmp_path / "new"),
                "--steps",
                "1",
                "--num-per-prompt",
                "1",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tiny_sd3_dir),
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--out",
                str(tmp_path / "new"),
                "--steps",
                "1",
                "--num-per-prompt",
                "1",
            ]
        )
        == 0
    )  # resumes its own
