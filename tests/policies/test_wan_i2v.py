"""Wan image-to-video (WanImageToVideoPipeline) as a policy, on tiny random offline instances of Wan2.1-I2V's layout
(CLIP image features), Wan2.2-I2V-A14B's (two experts, no image encoder) and Wan2.2-TI2V-5B's (the frame as the first
latent frame, a timestep per token)."""

import numpy as np
import pytest
import torch
from PIL import Image
from policy_checks import assert_lora_trains_every_adapter_and_reference_is_base
from tiny_pipelines import tiny_wan22_ti2v, tiny_wan_i2v

from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.tasks.base import Condition

SPEC = SampleSpec(16, 16, 9)
PROMPTS = ["a red circle", "two squares"]


def _frame(seed: int, height: int = 16, width: int | None = None) -> Image.Image:
    size = (height, width or height, 3)
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8))


LAYOUTS = {  # name -> (pipeline, sample spec)
    "wan21_i2v": (lambda: tiny_wan_i2v(), SPEC),
    "wan22_i2v_a14b": (lambda: tiny_wan_i2v(two_experts=True), SPEC),
    # its VAE is 16x: 64x96 gives 2x3 tokens a frame, so the per-token timesteps' order shows
    "wan22_ti2v_5b": (lambda: tiny_wan22_ti2v(image_to_video=True), SampleSpec(64, 96, 9)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ode_rollout_reproduces_the_image_to_video_pipeline(layout):
    """From the same noise, first frames and prompts, flowrl's 3-step ODE at CFG 5 gives the pipeline's latents:
    the frame's VAE latents (with mid-grey frames after it) and the first-frame mask concatenated on the channel
    axis, CLIP's features of the frame in both CFG branches (Wan2.1), each step on the expert the pipeline takes
    (Wan2.2). Two videos in one batch, each as the pipeline makes it alone; another first frame changes the video."""
    make, spec = LAYOUTS[layout]
    pipe = make()
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(spec)
    assert shape[0] == pipe.vae.config.z_dim  # the noise has the VAE's channels (Wan2.1's transformer takes 36)
    frames = [_frame(1, spec.height, spec.width), _frame(2, spec.height, spec.width)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    items = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames)]
    traj = rollout(
        policy,
        policy.encode(items, 5.0, spec),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        5.0,
        initial_noise=noise,
    )
    expected = torch.cat(
        [
            pipe(
                image=frame,
                prompt=prompt,
                negative_prompt="",
                guidance_scale=5.0,
                num_inference_steps=3,
                latents=noise[i : i + 1],
                output_type="latent",
                height=spec.height,
                width=spec.width,
                num_frames=9,
                max_sequence_length=16,
            ).frames
            for i, (prompt, frame) in enumerate(zip(PROMPTS, frames))
        ]
    )
    torch.testing.assert_close(traj.final, expected, atol=1e-4, rtol=1e-4)
    swapped = [Condition(PROMPTS[0], inputs={"source_image": frames[1]})]
    other = rollout(
        policy,
        policy.encode(swapped, 5.0, spec),
        sample_generators([1]),
        shape,
        3,
        "ode",
        0.0,
        5.0,
        initial_noise=noise[:1],
    )
    assert (other.final - traj.final[:1]).abs().max() > 1e-3


def test_clip_reads_the_original_frame_and_the_experts_split_a_mixed_batch():
    """Wan2.1-I2V: CLIP's features are of the frame as given (40x24 here), not of the one resized to the sample size
    for the VAE. Wan2.2-I2V-A14B: a batch with one row above the boundary and one below gives each row what it
    gives alone (the condition follows its row to its expert)."""
    pipe = tiny_wan_i2v()
    policy = policy_for(pipe, max_sequence_length=16)
    frame = Image.fromarray(np.random.default_rng(5).integers(0, 255, (40, 24, 3), dtype=np.uint8))
    cond = policy.encode([Condition(PROMPTS[0], inputs={"source_image": frame})], 5.0, SPEC)
    torch.testing.assert_close(cond.tensors["image_embeds"], pipe.encode_image(frame, "cpu"))
    assert cond.tensors["condition"].shape[-2:] == (2, 2)  # the VAE's frame: the 16x16 sample size

    policy = policy_for(tiny_wan_i2v(two_experts=True), max_sequence_length=16)
    items = [Condition(prompt, inputs={"source_image": _frame(i)}) for i, prompt in enumerate(PROMPTS)]
    cond = policy.encode(items, 5.0, SPEC)
    x = torch.randn(2, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.95, 0.5])  # the high-noise expert, then the low-noise one (boundary 0.9)
    with torch.no_grad():
        mixed = policy.velocity(x, sigma, cond, 5.0)
        alone = [policy.velocity(x[i : i + 1], sigma[i : i + 1], cond.select([i]), 5.0) for i in range(2)]
    torch.testing.assert_close(mixed, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_a_groups_first_frame_is_encoded_once_and_trains_every_adapter(monkeypatch):
    pipe = tiny_wan_i2v()
    policy = policy_for(pipe, max_sequence_length=16)
    calls = {"vae": 0, "clip": 0}
    vae_encode, clip = pipe.vae.encode, pipe.encode_image

    def count(name, function):
        def counted(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(pipe.vae, "encode", count("vae", vae_encode))
    monkeypatch.setattr(pipe, "encode_image", count("clip", clip))
    group = [Condition(PROMPTS[0], inputs={"source_image": _frame(1)})] * 4
    cond = policy.encode(group, 5.0, SPEC)
    assert calls == {"vae": 1, "clip": 1}
    assert torch.equal(cond.negative["condition"], cond.tensors["condition"])
    assert torch.equal(cond.tensors["image_embeds"][0], cond.tensors["image_embeds"][3])

    x = torch.randn(4, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    assert_lora_trains_every_adapter_and_reference_is_base(policy, x, 0.6, cond, 5.0)


def test_ti2v_keeps_the_given_frame_under_sde_noise_and_scores_its_steps_as_drawn():
    """Wan2.2-TI2V-5B under the SDE: every step ends with the first latent frame on the given frame's (the pipeline's
    output), a stored trajectory's steps score as they were drawn (on-policy ratio 1), and no weight moves the first
    frame's velocity while the others train."""
    pipe = tiny_wan22_ti2v(image_to_video=True)
    policy = policy_for(pipe, max_sequence_length=16)
    spec = SampleSpec(32, 32, 9)
    shape = policy.noise_shape(spec)
    cond = policy.encode(
        [Condition(p, inputs={"source_image": _frame(i, 32)}) for i, p in enumerate(PROMPTS)], 5.0, spec
    )
    traj = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "flow", 0.7, 5.0)
    given = cond.tensors["condition"][:, :, 0]
    assert all(torch.equal(traj.latents[i][:, :, 0], given) for i in range(1, 4))
    sigmas = policy.sigmas(3, shape)
    for i in range(3):
        again = policy.step(
            "flow",
            traj.latents[i],
            float(sigmas[i]),
            float(sigmas[i + 1]),
            cond,
            5.0,
            0.7,
            prev_sample=traj.latents[i + 1],
        )
        torch.testing.assert_close(again[3], traj.log_probs[i], atol=1e-6, rtol=1e-6)
    policy.add_lora(4, 8, policy.lora_targets)
    v = policy.velocity(traj.latents[1], float(sigmas[1]), cond, 5.0)
    v[:, :, 0].sum().backward(retain_graph=True)
    assert all(p.grad is None or not p.grad.any() for p in policy.trainable_parameters())
    v[:, :, 1:].sum().backward()
    assert any(p.grad is not None and p.grad.any() for p in policy.trainable_parameters())


def test_a_prompt_without_a_first_frame_is_named():
    from flowrl.errors import UserError

    policy = policy_for(tiny_wan_i2v(), max_sequence_length=16)
    with pytest.raises(UserError, match="prompt 'a red circle' has no condition image.*give it as 'image'"):
        policy.encode(["a red circle"], 5.0, SPEC)


def test_the_demo_animates_an_uploaded_first_frame(tmp_path):
    """An image-to-video page: a video page with a first-frame upload (required: no world makes one), shown first,
    then each model's clip, scored by the video reward."""
    gr = pytest.importorskip("gradio")
    from demo_grid import read_grid

    from flowrl.demo import build_demo

    tiny_wan_i2v().save_pretrained(tmp_path / "i2v")
    demo = build_demo(str(tmp_path / "i2v"), [], steps=2, max_sequence_length=16, size=(16, 16, 5))
    assert [b.label for b in demo.blocks.values() if isinstance(b, gr.Image)] == ["first frame (required)"]
    handler = demo.generate
    quiet = lambda *args, **kwargs: None  # noqa: E731
    frame = np.asarray(_frame(4))
    html, table = handler("a red circle", 3, 1, 2, 4.5, frame, progress=quiet)
    grid = read_grid(html)
    assert grid["columns"] == ["source", "base"] and grid["captions"][0] == "input"
    assert grid["images"][1][:6] == b"GIF89a" and "| base | 0." in table and "frame_consistency" in table
    with pytest.raises(gr.Error, match="upload a first frame: WanImageToVideoPipeline starts from one"):
        handler("a red circle", 3, 1, 2, 4.5, None, progress=quiet)
