"""Policy adapters on tiny offline SD3, FLUX, FLUX.2 ([klein] and [dev]), Wan (2.1, and 2.2's two experts), HunyuanVideo
(and SkyReels image to video), LTX-Video, Qwen-Image and Z-Image pipelines (real diffusers classes)."""

import contextlib

import pytest
import torch
from policy_checks import assert_lora_trains_every_adapter_and_reference_is_base
from tiny_pipelines import (
    tiny_flux,
    tiny_flux2_dev,
    tiny_flux2_klein,
    tiny_hunyuan_video,
    tiny_ltx,
    tiny_qwen_image,
    tiny_shapes_sd3,
    tiny_wan,
    tiny_wan22,
    tiny_wan22_ti2v,
    tiny_z_image,
)

from flowrl.errors import ConfigError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators

CASES = {
    "sd3": (tiny_shapes_sd3, SampleSpec(32, 32), 4.0),
    "flux": (tiny_flux, SampleSpec(8, 8), 3.5),
    "wan": (tiny_wan, SampleSpec(16, 16, num_frames=9), 5.0),
    "wan22": (tiny_wan22, SampleSpec(16, 16, num_frames=9), 5.0),  # two experts: step 0 high noise, the rest low
    "wan22_ti2v": (tiny_wan22_ti2v, SampleSpec(32, 32, num_frames=9), 5.0),  # TI2V-5B's layout, text to video
    "qwen_image": (tiny_qwen_image, SampleSpec(32, 32), 4.0),
    "z_image": (tiny_z_image, SampleSpec(32, 32), 4.0),  # ZImagePipeline's guidance_scale 3.0
    "flux2_klein": (tiny_flux2_klein, SampleSpec(32, 32), 4.0),  # the undistilled (base) model: true CFG
    "flux2_dev": (tiny_flux2_dev, SampleSpec(32, 32), 4.0),  # guidance-distilled: the scale is an embedding
    "hunyuan_video": (tiny_hunyuan_video, SampleSpec(32, 32, num_frames=5), 6.0),  # embedded guidance, no CFG
    "ltx": (tiny_ltx, SampleSpec(32, 32, num_frames=9), 3.0),  # packed video tokens, shift from their count
}
PROMPTS = ["a red circle", "two squares"]


def _pipeline_latents(name, pipe, noise, steps, guidance, spec):
    """The pipeline's own latents from the same initial noise (FLUX's and Qwen-Image's packed into their 2x2 tokens
    and back)."""
    packed = pipe._pack_latents(noise, *noise.shape) if name in ("flux", "qwen_image") else noise
    packed = pipe._pack_latents(noise) if name == "ltx" else packed
    kwargs = dict(
        prompt=PROMPTS,
        num_inference_steps=steps,
        guidance_scale=guidance,
        latents=packed,
        output_type="latent",
        height=spec.height,
        width=spec.width,
        max_sequence_length=16,
    )
    if name in ("sd3", "wan", "wan22", "wan22_ti2v", "ltx"):
        kwargs["negative_prompt"] = [""] * len(PROMPTS)
    if name in ("wan", "wan22", "wan22_ti2v", "hunyuan_video", "ltx"):
        kwargs["num_frames"] = spec.num_frames
    if name == "qwen_image":  # true CFG against the model card's negative prompt
        kwargs.update(negative_prompt=[" "] * len(PROMPTS), true_cfg_scale=kwargs.pop("guidance_scale"))
    if name == "z_image":  # its guidance_scale w guides as pos + w (pos - neg): flowrl's scale w + 1
        kwargs.update(prompt=list(PROMPTS), negative_prompt=[""] * len(PROMPTS), guidance_scale=guidance - 1)
    out = pipe(**kwargs)
    latents = out.images if hasattr(out, "images") else out.frames
    if name == "flux":
        return pipe._unpack_latents(latents, spec.height, spec.width, pipe.vae_scale_factor)
    if name == "qwen_image":
        return pipe._unpack_latents(latents, spec.height, spec.width, pipe.vae_scale_factor)[:, :, 0]
    if name == "ltx":  # packed tokens back to [B, C, F, H, W]
        return pipe._unpack_latents(latents, *noise.shape[2:])
    if name == "flux2_dev":  # Flux2Pipeline hands back its packed tokens: row-major, patchified and normalised
        return latents.permute(0, 2, 1).reshape(len(PROMPTS), -1, spec.height // 4, spec.width // 4)
    if name == "flux2_klein":  # the pipeline hands back its latents un-normalised and unpatchified
        return (pipe._patchify_latents(latents) - _flux2_bn(pipe)[0]) / _flux2_bn(pipe)[1]
    return latents


def _random_images(side: int, seeds) -> list:
    """Random RGB PIL images of side x side pixels, one per seed (editors' sources, first frames)."""
    import numpy as np
    from PIL import Image

    return [Image.fromarray(np.random.default_rng(i).integers(0, 255, (side, side, 3), dtype=np.uint8)) for i in seeds]


def _flux2_bn(pipe):
    vae = pipe.vae
    return (
        vae.bn.running_mean.view(1, -1, 1, 1),
        torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps),
    )


@pytest.mark.parametrize("name", CASES)
def test_ode_rollout_reproduces_the_pipeline(name):
    make, spec, guidance = CASES[name]
    pipe = make()
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(spec)
    noise = torch.randn(len(PROMPTS), *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, guidance)
    traj = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, guidance, initial_noise=noise)
    torch.testing.assert_close(
        traj.final, _pipeline_latents(name, pipe, noise, 3, guidance, spec).float(), atol=1e-4, rtol=1e-4
    )
    decoded = policy.decode(traj.final)
    assert decoded.shape[:2] == (2, 3) and decoded.shape[-2:] == (spec.height, spec.width)
    assert 0 <= decoded.min() and decoded.max() <= 1


@pytest.mark.parametrize("name", CASES)
def test_sde_rollout_stores_trajectory_and_log_probs(name):
    make, spec, guidance = CASES[name]
    policy = policy_for(make(), max_sequence_length=16)
    shape = policy.noise_shape(spec)
    cond = policy.encode(PROMPTS, guidance)
    traj = rollout(policy, cond, sample_generators([5, 6]), shape, 4, "flow", 0.7, guidance)
    assert traj.latents.shape == (5, 2, *shape)
    assert traj.log_probs.shape == (4, 2) and torch.isfinite(traj.log_probs).all()
    again = rollout(policy, cond, sample_generators([5, 6]), shape, 4, "flow", 0.7, guidance)
    assert torch.equal(traj.latents, again.latents)  # per-sample generators make rollouts reproducible
    solo = rollout(policy, cond.select([1]), sample_generators([6]), shape, 4, "flow", 0.7, guidance)
    torch.testing.assert_close(solo.latents[:, 0], traj.latents[:, 1], atol=1e-4, rtol=1e-4)  # batch-invariant


@pytest.mark.parametrize("name", CASES)
def test_lora_trains_only_the_adapter_and_reference_is_the_base(name):
    make, spec, guidance = CASES[name]
    policy = policy_for(make(), max_sequence_length=16)
    shape = policy.noise_shape(spec)
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, guidance)
    sigma = 0.97 if name == "wan22" else 0.6  # Wan2.2 adapts its high-noise expert (above 0.95 here)
    assert_lora_trains_every_adapter_and_reference_is_base(policy, x, sigma, cond, guidance)


def test_cfg_combines_conditional_and_unconditional_velocity():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)))
    cond = policy.encode(PROMPTS, 3.0)
    text = policy.velocity(x, 0.5, policy.encode(PROMPTS, 1.0), 1.0)
    uncond = policy.velocity(x, 0.5, policy.encode(["", ""], 1.0), 1.0)
    torch.testing.assert_close(policy.velocity(x, 0.5, cond, 3.0), uncond + 3.0 * (text - uncond), atol=1e-5, rtol=1e-4)


def test_qwen_image_pads_prompts_without_changing_samples_and_decodes_as_the_pipeline():
    """Qwen-Image's prompt embeddings vary in length: each is padded (masked) to the run's text length so rows
    encoded apart stack, and a prompt sampled beside a longer one, or with more padding, gives what it gives alone;
    the decoded image is the pipeline's own from the same latents; the guided velocity is the pipeline's
    norm-rescaled true CFG, computed here in its packed layout."""
    pipe = tiny_qwen_image()
    policy = policy_for(pipe, max_sequence_length=16)
    spec = SampleSpec(32, 32)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 4.0)
    lengths = cond.tensors["mask"].sum(1).tolist()
    assert cond.tensors["embeds"].shape[1] == 16 and lengths[0] != lengths[1]  # "a red circle" is one word longer
    both = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "flow", 0.7, 4.0, initial_noise=noise)
    alone = rollout(
        policy,
        policy.encode(PROMPTS[1:], 4.0),
        sample_generators([2]),
        shape,
        3,
        "flow",
        0.7,
        4.0,
        initial_noise=noise[1:],
    )
    torch.testing.assert_close(alone.latents[:, 0], both.latents[:, 1], atol=1e-5, rtol=1e-5)
    # the columns `_forward` drops are masked padding: the transformer on all 16, with the mask, gives the same
    text_cond = policy.encode(PROMPTS, 1.0).tensors
    with torch.no_grad():
        trimmed = policy.velocity(noise, 0.6, policy.encode(PROMPTS, 1.0), 1.0)
        full = pipe.transformer(
            hidden_states=pipe._pack_latents(noise, *noise.shape),
            timestep=torch.full((2,), 0.6),
            encoder_hidden_states=text_cond["embeds"],
            encoder_hidden_states_mask=text_cond["mask"],
            img_shapes=[[(1, 2, 2)]] * 2,
            return_dict=False,
        )[0]
    torch.testing.assert_close(
        trimmed, pipe._unpack_latents(full, 32, 32, pipe.vae_scale_factor)[:, :, 0], atol=1e-5, rtol=1e-5
    )

    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    images = pipe(
        prompt=PROMPTS,
        negative_prompt=[" "] * 2,
        true_cfg_scale=4.0,
        num_inference_steps=3,
        latents=pipe._pack_latents(noise, *noise.shape),
        output_type="pt",
        height=32,
        width=32,
        max_sequence_length=16,
    ).images
    torch.testing.assert_close(policy.decode(ode.final), images, atol=1e-5, rtol=1e-5)

    x = noise
    text = policy.velocity(x, 0.5, policy.encode(PROMPTS, 1.0), 1.0)
    uncond = policy.velocity(x, 0.5, policy.encode([" ", " "], 1.0), 1.0)
    comb = pipe._pack_latents(uncond + 4.0 * (text - uncond), *x.shape)
    cond_packed = pipe._pack_latents(text, *x.shape)
    expected = comb * (cond_packed.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
    got = pipe._pack_latents(policy.velocity(x, 0.5, cond, 4.0), *x.shape)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, pipe._pack_latents(uncond + 4.0 * (text - uncond), *x.shape), atol=1e-3)


def test_z_image_decodes_as_the_pipeline_and_cuts_prompts_where_it_does():
    """Z-Image's images from flowrl's ODE latents are ZImagePipeline's own; a prompt longer than
    max_sequence_length (with the chat template) is cut where the pipeline cuts it, and stays masked to its length."""
    pipe = tiny_z_image()
    policy = policy_for(pipe, max_sequence_length=12)
    shape = policy.noise_shape(SampleSpec(32, 32))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    prompts = ["a red circle and a blue square and a green triangle", "a square"]
    cond = policy.encode(prompts, 3.0)
    assert cond.tensors["mask"].sum(1).tolist() == [12, 10]  # cut at 12; "a square" in the template: 10 tokens
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.0, initial_noise=noise)
    images = pipe(
        prompt=list(prompts),
        negative_prompt=[""] * 2,
        guidance_scale=2.0,
        num_inference_steps=3,
        latents=noise,
        output_type="pt",
        height=32,
        width=32,
        max_sequence_length=12,
    ).images
    torch.testing.assert_close(policy.decode(ode.final), images, atol=1e-5, rtol=1e-5)


# FLUX.2's variants: the pipeline, and the scale the pipeline is given for flowrl's 4.0 (klein's distilled models
# ignore it; dev takes it as its guidance embedding)
FLUX2 = {
    "base": (tiny_flux2_klein, 4.0),
    "distilled": (lambda: tiny_flux2_klein(distilled=True), 1.0),
    "dev": (tiny_flux2_dev, 4.0),
}


@pytest.mark.parametrize("variant", FLUX2)
def test_flux2_edits_with_a_reference_image_as_the_pipeline(variant):
    """pipeline.policy: Flux2KleinEdit (Flux2Edit for dev): each sample's source goes in as FLUX.2's first reference
    image (tokens after the sample's, time coordinate 10, both CFG branches); from the same noise the 3-step ODE at
    scale 4 decodes to the pipeline's own edits (64 px: the pipeline takes no smaller reference), the source changes
    the result, and every LoRA parameter gets a gradient."""

    from flowrl.tasks.base import Condition

    make, pipeline_scale = FLUX2[variant]
    pipe = make()
    policy = policy_for(pipe, "Flux2Edit" if variant == "dev" else "Flux2KleinEdit", max_sequence_length=16)
    spec = SampleSpec(64, 64)
    shape = policy.noise_shape(spec)
    sources = _random_images(64, (1, 2))
    items = [Condition(prompt, inputs={"source_image": source}) for prompt, source in zip(PROMPTS, sources)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(items, 4.0, spec)
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    images = torch.cat(
        [
            pipe(
                image=source,
                prompt=[prompt],
                guidance_scale=pipeline_scale,
                num_inference_steps=3,
                latents=noise[i : i + 1],
                output_type="pt",
                height=64,
                width=64,
                max_sequence_length=16,
            ).images
            for i, (prompt, source) in enumerate(zip(PROMPTS, sources))
        ]
    )
    torch.testing.assert_close(policy.decode(ode.final), images, atol=1e-5, rtol=1e-5)
    plain = policy_for(pipe, max_sequence_length=16)
    without = rollout(
        plain, plain.encode(PROMPTS, 4.0), sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise
    )
    assert (without.final - ode.final).abs().max() > 1e-2
    # a sample size off the 4-pixel patch grid (16 px on the released models): the source covers what the latents do
    odd = SampleSpec(66, 70)
    assert policy.encode(items, 4.0, odd).tensors["image_latents"].shape[2:] == policy.noise_shape(odd)
    assert_lora_trains_every_adapter_and_reference_is_base(policy, noise, 0.6, cond, 4.0)


@pytest.mark.parametrize("variant", ["base", "dev"])
def test_flux2_edits_with_several_reference_images_as_the_pipeline(variant):
    """A sample's images in a list (the source, then further references) go in in order (time coordinates 10, 20);
    a batch mixing two images and one gives each sample the pipeline's own edit from that list, and what it gives
    alone; a pipeline that takes one image names the prompt that gives two."""

    from tiny_pipelines import tiny_flux_kontext

    from flowrl.errors import UserError
    from flowrl.tasks.base import Condition

    make, pipeline_scale = FLUX2[variant]
    pipe = make()
    policy = policy_for(pipe, "Flux2Edit", max_sequence_length=16)
    spec = SampleSpec(64, 64)
    shape = policy.noise_shape(spec)
    images = _random_images(64, range(3))
    lists = [images[:2], images[2:]]
    items = [Condition(prompt, inputs={"source_image": given}) for prompt, given in zip(PROMPTS, lists)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(items, 4.0, spec)
    assert cond.tensors["reference_count"].tolist() == [2, 1]
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    expected = torch.cat(
        [
            pipe(
                image=given,
                prompt=[prompt],
                guidance_scale=pipeline_scale,
                num_inference_steps=3,
                latents=noise[i : i + 1],
                output_type="pt",
                height=64,
                width=64,
                max_sequence_length=16,
            ).images
            for i, (prompt, given) in enumerate(zip(PROMPTS, lists))
        ]
    )
    torch.testing.assert_close(policy.decode(ode.final), expected, atol=1e-5, rtol=1e-5)
    alone = rollout(
        policy,
        policy.encode(items[:1], 4.0, spec),
        sample_generators([1]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise[:1],
    )
    torch.testing.assert_close(alone.final, ode.final[:1], atol=1e-5, rtol=1e-5)
    first_only = rollout(
        policy,
        policy.encode([Condition(PROMPTS[0], inputs={"source_image": images[0]})], 4.0, spec),
        sample_generators([1]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise[:1],
    )
    assert (first_only.final - ode.final[:1]).abs().max() > 1e-3  # the second image counts
    assert_lora_trains_every_adapter_and_reference_is_base(policy, noise, 0.6, cond, 4.0)
    kontext = policy_for(tiny_flux_kontext(), max_sequence_length=16)
    with pytest.raises(
        UserError,
        match=r"prompt 'a red circle' gives 2 images; FluxKontextPipeline \(adapter "
        r"FluxKontextPolicy\) takes one",
    ):
        kontext.encode(items[:1], 3.5, SampleSpec(16, 16))


def test_skyreels_image_to_video_samples_as_the_pipeline_from_each_samples_first_frame(monkeypatch):
    """HunyuanSkyreelsImageToVideoPipeline: each sample's first frame (its latents, then zero frames, on the channel
    axis) in both branches of true CFG against "", the guidance embedding at the pipeline's 1.0; from the same noise
    the 3-step ODE at CFG 4 gives the pipeline's latents for each frame (the pipeline's VAE posterior draw set to
    its mode, flowrl's deterministic encoding); the frame changes the result; a prompt without a frame is one error;
    every LoRA parameter gets a gradient."""

    import diffusers.pipelines.hunyuan_video.pipeline_hunyuan_skyreels_image2video as skyreels

    from flowrl.errors import UserError
    from flowrl.tasks.base import Condition

    drawn = skyreels.retrieve_latents
    monkeypatch.setattr(
        skyreels, "retrieve_latents", lambda out, generator=None, sample_mode="sample": drawn(out, generator, "argmax")
    )
    pipe = tiny_hunyuan_video(skyreels_i2v=True)
    policy = policy_for(pipe, max_sequence_length=16)
    assert policy.default_spec() == SampleSpec(544, 960, 97)  # the SkyReels pipeline's defaults, not HunyuanVideo's
    spec = SampleSpec(32, 32, 5)
    shape = policy.noise_shape(spec)
    frames = _random_images(32, (1, 2))
    items = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(items, 4.0, spec)
    assert torch.equal(cond.negative["image_latents"], cond.tensors["image_latents"])
    assert "embeds" not in policy.encode(items, 1.0, spec).negative  # no CFG branch at scale 1
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    expected = torch.cat(
        [
            pipe(
                image=frame,
                prompt=[prompt],
                negative_prompt=[""],
                true_cfg_scale=4.0,
                num_inference_steps=3,
                latents=noise[i : i + 1],
                output_type="latent",
                height=32,
                width=32,
                num_frames=5,
                max_sequence_length=16,
            ).frames
            for i, (prompt, frame) in enumerate(zip(PROMPTS, frames))
        ]
    )
    torch.testing.assert_close(ode.final, expected, atol=1e-4, rtol=1e-4)
    swapped = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames[::-1])]
    other = rollout(
        policy,
        policy.encode(swapped, 4.0, spec),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise,
    )
    assert (other.final - ode.final).abs().max() > 1e-3
    with pytest.raises(UserError, match="an image-to-video pipeline needs one"):
        policy.encode(["a red circle"], 4.0, spec)
    assert_lora_trains_every_adapter_and_reference_is_base(policy, noise, 0.6, cond, 4.0)


def test_hunyuan_video_gives_its_transformer_the_time_in_fp32_under_bf16_weights(monkeypatch):
    """HunyuanVideoPipeline's latents are fp32, so its timestep is; flowrl's latents reach `_forward` in the weights'
    dtype, where bf16 would round 990.6 to 992."""
    policy = policy_for(tiny_hunyuan_video(), max_sequence_length=16)
    policy.transformer.to(torch.bfloat16)
    seen = []
    forward = policy.transformer.forward
    monkeypatch.setattr(policy.transformer, "forward", lambda **kw: seen.append(kw["timestep"]) or forward(**kw))
    x = torch.randn(1, *policy.noise_shape(SampleSpec(32, 32, 5)), generator=torch.Generator().manual_seed(0))
    policy.velocity(x, 0.9905664, policy.encode(PROMPTS[:1], 6.0), 6.0)
    assert seen[0].dtype == torch.float32 and abs(float(seen[0][0]) - 990.5664) < 1e-3


def test_z_image_gives_its_transformer_the_time_in_fp32_under_bf16_weights(monkeypatch):
    """ZImagePipeline's latents are fp32, so its transformer sees 1 - sigma in fp32; in bf16 it would be rounded by up
    to 2 of its 1000 time units."""
    policy = policy_for(tiny_z_image(), max_sequence_length=16)
    policy.transformer.to(torch.bfloat16)
    seen = []
    forward = policy.transformer.forward
    monkeypatch.setattr(
        policy.transformer, "forward", lambda x, t, cap, **kw: seen.append(t) or forward(x, t, cap, **kw)
    )
    x = torch.randn(1, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(0))
    policy.velocity(x, 0.3, policy.encode(PROMPTS[:1], 1.0), 1.0)
    assert seen[0].dtype == torch.float32 and abs(float(seen[0][0]) - 0.7) < 1e-7


@pytest.mark.parametrize("variant", FLUX2)
def test_flux2_decodes_as_the_pipeline_and_only_klein_base_takes_cfg(variant):
    """FLUX.2: flowrl's latents (patchified, batch-norm normalised) decode to the pipeline's images; only klein's base
    models take a CFG branch: a distilled klein model takes none whatever the scale (as the pipeline: its images at
    scale 1), nor does dev, whose scale is its guidance embedding (another scale, other images)."""
    make, pipeline_scale = FLUX2[variant]
    pipe = make()
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(SampleSpec(32, 32))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 4.0)
    assert bool(cond.negative) is (variant == "base")  # (the pipeline guides against "" itself)
    assert policy.default_spec() == SampleSpec(128 * pipe.vae_scale_factor, 128 * pipe.vae_scale_factor)
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    images = pipe(
        prompt=list(PROMPTS),
        guidance_scale=pipeline_scale,
        num_inference_steps=3,
        latents=noise,
        output_type="pt",
        height=32,
        width=32,
        max_sequence_length=16,
    ).images
    torch.testing.assert_close(policy.decode(ode.final), images, atol=1e-5, rtol=1e-5)
    if variant == "dev":
        other = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 2.0, initial_noise=noise)
        assert (other.final - ode.final).abs().max() > 1e-3


def test_ltx_decodes_its_videos_as_the_pipeline():
    """LTX-Video: flowrl's decoded ODE videos (per-channel statistics undone) are LTXPipeline's own (the latents are
    checked with every family above)."""
    pipe = tiny_ltx()
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(SampleSpec(32, 32, 9))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    ode = rollout(
        policy, policy.encode(PROMPTS, 3.0), sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.0, initial_noise=noise
    )
    video = pipe(
        prompt=PROMPTS,
        negative_prompt=[""] * 2,
        guidance_scale=3.0,
        num_inference_steps=3,
        latents=pipe._pack_latents(noise),
        output_type="pt",
        height=32,
        width=32,
        num_frames=9,
        max_sequence_length=16,
    ).frames
    torch.testing.assert_close(policy.decode(ode.final), video.permute(0, 2, 1, 3, 4), atol=1e-5, rtol=1e-5)


def test_ltx_image_to_video_holds_each_samples_first_frame_as_the_pipeline():
    """LTXImageToVideoPipeline: each sample's frame (VAE mode, normalised) is the first latent frame, at time 0 on its
    tokens, in both CFG branches; from the same noise (the pipeline's latents given with that frame in place, as it
    mixes them) the 3-step ODE gives the pipeline's latents; an SDE rollout ends every step on the frame and its
    stored steps score as drawn; another frame changes the rest; every LoRA parameter gets a gradient."""
    from diffusers import LTXImageToVideoPipeline

    from flowrl.tasks.base import Condition

    pipe = LTXImageToVideoPipeline(**tiny_ltx().components)
    pipe.set_progress_bar_config(disable=True)
    policy = policy_for(pipe, max_sequence_length=16)
    spec = SampleSpec(32, 32, 9)
    shape = policy.noise_shape(spec)
    frames = _random_images(32, (1, 2))
    items = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames)]
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(items, 3.0, spec)
    first = cond.tensors["condition"][:, :, 0]
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 3.0, initial_noise=noise)
    given = noise.clone()
    given[:, :, 0] = first
    out = pipe(
        image=frames,
        prompt=PROMPTS,
        negative_prompt=[""] * 2,
        guidance_scale=3.0,
        num_inference_steps=3,
        latents=pipe._pack_latents(given),
        output_type="latent",
        height=32,
        width=32,
        num_frames=9,
        max_sequence_length=16,
    ).frames
    torch.testing.assert_close(ode.final, pipe._unpack_latents(out, *shape[1:]), atol=1e-4, rtol=1e-4)
    sde = rollout(policy, cond, sample_generators([3, 4]), shape, 3, "flow", 0.7, 3.0)
    assert all(torch.equal(sde.latents[i + 1][:, :, 0], first) for i in range(3))
    for i in range(3):  # a stored step scores as drawn: GRPO's first ratio is 1
        rescored = policy.step(
            "flow", sde.latents[i], sde.sigmas[i], sde.sigmas[i + 1], cond, 3.0, 0.7, prev_sample=sde.latents[i + 1]
        )[3]
        torch.testing.assert_close(rescored, sde.log_probs[i], atol=1e-4, rtol=1e-5)
    swapped = [Condition(prompt, inputs={"source_image": frame}) for prompt, frame in zip(PROMPTS, frames[::-1])]
    other = rollout(
        policy,
        policy.encode(swapped, 3.0, spec),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        3.0,
        initial_noise=noise,
    )
    assert (other.final[:, :, 1:] - ode.final[:, :, 1:]).abs().max() > 1e-3
    assert_lora_trains_every_adapter_and_reference_is_base(policy, noise, 0.6, cond, 3.0)
    # an LTX-Video folder names LTXPipeline: `pipeline.policy: LTXImageToVideoPipeline` makes it the same adapter
    chosen = policy_for(tiny_ltx(), "LTXImageToVideoPipeline", max_sequence_length=16)
    again = rollout(
        chosen,
        chosen.encode(items, 3.0, spec),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        3.0,
        initial_noise=noise,
    )
    torch.testing.assert_close(again.final, ode.final, rtol=0, atol=0)


def test_first_frames_are_encoded_untiled_when_decoding_tiles():
    """pipeline.vae_tiling tiles decoding; a first frame is encoded whole, as the pipelines encode it (tiled, the tiny
    LTX VAE's latents of a 64 px frame in 32 px tiles move by 0.42)."""

    from flowrl.tasks.base import Condition

    pipe = tiny_ltx()
    policy = policy_for(pipe, "LTXImageToVideoPipeline", max_sequence_length=16)
    spec = SampleSpec(64, 64, 9)
    (frame,) = _random_images(64, (1,))
    items = [Condition("a red circle", inputs={"source_image": frame})]
    whole = policy.encode(items, 1.0, spec).tensors["condition"]
    pipe.vae.enable_tiling(
        tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16, tile_sample_stride_width=16
    )
    torch.testing.assert_close(policy.encode(items, 1.0, spec).tensors["condition"], whole, rtol=0, atol=0)
    assert pipe.vae.use_tiling  # and decoding still tiles


def test_hunyuan_video_decodes_as_the_pipeline_and_takes_its_scale_as_an_embedding():
    """HunyuanVideo: flowrl's decoded ODE videos are the pipeline's own (the latents are checked with every family
    above); the guidance scale goes in as an embedding (another scale, other videos; no CFG branch), and the prompt
    is what the Llama reads after the template's crop (another prompt, other embeddings)."""
    pipe = tiny_hunyuan_video()
    policy = policy_for(pipe, max_sequence_length=16)
    spec = SampleSpec(32, 32, 5)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 6.0)
    assert not cond.negative and cond.tensors["mask"].sum(1).tolist() == [4, 3]  # the prompt's words and <|eot_id|>
    ode = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 6.0, initial_noise=noise)
    video = pipe(
        prompt=PROMPTS,
        num_inference_steps=3,
        guidance_scale=6.0,
        latents=noise,
        output_type="pt",
        height=32,
        width=32,
        num_frames=5,
        max_sequence_length=16,
    ).frames
    torch.testing.assert_close(policy.decode(ode.final), video.permute(0, 2, 1, 3, 4), atol=1e-5, rtol=1e-5)
    other = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 2.0, initial_noise=noise)
    assert (other.final - ode.final).abs().max() > 1e-3
    assert policy.fps == 24  # HunyuanVideo's reference sampler saves its clips at 24 frames a second


def test_pipeline_shift_samples_as_the_pipeline_with_that_shift_and_is_refused_where_it_cannot_apply():
    """pipeline.shift replaces the folder's: HunyuanVideo at DanceGRPO's 5 samples as the pipeline whose scheduler
    says 5 (and not as at the folder's 7); a size-shifted schedule (FLUX) and DDIM (SD) name the setting."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from real_layouts import flux_dev
    from tiny_pipelines import tiny_shapes_sd

    from flowrl.policies.base import SampleSpec as Spec

    pipe = tiny_hunyuan_video()
    policy = policy_for(pipe, max_sequence_length=16)
    spec = Spec(32, 32, 5)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 6.0)
    at_seven = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 6.0, initial_noise=noise)
    policy.set_shift(5.0, "pipeline.shift")
    at_five = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 6.0, initial_noise=noise)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config, shift=5.0)
    torch.testing.assert_close(
        at_five.final, _pipeline_latents("hunyuan_video", pipe, noise, 3, 6.0, spec).float(), atol=1e-4, rtol=1e-4
    )
    assert (at_five.final - at_seven.final).abs().max() > 1e-3
    with pytest.raises(ConfigError, match=r"--shift: FluxPipeline's scheduler shifts its schedule by the sample size"):
        policy_for(flux_dev(), max_sequence_length=16).set_shift(3.0, "--shift")  # FLUX-dev's dynamic shifting
    with pytest.raises(
        ConfigError,
        match=r"pipeline.shift: StableDiffusionPipeline samples with DDIMScheduler, "
        "which takes no shift",
    ):
        policy_for(tiny_shapes_sd(), max_sequence_length=16).set_shift(3.0, "pipeline.shift")


def test_wan22_ti2v_decodes_its_videos_as_the_pipeline():
    """Wan2.2-TI2V-5B's VAE (48 channels, 16x with a 2x2 patchify): flowrl's decoded ODE videos are WanPipeline's
    own (the latents are checked with every family above)."""
    pipe = tiny_wan22_ti2v()
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(SampleSpec(32, 32, 9))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    ode = rollout(
        policy, policy.encode(PROMPTS, 5.0), sample_generators([1, 2]), shape, 3, "ode", 0.0, 5.0, initial_noise=noise
    )
    video = pipe(
        prompt=PROMPTS,
        negative_prompt=[""] * 2,
        num_inference_steps=3,
        guidance_scale=5.0,
        latents=noise,
        output_type="pt",
        height=32,
        width=32,
        num_frames=9,
        max_sequence_length=16,
    ).frames
    torch.testing.assert_close(policy.decode(ode.final).permute(0, 2, 1, 3, 4), video, atol=1e-5, rtol=1e-5)
    # its clips play at 24 frames a second (the A14B experts' and Wan2.1's at 16)
    assert policy.fps == 24 and policy_for(tiny_wan22(), max_sequence_length=16).fps == 16


def test_a_frame_count_the_video_vae_cannot_take_is_one_error():
    """Wan's causal VAE takes 1 + 4k frames: 8 would have come out as a 5-frame clip (and been recorded as 8)."""
    from flowrl.errors import UserError

    policy = policy_for(tiny_wan22_ti2v(), max_sequence_length=16)
    with pytest.raises(UserError, match=r"num_frames .*: 8 frames; WanPipeline's VAE takes 1 \+ 4 k frames: 5 or 9"):
        policy.noise_shape(SampleSpec(32, 32, num_frames=8))
    assert policy.noise_shape(SampleSpec(32, 32, num_frames=9))[1] == 3


@pytest.mark.parametrize(
    "make", [tiny_shapes_sd3, tiny_flux, tiny_wan, tiny_ltx, tiny_hunyuan_video, tiny_qwen_image, tiny_flux2_klein]
)
def test_a_size_the_pipeline_cannot_draw_exactly_is_one_error_naming_the_setting(make):
    """A side that is a multiple of size_multiple decodes to exactly that size; any other is refused up front (the
    pipelines would round it down, and FLUX Kontext's source would not pack)."""
    from flowrl.errors import UserError

    policy = policy_for(make(), max_sequence_length=16)
    step = policy.size_multiple
    spec = policy.sample_spec(3 * step, 2 * step, 9 if policy.modality == "video" else None)
    shape = policy.noise_shape(spec)
    sample = policy.decode(torch.zeros(1, *shape))
    assert tuple(sample.shape[-2:]) == (3 * step, 2 * step)
    with pytest.raises(UserError, match=rf"pipeline.width: {2 * step + 1} pixels; .* needs a multiple of {step}"):
        policy.sample_spec(3 * step, 2 * step + 1, spec.num_frames)
    with pytest.raises(UserError, match=rf"--height: {3 * step - 1} pixels"):
        policy.sample_spec(3 * step - 1, None, spec.num_frames, ("--height", "--width"))


def test_wan22_steps_high_noise_with_the_trained_expert_and_low_noise_with_the_frozen_one():
    """Per sample, as WanPipeline splits its steps: t >= boundary_ratio x 1000 goes to `transformer` (the one the
    LoRA adapts), below to `transformer_2`, which stays frozen; a batch mixing both equals each sample alone."""
    pipe = tiny_wan22()
    policy = policy_for(pipe, max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    assert not any(p.requires_grad for p in pipe.transformer_2.parameters())
    x = torch.randn(2, *policy.noise_shape(SampleSpec(16, 16, 9)), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(PROMPTS, 1.0)
    sigma = torch.tensor([0.5, 0.97])  # one sample on each side of 0.95, the low-noise one first
    mixed = policy.velocity(x, sigma, cond, 1.0)
    embeds = cond.tensors["embeds"]
    with torch.no_grad():
        low = pipe.transformer_2(
            hidden_states=x[:1], timestep=sigma[:1] * 1000, encoder_hidden_states=embeds[:1], return_dict=False
        )[0]
        high = pipe.transformer(
            hidden_states=x[1:], timestep=sigma[1:] * 1000, encoder_hidden_states=embeds[1:], return_dict=False
        )[0]
    torch.testing.assert_close(mixed, torch.cat([low, high]), atol=1e-5, rtol=1e-5)
    mixed[0].sum().backward()  # the low-noise sample reaches no trainable weight
    assert all(p.grad is None or not p.grad.any() for p in policy.trainable_parameters())
    policy.velocity(x, sigma, cond, 1.0)[1].sum().backward()
    assert all(p.grad is not None and p.grad.any() for p in policy.trainable_parameters())


def test_wan22_guides_its_low_noise_expert_with_the_second_scale_as_the_pipeline():
    """pipeline.guidance_scale_2 / --guidance-2: WanPipeline's guidance_scale_2, the CFG scale wherever the low-noise
    expert acts; from the same noise the ODE gives the pipeline's latents, and differs from one scale for both. A
    pipeline without two experts refuses a second scale, naming the setting."""
    pipe = tiny_wan22()
    policy = policy_for(pipe, max_sequence_length=16)
    policy.set_guidance_scale_2(2.0, "pipeline.guidance_scale_2")
    spec = SampleSpec(16, 16, num_frames=9)
    shape = policy.noise_shape(spec)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    traj = rollout(
        policy, policy.encode(PROMPTS, 5.0), sample_generators([1, 2]), shape, 4, "ode", 0.0, 5.0, initial_noise=noise
    )
    expected = pipe(
        prompt=PROMPTS,
        negative_prompt=[""] * 2,
        num_inference_steps=4,
        guidance_scale=5.0,
        guidance_scale_2=2.0,
        latents=noise,
        output_type="latent",
        height=16,
        width=16,
        num_frames=9,
        max_sequence_length=16,
    ).frames
    torch.testing.assert_close(traj.final, expected.float(), atol=1e-4, rtol=1e-4)
    one_scale = _pipeline_latents("wan22", pipe, noise, 4, 5.0, spec).float()
    assert (one_scale - expected).abs().max() > 1e-2
    with pytest.raises(ConfigError, match="pipeline.guidance_scale_2: only a Wan2.2 pipeline with two experts"):
        policy_for(tiny_wan(), max_sequence_length=16).set_guidance_scale_2(2.0, "pipeline.guidance_scale_2")
    with pytest.raises(ConfigError, match="--guidance-2: only a Wan2.2 pipeline"):
        policy_for(tiny_shapes_sd3(), max_sequence_length=16).set_guidance_scale_2(2.0, "--guidance-2")


def test_unknown_pipeline_class_is_named():
    with pytest.raises(ConfigError, match="unknown policy 'object'"):
        policy_for(object())


def test_condition_inputs_travel_through_encode_and_follow_selection():
    """Per-sample inputs (here a stand-in source image) enter the conditioning through `encode_inputs` and stay
    aligned with their items under selection (what FK re-indexing and microbatching do)."""
    from flowrl.policies.sd3 import SD3Policy
    from flowrl.tasks import Condition

    class SourcePolicy(SD3Policy):
        def encode_inputs(self, cond, items, spec=None):
            cond.tensors["source"] = torch.stack([torch.as_tensor(item.inputs["source"]) for item in items])
            return cond

    policy = SourcePolicy(tiny_shapes_sd3(), max_sequence_length=16)
    items = [Condition("a red circle", inputs={"source": torch.full((2,), float(i))}, meta={"id": i}) for i in range(3)]
    cond = policy.encode(items, 1.0)
    assert cond.prompts == ["a red circle"] * 3 and cond.items == items
    picked = cond.select([2, 0])
    assert picked.tensors["source"][:, 0].tolist() == [2.0, 0.0]
    assert [item.meta["id"] for item in picked.items] == [2, 0]


def test_shipped_schedulers_are_switched_to_the_sampler_flowrl_steps_with_a_note(caplog):
    """SD 1.5 ships PNDM, whose 4-step schedule repeats t = 501; flowrl samples DDIM on the same config (no repeat).
    Wan2.1 ships UniPC with flow sigmas; flowrl steps flow-match Euler with the same shift. Both say so."""
    import logging

    from diffusers import FlowMatchEulerDiscreteScheduler, PNDMScheduler, UniPCMultistepScheduler
    from tiny_pipelines import tiny_shapes_sd

    sd15 = dict(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
    )
    pndm = PNDMScheduler(**sd15)
    pndm.set_timesteps(4)
    assert pndm.timesteps.tolist() == [751, 501, 501, 251, 1]  # what sampling with the shipped scheduler would do
    pipe = tiny_shapes_sd()
    pipe.scheduler = PNDMScheduler(**sd15)
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        policy = policy_for(pipe)
    assert policy.sigmas(4).tolist() == [751.0, 501.0, 251.0, 1.0, -1.0]
    assert "PNDMScheduler" in caplog.text and "DDIMScheduler" in caplog.text

    wan = tiny_wan()
    wan.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flowrl"):
        policy = policy_for(wan, max_sequence_length=16)
    assert "UniPCMultistepScheduler" in caplog.text
    euler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    euler.set_timesteps(6)
    torch.testing.assert_close(policy.sigmas(6), euler.sigmas.float())


def test_a_gated_lora_acts_only_from_its_noise_level_and_per_sample():
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    x = torch.randn(2, *policy.noise_shape(SampleSpec(32, 32)), generator=torch.Generator().manual_seed(1))
    cond = policy.encode(PROMPTS, 4.0)
    policy.add_lora(4, 8, policy.lora_targets)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    sigmas = torch.tensor([0.8, 0.3])
    tuned = policy.velocity(x, sigmas, cond, 4.0)
    with policy.reference():
        base = policy.velocity(x, sigmas, cond, 4.0)
    policy.lora_active_from_sigma = 0.5
    gated = policy.velocity(x, sigmas, cond, 4.0)
    torch.testing.assert_close(gated[0], tuned[0])  # sigma 0.8 >= 0.5: the LoRA acts
    torch.testing.assert_close(gated[1], base[1])  # sigma 0.3: the base network's output
    assert not torch.allclose(tuned[1], base[1])
    with policy.reference():  # nested: the gate's own reference pass must not switch the adapter back on
        torch.testing.assert_close(policy.velocity(x, sigmas, cond, 4.0), base)
    torch.testing.assert_close(policy.velocity(x, 0.8, cond, 4.0)[0], tuned[0])


def test_a_checkpoint_brings_back_its_lora_gate(tmp_path):
    from flowrl.checkpoint import load_trained_weights, save_checkpoint
    from flowrl.policies import load_pipeline

    tiny_shapes_sd3().save_pretrained(tmp_path / "pipe")
    tuned = policy_for(load_pipeline(tmp_path / "pipe"), max_sequence_length=16)
    tuned.add_lora(4, 8, tuned.lora_targets)
    adapter = {"rank": 4, "alpha": 8, "target_modules": tuned.lora_targets, "active_from_sigma": 0.5}
    checkpoint = save_checkpoint(tmp_path / "run", 1, tuned.trainable_state_dict(), {}, None, adapter)
    loaded = policy_for(load_pipeline(tmp_path / "pipe"), max_sequence_length=16)
    load_trained_weights(loaded, checkpoint)
    assert loaded.has_lora and loaded.lora_active_from_sigma == 0.5
    # a sampling-only gate (lora.sample_from_sigma) is what a trained checkpoint is drawn with
    sampled = save_checkpoint(
        tmp_path / "run",
        2,
        tuned.trainable_state_dict(),
        {},
        None,
        {**adapter, "active_from_sigma": None, "sample_from_sigma": 0.6},
    )
    loaded = policy_for(load_pipeline(tmp_path / "pipe"), max_sequence_length=16)
    load_trained_weights(loaded, sampled)
    assert loaded.lora_active_from_sigma == 0.6


def test_the_runs_evaluation_samples_with_the_sampling_gate_and_training_keeps_its_own(monkeypatch):
    from types import SimpleNamespace

    import flowrl.experiment as experiment
    from flowrl.config import EvalSection, LoraSection, MemorySection, RuntimeSection
    from flowrl.sample_io import ImageSamples
    from flowrl.tasks.base import build_task

    policy = SimpleNamespace(lora_active_from_sigma=None, lora_targets=["attn.to_q"])
    seen = []

    def fake_generate(sampled_policy, conditions, num_per_prompt, *args, **kwargs):
        seen.append(sampled_policy.lora_active_from_sigma)
        return ImageSamples(torch.zeros(len(conditions) * num_per_prompt, 3, 32, 32)), []

    monkeypatch.setattr(experiment, "generate_samples", fake_generate)
    trainer = SimpleNamespace(
        policy=policy,
        spec=None,
        eval_spec=None,
        task=build_task("shapes"),
        rank=0,
        world=1,
        is_main=True,
        accelerator=SimpleNamespace(autocast=contextlib.nullcontext),
        config=SimpleNamespace(
            eval=EvalSection(num_per_prompt=1),
            memory=MemorySection(),
            runtime=RuntimeSection(),
            lora=LoraSection(sample_from_sigma=0.6),
        ),
    )
    experiment.evaluate(trainer, None)
    assert seen == [0.6] and policy.lora_active_from_sigma is None  # the rollouts' gate is back after the eval
    trainer.config.lora = LoraSection(active_from_sigma=0.5)
    policy.lora_active_from_sigma = 0.5
    experiment.evaluate(trainer, None)
    assert seen[-1] == 0.5 and policy.lora_active_from_sigma == 0.5


def test_a_sharing_copy_shares_frozen_weights_and_owns_its_adapter():
    """The asynchronous rollout worker's policy: the same frozen tensors as the learner's (no second model in memory),
    its own LoRA, so loading a snapshot into it leaves the learner's outputs alone; one encoding lock for both."""
    policy = policy_for(tiny_shapes_sd3(), max_sequence_length=16)
    policy.add_lora(4, 8, policy.lora_targets)
    policy.set_memory_options(offload_text_encoders=True, embedding_cache=False)
    copy = policy.sharing_copy()
    learner, worker = dict(policy.transformer.named_parameters()), dict(copy.transformer.named_parameters())
    assert learner.keys() == worker.keys()
    frozen = [name for name, p in learner.items() if not p.requires_grad]
    adapter = [name for name, p in learner.items() if p.requires_grad]
    assert frozen and adapter and all(learner[n] is worker[n] for n in frozen)
    assert all(learner[n].data_ptr() != worker[n].data_ptr() for n in adapter)
    assert all(a is b for a, b in zip(policy.pipeline.vae.parameters(), copy.pipeline.vae.parameters()))
    assert all(a is b for a, b in zip(policy.text_encoders()[0].parameters(), copy.text_encoders()[0].parameters()))

    x = torch.randn(2, *policy.noise_shape(policy.default_spec()), generator=torch.Generator().manual_seed(0))
    prompts = ["a red circle", "two squares"]
    with torch.no_grad():
        before = policy.velocity(x, 0.6, policy.encode(prompts, 2.0), 2.0)
        for name in adapter:
            worker[name].data.normal_(0, 0.5)  # a snapshot of other weights in the worker only
        assert torch.equal(policy.velocity(x, 0.6, policy.encode(prompts, 2.0), 2.0), before)
        assert not torch.allclose(copy.velocity(x, 0.6, copy.encode(prompts, 2.0), 2.0), before)
    # offloading moves the shared text encoders between devices (a no-op on this CPU machine): one lock for both
    assert copy._encode_lock is policy._encode_lock


def test_sd3_with_dynamic_shifting_takes_its_schedulers_bounds_as_the_pipeline_does():
    """StableDiffusion3Pipeline computes mu from the scheduler config's sequence lengths and shifts (max_shift
    defaulting to 1.16): a folder with its own bounds samples on the pipeline's sigmas."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = tiny_shapes_sd3()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_image_seq_len=16, max_image_seq_len=256, base_shift=0.2, max_shift=2.5
    )
    policy = policy_for(pipe, max_sequence_length=16)
    shape = policy.noise_shape(SampleSpec(32, 32))
    pipe(
        prompt=["a red circle"],
        num_inference_steps=4,
        guidance_scale=1.0,
        height=32,
        width=32,
        output_type="latent",
        max_sequence_length=16,
    )
    torch.testing.assert_close(policy.sigmas(4, shape)[:4].float(), pipe.scheduler.sigmas[:4].float())
