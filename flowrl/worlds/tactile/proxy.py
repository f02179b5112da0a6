"""The downstream proxy: a small regressor of a material's friction coefficient from its tactile image, trained on
recorded images with or without generated ones added (the augmentation whose worth PhysTacGen measures on force
coefficients); its held-out mean absolute error says whether the generated images help."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class FrictionRegressor(nn.Module):
    """Two strided convolutions, global pooling and a linear head: a tactile image [B, 3, H, W] -> friction [B]."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.SiLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.SiLU(),
        )
        self.head = nn.Linear(4 * width, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        maps = self.features(images * 2 - 1)
        pooled = torch.cat([maps.mean((2, 3)), maps.std((2, 3))], dim=1)  # texture lives in the spread
        return self.head(pooled)[:, 0]


def train_regressor(
    images: torch.Tensor, friction: torch.Tensor, steps: int = 300, lr: float = 3e-3, batch: int = 32, seed: int = 0
) -> FrictionRegressor:
    """Fit a FrictionRegressor to (images [N, 3, H, W] in [0, 1], friction [N]) with Adam on the L1 loss."""
    torch.manual_seed(seed)
    model = FrictionRegressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = torch.as_tensor(rng.integers(len(images), size=min(batch, len(images))))
        loss = (model(images[rows]) - friction[rows]).abs().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def heldout_error(model: FrictionRegressor, images: torch.Tensor, friction: torch.Tensor) -> float:
    """Mean absolute error of the regressor's friction on held-out images."""
    return (model(images) - friction).abs().mean().item()
