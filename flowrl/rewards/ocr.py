"""OCR reward (Flow-GRPO's): how exactly a sample shows the text its prompt quotes, read by PP-OCRv4.

The text is what the prompt holds between the first pair of double quotes; the reading is every recognised line
joined. Both are lower-cased with spaces removed, and r = 1 - min(d, n) / n with d their Levenshtein distance and n
the target's length (1: the text is right; 0: nothing of it), d = 0 where the reading contains the target (as
Flow-GRPO's flow_grpo/ocr.py). The detector and recogniser weights ship inside the
`rapidocr-onnxruntime` wheel (`pip install -e ".[ocr]"`), so the reward is real offline. Not differentiable.
"""

from __future__ import annotations

import torch

from flowrl.errors import ConfigError
from flowrl.images import to_uint8
from flowrl.rewards.base import Reward, RewardOutput, register_reward


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def quoted_text(prompt: str) -> str | None:
    """The text between the prompt's first pair of double quotes, or None."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else None


def text_score(read: str, target: str) -> float:
    read, target = read.replace(" ", "").lower(), target.replace(" ", "").lower()
    if not target:
        return 0.0
    if target in read:  # Flow-GRPO's rule: the text shown among other text counts as right
        return 1.0
    return 1 - min(levenshtein(read, target), len(target)) / len(target)


@register_reward("ocr")
class OCRReward(Reward):
    name = "ocr"

    def __init__(self):
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError:
            raise ConfigError('reward ocr: needs rapidocr-onnxruntime (pip install -e ".[ocr]")') from None
        self.engine = RapidOCR()

    def read(self, image) -> str:
        lines, _ = self.engine(image)
        return "".join(text for _, text, confidence in (lines or []) if float(confidence) > 0)

    def __call__(self, samples, prompts, meta=None) -> RewardOutput:
        scores = []
        for image, prompt in zip(to_uint8(samples), prompts):
            target = quoted_text(prompt)
            scores.append(0.0 if target is None else text_score(self.read(image), target))
        return RewardOutput(torch.tensor(scores, dtype=torch.float32))
