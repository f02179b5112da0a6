"""The shapes-wan pretraining recipe's parts: frame-batched encoding, the latent pool, and a whole tiny run that
writes a WanPipeline diffusers loads unmodified."""

import json
import subprocess
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from conftest import REPO
from diffusers import WanPipeline
from run_helpers import assert_same_weights, stopped_then_continued

from flowrl.errors import UserError
from flowrl.inference import generate_samples
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.policies.wan_vae import frame_convolutions, frames_independent
from flowrl.pretrain_progress import PretrainProgress
from flowrl.worlds.moving_shapes.card_wan import evaluate_and_write_card
from flowrl.worlds.moving_shapes.model_wan import ShapesWanSize, build_pipeline, build_vae
from flowrl.worlds.moving_shapes.pretrain_wan import (
    LatentPool,
    ShapeProbe,
    WanPretrainConfig,
    clips_to_tensor,
    decode_unclamped,
    encode_mean,
    inflate_causal_convs,
    normalised_latents,
    object_mask,
    pretrain_shapes_wan,
    prompt_words_loss,
    shape_targets,
)
from flowrl.worlds.moving_shapes.prompts import eval_prompt_set, motion_vocabulary
from flowrl.worlds.moving_shapes.world import sample_pairs
from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
from flowrl.worlds.shapes.tokenizer import SPECIAL_TOKENS, build_tokenizer

TINY = ShapesWanSize(
    num_layers=1, num_heads=2, head_dim=12, ffn_dim=32, text_hidden=16, text_layers=1, latent_channels=4, vae_base_dim=8
)


def test_a_frame_independent_vae_encodes_frames_as_one_batch():
    vae = build_vae(TINY, seed=0).eval()
    clips = clips_to_tensor(sample_pairs(2, np.random.default_rng(0))[0])
    assert not frames_independent(vae)  # random past taps: frames depend on earlier ones
    inflate_causal_convs(vae)
    assert frames_independent(vae)
    with torch.no_grad():
        torch.testing.assert_close(encode_mean(vae, clips), vae.encode(clips).latent_dist.mode(), atol=1e-5, rtol=0)


def test_frame_convolutions_are_the_same_function_and_keep_past_taps_zero():
    vae = build_vae(TINY, seed=0)
    inflate_causal_convs(vae)
    with torch.no_grad():  # a current tap that is not near zero, so a wrong padding or tap would show
        vae.encoder.conv_in.weight[:, :, -1].normal_()
    clips = clips_to_tensor(sample_pairs(2, np.random.default_rng(0))[0])
    reference = decode_unclamped(vae, encode_mean(vae, clips))
    with frame_convolutions(vae):
        fast = decode_unclamped(vae, vae.encode(clips).latent_dist.mode())
        fast.pow(2).mean().backward()
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=1e-4)
    taps = [m.weight for m in vae.modules() if type(m).__name__ == "WanCausalConv3d" and m.weight.shape[2] > 1]
    assert all(w.grad is not None and not w.grad[:, :, :-1].any() for w in taps)
    assert all(w.grad[:, :, -1].any() for w in taps)
    assert all("forward" not in m.__dict__ for m in vae.modules())  # the context restores the modules
    with torch.no_grad():
        taps[0][:, :, 0] = 0.1  # frames now interact: the context must leave the 3-D path alone
    with frame_convolutions(vae):
        assert all("forward" not in m.__dict__ for m in vae.modules())


def test_the_latent_pool_refreshes_its_oldest_clips_and_keeps_prompts_paired():
    vae = build_vae(TINY, seed=0).eval()
    inflate_causal_convs(vae)
    vae.register_to_config(latents_mean=[0.1] * 4, latents_std=[2.0] * 4)
    pool = LatentPool(vae, size=6, refresh=2, rng=np.random.default_rng(0))
    first = list(pool.prompts)
    latents, prompts = pool(3, np.random.default_rng(1))
    assert latents.shape[0] == 3 and pool.prompts[2:] == first[2:] and pool.next == 2
    for z, prompt in zip(latents, prompts):
        assert any(torch.equal(z, pool.latents[i]) and pool.prompts[i] == prompt for i in range(6))
    frames, prompts = pool.frames(4, np.random.default_rng(2))
    assert frames.shape == (4, *pool.latents.shape[1:2], 1, *pool.latents.shape[3:])
    for z, prompt in zip(frames, prompts):  # a frame of some pooled clip, paired with that clip's prompt
        assert any(
            torch.equal(z[:, 0], pool.latents[i, :, f]) and pool.prompts[i] == prompt
            for i in range(6)
            for f in range(pool.latents.shape[2])
        )
    clips, prompts = sample_pairs(2, np.random.default_rng(3))
    torch.testing.assert_close(normalised_latents(vae, clips), (encode_mean(vae, clips_to_tensor(clips)) - 0.1) / 2.0)


def test_the_object_mask_marks_latent_pixels_away_from_the_background():
    background = torch.tensor([0.5, -0.2, 0.1, 0.0])
    latents = background.view(1, 4, 1, 1, 1).repeat(2, 1, 9, 16, 16) + 0.3 * torch.randn(2, 4, 9, 16, 16).clamp(-1, 1)
    latents[1, 2, 3:5, 4:7, 8:10] += 1.5  # an object in one channel of a few frames of the second clip
    mask = object_mask(latents, background)
    assert mask.shape == (2, 1, 9, 16, 16)
    expected = torch.zeros_like(mask, dtype=torch.bool)
    expected[1, 0, 3:5, 4:7, 8:10] = True
    assert torch.equal(mask.bool(), expected)


def test_shape_targets_are_each_latent_pixels_class_shares():
    labels = np.zeros((1, 1, 4, 4), dtype=np.int64)
    labels[0, 0, :2, :2] = 2  # a square fills the first latent pixel
    labels[0, 0, 2, 2] = 1  # a circle covers a quarter of the last one
    target = shape_targets(labels, 2, 4)
    assert target.shape == (1, 4, 1, 2, 2)
    assert torch.allclose(target.sum(1), torch.ones(1, 1, 2, 2))
    assert target[0, :, 0, 0, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert target[0, :, 0, 1, 1].tolist() == [0.75, 0.25, 0.0, 0.0]


def test_the_shape_probe_reads_standardised_latents():
    torch.manual_seed(0)
    probe = ShapeProbe(channels=4, classes=4)
    z = torch.randn(3, 4, 2, 5, 5)
    scale, shift = torch.tensor([0.1, 3.0, 1.0, 20.0]), torch.tensor([5.0, -2.0, 0.0, 1.0])
    rescaled = z * scale.view(1, 4, 1, 1, 1) + shift.view(1, 4, 1, 1, 1)
    # a channel's size and offset do not change what the probe reads: the class must be as large as the latents' spread
    assert torch.allclose(probe(z), probe(rescaled), atol=1e-4)
    # the logits of one latent pixel are bounded by the scale times its standardised length
    logits = probe(z) - probe.bias.view(1, -1, 1, 1, 1)
    standardised = (z - z.mean((0, 2, 3, 4), keepdim=True)) / z.std((0, 2, 3, 4), keepdim=True)
    assert (logits.abs() <= probe.scale * standardised.norm(dim=1, keepdim=True) + 1e-4).all()


def test_the_words_loss_asks_every_real_token_for_the_whole_prompts_words():
    tokenizer = build_tokenizer(words=motion_vocabulary())
    prompts = ["a red circle moving left", "a blue square"]
    ids = tokenizer(prompts, padding="max_length", max_length=16, return_tensors="pt").input_ids
    real = ids != SPECIAL_TOKENS.index("<pad>")
    vocabulary = len(tokenizer)
    # the head is the identity, so the "embeddings" are the logits: +20 on the prompt's words, -20 elsewhere
    logits = torch.full((2, 16, vocabulary), -20.0)
    for b, prompt in enumerate(prompts):
        for word in prompt.split():
            logits[b, :, tokenizer.convert_tokens_to_ids(word)] = 20.0
    logits[~real] = 20.0  # padding positions are wrong everywhere and must not count
    head = torch.nn.Identity()
    assert prompt_words_loss(tokenizer, head, prompts, logits) < 1e-6
    # one real token missing one word of its prompt costs that token's share of the loss
    missing = logits.clone()
    missing[1, 1, tokenizer.convert_tokens_to_ids("square")] = -20.0
    expected = torch.nn.functional.softplus(torch.tensor(20.0)) / vocabulary / real.sum()
    assert torch.isclose(prompt_words_loss(tokenizer, head, prompts, missing), expected, rtol=1e-3)
    # special tokens are never targets: a head that calls them present pays for it
    special = logits.clone()
    special[:, :, SPECIAL_TOKENS.index("<eos>")] = 20.0
    assert prompt_words_loss(tokenizer, head, prompts, special) > 0.1


def test_a_temporal_patch_must_divide_the_latent_frames_and_sets_the_token_grid():
    with pytest.raises(ValueError, match="temporal_patch 2"):
        ShapesWanSize(temporal_patch=2)
    size = ShapesWanSize(temporal_patch=3, patch=2)
    assert size.tokens() == 3 * 8 * 8
    pipe = build_pipeline(replace(TINY, temporal_patch=3, patch=2), seed=0)
    assert pipe.transformer.config.patch_size == (3, 2, 2)
    latents = torch.randn(1, TINY.latent_channels, 9, 16, 16)
    out = pipe.transformer(latents, torch.tensor([500.0]), torch.randn(1, 16, TINY.text_hidden), return_dict=False)[0]
    assert out.shape == latents.shape


def test_a_tiny_run_of_the_default_structure_samples_clips():
    cfg = WanPretrainConfig(
        vae_steps=1, vae_batch=9, flow_steps=2, flow_batch=2, flow_pool=4, flow_refresh=1, warmup_steps=1, threads=1
    )
    pipe, facts = pretrain_shapes_wan(cfg, TINY)
    assert pipe.transformer.config.patch_size == (9, 2, 2) and np.isfinite(facts["flow_final_loss"])
    policy = policy_for(pipe.to(torch.float32), max_sequence_length=16)
    samples, _ = generate_samples(policy, ["a red circle moving left"], 1, 0, 2, 4.5, SampleSpec(32, 32, 9), desc=None)
    assert samples.to_uint8().shape == (1, 9, 32, 32, 3)


def test_a_tiny_run_writes_a_pipeline_diffusers_loads(tmp_path):
    cfg = WanPretrainConfig(
        vae_steps=2,
        vae_batch=9,
        flow_steps=2,
        flow_batch=2,
        flow_pool=4,
        flow_refresh=1,
        flow_image_batch=2,
        flow_image_steps=2,
        flow_image_stage_batch=3,
        warmup_steps=1,
        threads=1,
        flow_object_weight=9.0,
        vae_shape_weight=0.1,
        vae_clip_steps=1,
        vae_clip_batch=2,
        flow_text_words_weight=1.0,
    )
    with pytest.raises(ValueError, match="temporal_patch 9 cannot patchify"):  # the default (9, 2, 2) structure
        pretrain_shapes_wan(cfg, TINY)
    pipe, facts = pretrain_shapes_wan(cfg, replace(TINY, temporal_patch=1, patch=4))  # one-frame videos need 1
    assert 0.0 <= facts["vae_shape_probe_accuracy"] <= 1.0
    assert np.isfinite(facts["flow_image_final_loss"]) and np.isfinite(facts["flow_final_loss"])
    assert facts["flow_minutes"] > 0
    save_pipeline(pipe, tmp_path, facts)
    loaded = WanPipeline.from_pretrained(tmp_path, torch_dtype=torch.float32)
    assert loaded.scheduler.config.shift == TINY.flow_shift
    loaded.set_progress_bar_config(disable=True)
    # WanPipeline rounds num_frames to k * temporal_factor + 1, which for a factor of 1 adds a frame: 8 gives 9
    frames = loaded(
        "a red circle moving left",
        height=32,
        width=32,
        num_frames=8,
        num_inference_steps=2,
        guidance_scale=4.5,
        max_sequence_length=16,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert frames.shape == (1, 9, 32, 32, 3) and np.isfinite(frames).all()
    result = evaluate_and_write_card(tmp_path, num_per_prompt=2, seeds=2)  # the grid shows two clips per prompt
    card = (tmp_path / "README.md").read_text()
    stored = json.loads((tmp_path / "eval.json").read_text())
    assert stored["protocol"]["seeds"] == [2024, 2025] and len(stored["protocol"]["overall_by_seed"]) == 2
    assert sum(result["counts"].values()) == 4 * len(eval_prompt_set())  # both seeds' clips are judged
    assert "seeds [2024, 2025]" in card and (tmp_path / "samples.png").is_file()
    # the card is committed with the folder, and CI checks the format of Python blocks in markdown
    check = ["ruff", "format", "--check", "--config", str(REPO / "pyproject.toml"), str(tmp_path / "README.md")]
    formatted = subprocess.run(check, capture_output=True)
    assert formatted.returncode == 0, formatted.stdout.decode()


def test_a_run_stopped_mid_stage_continues_to_the_uninterrupted_weights(tmp_path):
    cfg = WanPretrainConfig(
        vae_steps=1,
        vae_batch=9,
        flow_steps=4,
        flow_batch=2,
        flow_pool=4,
        flow_refresh=1,
        flow_image_steps=2,
        flow_image_stage_batch=3,
        warmup_steps=1,
        threads=1,
        flow_text_words_weight=1.0,
    )
    size = replace(TINY, temporal_patch=1, patch=4)
    whole, whole_facts = pretrain_shapes_wan(cfg, size)
    settings = {"recipe": "shapes-wan", "config": asdict(cfg)}
    # stopped after step 2 of the video stage (the VAE and image stages already done)
    saved, (resumed, facts) = stopped_then_continued(
        lambda progress: pretrain_shapes_wan(cfg, size, progress=progress),
        tmp_path / "progress",
        settings,
        stage="pretrain video flow",
        step=2,
    )
    assert saved == {"video_vae.pt", "pretrain_image_flow.pt", "pretrain_video_flow.pt"}
    for name in ("transformer", "text_encoder", "vae"):  # bit for bit
        assert_same_weights(getattr(whole, name).state_dict(), getattr(resumed, name).state_dict(), tolerance=0)
    assert facts["flow_final_loss"] == whole_facts["flow_final_loss"]
    assert facts["latents_mean"] == whole_facts["latents_mean"] and facts["total_minutes"] > facts["vae_minutes"]


def test_progress_saved_under_other_settings_is_refused(tmp_path):
    PretrainProgress(tmp_path, {"recipe": "shapes-wan", "config": {"flow_steps": 5000}})
    with pytest.raises(UserError, match="other settings"):
        PretrainProgress(tmp_path, {"recipe": "shapes-wan", "config": {"flow_steps": 15000}})
