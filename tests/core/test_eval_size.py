"""A run trains at a low resolution and evaluates at the full one (eval.height / width / num_frames), on the tiny
layouts of SD3.5-Medium, FLUX.1-dev and Wan2.1; a size the denoiser cannot take stops the run at start-up."""

import pytest
from conftest import REPO
from real_layouts import LAYOUTS

from flowrl.config import load_config
from flowrl.errors import ConfigError
from flowrl.experiment import evaluate
from flowrl.train import Trainer

SMALL = [
    "lora.rank=4",
    "train.updates=1",
    "train.groups_per_update=1",
    "train.group_size=2",
    "memory.microbatch_size=2",
    "train.checkpoint_every=0",
    "runtime.threads=1",
    "memory.mixed_precision=no",
    "memory.weight_dtype=fp32",
    "sampler.num_steps=2",
    "eval.num_steps=2",
    "eval.num_per_prompt=1",
    "pipeline.max_sequence_length=16",
]
CASES = {  # config -> (layout, training size, eval size, reward)
    "sd35m_pickscore_grpo": ("sd35_medium", (64, 64, None), (128, 128, None), "jpeg_compressibility"),
    "flux_dev_nft": ("flux_dev", (32, 32, None), (64, 48, None), "jpeg_compressibility"),
    "wan21_1.3b_grpo": (
        "wan21",
        (16, 16, 5),
        (32, 32, 9),
        "{name: per_frame, params: {reward: jpeg_compressibility, frames: 2}}",
    ),
}


def _config(name, tmp_path, training, evaluated, reward, layout_dir):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red apple\na cat on a table\n")
    sizes = [f"pipeline.{k}={v}" for k, v in zip(("height", "width", "num_frames"), training) if v]
    sizes += [f"eval.{k}={v}" for k, v in zip(("height", "width", "num_frames"), evaluated) if v]
    reward = reward if reward.startswith("{") else f"{{name: {reward}}}"
    return load_config(
        REPO / "configs" / "real" / f"{name}.yaml",
        [
            f"pipeline.path={layout_dir}",
            f"run.out_dir={tmp_path / 'runs'}",
            f"prompts.source={prompts}",
            f"eval.prompts={prompts}",
            f"reward=[{reward}]",
            *sizes,
            *SMALL,
        ],
    )


@pytest.mark.parametrize("name", CASES)
def test_training_at_a_low_resolution_evaluates_at_the_full_one(name, tmp_path):
    layout, training, evaluated, reward = CASES[name]
    layout_dir = tmp_path / layout
    LAYOUTS[layout]().save_pretrained(layout_dir)
    trainer = Trainer(_config(name, tmp_path, training, evaluated, reward, layout_dir), log=False)
    batch, _ = trainer.collect(0)
    trained = trainer.policy.decode(batch.trajectory.final[:1])
    assert tuple(trained.shape[-2:]) == training[:2]
    _, samples, _ = evaluate(trainer, None)
    assert tuple(samples.tensor.shape[-2:]) == evaluated[:2]
    if evaluated[2]:  # video: [B, F, H, W, C] or [B, C, F, H, W]; the frame count is in the shape either way
        assert evaluated[2] in samples.tensor.shape and training[2] in trained.shape


def test_an_eval_size_the_denoiser_cannot_take_is_refused_at_start_up(tmp_path):
    layout_dir = tmp_path / "sd35_medium"
    LAYOUTS["sd35_medium"]().save_pretrained(layout_dir)
    # SD3's learned positional embedding holds 16 x 16 patches of 2 latent pixels at 8x: at most 256 px a side
    config = _config(
        "sd35m_pickscore_grpo", tmp_path, (64, 64, None), (512, 512, None), "jpeg_compressibility", layout_dir
    )
    refusal = r"eval.height / eval.width: SD3Transformer2DModel cannot sample at 512 x 512"
    with pytest.raises(ConfigError, match=refusal):
        Trainer(config, log=False)


def test_frames_for_an_image_pipelines_evaluations_are_refused(tiny_sd3_dir, tmp_path):
    from run_helpers import tiny_run_config

    path = tiny_run_config(tmp_path / "c.yaml", tiny_sd3_dir, tmp_path / "runs", "frames")
    with pytest.raises(ConfigError, match="eval.num_frames: StableDiffusion3Pipeline samples image, not video"):
        Trainer(load_config(path, ["eval.num_frames=5", "eval.enabled=true"]), log=False)
