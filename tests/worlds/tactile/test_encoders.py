"""The world's contrastive encoders: the InfoNCE against a hand computation, the saved encoders load through the same
timm path as DINOv2 with the same features, and the learned similarity is 1 for identical images."""

import math

import pytest
import torch

from flowrl.worlds.tactile.encoders import EncoderConfig, info_nce, learned_similarity, save_encoders, train_encoders
from flowrl.worlds.tactile.pretrain import PairPool
from flowrl.worlds.tactile.priors import encode, timm_encoder


def test_info_nce_by_hand():
    camera = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # unit rows (1, 0), (0, 1)
    tactile = torch.tensor([[3.0, 0.0], [1.0, 1.0]])  # unit rows (1, 0), (0.707, 0.707)
    c = 1 / math.sqrt(2)
    # logits / 0.5: [[2, 2c], [0, 2c]]; rows: -log softmax at the diagonal; columns likewise
    row0 = -2 + math.log(math.exp(2) + math.exp(2 * c))
    row1 = -2 * c + math.log(1 + math.exp(2 * c))
    col0 = -2 + math.log(math.exp(2) + 1)
    col1 = -2 * c + math.log(math.exp(2 * c) * 2)
    expected = ((row0 + row1) / 2 + (col0 + col1) / 2) / 2
    assert info_nce(camera, tactile, 0.5).item() == pytest.approx(expected, rel=1e-6)


def test_trained_encoders_load_as_timm_models_with_their_features(tmp_path):
    encoders, facts = train_encoders(EncoderConfig(steps=2, batch=8), PairPool(16, 32, 0))
    assert 0.0 <= facts["eval_retrieval_accuracy"] <= 1.0 and facts["eval_pairs"] == 64
    save_encoders(encoders, tmp_path, facts)
    loaded = timm_encoder(tmp_path / "tactile")
    images = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(encode(loaded, images), encode(encoders["tactile"], images), atol=2e-2, rtol=2e-2)
    similarity = learned_similarity(loaded, images, images)
    torch.testing.assert_close(similarity, torch.ones(3), atol=1e-5, rtol=0)
    assert learned_similarity(loaded, images, images.flip(0))[0] < 0.9999
