"""The learned shapes scorer: its recipe's pieces, a save/load round trip as the `shapes_clip` reward, and the
shipped model's measured agreement with the verifier."""

import json

import numpy as np
import pytest
import torch
from conftest import REPO

from flowrl.eval.metrics import auc
from flowrl.rewards import build_reward
from flowrl.worlds.shapes import verifier
from flowrl.worlds.shapes.model_scorer import ScorerSize
from flowrl.worlds.shapes.pretrain_scorer import (
    ScorerConfig,
    climb_scorer,
    pair_logits,
    pretrain_scorer,
    save_scorer,
    verdict_matrix,
)
from flowrl.worlds.shapes.scenes import sample_pairs


def test_auc_by_hand():
    # positives 0.9, 0.4; negatives 0.5, 0.1, 0.4: pairs won 3 + 1.5 (a tie counts half) of 6
    assert auc(torch.tensor([0.9, 0.4, 0.5, 0.1, 0.4]), torch.tensor([1, 1, 0, 0, 0])) == pytest.approx(4.5 / 6)
    assert auc(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1, 0, 0])) == 1.0


def test_verdicts_are_the_verifiers():
    images, prompts = sample_pairs(6, np.random.default_rng(0))
    matrix = verdict_matrix(images, prompts)
    expected = torch.tensor([[verifier.score(im, p) for p in prompts] for im in images])
    assert torch.equal(matrix, expected) and torch.all(matrix.diagonal() == 1)  # a render meets its own prompt


def test_a_trained_scorer_saves_and_loads_as_a_differentiable_reward(tmp_path):
    cfg = ScorerConfig(steps=3, batch=8, generated=0, threads=2)
    model, tokenizer, facts = pretrain_scorer(cfg, ScorerSize(hidden=32, layers=1, heads=2, projection=16))
    save_scorer(model, tokenizer, tmp_path, facts)
    reward = build_reward("shapes_clip", path=str(tmp_path))
    images = torch.rand(2, 3, 32, 32, requires_grad=True)
    out = reward(images, ["a red circle", "two squares"])
    assert out.scores.shape == (2,)
    out.scores.sum().backward()
    assert images.grad.abs().sum() > 0


def test_climbing_the_scorer_raises_its_own_prompt_score_within_the_pixel_budget():
    torch.manual_seed(0)
    cfg = ScorerConfig(steps=2, batch=8, generated=0, threads=2)
    model, tokenizer, _ = pretrain_scorer(cfg, ScorerSize(hidden=32, layers=1, heads=2, projection=16))
    model.score_bias = model.config.score_bias
    images, prompts = sample_pairs(6, np.random.default_rng(3))
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    climbed = climb_scorer(model, tokenizer, pixels, prompts, steps=4, eps=0.1)
    assert (climbed - pixels).abs().max() <= 0.1 + 1e-6 and climbed.min() >= 0 and climbed.max() <= 1
    own = torch.arange(6)
    with torch.no_grad():
        before = pair_logits(model, tokenizer, pixels, prompts)[own, own]
        after = pair_logits(model, tokenizer, climbed, prompts)[own, own]
    assert bool((after > before).all())


def test_adversarial_training_adds_each_pool_sample_climbed_and_labelled_by_the_verifier(monkeypatch):
    import flowrl.worlds.shapes.pretrain_scorer as recipe

    pool = sample_pairs(8, np.random.default_rng(5))
    monkeypatch.setattr(recipe, "generated_pairs", lambda *args: pool)
    seen = []
    verdicts = recipe.verdict_matrix
    monkeypatch.setattr(
        recipe, "verdict_matrix", lambda images, prompts: seen.append(len(images)) or verdicts(images, prompts)
    )
    sizes = ScorerSize(hidden=32, layers=1, heads=2, projection=16)
    for steps, expected in ((0, 4 + 3), (2, 4 + 3 + 3)):
        seen.clear()
        cfg = ScorerConfig(steps=2, batch=4, generated=8, generated_per_step=3, threads=2, adversarial_steps=steps)
        pretrain_scorer(cfg, sizes, pipeline_dir="unused")
        assert seen == [expected, expected]


def test_mixed_colour_renders_join_every_step(monkeypatch):
    import flowrl.worlds.shapes.pretrain_scorer as recipe

    seen = []
    verdicts = recipe.verdict_matrix
    monkeypatch.setattr(
        recipe, "verdict_matrix", lambda images, prompts: seen.append(len(images)) or verdicts(images, prompts)
    )
    cfg = ScorerConfig(steps=2, batch=4, generated=0, threads=2, mixed_color_per_step=3)
    pretrain_scorer(cfg, ScorerSize(hidden=32, layers=1, heads=2, projection=16))
    assert seen == [4 + 3, 4 + 3]


def test_pool_checkpoints_add_their_own_seeded_samples_after_the_base_pool(monkeypatch):
    import flowrl.worlds.shapes.pretrain_scorer as recipe

    calls = []

    def fake_pairs(pipeline_dir, count, seed, checkpoint=None):
        calls.append((count, seed, checkpoint))
        return sample_pairs(count, np.random.default_rng(seed))

    monkeypatch.setattr(recipe, "generated_pairs", fake_pairs)
    cfg = ScorerConfig(generated=6, pool_checkpoints=["ck_a", "ck_b"], pool_per_checkpoint=4)
    images, prompts = recipe.generation_pool("unused", cfg)
    assert calls == [(6, 0, None), (4, 1000, "ck_a"), (4, 2000, "ck_b")]
    assert len(images) == len(prompts) == 14
    assert prompts[6:10] == sample_pairs(4, np.random.default_rng(1000))[1]


def test_pretrain_scorer_names_a_missing_pool_checkpoint(tmp_path):
    from run_helpers import run_flowrl

    result = run_flowrl("pretrain", "scorer", "--out", str(tmp_path / "s"), "--pool-checkpoint", str(tmp_path / "nope"))
    assert result.returncode == 2 and "--pool-checkpoint" in result.stderr and "nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_shipped_scorer_agrees_with_the_verifier_as_its_card_says():
    folder = REPO / "pipelines/shapes-scorer"
    measured = json.loads((folder / "eval.json").read_text())
    assert measured["rendered"]["auc_clean"] > 0.9
    card = (folder / "README.md").read_text()
    assert f"{measured['generated']['auc_own_prompt']:.3f}" in card
    assert sum(f.stat().st_size for f in folder.glob("*.safetensors")) < 2e6


def test_the_shipped_scorer_tells_every_eval_prompt_apart():
    """Its text feature is its only view of the prompt: pooled at some word instead of <eos> (transformers' legacy
    rule for eos_token_id 2), 13 of the 36 eval prompts shared one with another ("two circles" = "two squares")."""
    from transformers import AutoTokenizer, CLIPModel

    from flowrl.worlds.shapes.prompts import eval_prompt_set

    folder = REPO / "pipelines/shapes-scorer"
    model, tokenizer = CLIPModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    prompts = eval_prompt_set()
    with torch.no_grad():
        features = model.get_text_features(
            **tokenizer(prompts, padding="max_length", max_length=16, return_tensors="pt")
        )
    features = getattr(features, "pooler_output", features)
    distance = torch.cdist(features, features) + torch.eye(len(prompts)) * 1e9
    assert distance.min() > 1e-3
