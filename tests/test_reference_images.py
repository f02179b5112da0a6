"""Several reference images per sample (an editor's source, then further references): read from .jsonl prompt
files, and trained on several processes as on one when rows with different numbers of images share a step."""
import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from flowrl.errors import UserError
from flowrl.tasks.base import read_prompt_file
from run_helpers import assert_same_weights, train_and_collect, train_on_two_processes
from tiny_pipelines import tiny_flux2_klein


def _images(folder, names):
    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (40, 24, 3), dtype=np.uint8)).save(folder / name)


def _edits_of_two_and_one_images(folder):
    """A saved tiny FLUX.2 [klein] in `folder`/klein and an edits.jsonl beside it whose lines give 2 images and 1."""
    tiny_flux2_klein().save_pretrained(folder / "klein")
    _images(folder, ["a.png", "b.png", "c.png"])
    prompts = folder / "edits.jsonl"
    prompts.write_text(json.dumps({"prompt": "a red circle", "image": ["a.png", "b.png"]}) + "\n"
                       + json.dumps({"prompt": "two squares", "image": "c.png"}) + "\n")
    return folder / "klein", prompts


def test_a_jsonl_line_lists_its_images_relative_to_the_file(tmp_path):
    (tmp_path / "refs").mkdir()
    _images(tmp_path / "refs", ["a.png", "b.png"])
    prompts = tmp_path / "edits.jsonl"
    prompts.write_text(json.dumps({"prompt": "put the hat on the cat", "image": ["refs/a.png", "refs/b.png"]}) + "\n"
                       + json.dumps({"prompt": "make it red", "image": "refs/a.png"}) + "\n")
    two, one = read_prompt_file(prompts)
    assert two.meta["image"] == [str((tmp_path / "refs" / n).absolute()) for n in ("a.png", "b.png")]
    assert one.meta["image"] == str((tmp_path / "refs/a.png").absolute())
    from flowrl.images import item_images

    assert [tuple(i.shape) for i in item_images(two, "source_image", None, "an editor")] == [(3, 40, 24)] * 2
    prompts.write_text(json.dumps({"prompt": "p", "image": ["a.png", 3]}) + "\n")
    with pytest.raises(UserError, match=r"edits.jsonl line 1: 'image' must be a file path or a list of file paths"):
        read_prompt_file(prompts)


def test_flowrl_sample_edits_from_a_jsonl_of_image_lists(tmp_path):
    """`flowrl sample` with FLUX.2 [klein] editing (`--policy Flux2KleinEdit`) on a .jsonl whose lines give two
    images and one: every edit is written, and the index keeps each line's images."""
    from flowrl.cli import main

    klein, prompts = _edits_of_two_and_one_images(tmp_path)
    out = tmp_path / "edits"
    assert main(["sample", "--pipeline", str(klein), "--policy", "Flux2KleinEdit", "--prompts",
                 str(prompts), "--out", str(out), "--steps", "2", "--height", "32", "--width", "32",
                 "--max-sequence-length", "16", "--num-per-prompt", "2", "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["a red circle"] * 2 + ["two squares"] * 2
    assert records[0]["image"] == [str(tmp_path / n) for n in ("a.png", "b.png")]
    for r in records:
        assert np.asarray(Image.open(out / r["file"])).shape == (32, 32, 3)


@pytest.mark.slow
def test_two_processes_train_rows_with_different_image_counts_as_one(tmp_path):
    """FLUX.2 [klein] editing from a .jsonl whose lines give 2 and 1 images: a step whose rows mix the two calls the
    transformer once per image count (through its DDP wrapper, twice before one backward), and 2 gloo processes
    give the weights of one."""
    klein, prompts = _edits_of_two_and_one_images(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "one", "out_dir": str(tmp_path / "runs"), "seed": 0},
        "task": {"name": "prompt_file"},
        "pipeline": {"path": str(klein), "height": 32, "width": 32, "max_sequence_length": 16,
                     "policy": "Flux2KleinEdit"},
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 3, "guidance_scale": 2.0},
        "algorithm": {"name": "grpo", "params": {"clip_range": 1e-3}},
        "reward": [{"name": "jpeg_incompressibility"}],
        "prompts": {"source": str(prompts)},
        "train": {"updates": 1, "groups_per_update": 8, "group_size": 2, "lr": 1e-3, "microbatch_size": 32,
                  "ema_decay": 0.0, "checkpoint_every": 0, "threads": 1, "mixed_precision": "no",
                  "weight_dtype": "fp32"},
        "eval": {"enabled": False},
    }))
    single = train_and_collect(config)
    assert_same_weights(single, train_on_two_processes(config, tmp_path / "two.safetensors", 29535, ["run.name=two"]))
    assert all(torch.isfinite(v).all() for v in single.values())
