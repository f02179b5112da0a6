"""A toy flow model whose velocity is exact for a 2-D Gaussian mixture (FK steering's and safety steering's tests:
the tilted target p(x) exp(lambda r(x)) has a closed form)."""

import torch

from flowrl.policies.base import FlowPolicy

MEANS = torch.tensor([[-1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
SCALE = 0.3  # every component is N(mean, SCALE^2 I)
WEIGHTS = torch.tensor([0.5, 0.5], dtype=torch.float64)


class GaussianMixtureFlow(FlowPolicy):
    """The exact rectified-flow velocity of the mixture: v = (x_t - E[x0 | x_t]) / t."""

    def __init__(self):
        self._sigma_cache = {}

    @property
    def device(self):
        return torch.device("cpu")

    def sigmas(self, num_steps, noise_shape=()):
        return torch.linspace(1.0, 0.0, num_steps + 1)

    def velocity(self, latents, sigma, cond, guidance_scale):
        x = latents.double()
        t = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1).expand(len(x), 1)
        var = (1 - t) ** 2 * SCALE**2 + t**2  # [N, 1]
        centred = x[:, None, :] - (1 - t)[:, None] * MEANS[None]  # [N, K, 2]
        log_resp = torch.log(WEIGHTS)[None] - (centred**2).sum(-1) / (2 * var) - torch.log(var)
        resp = torch.softmax(log_resp, dim=1)
        x0_k = MEANS[None] + ((1 - t) * SCALE**2 / var)[:, None] * centred
        x0 = (resp[..., None] * x0_k).sum(1)
        return ((x - x0) / t.clamp(min=1e-6)).float()
