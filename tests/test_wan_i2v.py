"""Wan image-to-video (WanImageToVideoPipeline) as a policy, on tiny random offline instances of Wan2.1-I2V's layout
(CLIP image features) and Wan2.2-I2V-A14B's (two experts, no image encoder)."""
import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.tasks.base import Condition
from policy_checks import assert_lora_trains_every_adapter_and_reference_is_base
from tiny_pipelines import tiny_wan_i2v

SPEC = SampleSpec(16, 16, 9)
PROMPTS = ["a red circle", "two squares"]


def _frame(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8))


@pytest.mark.parametrize("two_experts", [False, True], ids=["wan21_i2v", "wan22_i2v_a14b"])
def test_ode_rollout_reproduces_the_image_to_video_pipeline(two_experts):
    """From the same noise, first frames and prompts, flowrl's 3-step ODE at CFG 5 gives the pipeline's latents:
    the frame's VAE latents (with mid-grey frames after it) and the first-frame mask concatenated on the channel
    axis, CLIP's features of the frame in both CFG branches (Wan2.1), each step on the expert the pipeline takes
    (Wan2.2). Two videos in one batch, each as the pipeline makes it alone; another first frame changes the video."""
    pipe = tiny_wan_i2v(two_experts=two_experts)
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(SPEC)
    assert shape[0] == 16  # the noise has the VAE's channels; the transformer takes 36
    frames = [_frame(1), _frame(2)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    items = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames)]
    traj = rollout(policy, policy.encode(items, 5.0, SPEC), sample_generators([1, 2]), shape, 3, "ode", 0.0, 5.0,
                   initial_noise=noise)
    expected = torch.cat([pipe(image=frame, prompt=prompt, negative_prompt="", guidance_scale=5.0,
                               num_inference_steps=3, latents=noise[i:i + 1], output_type="latent", height=16,
                               width=16, num_frames=9, max_sequence_length=16).frames
                          for i, (prompt, frame) in enumerate(zip(PROMPTS, frames))])
    torch.testing.assert_close(traj.final, expected, atol=1e-4, rtol=1e-4)
    swapped = [Condition(PROMPTS[0], inputs={"source_image": frames[1]})]
    other = rollout(policy, policy.encode(swapped, 5.0, SPEC), sample_generators([1]), shape, 3, "ode", 0.0, 5.0,
                    initial_noise=noise[:1])
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
        alone = [policy.velocity(x[i:i + 1], sigma[i:i + 1], cond.select([i]), 5.0) for i in range(2)]
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


def test_a_prompt_without_a_first_frame_and_ti2v_are_named():
    from flowrl.errors import ConfigError, UserError

    policy = policy_for(tiny_wan_i2v(), max_sequence_length=16)
    with pytest.raises(UserError, match="prompt 'a red circle' has no condition image.*give it as 'image'"):
        policy.encode(["a red circle"], 5.0, SPEC)
    pipe = tiny_wan_i2v()
    pipe.register_to_config(expand_timesteps=True)
    with pytest.raises(ConfigError, match="expands timesteps per token"):
        policy_for(pipe, max_sequence_length=16)


def test_the_demo_animates_an_uploaded_first_frame(tmp_path):
    """An image-to-video page: a video page with a first-frame upload (required: no world makes one), shown first,
    then each model's clip, scored by the video reward."""
    gr = pytest.importorskip("gradio")
    from flowrl.demo import build_demo

    tiny_wan_i2v().save_pretrained(tmp_path / "i2v")
    demo = build_demo(str(tmp_path / "i2v"), [], steps=2, max_sequence_length=16, size=(16, 16, 5))
    assert [b.label for b in demo.blocks.values() if isinstance(b, gr.Image)] == ["first frame (required)"]
    handler = next(iter(demo.fns.values())).fn
    quiet = lambda *args, **kwargs: None  # noqa: E731
    frame = np.asarray(_frame(4))
    gallery, table = handler("a red circle", 3, frame, progress=quiet)
    assert [caption.split(" |")[0] for _, caption in gallery] == ["source", "base"]
    assert str(gallery[1][0]).endswith(".gif") and "| base | 0." in table and "frame_consistency" in table
    with pytest.raises(gr.Error, match="upload a first frame: WanImageToVideoPipeline starts from one"):
        handler("a red circle", 3, None, progress=quiet)
