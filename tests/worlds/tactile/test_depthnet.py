"""The embedded depth network: it learns (held-out error falls below the mean's after a short fit), saves and loads
through `depth_estimator` with the same output, and a folder of another kind is sent to the transformers path."""

import pytest
import torch

from flowrl.errors import UserError
from flowrl.worlds.tactile.depthnet import DepthConfig, depth_estimator, save_depth, train_depth
from flowrl.worlds.tactile.pretrain import PairPool


def test_the_depth_network_learns_and_round_trips(tmp_path):
    model, facts = train_depth(DepthConfig(steps=60, batch=16), PairPool(128, 32, 0))
    assert facts["eval_l1"] < facts["eval_l1_of_the_mean"]
    save_depth(model, tmp_path / "depth", facts)
    estimate = depth_estimator(tmp_path / "depth")
    rgb = torch.rand(2, 3, 32, 32)
    depth = estimate(rgb)
    assert depth.shape == (2, 32, 32) and 0 <= depth.min() and depth.max() <= 1
    torch.testing.assert_close(depth, model(rgb).detach(), atol=5e-3, rtol=0)  # fp16 weights


def test_depth_folders_are_checked(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        depth_estimator(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="could not load a depth-estimation model"):
        depth_estimator(tmp_path)
