"""Qwen-Image-Edit (QwenImageEditPipeline) and its Plus pipeline (-2509 / -2511, here with -2511's zero_cond_t) as
policies, on tiny random offline instances of the real diffusers and transformers classes."""

import numpy as np
import pytest
import torch
from PIL import Image
from policy_checks import assert_lora_trains_every_adapter_and_reference_is_base
from tiny_pipelines import tiny_qwen_image_edit

from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.tasks.base import Condition

SPEC = SampleSpec(32, 32)
INSTRUCTIONS = ["make the red circle blue", "remove the square"]


def _source(seed: int, size=(32, 32)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8))


@pytest.fixture
def keep_sources_small(monkeypatch):
    """The pipelines bring every source to about 1024x1024 pixels (the Plus pipeline's reader to 384x384): here
    both keep the source's own size, on the pipelines' and on flowrl's side alike, so tiny models stay tiny."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: (32, 32, None))
    monkeypatch.setattr(plus, "calculate_dimensions", lambda area, ratio: (32, 32))


def _pipeline_latents(pipe, source, instruction, noise, guidance):
    out = pipe(
        image=source,
        prompt=instruction,
        negative_prompt=" ",
        true_cfg_scale=guidance,
        num_inference_steps=3,
        latents=pipe._pack_latents(noise, *noise.shape),
        output_type="latent",
        height=32,
        width=32,
    ).images
    return pipe._unpack_latents(out, 32, 32, pipe.vae_scale_factor)[:, :, 0]


@pytest.mark.parametrize("plus", [False, True], ids=["edit", "edit_plus_2511"])
def test_ode_rollout_reproduces_the_edit_pipeline(plus, keep_sources_small):
    """From the same noise, source and instruction, flowrl's 3-step ODE at true CFG 4 gives the pipeline's latents:
    the instruction read with its source, the source's latents after the sample's tokens (with -2511's zero_cond_t
    marking them), the norm-rescaled CFG against " " read with the same source. Two edits in one batch, each as
    the pipeline makes it alone."""
    pipe = tiny_qwen_image_edit(plus=plus)
    policy = policy_for(pipe)
    shape = policy.noise_shape(SPEC)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    sources = [_source(1), _source(2)]
    items = [Condition(text, inputs={"source_image": source}) for text, source in zip(INSTRUCTIONS, sources)]
    traj = rollout(
        policy,
        policy.encode(items, 4.0, SPEC),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise,
    )
    expected = torch.cat(
        [
            _pipeline_latents(pipe, source, text, noise[i : i + 1], 4.0)
            for i, (text, source) in enumerate(zip(INSTRUCTIONS, sources))
        ]
    )
    torch.testing.assert_close(traj.final, expected, atol=1e-4, rtol=1e-4)
    assert (traj.final[0] - traj.final[1]).abs().max() > 1e-3


def test_the_plus_pipeline_edits_with_several_images_as_the_pipeline(keep_sources_small, monkeypatch):
    """-2511 with a list of images (the source, then a reference): the instruction is read as one multi-image prompt
    ("Picture 1: ... Picture 2: ..."), each image's latents follow the sample's tokens in order; from the same noise
    a batch mixing a two-image and a one-image edit gives the pipeline's latents for each (its `image=[a, b]`), the
    second image changes the result, and the edit with two images is read once; Qwen-Image-Edit (one image) names
    a prompt that gives two."""
    from flowrl.errors import UserError

    pipe = tiny_qwen_image_edit(plus=True)
    policy = policy_for(pipe)
    shape = policy.noise_shape(SPEC)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    lists = [[_source(1), _source(3)], [_source(2)]]
    items = [Condition(text, inputs={"source_image": given}) for text, given in zip(INSTRUCTIONS, lists)]
    reads = []
    original = pipe.encode_prompt
    monkeypatch.setattr(
        pipe,
        "encode_prompt",
        lambda prompt, image=None, **kw: (
            reads.append((prompt[0], len(image) if isinstance(image, list) else 1))
            or original(prompt, image=image, **kw)
        ),
    )
    cond = policy.encode(items, 4.0, SPEC)
    assert sorted(reads) == sorted([(INSTRUCTIONS[0], 2), (" ", 2), (INSTRUCTIONS[1], 1), (" ", 1)])
    assert cond.tensors["reference_count"].tolist() == [2, 1]
    traj = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    expected = torch.cat(
        [
            _pipeline_latents(pipe, given, text, noise[i : i + 1], 4.0)
            for i, (text, given) in enumerate(zip(INSTRUCTIONS, lists))
        ]
    )
    torch.testing.assert_close(traj.final, expected, atol=1e-4, rtol=1e-4)
    first_only = rollout(
        policy,
        policy.encode([Condition(INSTRUCTIONS[0], inputs={"source_image": lists[0][0]})], 4.0, SPEC),
        sample_generators([1]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise[:1],
    )
    assert (first_only.final - traj.final[:1]).abs().max() > 1e-3
    with pytest.raises(
        UserError,
        match=r"gives 2 images; QwenImageEditPipeline \(adapter QwenImageEditPolicy\) "
        r"takes one",
    ):
        policy_for(tiny_qwen_image_edit()).encode(items[:1], 4.0, SPEC)


def test_instructions_are_read_with_their_sources_once_per_pair(keep_sources_small, monkeypatch):
    """The embeddings depend on the source (Qwen2.5-VL reads it); a group's copies of one edit are read once (and
    " " once per source); the embedding cache keys on instruction and source, so a second call reads nothing and
    a new source with a known instruction is read anew; an edit sampled beside a longer one gives what it gives
    alone (padding is masked)."""
    pipe = tiny_qwen_image_edit(plus=True)
    policy = policy_for(pipe)
    reads = []
    original = pipe.encode_prompt
    monkeypatch.setattr(pipe, "encode_prompt", lambda prompt, **kw: reads.append(prompt) or original(prompt, **kw))
    a, b = _source(1), _source(2)
    group = [Condition(INSTRUCTIONS[0], inputs={"source_image": a})] * 3 + [
        Condition(INSTRUCTIONS[1], inputs={"source_image": b})
    ]
    cond = policy.encode(group, 4.0, SPEC)
    assert sorted(map(tuple, reads)) == sorted([(INSTRUCTIONS[0],), (INSTRUCTIONS[1],), (" ",), (" ",)])
    assert torch.equal(cond.tensors["embeds"][0], cond.tensors["embeds"][2])
    latents = cond.tensors["image_latents"]  # one VAE encoding per distinct source, mapped back to every sample
    assert torch.equal(latents[0], latents[2]) and not torch.allclose(latents[0], latents[3])
    assert torch.equal(cond.negative["image_latents"], latents)
    other = policy.encode([Condition(INSTRUCTIONS[0], inputs={"source_image": b})], 1.0, SPEC)
    length = int(other.tensors["mask"].sum())
    assert (other.tensors["embeds"][0, :length] - cond.tensors["embeds"][0, :length]).abs().max() > 1e-4

    policy.set_memory_options(embedding_cache=True)
    reads.clear()
    first = policy.encode(group, 4.0, SPEC)
    assert len(reads) == 4
    reads.clear()
    again = policy.encode(group, 4.0, SPEC)
    assert reads == [] and torch.equal(again.tensors["embeds"], first.tensors["embeds"])
    policy.encode([Condition(INSTRUCTIONS[0], inputs={"source_image": b})], 4.0, SPEC)
    assert reads == [[INSTRUCTIONS[0]]]  # " " with source b is cached; this pair is new

    shape = policy.noise_shape(SPEC)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    pair = policy.encode(group[2:], 4.0, SPEC)
    both = rollout(policy, pair, sample_generators([1, 2]), shape, 3, "flow", 0.7, 4.0, initial_noise=noise)
    alone = rollout(
        policy,
        policy.encode(group[:1], 4.0, SPEC),
        sample_generators([1]),
        shape,
        3,
        "flow",
        0.7,
        4.0,
        initial_noise=noise[:1],
    )
    assert pair.tensors["mask"][0].sum() != pair.tensors["mask"][1].sum()
    torch.testing.assert_close(alone.latents[:, 0], both.latents[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("plus", [False, True], ids=["edit", "edit_plus_2511"])
def test_the_edit_lora_trains_every_adapter_and_its_reference_is_the_base(plus, keep_sources_small):
    policy = policy_for(tiny_qwen_image_edit(plus=plus))
    x = torch.randn(2, *policy.noise_shape(SPEC), generator=torch.Generator().manual_seed(0))
    cond = policy.encode(
        [Condition(text, inputs={"source_image": _source(i)}) for i, text in enumerate(INSTRUCTIONS)], 4.0, SPEC
    )
    assert_lora_trains_every_adapter_and_reference_is_base(policy, x, 0.6, cond, 4.0)


@pytest.mark.parametrize("plus", [False, True], ids=["edit", "edit_plus_2511"])
def test_the_reader_sees_the_original_source_at_the_pipelines_area(plus, monkeypatch):
    """Qwen2.5-VL reads the original source (not the one resized to the sample size), brought by the pipeline's own
    image processor to the pipeline's area for its aspect ratio: 1024x1024 for Qwen-Image-Edit, 384x384 for Plus.
    Without a sample size, a source whose sides are not whole 2x2 latent patches is cut to the nearest below."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus_module

    pipe = tiny_qwen_image_edit(plus=plus)
    policy = policy_for(pipe)
    module, area = (plus_module, 384 * 384) if plus else (edit, 1024 * 1024)
    seen = []
    original = pipe.encode_prompt
    monkeypatch.setattr(
        pipe, "encode_prompt", lambda prompt, image, **kw: seen.append(image) or original(prompt, image=image, **kw)
    )
    source = _source(3, size=(40, 24))  # 40 high, 24 wide
    cond = policy.encode([Condition(INSTRUCTIONS[0], inputs={"source_image": source})], 4.0, SPEC)
    width, height = module.calculate_dimensions(area, 24 / 40)[:2]
    expected = np.asarray(pipe.image_processor.resize(source, height, width))
    assert len(seen) == 2 and all(np.array_equal(np.asarray(image), expected) for image in seen)
    assert cond.tensors["image_latents"].shape[-2:] == (4, 4)  # the VAE's source: the 32x32 sample size
    unsized = policy.encode([Condition(INSTRUCTIONS[0], inputs={"source_image": source})], 1.0)
    assert unsized.tensors["image_latents"].shape[-2:] == (4, 2)  # 40x24 cut to 32x16: whole 16-pixel patches


def test_safety_steering_refuses_an_editing_pipeline():
    from flowrl.errors import UserError
    from flowrl.worlds.safety.steering import SteeringConfig, load_steering

    with pytest.raises(UserError, match="safety steering runs on text-to-image.*QwenImageEditPipeline here .* takes a"):
        load_steering(policy_for(tiny_qwen_image_edit()), SteeringConfig(mode="negative"))


def test_a_source_that_cannot_be_found_is_named():
    from flowrl.errors import UserError

    policy = policy_for(tiny_qwen_image_edit())
    with pytest.raises(UserError, match="needs a condition image"):
        policy.encode(["a red circle above a square"], 4.0, SPEC)


def test_the_plus_pipeline_sizes_each_image_as_the_pipeline_with_a_reference_size(monkeypatch):
    """pipeline.reference_size N: each image goes into the VAE at the pipeline's own size for an N x N area at its
    aspect ratio (calculate_dimensions: sides in multiples of 32), here with the pipeline's area (VAE_IMAGE_SIZE) set
    to 48 x 48 on both sides to keep the tiny model tiny; a batch whose rows differ in their images' number and
    sizes gives the pipeline's latents for each list, where the sample size would have squashed them."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    real = plus.calculate_dimensions
    # the reader's 384 x 384 area kept small, as keep_sources_small keeps it
    monkeypatch.setattr(
        plus, "calculate_dimensions", lambda area, ratio: (32, 32) if area == 384 * 384 else real(area, ratio)
    )
    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", 48 * 48)
    pipe = tiny_qwen_image_edit(plus=True)
    policy = policy_for(pipe)
    policy.set_reference_size(48, "pipeline.reference_size")
    lists = [[_source(1, (32, 64)), _source(3, (48, 32))], [_source(2, (64, 32))]]
    items = [Condition(text, inputs={"source_image": given}) for text, given in zip(INSTRUCTIONS, lists)]
    cond = policy.encode(items, 4.0, SPEC)
    # 32 x 64 stays; 48 x 32 (w / h = 2/3) becomes 64 x 32 over 48 x 48 = 2304 px: width sqrt(2304 * 2/3) = 39 -> 32,
    # height 59 -> 64; in latents (the tiny VAE's 8x): 4 x 8 and 8 x 4
    assert cond.tensors["reference_shapes"].tolist() == [[[4, 8], [8, 4]], [[8, 4], [0, 0]]]
    shape = policy.noise_shape(SPEC)
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    traj = rollout(policy, cond, sample_generators([1, 2]), shape, 3, "ode", 0.0, 4.0, initial_noise=noise)
    expected = torch.cat(
        [
            _pipeline_latents(pipe, given, text, noise[i : i + 1], 4.0)
            for i, (text, given) in enumerate(zip(INSTRUCTIONS, lists))
        ]
    )
    torch.testing.assert_close(traj.final, expected, atol=1e-4, rtol=1e-4)
    squashed = policy_for(pipe)
    at_sample_size = rollout(
        squashed,
        squashed.encode(items, 4.0, SPEC),
        sample_generators([1, 2]),
        shape,
        3,
        "ode",
        0.0,
        4.0,
        initial_noise=noise,
    )
    assert (at_sample_size.final - traj.final).abs().max() > 1e-3
    # without a sample size or a reference size, each image keeps its own size (to whole 2x2 latent patches): images
    # of different sizes share the batch
    unsized = squashed.encode(items, 4.0)
    assert unsized.tensors["reference_shapes"].tolist() == [[[4, 8], [6, 4]], [[8, 4], [0, 0]]]
    # an area whose rounding to multiples of 32 leaves a side of 0 is one error naming the setting
    from flowrl.errors import UserError

    policy.set_reference_size(16, "pipeline.reference_size")
    with pytest.raises(UserError, match=r"pipeline.reference_size 16: an image of 64x8 would become 32x0"):
        policy.pipeline_sized(torch.rand(3, 8, 64))
