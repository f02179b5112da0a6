"""Wan's causal VAE when its frames do not interact: every causal 3-D convolution's past taps zero and no temporal
compression (shapes-wan's VAE, trained frame by frame from an inflated per-frame autoencoder). Such a VAE is then
the same function as per-frame 2-D convolutions, which `frame_convolutions` runs faster on CPU (measured by
benchmarks/wan_frame_convs.py). A VAE whose frames interact (any released Wan VAE) is left
as it is.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def past_taps(vae) -> list[torch.Tensor]:
    """Every causal 3-D convolution's weights on earlier frames (views: all but the last time tap)."""
    return [
        module.weight[:, :, :-1]
        for module in vae.modules()
        if type(module).__name__ == "WanCausalConv3d" and module.weight.shape[2] > 1
    ]


def frames_independent(vae) -> bool:
    """True when the VAE maps every frame on its own: no temporal compression and every causal convolution's past
    taps still zero (as `inflate_causal_convs` left them when only frames were trained)."""
    if vae.config.scale_factor_temporal != 1:
        return False
    return not any(taps.any() for taps in past_taps(vae))


def _frame_conv(conv, x: torch.Tensor, cache_x=None) -> torch.Tensor:
    """A WanCausalConv3d whose past taps are zero, as the 2-D convolution of every frame with its current tap:
    the same output (the cached and padded past frames meet zero weights), without the 3x multiply-adds on them
    and the zero padding in time."""
    b, c, f, h, w = x.shape
    frames = x.transpose(1, 2).reshape(b * f, c, h, w)
    out = torch.nn.functional.conv2d(
        frames, conv.weight[:, :, -1], conv.bias, stride=conv.stride[1:], padding=(conv._padding[2], conv._padding[0])
    )
    return out.view(b, f, *out.shape[1:]).transpose(1, 2)


@contextlib.contextmanager
def frame_convolutions(vae):
    """While the VAE is frame-independent (`frames_independent`), run its causal 3-D convolutions as per-frame 2-D
    ones: the same function (tests/worlds/moving_shapes/test_shapes_wan_recipe.py), faster
    (benchmarks/wan_frame_convs.py).
    Past taps get zero gradients through it, so AdamW without weight decay keeps them zero.
    Outside the context, and for a VAE whose frames interact, nothing changes."""
    if not frames_independent(vae):
        yield
        return
    convs = [
        m
        for m in vae.modules()
        if type(m).__name__ == "WanCausalConv3d" and m.stride[0] == 1 and m._padding[4] == m.kernel_size[0] - 1
    ]
    for conv in convs:
        conv.forward = functools.partial(_frame_conv, conv)
    try:
        yield
    finally:
        for conv in convs:
            del conv.forward
