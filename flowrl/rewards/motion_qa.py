"""`moving_shapes_qa`: the project's moving-shapes question scorer as a reward (mean over a prompt's sub-prompts of
p(yes)), differentiable in the pixels; TVRL takes its credit maps from it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from .base import register_reward
from .clip import require_local_folder
from .questions import QuestionScorer

DEFAULT_QA = Path(__file__).resolve().parents[2] / "pipelines" / "shapes-motion-qa"


@register_reward("moving_shapes_qa")
class MovingShapesQA(QuestionScorer):
    name = "moving_shapes_qa"
    modalities = ("video",)

    def __init__(self, path: str | None = None):
        from ..models.motion_qa import load_model

        folder = require_local_folder(
            path or DEFAULT_QA,
            "moving_shapes_qa",
            "the project ships it in pipelines/shapes-motion-qa (`flowrl pretrain motion-qa` rebuilds it)",
        )
        self.model, self.tokenizer = load_model(folder)

    def questions(self, prompt: str) -> list[str]:
        from ..motion.prompts import parse_prompt, sub_prompts

        return sub_prompts(parse_prompt(prompt))

    def log_yes(self, samples: torch.Tensor, questions: list[str]) -> torch.Tensor:
        from ..models.motion_qa import tokenize

        if samples.ndim != 5:
            raise ConfigError("reward moving_shapes_qa: expected videos [B, 3, F, H, W]")
        device = next(self.model.parameters()).device
        logits = self.model(samples.to(device).float(), *tokenize(self.tokenizer, questions, device))
        return torch.nn.functional.logsigmoid(logits)
