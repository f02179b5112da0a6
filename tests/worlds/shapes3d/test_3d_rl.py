"""RL on the image-to-3D pipeline through the one loop: the policy adapter, 3D samples on disk, the geometric rewards,
the DPO-style baseline, and asynchronous rollouts (staleness 0 equals synchronous training bit for bit; with
staleness S a batch is sampled with the weights of S updates before; resume is exact)."""

import numpy as np
import pytest
import torch
import yaml
from run_helpers import by_section

from flowrl.config import load_config
from flowrl.sdf import grid_points
from flowrl.tasks.base import Condition
from flowrl.worlds.shapes3d.conditions import condition_item, eval_conditions, solid_of, world_image
from flowrl.worlds.shapes3d.geometry import Primitive, Solid, sdf_grid


def config_file(tmp_path, pipeline_dir, name, algorithm="grpo", params=None, kind="flow", **train):
    data = {
        "run": {"name": name, "out_dir": str(tmp_path / "runs"), "seed": 0},
        "task": {"name": "shapes3d"},
        "pipeline": {"path": str(pipeline_dir)},
        "lora": {"rank": 4, "alpha": 8},
        "sampler": {"kind": kind, "noise_level": 0.7, "num_steps": 4, "guidance_scale": 2.0},
        "algorithm": {"name": algorithm, "params": params or {"clip_range": 1e-2, "timestep_fraction": 0.5}},
        "reward": [{"name": "silhouette_iou"}, {"name": "shape_match", "weight": 0.5}],
        "prompts": {"source": "train"},
        **by_section(
            **{
                "updates": 3,
                "groups_per_update": 2,
                "group_size": 4,
                "lr": 1e-2,
                "microbatch_size": 8,
                "checkpoint_every": 1,
                "threads": 1,
                **train,
            }
        ),
        "eval": {"enabled": False},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(path, overrides=()):
    from flowrl.train import Trainer

    trainer = Trainer(load_config(path, list(overrides)), log=False)
    rows = []
    trainer.run(lambda update, metrics: rows.append(metrics))
    return trainer, rows


def sphere_field(radius=0.5, resolution=32):
    return sdf_grid(Solid((Primitive("sphere", (0.0, -0.3, 0.0), (radius,) * 3),)), resolution)


# ---- policy and samples -----------------------------------------------------------------------------------------
def test_policy_samples_shape_fields_conditioned_on_the_world_render(tiny_shapes3d_dir):
    from flowrl.inference import generate_samples
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.sample_io import ShapeSamples

    policy = policy_for(load_pipeline(tiny_shapes3d_dir))
    items = eval_conditions()[:2]
    cond = policy.encode(items, 2.0)
    expected = torch.from_numpy(np.array(world_image(items[0]))).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(cond.tensors["image"][0], expected)
    assert cond.negative["image"].abs().sum() == 0  # CFG's unconditional branch: the all-zero image
    samples, records = generate_samples(policy, items, 2, 0, 3, 2.0, desc=None)
    assert isinstance(samples, ShapeSamples) and samples.tensor.shape == (4, 32, 32, 32)
    again, _ = generate_samples(policy, items[1:], 2, 0, 3, 2.0, desc=None, seeds=[r["seed"] for r in records[2:]])
    torch.testing.assert_close(again.tensor, samples.tensor[2:])  # a sample depends on its own seed only
    from flowrl.errors import UserError

    with pytest.raises(UserError, match="condition image"):  # one message, exit code 2 from the CLI
        policy.encode([Condition("a teapot")], 2.0)


def test_shape_samples_write_meshes_and_read_back(tmp_path):
    import trimesh

    from flowrl.sample_io import ShapeSamples, read_samples, write_samples

    fields = torch.from_numpy(np.stack([sphere_field(0.5), sphere_field(0.3)]))
    samples = ShapeSamples(fields)
    write_samples(tmp_path, samples, [{"prompt": "a sphere", "seed": 1}, {"prompt": "a small sphere", "seed": 2}])
    mesh = trimesh.load(tmp_path / "00000.glb", force="mesh")
    assert abs(mesh.volume - 4 / 3 * np.pi * 0.125) < 0.03  # the GLB holds the sphere of radius 0.5
    assert trimesh.load(tmp_path / "00001.ply").is_watertight
    back, records = read_samples(tmp_path)
    assert isinstance(back, ShapeSamples) and records[0]["modality"] == "3d"
    torch.testing.assert_close(back.tensor, fields, atol=2e-3, rtol=0)  # stored as fp16
    strip = samples.preview()
    assert strip.shape == (2, 32, 128, 3) and strip[0].sum() > strip[1].sum()  # the bigger sphere covers more


# ---- rewards ---------------------------------------------------------------------------------------------------
def test_geometric_rewards_score_the_truth_high_and_broken_shapes_low():
    from flowrl.rewards import build_reward

    item = condition_item("a sphere on top of a cylinder", 5)
    truth = sdf_grid(solid_of(item), 32)
    other = sdf_grid(solid_of(condition_item("a small cone", 1)), 32)
    centres = grid_points(32).reshape(32, 32, 32, 3).numpy()
    speck = np.minimum(truth, np.linalg.norm(centres - centres[28, 28, 28], axis=-1) - 0.03)  # one cell inside
    noisy = truth + np.random.default_rng(0).normal(0, 0.05, truth.shape)
    grids = torch.from_numpy(np.stack([truth, other, speck, noisy, np.ones_like(truth)]).astype(np.float32))
    meta = {"conditions": [item] * 5}
    score = {
        name: build_reward(name, **params)(grids, [item.prompt] * 5, meta).scores
        for name, params in [
            ("silhouette_iou", {}),
            ("shape_match", {}),
            ("mesh_validity", {}),
            ("mesh_smoothness", {}),
        ]
    }
    assert score["silhouette_iou"][0] > 0.9 > score["silhouette_iou"][1] + 0.2 and score["silhouette_iou"][4] == 0
    assert score["shape_match"][0] == 1.0 and score["shape_match"][1] < 0.4
    assert score["mesh_validity"].tolist() == [1.0, 1.0, 0.0, score["mesh_validity"][3].item(), 0.0]
    assert score["mesh_smoothness"][0] > score["mesh_smoothness"][3] + 0.05
    dense = build_reward("mesh_validity", dense=True)(grids[2:3], [item.prompt], {"conditions": [item]}).scores
    assert 0.5 < dense.item() < 1.0  # watertight, one of two components a floater


def test_shape_match_against_the_prompt_is_the_mean_over_draws_of_its_solid():
    """against: prompt scores a field by its mean IoU over fixed draws of the solid the prompt describes (by hand
    here); against the item's one solid, the truth scores 1 and another draw of the same prompt less."""
    from flowrl.errors import ConfigError
    from flowrl.prompt_source import text_seed
    from flowrl.rewards.base import build_reward
    from flowrl.sdf import volume_iou
    from flowrl.worlds.shapes3d.prompts import parse_prompt, sample_solid

    item = condition_item("a tall box on top of a cone", 7)
    other = sample_solid(parse_prompt(item.prompt), np.random.default_rng(123))
    grids = np.stack([sdf_grid(solid_of(item), 32), sdf_grid(other, 32)])
    meta = {"conditions": [item, item]}
    draws = [
        sdf_grid(sample_solid(parse_prompt(item.prompt), np.random.default_rng([text_seed(item.prompt), j])), 32)
        for j in range(3)
    ]
    by_hand = [np.mean([volume_iou(g, d) for d in draws]) for g in grids]
    reward = build_reward("shape_match", against="prompt", draws=3)
    scores = reward(torch.from_numpy(grids), [item.prompt] * 2, meta).scores.numpy()
    np.testing.assert_allclose(scores, by_hand, rtol=1e-6)
    assert all(0.4 < s < 0.95 for s in scores)  # no draw is the item's own solid
    solid = build_reward("shape_match")(torch.from_numpy(grids), [item.prompt] * 2, meta).scores
    assert solid[0] == pytest.approx(1.0) and solid[1] < 0.95
    with pytest.raises(ConfigError, match="params.against"):
        build_reward("shape_match", against="text")


def test_rewards_refuse_other_modalities(tmp_path, tiny_sd3_dir):
    from flowrl.builders import build_rewards
    from flowrl.errors import ConfigError

    config = load_config(config_file(tmp_path, tiny_sd3_dir, "x"))
    with pytest.raises(ConfigError, match="silhouette_iou scores 3d"):
        build_rewards(config, "image")


# ---- methods through the loop -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm,params,kind",
    [
        ("grpo", {"clip_range": 1e-2, "timestep_fraction": 0.5}, "flow"),
        ("nft", {"timestep_fraction": 0.5}, "ode"),
        ("dho", {"timestep_fraction": 0.5}, "ode"),
        ("dho", {"timestep_fraction": 0.5, "chamfer_cost": 1.0}, "ode"),
        ("dpo", {"timestep_fraction": 0.5, "beta": 100.0}, "ode"),
    ],
)
def test_every_3d_method_trains_through_the_loop(tmp_path, tiny_shapes3d_dir, algorithm, params, kind):
    trainer, rows = run(config_file(tmp_path, tiny_shapes3d_dir, algorithm, algorithm, params, kind, updates=2))
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    assert any(v.abs().sum() > 0 for k, v in trainer.policy.trainable_state_dict().items() if "lora_B" in k)


def test_dpo_pairs_best_with_worst_and_raises_the_preference():
    from flowrl.algorithms.dpo import best_worst_pairs

    rewards = torch.tensor([0.1, 0.9, 0.5, 0.3, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert best_worst_pairs(rewards, groups, 1) == [(1, 0)]  # group 1 has no strictly better sample
    assert best_worst_pairs(rewards, groups, 2) == [(1, 0), (2, 3)]


def test_dpo_steps_lower_the_loss_on_a_fixed_batch(tmp_path, tiny_shapes3d_dir):
    from flowrl.train import Trainer

    trainer = Trainer(
        load_config(
            config_file(tmp_path, tiny_shapes3d_dir, "dpo", "dpo", {"beta": 100.0}, "ode", groups_per_update=4)
        ),
        log=False,
    )
    batch, _ = trainer.collect(0)
    items, _ = trainer.algorithm.prepare(batch, trainer.policy)
    losses = []
    for _ in range(15):
        loss, _ = trainer.algorithm.loss(trainer.policy, batch, items)
        losses.append(loss.mean().item())
        loss.mean().backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
    assert losses[0] == pytest.approx(np.log(2), abs=1e-4)  # policy = reference at the start
    assert losses[-1] < losses[0] - 0.05


# ---- asynchronous rollouts --------------------------------------------------------------------------------------
def test_staleness_zero_equals_synchronous_training_exactly(tmp_path, tiny_shapes3d_dir):
    sync, sync_rows = run(config_file(tmp_path, tiny_shapes3d_dir, "sync"))
    asyn, async_rows = run(config_file(tmp_path, tiny_shapes3d_dir, "async", async_rollouts=True, staleness=0))
    assert asyn.worker is not None and all(r["staleness"] == 0 for r in async_rows)
    assert [r["reward_mean"] for r in sync_rows] == [r["reward_mean"] for r in async_rows]
    for (name, a), b in zip(sync.policy.trainable_state_dict().items(), asyn.policy.trainable_state_dict().values()):
        assert torch.equal(a, b), name


def test_a_stale_batch_is_sampled_with_the_older_weights(tmp_path, tiny_shapes3d_dir):
    from flowrl.train import Trainer

    _, rows = run(config_file(tmp_path, tiny_shapes3d_dir, "stale", async_rollouts=True, staleness=1))
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0]
    base = Trainer(load_config(config_file(tmp_path, tiny_shapes3d_dir, "base")), log=False)
    _, metrics = base.collect(1)  # update 1's prompts and seeds with the untrained weights (version 0)
    assert rows[1]["reward_mean"] == metrics["reward_mean"]
    _, rows_sync = run(config_file(tmp_path, tiny_shapes3d_dir, "sync1"))
    assert rows_sync[1]["reward_mean"] != rows[1]["reward_mean"]  # synchronous: sampled after update 0's step


def test_async_resume_is_exact(tmp_path, tiny_shapes3d_dir):
    whole, _ = run(config_file(tmp_path, tiny_shapes3d_dir, "whole", async_rollouts=True, staleness=1, updates=4))
    path = config_file(tmp_path, tiny_shapes3d_dir, "parts", async_rollouts=True, staleness=1, updates=4)
    run(path, ["train.updates=2"])
    resumed, _ = run(path)
    assert resumed.resumed_from is not None and resumed.resumed_from.name == "update_000002"
    for (name, a), b in zip(
        whole.policy.trainable_state_dict().items(), resumed.policy.trainable_state_dict().values()
    ):
        assert torch.equal(a, b), name


# ---- demo ------------------------------------------------------------------------------------------------------
def test_demo_compares_base_and_tuned_meshes(tmp_path, tiny_shapes3d_dir):
    import trimesh
    from tiny_pipelines import random_lora_checkpoint

    from flowrl.demo import CheckpointSet, Comparison
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.rewards import build_reward

    checkpoint = random_lora_checkpoint(tiny_shapes3d_dir, tmp_path / "run")
    policy = policy_for(load_pipeline(tiny_shapes3d_dir))
    compare = Comparison(
        policy,
        CheckpointSet(policy, [str(checkpoint)]),
        build_reward("silhouette_iou"),
        3,
        2.0,
        policy.default_spec(),
        tmp_path,
    )
    entries = compare("a sphere on top of a cylinder", 0)
    assert [e["label"] for e in entries] == ["base", "run/update_000003"]
    meshes = [trimesh.load(e["mesh"], force="mesh") for e in entries]
    assert all(e["mesh"].endswith(".glb") for e in entries) and all(0 <= e["score"] <= 1 for e in entries)
    assert entries[0]["shown"].shape[1] == 4 * entries[0]["shown"].shape[0]  # a turntable strip of 4 views
    assert not np.array_equal(entries[0]["shown"], entries[1]["shown"]) or not np.allclose(
        meshes[0].bounds, meshes[1].bounds
    )  # the checkpoint's adapter is what draws the second
    gr = pytest.importorskip("gradio")
    from flowrl.demo import build_demo

    demo = build_demo(str(tiny_shapes3d_dir), [str(checkpoint)], steps=3, guidance_scale=2.0)
    viewers = [b for b in demo.blocks.values() if isinstance(b, gr.Model3D)]
    assert [v.label for v in viewers] == ["base", "run/update_000003"]  # one mesh viewer per model


def test_sample_cli_writes_meshes_for_world_prompts_and_image_files(tiny_shapes3d_dir, tmp_path):
    import json

    from PIL import Image
    from run_helpers import run_flowrl

    Image.fromarray(np.array(world_image(condition_item("a tall box", 3)))).save(tmp_path / "box.png")
    (tmp_path / "prompts.jsonl").write_text(
        json.dumps({"prompt": "a cone"})
        + "\n"
        + json.dumps({"prompt": "my box", "image": str(tmp_path / "box.png")})
        + "\n"
    )
    out = tmp_path / "samples"
    result = run_flowrl(
        "sample",
        "--pipeline",
        str(tiny_shapes3d_dir),
        "--prompts",
        str(tmp_path / "prompts.jsonl"),
        "--out",
        str(out),
        "--steps",
        "3",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["modality"] for r in records] == ["3d", "3d"]
    assert all((out / r["file"]).is_file() and r["file"].endswith(".glb") for r in records)
    assert all(r["extra_files"][0].endswith(".ply") for r in records)


def test_resuming_asynchronously_without_the_snapshots_is_one_clear_error(tmp_path, tiny_shapes3d_dir):
    from flowrl.errors import UserError

    path = config_file(tmp_path, tiny_shapes3d_dir, "switch", updates=2)
    run(path, ["train.updates=1"])  # a synchronous checkpoint at update 1
    with pytest.raises(UserError, match="runtime.staleness"):
        run(path, ["runtime.async_rollouts=true", "runtime.staleness=1"])


def test_an_empty_field_is_written_as_a_valid_empty_glb(tmp_path):
    """No surface: a GLB of an empty scene, one JSON chunk whose length fits the file (trimesh wrote a zero-length BIN
    chunk, which glTF forbids)."""
    import json
    import struct

    import trimesh

    from flowrl.sample_io import ShapeSamples, write_samples

    write_samples(tmp_path, ShapeSamples(torch.full((1, 32, 32, 32), 0.2)), [{"prompt": "nothing", "seed": 0}])
    data = (tmp_path / "00000.glb").read_bytes()
    magic, version, length = struct.unpack("<4sII", data[:12])
    chunk_length, kind = struct.unpack("<I4s", data[12:20])
    assert (magic, version, length, kind) == (b"glTF", 2, len(data), b"JSON") and 20 + chunk_length == len(data)
    assert chunk_length % 4 == 0 and json.loads(data[20:])["asset"]["version"] == "2.0"
    assert len(trimesh.load(tmp_path / "00000.glb").geometry) == 0


def test_the_pipeline_guides_only_above_scale_one_as_the_policy_does(tiny_shapes3d_dir):
    from flowrl.worlds.shapes3d.pipeline import Shapes3DFlowPipeline

    pipe = Shapes3DFlowPipeline.from_pretrained(tiny_shapes3d_dir)
    x, t = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0)), torch.full((2,), 0.5)
    image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        image = {"image": image}
        torch.testing.assert_close(pipe.velocity(x, t, image, 0.5), pipe.velocity(x, t, image, 1.0))
        assert not torch.allclose(pipe.velocity(x, t, image, 2.0), pipe.velocity(x, t, image, 1.0))


# ---- text-to-3D ---------------------------------------------------------------------------------------------------
def test_a_text_policy_samples_what_the_pipeline_samples_for_a_prompt(tiny_shapes3d_text_dir):
    """The policy's guided ODE rollout of a world prompt equals the pipeline's own sample from the same noise: both
    read the prompt's words and guide against the empty prompt (all padding)."""
    from flowrl.errors import UserError
    from flowrl.policies import load_pipeline, policy_for
    from flowrl.rollout import rollout, sample_generators

    pipe = load_pipeline(tiny_shapes3d_text_dir)
    policy = policy_for(pipe)
    items = [condition_item("a cone on top of a box"), condition_item("a tall sphere")]
    cond = policy.encode(items, 2.0)
    assert set(cond.tensors) == {"words"} and cond.negative["words"].abs().sum() == 0
    assert (cond.tensors["words"][0] > 0).sum() == 7 and (cond.tensors["words"][1] > 0).sum() == 3
    noise = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0))
    shape = policy.noise_shape(policy.default_spec())
    mine = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 2.0, initial_noise=noise).final
    prompts = [i.prompt for i in items]
    theirs = pipe(prompt=prompts, num_inference_steps=3, guidance_scale=2.0, latents=noise, output_type="latent")
    torch.testing.assert_close(mine, theirs.latents, atol=1e-5, rtol=1e-4)
    with pytest.raises(UserError, match="'teapot'"):  # one message naming the word, exit code 2 from the CLI
        policy.encode([Condition("a teapot")], 2.0)


def test_grpo_trains_a_text_to_3d_pipeline_through_the_loop(tmp_path, tiny_shapes3d_text_dir):
    trainer, rows = run(config_file(tmp_path, tiny_shapes3d_text_dir, "text3d", updates=2))
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    assert any(v.abs().sum() > 0 for k, v in trainer.policy.trainable_state_dict().items() if "lora_B" in k)


def test_dpo_loss_after_some_steps_by_hand():
    """Away from the reference (after a few steps): winner error 1 against 2 at the reference, loser error 4 against
    2, so the margin (err_w - ref_w) - (err_l - ref_l) is -3 and the loss -log sigmoid(-beta / 2 x -3), at beta 0.1
    log(1 + exp(-0.15)); the winner's velocity is pushed toward its target, the loser's away from its own."""
    import math
    from types import SimpleNamespace

    from flowrl.algorithms import WorkItems, build_algorithm
    from flowrl.config import SamplerSection

    dpo = build_algorithm("dpo", {"beta": 0.1}, SamplerSection(kind="ode"))
    v_w = torch.ones(1, 4, requires_grad=True)
    v_l = torch.full((1, 4), 2.0, requires_grad=True)
    dpo.velocities = lambda policy, traj, keys, winners: (v_w, v_l)
    dpo.u_w, dpo.u_l = torch.zeros(1, 4), torch.zeros(1, 4)
    dpo.ref_w, dpo.ref_l = torch.tensor([2.0]), torch.tensor([2.0])
    losses, info = dpo.loss(None, SimpleNamespace(trajectory=None), WorkItems.build([0], [0]))
    assert float(losses[0]) == pytest.approx(math.log(1 + math.exp(-0.15)), rel=1e-6)
    assert float(info["dpo_margin"][0]) == pytest.approx(-3.0) and float(info["implicit_accuracy"][0]) == 1.0
    losses.sum().backward()
    assert (v_w.grad > 0).all() and (v_l.grad < 0).all()  # descent lowers the winner's error, raises the loser's
