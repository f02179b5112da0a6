"""The configs in configs/real/ run end to end on tiny random pipelines with the real layouts (SD3.5-Medium, FLUX.1-dev,
Wan2.1, Wan2.2-A14B, Wan2.1-I2V, Wan2.2-I2V-A14B, HunyuanVideo (and SkyReels-I2V), LTX-Video, SD 1.5, Qwen-Image,
Z-Image, FLUX.2 [klein] and [dev], and the editors FLUX.1 Kontext-dev and Qwen-Image-Edit-2511): 2 updates with
evaluation and checkpoints, then the checkpoint's LoRA loads with diffusers' `load_lora_weights` and gives flowrl's
model exactly."""

import json

import pytest
import torch
from conftest import REPO
from real_layouts import LAYOUTS

from flowrl.checkpoint import load_trained_weights
from flowrl.config import load_config
from flowrl.experiment import run_experiment
from flowrl.policies import load_pipeline, policy_for
from flowrl.policies.base import SampleSpec

CASES = {  # config -> (layout, size (and schedule) overrides, reward overrides)
    "sd35m_pickscore_grpo": ("sd35_medium", ["pipeline.height=64", "pipeline.width=64"], "pickscore"),
    "flux_dev_nft": ("flux_dev", ["pipeline.height=32", "pipeline.width=32"], "pickscore"),
    "wan21_1.3b_grpo": ("wan21", ["pipeline.height=16", "pipeline.width=16", "pipeline.num_frames=5"], "per_frame"),
    "wan22_a14b_grpo": (
        "wan22_a14b",
        ["pipeline.height=16", "pipeline.width=16", "pipeline.num_frames=5", "sampler.sde_window_range=[1,2]"],
        "per_frame",
    ),  # step 1: sigma 0.92
    "sd15_ddpo": ("sd15", ["pipeline.height=64", "pipeline.width=64"], None),
    "qwen_image_pickscore_grpo": (
        "qwen_image",
        ["pipeline.height=32", "pipeline.width=32", "sampler.sde_window_range=[1,3]"],
        "pickscore",
    ),  # 3 steps here
    "z_image_pickscore_grpo": (
        "z_image",
        ["pipeline.height=32", "pipeline.width=32", "sampler.sde_window_range=[1,3]"],
        "pickscore",
    ),
    "flux2_klein_base_pickscore_grpo": (
        "flux2_klein_base",
        ["pipeline.height=32", "pipeline.width=32", "sampler.sde_window_range=[1,3]"],
        "pickscore",
    ),
    "hunyuan_video_dance_grpo": (
        "hunyuan_video",
        ["pipeline.height=32", "pipeline.width=32", "pipeline.num_frames=5"],
        "per_frame",
    ),
    "ltx_video_grpo": ("ltx", ["pipeline.height=32", "pipeline.width=32", "pipeline.num_frames=9"], "per_frame"),
    "flux2_dev_clip_pickscore_grpo": (
        "flux2_dev",
        ["pipeline.height=32", "pipeline.width=32", "sampler.sde_window_range=[1,3]"],
        "clip_pickscore",
    ),
}


# the tiny layouts' adapted layers are 16-32 wide, where the configs' ranks (32-256) are larger than any layer,
# which lora.rank refuses; the rank does not change what these tests check
TINY_RANK = "lora.rank=8"
SMALL_RUN = [
    TINY_RANK,
    "train.updates=2",
    "train.groups_per_update=2",
    "train.group_size=2",
    "memory.microbatch_size=4",
    "train.checkpoint_every=1",
    "runtime.threads=1",
    "memory.mixed_precision=no",
    "memory.weight_dtype=fp32",
    "sampler.num_steps=3",
    "eval.num_steps=2",
    "eval.num_per_prompt=1",
    "eval.every=1",
]


def _image_prompt_file(path, prompts: list[str], side: int):
    """A .jsonl of two prompts with image files beside it (random pixels): a 40x24 one and a side x side one."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    lines = []
    for prompt, (file, size) in zip(prompts, (("a.png", (40, 24)), ("b.png", (side, side)))):
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(path.parent / file)
        lines.append(json.dumps({"prompt": prompt, "image": file}))
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_checkpoint_loads_in_diffusers(pipeline_dir, checkpoint, velocity):
    """The run trained its adapter (`velocity` of the policy moved), and the checkpoint's LoRA loaded with diffusers'
    `load_lora_weights` gives flowrl's model exactly."""
    ours = policy_for(load_pipeline(pipeline_dir), max_sequence_length=16)
    base = velocity(ours)
    load_trained_weights(ours, checkpoint)
    expected = velocity(ours)
    assert (expected - base).abs().max() > 0  # the run trained the adapter
    pipe = load_pipeline(pipeline_dir)
    pipe.load_lora_weights(checkpoint)
    torch.testing.assert_close(velocity(policy_for(pipe, max_sequence_length=16)), expected, rtol=0, atol=0)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    from tiny_reward_models import save_tiny_clip

    folder = tmp_path_factory.mktemp("pickscore")
    save_tiny_clip(folder)
    return folder


@pytest.mark.parametrize("name", CASES)
def test_real_config_trains_evaluates_and_exports(name, clip_folder, tmp_path):
    layout, size, reward = CASES[name]
    pipeline_dir = tmp_path / layout
    LAYOUTS[layout]().save_pretrained(pipeline_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red apple\na cat on a table\n")
    overrides = [
        f"pipeline.path={pipeline_dir}",
        f"run.out_dir={tmp_path / 'runs'}",
        *size,
        f"prompts.source={prompts}",
        f"eval.prompts={prompts}",
        *SMALL_RUN,
    ]
    if name != "sd15_ddpo":
        overrides.append("pipeline.max_sequence_length=16")
    if reward == "pickscore":
        overrides.append(f"reward=[{{name: pickscore, params: {{path: {clip_folder}}}}}]")
    elif reward == "clip_pickscore":  # both terms, standardized within groups (GDPO), on one tiny CLIP
        overrides.append(
            f"reward=[{{name: clipscore, params: {{path: {clip_folder}}}}}, "
            f"{{name: pickscore, weight: 0.5, params: {{path: {clip_folder}}}}}]"
        )
    elif reward == "per_frame":
        overrides.append(
            f"reward=[{{name: per_frame, params: {{reward: pickscore, params: {{path: {clip_folder}}}, frames: 2}}}}]"
        )
    config = load_config(REPO / "configs" / "real" / f"{name}.yaml", overrides)
    run_dir = run_experiment(config)
    evals = json.loads((run_dir / "eval.json").read_text())
    assert set(evals) == {"0", "1", "2"} and all("overall" in e for e in evals.values())
    assert (run_dir / "before_after.png").is_file() and (run_dir / "report.html").is_file()
    checkpoint = run_dir / "checkpoints" / "update_000002"

    def velocity(policy):
        spec = {
            "wan21": SampleSpec(16, 16, 5),
            "wan22_a14b": SampleSpec(16, 16, 5),
            "z_image": SampleSpec(32, 32),
            "flux2_klein_base": SampleSpec(32, 32),
            "flux2_dev": SampleSpec(32, 32),
            "hunyuan_video": SampleSpec(32, 32, 5),
            "ltx": SampleSpec(32, 32, 9),
        }.get(layout, policy.default_spec())  # Z-Image's and FLUX.2's defaults: 1024 px
        x = torch.randn(2, *policy.noise_shape(spec), generator=torch.Generator().manual_seed(0))
        # Wan2.2 adapts its high-noise expert, above the boundary 0.875
        sigma = (0.95 if layout == "wan22_a14b" else 0.6) if policy.prediction == "flow" else 500
        with torch.no_grad():
            return policy.velocity(x, sigma, policy.encode(["a red apple", "a cat"], 2.0), 2.0)

    assert_checkpoint_loads_in_diffusers(pipeline_dir, checkpoint, velocity)
    if config.pipeline.shift is not None:  # the run's schedule travels with an exported model
        from flowrl.export import export_pipeline

        exported = export_pipeline(pipeline_dir, checkpoint, tmp_path / "tuned")
        assert (
            json.loads((exported / "scheduler" / "scheduler_config.json").read_text())["shift"] == config.pipeline.shift
        )


def test_an_image_reward_on_a_video_pipeline_is_named_at_start_up(tmp_path):
    from tiny_pipelines import tiny_wan

    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    tiny_wan().save_pretrained(tmp_path / "wan")
    config = load_config(
        REPO / "configs" / "real" / "wan21_1.3b_grpo.yaml",
        [
            f"pipeline.path={tmp_path / 'wan'}",
            TINY_RANK,
            "reward=[{name: jpeg_compressibility}]",
            f"prompts.source={REPO / 'assets' / 'prompts' / 'video_prompts.txt'}",
            "memory.weight_dtype=fp32",
            "memory.mixed_precision=no",
            "pipeline.max_sequence_length=16",
        ],
    )
    with pytest.raises(
        ConfigError,
        match=r"reward\[0\].name: jpeg_compressibility scores image, but the pipeline "
        "samples video; score frames with {name: per_frame",
    ):
        Trainer(config, log=False)


def test_per_frame_reward_scores_sampled_frames_and_aggregates():
    from flowrl.rewards import build_reward

    video = torch.zeros(2, 3, 5, 8, 8)
    video[0, :, 1] = 1.0  # one bright frame in the first video
    mean = build_reward("per_frame", reward="jpeg_incompressibility", frames=0)
    single = build_reward("jpeg_incompressibility")
    frames = video.permute(0, 2, 1, 3, 4).reshape(10, 3, 8, 8)
    per_frame = single(frames, ["p"] * 10).scores.view(2, 5)
    torch.testing.assert_close(mean(video, ["p", "q"]).scores, per_frame.mean(1))
    lowest = build_reward("per_frame", reward="jpeg_incompressibility", aggregate="min", frames=3)
    torch.testing.assert_close(lowest(video, ["p", "q"]).scores, per_frame[:, [0, 2, 4]].min(1).values)


def test_frame_consistency_is_one_for_a_still_video_and_falls_with_flicker_and_motion():
    from flowrl.rewards import build_reward

    reward = build_reward("frame_consistency", size=8)
    torch.manual_seed(0)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    frame = torch.exp(-((yy - 8) ** 2 + (xx - 6) ** 2) / 18).expand(3, 16, 16)  # a smooth blob
    still = frame[:, None].expand(3, 5, 16, 16)
    moving = torch.stack([torch.roll(frame, t, dims=-1) for t in range(5)], 1)  # the blob slides one pixel a frame
    flicker = torch.stack([frame if t % 2 == 0 else torch.rand(3, 16, 16) for t in range(5)], 1)
    scores = reward(torch.stack([still, moving, flicker]), ["p"] * 3).scores
    torch.testing.assert_close(scores[0], torch.tensor(1.0))
    assert scores[0] > scores[1] > scores[2], scores
    # hand formula for the flicker video: frames 0, 2, 4 equal; mean over t of (cos(t, 0) + cos(t, t-1)) / 2
    f = reward.features(flicker.permute(1, 0, 2, 3))
    expected = sum((f[t] @ f[0] + f[t] @ f[t - 1]) / 2 for t in range(1, 5)) / 4
    torch.testing.assert_close(scores[2], expected)
    with pytest.raises(Exception, match="expected videos"):
        reward(torch.rand(2, 3, 8, 8), ["p", "q"])


EDIT_CASES = {  # config -> (layout, guidance scale, overrides for a 3-step schedule)
    "flux_kontext_arro_grpo": ("flux_kontext_dev", 2.5, ["pipeline.max_sequence_length=16"]),
    "qwen_image_edit_arro_grpo": ("qwen_image_edit_plus", 4.0, ["sampler.sde_window_range=[1,3]"]),
}


@pytest.mark.parametrize("name", EDIT_CASES)
def test_the_arro_edit_configs_edit_files_with_a_vlm_rubric_and_export(name, tmp_path):
    """configs/real/flux_kontext_arro_grpo.yaml on FLUX.1 Kontext-dev's layout, and qwen_image_edit_arro_grpo.yaml on
    Qwen-Image-Edit-2511's (both tiny, random) with a tiny random Qwen2.5-VL auditor: sources of two sizes from a
    .jsonl file, 2 updates with the group rubric reward and its evaluations, and the checkpoint's LoRA loads into
    diffusers' own pipeline class exactly."""
    import numpy as np
    from PIL import Image
    from tiny_vlm import save_tiny_qwen25_vl

    from flowrl.tasks.base import read_prompt_file

    layout, guidance, schedule = EDIT_CASES[name]
    pipeline_dir, judge = tmp_path / layout, tmp_path / "qwen"
    LAYOUTS[layout]().save_pretrained(pipeline_dir)
    save_tiny_qwen25_vl(judge)
    edits = _image_prompt_file(tmp_path / "edits.jsonl", ["make the circle red", "remove the square"], 32)
    overrides = [
        f"pipeline.path={pipeline_dir}",
        f"run.out_dir={tmp_path / 'runs'}",
        "pipeline.height=32",
        "pipeline.width=32",
        *schedule,
        f"prompts.source={edits}",
        f"eval.prompts={edits}",
        *SMALL_RUN,
        "memory.offload_text_encoders=false",
        # the random judge may score every edit alike (no advantage): a small pixel reward keeps one
        f"reward=[{{name: edit_rubric, params: {{mode: group, judge: {{path: {judge}, dtype: float32, "
        "group_audit: true, max_new_tokens: 4}}}, {name: jpeg_compressibility, weight: 0.1}]",
    ]
    run_dir = run_experiment(load_config(REPO / "configs" / "real" / f"{name}.yaml", overrides))
    evals = json.loads((run_dir / "eval.json").read_text())
    assert set(evals) == {"0", "1", "2"} and all("overall" in e for e in evals.values())
    grid = np.asarray(Image.open(run_dir / "before_after.png"))
    assert grid.shape[1] == 260 + 3 * (32 * 4 + 4)  # the title column, then source (from its file) | base | tuned
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert "reward/edit_rubric" in rows[0] and len(rows) == 3  # the rubric scored every update's edits
    checkpoint = run_dir / "checkpoints" / "update_000002"
    items = read_prompt_file(edits)

    def velocity(policy):
        x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return policy.velocity(x, 0.6, policy.encode(items, guidance, SampleSpec(32, 32)), guidance)

    assert_checkpoint_loads_in_diffusers(pipeline_dir, checkpoint, velocity)


I2V_CASES = {  # config -> (layout, SDE window on the tiny 3-step schedule, a sigma the trained expert takes)
    "wan21_i2v_grpo": ("wan21_i2v", "[1,3]", 0.6),
    "wan22_i2v_a14b_grpo": ("wan22_i2v_a14b", "[0,1]", 0.95),  # shift 7: step 1 (sigma 0.875) is below 0.9
    "skyreels_i2v_dance_grpo": ("skyreels_i2v", "[0,5]", 0.6),  # SDE on every step
}


@pytest.mark.parametrize("name", I2V_CASES)
def test_the_image_to_video_configs_animate_first_frames_from_a_file_and_export(name, clip_folder, tmp_path):
    """configs/real/wan21_i2v_grpo.yaml, wan22_i2v_a14b_grpo.yaml and skyreels_i2v_dance_grpo.yaml on their layouts
    (tiny, random; Wan2.2's two experts): first frames of two sizes from a .jsonl file, 2 updates with PickScore on
    frames and their evaluations, and the checkpoint's LoRA loads into the diffusers pipeline exactly."""
    from flowrl.tasks.base import read_prompt_file

    layout, window, sigma = I2V_CASES[name]
    pipeline_dir = tmp_path / layout
    LAYOUTS[layout]().save_pretrained(pipeline_dir)
    clips = _image_prompt_file(tmp_path / "clips.jsonl", ["a red circle moves left", "a square turns blue"], 16)
    overrides = [
        f"pipeline.path={pipeline_dir}",
        f"run.out_dir={tmp_path / 'runs'}",
        "pipeline.height=16",
        "pipeline.width=16",
        "pipeline.num_frames=5",
        "pipeline.max_sequence_length=16",
        f"sampler.sde_window_range={window}",
        f"prompts.source={clips}",
        f"eval.prompts={clips}",
        *SMALL_RUN,
        f"reward=[{{name: per_frame, params: {{reward: pickscore, params: {{path: {clip_folder}}}, frames: 2}}}}]",
    ]
    run_dir = run_experiment(load_config(REPO / "configs" / "real" / f"{name}.yaml", overrides))
    evals = json.loads((run_dir / "eval.json").read_text())
    assert set(evals) == {"0", "1", "2"} and all("overall" in e for e in evals.values())
    assert (run_dir / "report.html").is_file()
    # first frame | base | tuned, each at its own aspect: a 16x16 frame, then strips of 5 frames (16x80), at the one
    # factor min(4, 256 / 80) = 3.2 -> cells 51 and 256 wide, 51 high
    from PIL import Image

    assert Image.open(run_dir / "before_after.png").size == (260 + (51 + 4) + 2 * (256 + 4), 20 + 2 * (51 + 4))
    items = read_prompt_file(clips)

    def velocity(policy):
        x = torch.randn(2, *policy.noise_shape(SampleSpec(16, 16, 5)), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return policy.velocity(x, sigma, policy.encode(items, 5.0, SampleSpec(16, 16, 5)), 5.0)

    assert_checkpoint_loads_in_diffusers(pipeline_dir, run_dir / "checkpoints" / "update_000002", velocity)


def test_sde_steps_where_wan22s_frozen_expert_denoises_are_named_at_start_up(tmp_path, caplog):
    """Wan2.2 trains its high-noise expert: SDE steps below the boundary train nothing. The Wan config's SDE on every
    step warns naming them; a window on them alone is a ConfigError; a window above the boundary says nothing; the
    shipped Wan2.2 config's window is above it on the release's schedule."""
    import logging

    from tiny_pipelines import tiny_wan22

    from flowrl.errors import ConfigError
    from flowrl.train import Trainer

    tiny_wan22().save_pretrained(tmp_path / "wan22")
    base = [
        f"pipeline.path={tmp_path / 'wan22'}",
        TINY_RANK,
        "reward=[{name: frame_consistency, params: {size: 8}}]",
        f"prompts.source={REPO / 'assets' / 'prompts' / 'video_prompts.txt'}",
        "memory.weight_dtype=fp32",
        "memory.mixed_precision=no",
        "pipeline.max_sequence_length=16",
        "pipeline.height=16",
        "pipeline.width=16",
        "pipeline.num_frames=5",
        "sampler.num_steps=4",
    ]  # sigmas 1.0, 0.93, 0.78, 0.05: step 0 alone >= 0.95

    def start(*overrides):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flowrl"):
            Trainer(load_config(REPO / "configs" / "real" / "wan21_1.3b_grpo.yaml", [*base, *overrides]), log=False)
        return [r.getMessage() for r in caplog.records if "train nothing" in r.getMessage()]

    warned = start()
    assert len(warned) == 1 and "SDE steps [1, 2, 3] sit at sigma < 0.95" in warned[0] and "are [0]" in warned[0]
    assert (
        start("sampler.sde_window_size=1", "sampler.sde_window_range=[0,1]", "pipeline.guidance_scale_2=2.0") == []
    )  # the low-noise expert's own CFG scale is accepted
    with pytest.raises(ConfigError, match=r"every SDE step \(\[2, 3\]\) sits at sigma < 0.95.*train nothing"):
        start("sampler.sde_window_size=1", "sampler.sde_window_range=[2,4]")

    # the shipped Wan2.2 config on the release's schedule (flow_shift 12, boundary 0.875): its SDE window (steps 1-3
    # of 10) lies wholly on the trained expert; the same schedule with SDE on every step names steps 6-9
    from real_layouts import wan22_a14b

    wan22_a14b().save_pretrained(tmp_path / "a14b")
    a14b = [f"pipeline.path={tmp_path / 'a14b'}", *base[1:-1]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        Trainer(load_config(REPO / "configs" / "real" / "wan22_a14b_grpo.yaml", a14b), log=False)
        assert not [r for r in caplog.records if "train nothing" in r.getMessage()]
        Trainer(
            load_config(REPO / "configs" / "real" / "wan22_a14b_grpo.yaml", [*a14b, "sampler.sde_window_size=0"]),
            log=False,
        )
    assert "SDE steps [6, 7, 8, 9] sit at sigma < 0.875" in caplog.text
