"""The friction proxy learns from tactile images: on held-out materials it beats predicting the training mean."""

import torch

from flowrl.worlds.tactile.proxy import heldout_error, train_regressor
from flowrl.worlds.tactile.scenes import world_pairs


def test_the_regressor_beats_the_mean_on_held_out_materials():
    train, held = world_pairs("train", 128), world_pairs("eval", 48)
    images, friction = torch.stack([p.tactile for p in train]), torch.tensor([p.friction for p in train])
    held_images, held_friction = torch.stack([p.tactile for p in held]), torch.tensor([p.friction for p in held])
    model = train_regressor(images, friction, steps=200)
    baseline = (held_friction - friction.mean()).abs().mean().item()
    assert heldout_error(model, held_images, held_friction) < 0.9 * baseline
