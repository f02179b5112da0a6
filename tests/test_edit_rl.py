"""Editing pipelines as policies: FluxKontextPipeline's source image as per-sample conditioning (the ODE rollout equals
the pipeline's own sampling), and edit RL through the one loop on the shapes-editing task (issue 19, part 3)."""
import numpy as np
import pytest
import torch
import yaml
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
    traj = rollout(policy, policy.encode(items, 3.5), sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.5,
                   initial_noise=noise)
    out = pipe(image=[Image.fromarray(s) for s in sources], prompt=PROMPTS, num_inference_steps=3, guidance_scale=3.5,
               latents=pipe._pack_latents(noise, *noise.shape), output_type="latent", height=8, width=8,
               max_sequence_length=16, _auto_resize=False, max_area=64)
    torch.testing.assert_close(traj.final, pipe._unpack_latents(out.images, 8, 8, pipe.vae_scale_factor),
                               atol=1e-5, rtol=1e-5)
    other = [Condition(p, inputs={"source_image": s[::-1].copy()}) for p, s in zip(PROMPTS, sources)]
    moved = rollout(policy, policy.encode(other, 3.5), sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.5,
                    initial_noise=noise)
    assert not torch.allclose(moved.final, traj.final)  # the source image conditions the edit
    with pytest.raises(UserError, match="source image"):
        policy.encode([Condition(PROMPTS[0])], 3.5)


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
        "train": {"updates": 2, "groups_per_update": 2, "group_size": 4, "lr": 1e-2, "microbatch_size": 8,
                  "checkpoint_every": 0, "threads": 1},
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
