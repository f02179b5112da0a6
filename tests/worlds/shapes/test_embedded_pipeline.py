"""The shipped default pipelines load with plain diffusers and match their model cards."""

import json

import numpy as np
import pytest
import torch
from conftest import REPO
from diffusers import StableDiffusion3Pipeline, StableDiffusionPipeline
from safetensors import safe_open

DEFAULTS = {
    "shapes-sd3": (
        StableDiffusion3Pipeline,
        {"max_sequence_length": 16},
        {"transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"},
        "flowrl pretrain shapes",
    ),
    "shapes-sd": (StableDiffusionPipeline, {}, {"unet", "vae", "text_encoder"}, "flowrl pretrain shapes-sd"),
}


@pytest.mark.parametrize("name", DEFAULTS)
def test_loads_unmodified_with_from_pretrained_and_samples(name):
    """As the model card shows it: no torch_dtype (transformers 5 would load the fp16 text encoders as stored, beside
    diffusers' fp32 denoiser, and the first call would fail on mixed dtypes)."""
    cls, kwargs, _, _ = DEFAULTS[name]
    pipe = cls.from_pretrained(REPO / "pipelines" / name)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        "a red circle",
        height=32,
        width=32,
        num_inference_steps=4,
        guidance_scale=4.5,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **kwargs,
    )
    assert out.images.shape == (1, 32, 32, 3) and np.isfinite(out.images).all()


def test_every_shipped_transformers_component_loads_in_fp32_by_default():
    folders = [f for f in (REPO / "pipelines").iterdir() if (f / "model_index.json").is_file()]
    components = [
        folder / name
        for folder in folders
        for name, spec in json.loads((folder / "model_index.json").read_text()).items()
        if isinstance(spec, list) and spec[0] == "transformers" and (folder / name / "config.json").is_file()
    ]
    assert len(components) >= 7
    for config in [c / "config.json" for c in components] + [REPO / "pipelines/shapes-scorer/config.json"]:
        assert json.loads(config.read_text())["dtype"] == "float32", config


@pytest.mark.parametrize("name", DEFAULTS)
def test_weights_are_fp16_safetensors_and_small(name):
    folder = REPO / "pipelines" / name
    files = list(folder.rglob("*.safetensors"))
    assert {f.parent.name for f in files} == DEFAULTS[name][2]
    assert not list(folder.rglob("*.bin"))
    for f in files:
        with safe_open(f, "pt") as weights:
            assert all(weights.get_tensor(k).dtype == torch.float16 for k in list(weights.keys())[:5])
    assert sum(f.stat().st_size for f in files) < 12e6


@pytest.mark.parametrize("name", DEFAULTS)
def test_model_card_reports_the_measured_band(name):
    folder = REPO / "pipelines" / name
    scores = json.loads((folder / "eval.json").read_text())
    assert 0.2 <= scores["overall"] <= 0.7  # follows prompts imperfectly, leaving room for RL
    card = (folder / "README.md").read_text()
    assert f"{scores['overall']:.3f}" in card and DEFAULTS[name][3] in card


def _pooled_at_eos(model, tokenizer, prompts):
    """The text model's pooled output and its last hidden state at each prompt's <eos>."""
    ids = tokenizer(prompts, padding="max_length", max_length=16, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model(input_ids=ids)
    eos = (ids == tokenizer.eos_token_id).int().argmax(-1)
    return out.pooler_output, out.last_hidden_state[torch.arange(len(prompts)), eos]


def test_clip_text_encoders_built_here_pool_the_eos_token():
    """transformers' CLIP text model pools the highest-id token, not <eos>, when its config's eos_token_id is 2 (a
    legacy rule); the project's word-level vocabulary must keep <eos> off id 2, or "two circles" and "two squares"
    pool at the same word."""
    from tiny_pipelines import TINY_SHAPES, tiny_flux

    from flowrl.worlds.shapes.model_scorer import build_scorer, scorer_tokenizer
    from flowrl.worlds.shapes.model_sd3 import build_text_encoder
    from flowrl.worlds.shapes.tokenizer import build_tokenizer
    from flowrl.worlds.shapes_edit.model_kontext import ShapesKontextSize, build_text_encoders

    prompts = ["two circles", "two squares", "a yellow circle left of a red square"]
    tokenizer = build_tokenizer()
    models = [
        build_text_encoder(TINY_SHAPES, 0),
        build_scorer(),
        build_text_encoders(ShapesKontextSize(), 0)[0],
        tiny_flux().text_encoder,
    ]
    assert scorer_tokenizer().eos_token_id == tokenizer.eos_token_id != 2
    for model in models:  # the transformer itself (CLIPTextModel is one in transformers 5)
        model = getattr(model, "text_model", model)
        pooled, at_eos = _pooled_at_eos(model.eval(), tokenizer, prompts)
        torch.testing.assert_close(pooled, at_eos)
        assert not torch.allclose(pooled[0], pooled[1])


def test_a_saved_recipe_pipeline_loads_in_fp32_without_torch_dtype(tmp_path):
    from tiny_pipelines import tiny_shapes_sd3

    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline

    save_pipeline(tiny_shapes_sd3().to(torch.float16), tmp_path, {})
    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path)
    assert {c.dtype for c in (pipe.text_encoder, pipe.text_encoder_3, pipe.transformer)} == {torch.float32}
    assert pipe(
        "a circle", height=32, width=32, num_inference_steps=1, max_sequence_length=16, output_type="np"
    ).images.shape == (1, 32, 32, 3)
