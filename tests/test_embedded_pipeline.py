"""The shipped default pipeline loads with plain diffusers and matches its model card."""
import json

import numpy as np
import pytest
import torch
from diffusers import StableDiffusion3Pipeline
from safetensors import safe_open

from conftest import REPO

FOLDER = REPO / "pipelines/shapes-sd3"


def test_loads_unmodified_with_from_pretrained_and_samples():
    pipe = StableDiffusion3Pipeline.from_pretrained(FOLDER, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    out = pipe("a red circle", height=32, width=32, num_inference_steps=4, guidance_scale=4.5,
               max_sequence_length=16, output_type="np", generator=torch.Generator().manual_seed(0))
    assert out.images.shape == (1, 32, 32, 3) and np.isfinite(out.images).all()


def test_weights_are_fp16_safetensors_and_small():
    files = list(FOLDER.rglob("*.safetensors"))
    assert {f.parent.name for f in files} == {"transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"}
    assert not list(FOLDER.rglob("*.bin"))
    for f in files:
        with safe_open(f, "pt") as weights:
            assert all(weights.get_tensor(k).dtype == torch.float16 for k in list(weights.keys())[:5])
    assert sum(f.stat().st_size for f in files) < 12e6


def test_model_card_reports_the_measured_band():
    scores = json.loads((FOLDER / "eval.json").read_text())
    assert 0.2 <= scores["overall"] <= 0.7  # follows prompts imperfectly, leaving room for RL
    card = (FOLDER / "README.md").read_text()
    assert f"{scores['overall']:.3f}" in card and "flowrl pretrain shapes" in card
