"""The moving-shapes world's rewards: `moving_shapes` (the clip verifier, dense or binary) and `moving_shapes_qa`, the
project's moving-shapes question scorer as a reward (mean over a prompt's sub-prompts of
p(yes)), differentiable in the pixels; TVRL takes its credit maps from it."""

from __future__ import annotations

from pathlib import Path

import torch

from flowrl.errors import ConfigError
from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, register_reward
from flowrl.rewards.clip import require_local_folder
from flowrl.rewards.questions import QuestionScorer
from flowrl.worlds.moving_shapes.verifier import judge_clip

DEFAULT_QA = Path(__file__).resolve().parents[3] / "pipelines" / "shapes-motion-qa"


@register_reward("moving_shapes")
class MovingShapesReward(Reward):
    """The moving-shapes video verifier: dense (fraction of the prompt's constraints met) or the binary verdict."""

    name = "moving_shapes"
    modalities = ("video",)

    def __init__(self, dense: bool = True):
        self.dense = dense

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        judged = [judge_clip(clip, p) for clip, p in zip(to_uint8(samples), prompts)]
        binary = torch.tensor([verdict for verdict, _ in judged])
        dense = torch.tensor([value for _, value in judged])
        return RewardOutput(dense if self.dense else binary, {"accuracy": binary})


@register_reward("moving_shapes_qa")
class MovingShapesQA(QuestionScorer):
    name = "moving_shapes_qa"
    modalities = ("video",)

    def __init__(self, path: str | None = None):
        from flowrl.worlds.moving_shapes.model_qa import load_model

        folder = require_local_folder(
            path or DEFAULT_QA,
            "moving_shapes_qa",
            "the project ships it in pipelines/shapes-motion-qa (`flowrl pretrain motion-qa` rebuilds it)",
        )
        self.model, self.tokenizer = load_model(folder)

    def questions(self, prompt: str) -> list[str]:
        from flowrl.worlds.moving_shapes.prompts import parse_prompt, sub_prompts

        return sub_prompts(parse_prompt(prompt))

    def log_yes(self, samples: torch.Tensor, questions: list[str]) -> torch.Tensor:
        from flowrl.worlds.moving_shapes.model_qa import tokenize

        if samples.ndim != 5:
            raise ConfigError("reward moving_shapes_qa: expected videos [B, 3, F, H, W]")
        device = next(self.model.parameters()).device
        logits = self.model(samples.to(device).float(), *tokenize(self.tokenizer, questions, device))
        return torch.nn.functional.logsigmoid(logits)
