"""Flow-matching noise-level sampling shared by the pretraining recipes and the data loss."""

import pytest
import torch

from flowrl.schedules import cosine_decay, sample_noise_levels


def test_logit_normal_is_the_sigmoid_of_the_generators_normals():
    # the shipped pipelines were trained on this exact stream; a change here would silently change every recipe
    drawn = sample_noise_levels("logit_normal", 7, torch.Generator().manual_seed(5))
    assert torch.equal(drawn, torch.sigmoid(torch.randn(7, generator=torch.Generator().manual_seed(5))))


def test_uniform_puts_more_weight_on_high_noise_than_logit_normal():
    generator = torch.Generator().manual_seed(0)
    uniform = sample_noise_levels("uniform", 20000, generator)
    logit_normal = sample_noise_levels("logit_normal", 20000, generator)
    assert 0 <= uniform.min() and uniform.max() < 1
    assert abs((uniform > 0.7).float().mean().item() - 0.30) < 0.02
    assert abs((logit_normal > 0.7).float().mean().item() - 0.197) < 0.02  # P(z > logit 0.7 = 0.847)


def test_an_unknown_sampling_is_refused_by_name():
    with pytest.raises(ValueError, match="logit_normal.*uniform.*'beta'"):
        sample_noise_levels("beta", 4)


def test_cosine_decay_ends():
    assert (
        cosine_decay(0, 10) == 1.0 and abs(cosine_decay(10, 10)) < 1e-12 and cosine_decay(5, 10) == pytest.approx(0.5)
    )
