"""The SDXL ControlNet adapter: its deterministic DDIM rollout is the pipeline's own sample for the same noise,
prompts and control images (the tactile world's two-ControlNet generator), and a condition without a control input
is refused naming it."""

import numpy as np
import pytest
import torch

from flowrl.errors import UserError
from flowrl.policies import policy_for
from flowrl.policies.base import SampleSpec
from flowrl.rollout import rollout, sample_generators
from flowrl.tasks.base import Condition
from flowrl.worlds.tactile.pipeline import build_pipeline

PROMPTS = ["woven, fine pitch, diagonal, soft, low friction", ""]


def test_deterministic_ddim_rollout_reproduces_the_pipeline():
    pipe = build_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    for net in pipe.controlnet.nets:  # zero-initialised output convolutions would hide the controls
        torch.nn.init.normal_(net.controlnet_cond_embedding.conv_out.weight, std=0.02)
        for block in [*net.controlnet_down_blocks, net.controlnet_mid_block]:
            torch.nn.init.normal_(block.weight, std=0.02)
    policy = policy_for(pipe)
    rng = np.random.default_rng(0)
    rgb, depth = (rng.integers(0, 256, size=(2, 32, 32, 3), dtype=np.uint8) for _ in range(2))
    items = [Condition(p, inputs={"rgb": rgb[i], "depth": depth[i]}) for i, p in enumerate(PROMPTS)]
    shape = policy.noise_shape(SampleSpec(32, 32))
    noise = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0))
    cond = policy.encode(items, 3.0, SampleSpec(32, 32))
    traj = rollout(policy, cond, sample_generators([1, 2]), shape, 4, "ode", 0.0, 3.0, initial_noise=noise)
    controls = [torch.as_tensor(a).permute(0, 3, 1, 2).float() / 255 for a in (rgb, depth)]
    expected = pipe(
        PROMPTS,
        image=controls,
        num_inference_steps=4,
        guidance_scale=3.0,
        latents=noise,
        height=32,
        width=32,
        negative_prompt=[""] * 2,
        output_type="latent",
        eta=0.0,
    ).images
    torch.testing.assert_close(traj.final, expected.float(), atol=1e-4, rtol=1e-4)
    other = policy.encode(
        [Condition(p, inputs={"rgb": rgb[i], "depth": 255 - depth[i]}) for i, p in enumerate(PROMPTS)], 3.0
    )
    changed = rollout(policy, other, sample_generators([1, 2]), shape, 4, "ode", 0.0, 3.0, initial_noise=noise)
    assert not torch.allclose(changed.final, traj.final, atol=1e-4)  # the depth control reaches the sample


def test_a_condition_without_a_control_is_refused():
    policy = policy_for(build_pipeline(seed=0))
    with pytest.raises(UserError, match="has no 'depth' input"):
        policy.encode([Condition("woven", inputs={"rgb": np.zeros((32, 32, 3), np.uint8)})], 3.0)
