"""The OCR reward with the real PP-OCRv4 weights from the rapidocr-onnxruntime wheel, on rendered text."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from flowrl.rewards import build_reward
from flowrl.rewards.ocr import levenshtein, text_score

pytest.importorskip("rapidocr_onnxruntime")  # the test extra installs it


def _render(text: str) -> torch.Tensor:
    image = Image.new("RGB", (256, 96), "white")
    ImageDraw.Draw(image).text((10, 20), text, fill="black", font=ImageFont.load_default(size=40))
    return torch.from_numpy(np.asarray(image)).permute(2, 0, 1).float() / 255


def test_edit_distance_and_score_by_hand():
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    assert text_score("Hello World", "helloworld") == 1.0
    assert text_score("hellx", "hello") == pytest.approx(0.8)
    assert text_score("something else entirely", "qz") == 0.0  # distance capped at the target's length
    # the target shown among other text is right (Flow-GRPO's rule), where the distance alone would read 0.25
    assert text_score("Grand OPEN today", "open") == 1.0


def test_right_text_scores_high_and_wrong_text_low():
    reward = build_reward("ocr")
    images = torch.stack([_render("HELLO 42"), _render("GOODBYE"), _render("HELLO 42")])
    prompts = ['a sign that says "hello 42"', 'a sign that says "hello 42"', "a sign with no quoted text"]
    scores = reward(images, prompts).scores
    assert scores[0] >= 0.9 and scores[1] <= 0.3 and scores[2] == 0.0
