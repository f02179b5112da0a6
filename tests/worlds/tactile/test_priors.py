"""The priors load tiny local instances (a transformers Depth-Anything, a timm ViT saved as timm saves models) and
give the world's conventions: relative depth with 0 nearest, one feature row per image."""

import pytest
import torch

from flowrl.errors import UserError
from flowrl.worlds.tactile.priors import DepthPrior, _normalised_nearest_zero, encode, timm_encoder


def test_relative_depth_puts_the_nearest_point_at_zero():
    disparity = torch.tensor([[[1.0, 3.0], [2.0, 5.0]]])  # larger: nearer
    torch.testing.assert_close(_normalised_nearest_zero(disparity), torch.tensor([[[1.0, 0.5], [0.75, 0.0]]]))


def test_a_tiny_depth_anything_loads_from_its_folder(tmp_path):
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation

    backbone = {
        "model_type": "dinov2",
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "patch_size": 14,
        "image_size": 28,
        "out_indices": [1, 2],
        "reshape_hidden_states": False,
    }
    config = DepthAnythingConfig(
        backbone_config=backbone,
        reassemble_hidden_size=16,
        neck_hidden_sizes=[8, 16],
        fusion_hidden_size=16,
        head_hidden_size=8,
        reassemble_factors=[1, 1],
    )
    torch.manual_seed(0)
    DepthAnythingForDepthEstimation(config).save_pretrained(tmp_path / "depth")
    prior = DepthPrior(tmp_path / "depth")
    depth = prior(torch.rand(2, 3, 32, 32))
    assert depth.shape == (2, 32, 32)
    assert torch.allclose(depth.flatten(1).min(1).values, torch.zeros(2))
    assert torch.allclose(depth.flatten(1).max(1).values, torch.ones(2))
    with pytest.raises(UserError, match="not a transformers depth model"):
        DepthPrior(tmp_path)


def test_a_timm_backbone_loads_from_a_local_folder(tmp_path):
    import timm
    from timm.models import save_for_hf

    args = dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2)
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, **args).eval()
    save_for_hf(model, tmp_path / "dino", model_args=args)
    encoder = timm_encoder(tmp_path / "dino")
    images = torch.rand(3, 3, 32, 32)
    features = encode(encoder, images, size=32)
    assert features.shape == (3, 32)
    torch.testing.assert_close(features, encode(model, images, size=32))
    with pytest.raises(UserError, match="not a timm model folder"):
        timm_encoder(tmp_path)
