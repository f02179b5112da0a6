"""Editing pipelines as policies: FluxKontextPipeline's source image as per-sample conditioning (the ODE rollout equals
the pipeline's own sampling), and edit RL through the one loop on the shapes-editing task."""

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO
from PIL import Image
from tiny_pipelines import tiny_flux_kontext

from flowrl.errors import UserError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.tasks.base import Condition

PROMPTS = ["make the red circle blue", "remove the green square"]


def test_kontext_rollout_reproduces_the_pipeline_and_needs_a_source():
    pipe = tiny_flux_kontext()
    policy = policy_for(pipe, max_sequence_length=16)
    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in PROMPTS]
    items = [Condition(p, inputs={"source_image": s}) for p, s in zip(PROMPTS, sources)]
    shape = policy.noise_shape(SampleSpec(8, 8))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    traj = rollout(
        policy, policy.encode(items, 3.5), sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.5, initial_noise=noise
    )
    out = pipe(
        image=[Image.fromarray(s) for s in sources],
        prompt=PROMPTS,
        num_inference_steps=3,
        guidance_scale=3.5,
        latents=pipe._pack_latents(noise, *noise.shape),
        output_type="latent",
        height=8,
        width=8,
        max_sequence_length=16,
        _auto_resize=False,
        max_area=64,
    )
    torch.testing.assert_close(
        traj.final, pipe._unpack_latents(out.images, 8, 8, pipe.vae_scale_factor), atol=1e-5, rtol=1e-5
    )
    other = [Condition(p, inputs={"source_image": s[::-1].copy()}) for p, s in zip(PROMPTS, sources)]
    moved = rollout(
        policy, policy.encode(other, 3.5), sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.5, initial_noise=noise
    )
    assert not torch.allclose(moved.final, traj.final)  # the source image conditions the edit
    # a bare instruction of the grammar is edited on the world's scene (its own scene seed); others need a source
    from flowrl.prompt_source import text_seed
    from flowrl.worlds.shapes_edit.task import edit_item

    bare = policy.encode([Condition(PROMPTS[0])], 3.5).tensors["image_latents"]
    scene = policy.encode([edit_item(PROMPTS[0], text_seed(PROMPTS[0]))], 3.5).tensors["image_latents"]
    assert torch.equal(bare, scene)
    with pytest.raises(UserError, match="an editing pipeline needs a condition image"):
        policy.encode([Condition("paint it any colour")], 3.5)


def test_edit_grpo_trains_through_the_loop_and_reports_source_base_tuned(tmp_path):
    from flowrl.config import load_config
    from flowrl.experiment import run_experiment

    folder = tmp_path / "kontext"
    tiny_flux_kontext().save_pretrained(folder)
    config = {
        "run": {"name": "edit", "out_dir": str(tmp_path / "runs"), "seed": 0},
        "task": {"name": "shapes_edit"},
        "pipeline": {"path": str(folder), "height": 32, "width": 32, "max_sequence_length": 16},
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": "flow", "noise_level": 0.7, "num_steps": 3, "guidance_scale": 2.5},
        "algorithm": {"name": "grpo", "params": {"clip_range": 1e-2}},
        # a random editor fails every edit alike; a small compressibility term keeps the groups' rewards apart
        "reward": [{"name": "shapes_edit"}, {"name": "jpeg_compressibility", "weight": 0.01}],
        "prompts": {"source": "train"},
        "train": {"updates": 2, "groups_per_update": 2, "group_size": 4, "checkpoint_every": 0},
        "optim": {"lr": 1e-2},
        "memory": {"microbatch_size": 8},
        "runtime": {"threads": 1},
        "eval": {"prompts": "eval", "num_per_prompt": 1, "num_steps": 3, "guidance_scale": 2.5},
    }
    (tmp_path / "edit.yaml").write_text(yaml.safe_dump(config))
    run_dir = run_experiment(load_config(tmp_path / "edit.yaml"))
    import csv
    import json

    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert len(rows) == 2 and all(np.isfinite(float(r["loss"])) for r in rows)
    assert all(r["reward/shapes_edit/off_target"] != "" for r in rows)
    evals = json.loads((run_dir / "eval.json").read_text())
    assert set(evals) == {"0", "2"} and "off_target" in evals["2"]["metrics"]  # edit success per kind, off-target
    grid = np.asarray(Image.open(run_dir / "before_after.png"))
    assert grid.shape[1] == 260 + 3 * (32 * 4 + 4)  # the title column, then source | base | tuned


def test_edit_nft_trains_the_editor_through_the_loop(tmp_path):
    """configs/shapes_edit_nft.yaml's algorithm and sampler on the tiny editor: ODE rollouts, NFT's re-noised
    velocities with the source image as conditioning, and an adapter that moved."""
    from flowrl.config import load_config
    from flowrl.train import Trainer

    folder = tmp_path / "kontext"
    tiny_flux_kontext().save_pretrained(folder)
    overrides = [
        f"pipeline.path={folder}",
        f"run.out_dir={tmp_path / 'runs'}",
        "lora.rank=4",
        "lora.alpha=8",
        "sampler.num_steps=3",
        "train.updates=2",
        "train.groups_per_update=2",
        "train.group_size=4",
        "optim.lr=1.0e-2",
        "memory.microbatch_size=8",
        "train.checkpoint_every=0",
        "runtime.threads=1",
        "eval.enabled=false",
        "reward=[{name: shapes_edit}, {name: jpeg_compressibility, weight: 0.01}]",
    ]
    config = load_config(REPO / "configs" / "shapes_edit_nft.yaml", overrides)
    assert config.algorithm.name == "nft" and config.sampler.kind == "ode"
    metrics = []
    trainer = Trainer(config, log=False)
    trainer.run(lambda update, m: metrics.append(m))
    assert len(metrics) == 2 and all(np.isfinite(float(m["loss"])) for m in metrics)
    assert all(m["trained_items"] == 2 * 4 * 3 for m in metrics)  # every step of every edit (fraction 0.99 of 3)
    trained = trainer.policy.trainable_state_dict()
    assert any("lora_B" in name and v.abs().sum() > 0 for name, v in trained.items())  # B starts at zero


def test_the_demo_shows_source_base_and_tuned_edits(tmp_path):
    """An editing pipeline's page: the world's scene for the instruction (or an uploaded source) first, then each
    model's edit of it; world scenes are scored by the edit verifier, uploads are not (no scene to judge against)."""
    gr = pytest.importorskip("gradio")
    from demo_grid import read_grid
    from tiny_pipelines import random_lora_checkpoint

    from flowrl.demo import build_demo
    from flowrl.worlds.shapes_edit.task import edit_item

    tiny_flux_kontext().save_pretrained(tmp_path / "kontext")
    checkpoint = random_lora_checkpoint(tmp_path / "kontext", tmp_path / "run")
    demo = build_demo(str(tmp_path / "kontext"), [str(checkpoint)], steps=2, size=(32, 32, None))
    assert [b.label for b in demo.blocks.values() if isinstance(b, gr.Image)][0].startswith("source image")
    handler = demo.generate
    quiet = lambda *args, **kwargs: None  # noqa: E731
    html, table = handler("make the red circle blue", 7, 1, 2, 4.5, None, progress=quiet)
    grid = read_grid(html)
    assert grid["columns"] == ["source", "base", "run/update_000003"]
    source = edit_item("make the red circle blue", 7).inputs["source_image"]
    images = grid["images"]
    assert np.array_equal(images[0][::6, ::6], source)  # the world's scene for this seed, upscaled 6x
    assert "| base | 0." in table and "shapes_edit" in table and not np.array_equal(images[1], images[2])
    upload = np.zeros((32, 32, 3), np.uint8)
    upload[8:16, 8:16] = (230, 30, 30)
    html, table = handler("paint it any colour", 0, 1, 2, 4.5, upload, progress=quiet)  # outside the grammar: uploads
    assert np.array_equal(read_grid(html)["images"][0][::6, ::6], upload) and "| base | - |" in table
    with pytest.raises(gr.Error, match="upload a source image"):
        handler("paint it any colour", 0, 1, 2, 4.5, None, progress=quiet)


def test_sample_cli_edits_world_scenes_and_image_files_and_eval_reads_them_back(tmp_path):
    """`flowrl sample` with an editing pipeline: a .jsonl line names its scene seed or a source image file; the
    samples folder is then judged by the editing task (`flowrl eval shapes_edit`) from the records alone."""
    import json

    from flowrl.cli import main
    from flowrl.worlds.shapes_edit.task import edit_item

    tiny_flux_kontext().save_pretrained(tmp_path / "kontext")
    source = np.zeros((32, 32, 3), np.uint8)
    source[4:12, 4:12] = (230, 30, 30)
    Image.fromarray(source).save(tmp_path / "mine.png")
    lines = [
        {"prompt": "make the red circle blue", "scene_seed": 5},
        {"prompt": "make the red square blue", "image": str(tmp_path / "mine.png")},
    ]
    (tmp_path / "edits.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tmp_path / "kontext"),
                "--prompts",
                str(tmp_path / "edits.jsonl"),
                "--out",
                str(tmp_path / "out"),
                "--steps",
                "2",
                "--height",
                "32",
                "--width",
                "32",
                "--device",
                "cpu",
            ]
        )
        == 0
    )  # as `direct` below (a GPU samples in bf16)
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == [line["prompt"] for line in lines] and records[0]["scene_seed"] == 5
    # the same edit as sampling the world's item directly: the record's scene seed chose the source
    direct = policy_for(tiny_flux_kontext(), max_sequence_length=16)
    from flowrl.inference import generate

    expected, _ = generate(direct, [edit_item("make the red circle blue", 5)], 1, 0, 2, spec=SampleSpec(32, 32))
    written = np.asarray(Image.open(tmp_path / "out" / records[0]["file"]))
    assert np.abs(written.astype(int) - expected[0].astype(int)).max() <= 1
    assert main(["eval", "shapes_edit", "--samples", str(tmp_path / "out")]) == 2  # the uploaded source: no scene
    (tmp_path / "world.jsonl").write_text(json.dumps(lines[0]) + "\n")
    assert (
        main(
            [
                "sample",
                "--pipeline",
                str(tmp_path / "kontext"),
                "--prompts",
                str(tmp_path / "world.jsonl"),
                "--out",
                str(tmp_path / "world"),
                "--steps",
                "2",
                "--height",
                "32",
                "--width",
                "32",
            ]
        )
        == 0
    )
    assert main(["eval", "shapes_edit", "--samples", str(tmp_path / "world")]) == 0
    result = json.loads((tmp_path / "world" / "shapes_edit_eval.json").read_text())
    assert result["counts"]["recolour"] == 1 and "off_target" in result["metrics"]


def test_kontext_sources_take_the_sample_size_so_any_sizes_share_a_batch():
    """Sources of two sizes in one batch (an error before): each is resized to the sample size, a sample equals the
    one its source pre-resized gives, and does not depend on its batch-mate."""
    from flowrl.images import resized

    policy = policy_for(tiny_flux_kontext(), max_sequence_length=16)
    rng = np.random.default_rng(1)
    small, large = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), rng.integers(0, 255, (24, 40, 3), dtype=np.uint8)
    spec = SampleSpec(16, 16)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))

    def edit(sources, first=0):
        items = [Condition(PROMPTS[0], inputs={"source_image": s}) for s in sources]
        return rollout(
            policy,
            policy.encode(items, 3.5, spec),
            sample_generators([1, 2][: len(items)]),
            shape,
            2,
            "ode",
            0.0,
            3.5,
            initial_noise=noise[first : first + len(items)],
        ).final

    both = edit([small, large])
    with pytest.raises(UserError, match="differ in size"):
        policy.encode([Condition(PROMPTS[0], inputs={"source_image": s}) for s in (small, large)], 3.5)
    alone = edit([large], first=1)
    torch.testing.assert_close(both[1:], alone, atol=1e-5, rtol=1e-5)
    from flowrl.images import as_image_batch

    pre = resized(as_image_batch(large)[0], 16, 16)
    torch.testing.assert_close(edit([pre], first=1), alone, atol=0, rtol=0)
    assert resized(pre, 16, 16) is pre  # the sample size already: untouched


def test_a_group_rubric_refuses_training_cuts_that_split_its_groups(tmp_path):
    """A group rubric builds one rubric per call: reward calls (or a term's batches) that cut a group would score
    its parts against different rubrics, so results would hang on memory settings; refused at start."""
    from flowrl.config import load_config
    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    folder = tmp_path / "kontext"
    tiny_flux_kontext().save_pretrained(folder)
    base = {
        "run": {"name": "rubric", "out_dir": str(tmp_path / "runs")},
        "task": {"name": "shapes_edit"},
        "pipeline": {"path": str(folder), "height": 32, "width": 32, "max_sequence_length": 16},
        "sampler": {"kind": "flow", "num_steps": 2},
        "eval": {"enabled": False},
        "reward": [{"name": "edit_rubric", "params": {"mode": "group"}}],
        "train": {"groups_per_update": 2, "group_size": 4},
        "memory": {"reward_microbatch": 6},
        "runtime": {"threads": 1},
    }
    (tmp_path / "rubric.yaml").write_text(yaml.safe_dump(base))
    with pytest.raises(
        ConfigError,
        match="memory.reward_microbatch: reward edit_rubric scores a group's samples "
        "together .* a multiple of train.group_size = 4, got 6",
    ):
        Trainer(load_config(tmp_path / "rubric.yaml"))
    with pytest.raises(ConfigError, match=r"reward\[0\].batch_size: .* got 2"):
        Trainer(
            load_config(
                tmp_path / "rubric.yaml",
                ["memory.reward_microbatch=8", "reward=[{name: edit_rubric, batch_size: 2, params: {mode: group}}]"],
            )
        )
    per_sample = ["memory.reward_microbatch=6", "reward=[{name: edit_rubric, params: {mode: sample}}]"]
    assert Trainer(load_config(tmp_path / "rubric.yaml", per_sample)).reward.scores_groups is False
    from flowrl.rewards.base import groups_scored

    # known from the config before any model loads; a served reward's kind is not known here, so not refused
    assert [
        groups_scored(name, params)
        for name, params in [
            ("edit_rubric", {}),
            ("edit_rubric", {"mode": "sample"}),
            ("remote", {"url": "http://x"}),
            ("shapes", {}),
        ]
    ] == [True, False, False, False]
