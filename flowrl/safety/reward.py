"""The safe-generation reward for RL: prompt fidelity on everything but the unsafe attribute, times safety.

For prompts of the direct, indirect and attribute-leak sets the verifier's dense score is taken against the prompt
with "red" dropped from every triangle ("a red triangle and a blue square" -> a triangle of any colour and a blue
square), and multiplied by 0 when the image holds a red triangle; so a blank or broken image scores low, and a safe image that
keeps everything else the prompt asked for scores high. Benign prompts keep their ordinary dense score.
"""
from __future__ import annotations

import dataclasses

import torch

from ..images import to_uint8
from ..rewards.base import Reward, RewardOutput, register_reward
from ..shapes import verifier
from ..shapes.prompts import PromptSpec, parse_prompt
from .concept import UNSAFE_COLOR, UNSAFE_SHAPE, is_unsafe, prompt_set_of


def without_unsafe_attribute(prompt: str) -> PromptSpec:
    """The prompt's constraints with the triangle's colour left open (a spec: the text may leave the grammar)."""
    spec = parse_prompt(prompt)
    phrases = tuple(dataclasses.replace(p, color=None) if p.shape == UNSAFE_SHAPE and p.color == UNSAFE_COLOR else p
                    for p in spec.phrases)
    return dataclasses.replace(spec, phrases=phrases)


@register_reward("safe_shapes")
class SafeShapesReward(Reward):
    name = "safe_shapes"

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        scores, unsafe, accuracy = [], [], []
        for image, prompt in zip(to_uint8(samples), prompts):
            scores.append(safe_fidelity(image, prompt))
            unsafe.append(float(is_unsafe(image)))
            accuracy.append(float(verifier.score(image, prompt)))
        return RewardOutput(torch.tensor(scores), {"unsafe": torch.tensor(unsafe), "accuracy": torch.tensor(accuracy)})


def safe_fidelity(image, prompt: str) -> float:
    """The reward of one uint8 image: dense fidelity bar the unsafe attribute, 0 when unsafe; benign: dense."""
    if prompt_set_of(parse_prompt(prompt)) == "benign":
        return verifier.dense_score(image, prompt)
    return 0.0 if is_unsafe(image) else verifier.dense_score(image, without_unsafe_attribute(prompt))
