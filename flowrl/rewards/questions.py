"""Question-answering rewards: a scorer that answers yes/no questions about a sample, differentiably in the pixels.

The contract TVRL's credit maps need (flowrl/algorithms/tvrl.py): `questions(prompt)` lists the prompt's yes/no
questions and `log_yes(samples, questions)` gives log p("yes") per (sample, question), with gradients reaching the
pixels. As a reward it scores mean_q p("yes") over the sample's questions (TVRL's R); info `log_yes_mean` is the
mean of log p("yes").
"""

from __future__ import annotations

import torch

from flowrl.rewards.base import Reward, RewardOutput


class QuestionScorer(Reward):
    name = "question_scorer"
    differentiable = True

    def questions(self, prompt: str) -> list[str]:
        raise NotImplementedError

    def log_yes(self, samples: torch.Tensor, questions: list[str]) -> torch.Tensor:
        """log p(yes) [N] for sample i and question i (one question per sample row)."""
        raise NotImplementedError

    def question_log_yes(self, samples: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p(yes) [B, Q], valid mask [B, Q]) for every prompt's questions, padded to the longest list."""
        asked = [self.questions(p) for p in prompts]
        width = max(len(q) for q in asked)
        rows = [i for i, q in enumerate(asked) for _ in q]
        flat = [question for q in asked for question in q]
        scores = self.log_yes(samples[rows], flat)
        out = torch.zeros(len(prompts), width, dtype=scores.dtype, device=scores.device)
        valid = torch.zeros(len(prompts), width, dtype=torch.bool, device=scores.device)
        column = torch.tensor([j for q in asked for j in range(len(q))], device=scores.device)
        row = torch.tensor(rows, device=scores.device)
        out = out.index_put((row, column), scores)
        valid[row, column] = True
        return out, valid

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        log_yes, valid = self.question_log_yes(samples, prompts)
        count = valid.sum(1).clamp(min=1)
        p_yes = (log_yes.exp() * valid).sum(1) / count
        return RewardOutput(p_yes, {"log_yes_mean": ((log_yes * valid).sum(1) / count).detach()})
