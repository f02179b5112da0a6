"""The image-to-3D (and text-to-3D) pipeline's models round-trip through diffusers' save_pretrained /
DiffusionPipeline.from_pretrained and produce latents, SDF grids and meshes of the right shapes."""

import numpy as np
import pytest
import torch
from conftest import REPO
from diffusers import DiffusionPipeline
from tiny_pipelines import tiny_shapes3d as tiny_pipeline

from flowrl.worlds.shapes3d.pipeline import (
    ShapeAutoencoder,
    ShapeFlowTransformer,
    Shapes3DFlowPipeline,
    fourier_features,
)


def test_round_trip_through_diffusers(tmp_path):
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path)
    loaded = DiffusionPipeline.from_pretrained(tmp_path)
    assert type(loaded) is Shapes3DFlowPipeline and loaded.autoencoder.config.latents_std == [2.0] * 4
    image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    outputs = [
        p(
            image,
            num_inference_steps=3,
            guidance_scale=2.0,
            generator=torch.Generator().manual_seed(0),
            resolution=16,
            output_type="sdf",
        )
        for p in (pipe, loaded)
    ]
    torch.testing.assert_close(outputs[0].latents, outputs[1].latents)
    torch.testing.assert_close(outputs[0].sdf, outputs[1].sdf)
    assert outputs[0].latents.shape == (2, 8, 4) and outputs[0].sdf.shape == (2, 16, 16, 16)


def test_the_pipeline_loads_and_decodes_in_half_precision_as_in_fp32(tmp_path):
    """Saved in fp16 as the shipped one is, the pipeline loads with dtype=float16 or bfloat16 and decodes (it fed
    fp32 latents to half-precision weights); the Fourier features stay fp32 (in bf16, angles near 32 pi round by 0.5
    rad), so a half-precision model's field is its fp32 field to half-precision rounding."""
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    full = pipe(
        image, num_inference_steps=2, generator=torch.Generator().manual_seed(0), resolution=16, output_type="sdf"
    ).sdf
    for dtype in (torch.float16, torch.bfloat16):
        half = DiffusionPipeline.from_pretrained(tmp_path, dtype=dtype)
        sdf = half(
            image, num_inference_steps=2, generator=torch.Generator().manual_seed(0), resolution=16, output_type="sdf"
        ).sdf
        assert sdf.dtype == torch.float32 and (sdf - full).abs().max() < 0.05 * full.abs().max()
    points = torch.tensor([[0.93, -0.71, 0.88]])
    assert fourier_features(points.bfloat16(), 6).dtype == torch.float32
    torch.testing.assert_close(fourier_features(points.bfloat16(), 6), fourier_features(points.bfloat16().float(), 6))


def test_meshes_come_from_the_decoded_field():
    pipe = tiny_pipeline()
    with torch.no_grad():  # make the decoder a sphere of radius 0.5 whatever the latents: |x| - 0.5
        pipe.autoencoder.decode = lambda latents, q: q.norm(dim=-1) - 0.5
    out = pipe(np.zeros((32, 32, 3), np.uint8), num_inference_steps=2, resolution=32)
    mesh = out.meshes[0]
    assert mesh.is_watertight and abs(mesh.volume - 4 / 3 * np.pi * 0.125) < 0.02


def test_encoder_and_decoder_shapes_and_normalisation():
    ae = tiny_pipeline().autoencoder
    points = torch.rand(3, 50, 3) * 2 - 1
    z = ae.encode(points)
    assert z.shape == (3, 8, 4)
    torch.testing.assert_close(ae.denormalise(ae.normalise(z)), z)
    assert ae.decode(z, points[:, :7]).shape == (3, 7)
    assert fourier_features(points, 3).shape == (3, 50, 21)


def test_a_tiny_pretrain_run_saves_a_pipeline_that_evaluates(tmp_path):
    from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
    from flowrl.worlds.shapes3d.pretrain import Shapes3DPretrainConfig, Shapes3DSize, evaluate_3d, pretrain_shapes3d
    from flowrl.worlds.shapes3d.prompts import eval_prompt_set

    cfg = Shapes3DPretrainConfig(
        ae_steps=2, ae_batch=4, surface_points=64, query_points=64, flow_steps=2, flow_batch=4, flow_pool=8, threads=1
    )
    size = Shapes3DSize(
        num_tokens=4,
        latent_channels=4,
        ae_width=16,
        ae_heads=2,
        ae_decoder_layers=1,
        fourier_bands=2,
        width=16,
        heads=2,
        layers=1,
    )
    pipe, facts = pretrain_shapes3d(cfg, size)
    assert len(pipe.autoencoder.config.latents_std) == 4 and facts["total_minutes"] > 0
    save_pipeline(pipe, tmp_path, facts)
    loaded = DiffusionPipeline.from_pretrained(tmp_path, torch_dtype=torch.float32)
    prompts = eval_prompt_set()[:2]
    result = evaluate_3d(loaded, prompts, num_per_prompt=1, num_steps=2, resolution=16)
    assert set(result["overall"]) >= {"iou", "chamfer", "fscore", "valid"}
    assert 0 <= result["overall"]["iou"] <= 1 and sum(result["counts"].values()) == 2


def test_a_pretrain_stopped_mid_flow_continues_to_the_uninterrupted_weights(tmp_path):
    """Stopped after the autoencoder stage and 2 of 4 flow steps, the recipe run again on its progress loads the
    autoencoder (its latent statistics and the random streams where it left them), draws the same pool and ends on the
    weights and loss of an uninterrupted run."""
    from dataclasses import asdict

    from run_helpers import assert_same_weights, stopped_then_continued

    from flowrl.worlds.shapes3d.pretrain import Shapes3DPretrainConfig, Shapes3DSize, pretrain_shapes3d

    cfg = Shapes3DPretrainConfig(
        ae_steps=2, ae_batch=4, surface_points=64, query_points=64, flow_steps=4, flow_batch=4, flow_pool=8, threads=1
    )
    size = Shapes3DSize(
        num_tokens=4, latent_channels=4, ae_width=16, ae_heads=2, ae_decoder_layers=1, fourier_bands=2, width=16,
        heads=2, layers=1,
    )  # fmt: skip
    whole, whole_facts = pretrain_shapes3d(cfg, size)
    settings = {"recipe": "shapes3d", "config": asdict(cfg)}
    saved, (resumed, facts) = stopped_then_continued(
        lambda progress: pretrain_shapes3d(cfg, size, progress=progress),
        tmp_path / "progress",
        settings,
        stage="pretrain 3D flow",
        step=2,
    )
    assert saved == {"shape_autoencoder.pt", "pretrain_3D_flow.pt"}
    for name in ("autoencoder", "transformer"):  # bit for bit
        assert_same_weights(getattr(whole, name).state_dict(), getattr(resumed, name).state_dict(), tolerance=0)
    assert resumed.autoencoder.config.latents_std == whole.autoencoder.config.latents_std
    assert facts["flow_final_loss"] == whole_facts["flow_final_loss"]
    assert facts["ae_final_l1"] == whole_facts["ae_final_l1"] and "latent_statistics" not in facts


def test_a_tiny_text_pretrain_on_a_saved_autoencoder_reads_prompts(tmp_path):
    """condition="text": the autoencoder is the saved one, unchanged; the transformer reads the grammar's words;
    evaluation samples from the prompts."""
    from flowrl.worlds.shapes3d.pretrain import Shapes3DPretrainConfig, Shapes3DSize, evaluate_3d, pretrain_shapes3d
    from flowrl.worlds.shapes3d.prompts import eval_prompt_set

    tiny_pipeline().save_pretrained(tmp_path / "image")
    cfg = Shapes3DPretrainConfig(
        surface_points=64,
        flow_steps=2,
        flow_batch=4,
        flow_pool=8,
        threads=1,
        condition="text",
        autoencoder=str(tmp_path / "image"),
    )
    pipe, facts = pretrain_shapes3d(cfg, Shapes3DSize(width=16, heads=2, layers=1))
    saved = ShapeAutoencoder.from_pretrained(tmp_path / "image", subfolder="autoencoder")
    assert facts["ae_minutes"] == 0 and pipe.autoencoder.config.latents_std == saved.config.latents_std
    torch.testing.assert_close(pipe.autoencoder.head[1].weight.float(), saved.head[1].weight, atol=1e-3, rtol=1e-3)
    assert pipe.transformer.condition == "text" and not hasattr(pipe.transformer, "image_in")
    pipe.to(torch.float32)
    result = evaluate_3d(pipe, eval_prompt_set()[:2], num_per_prompt=1, num_steps=2, resolution=16)
    assert sum(result["counts"].values()) == 2
    with pytest.raises(ValueError, match="text-to-3D"):
        pipe(np.zeros((32, 32, 3), np.uint8), num_inference_steps=1)


def test_a_text_transformer_reads_words_in_order_and_the_empty_prompt_is_padding():
    from flowrl.worlds.shapes3d.prompts import vocabulary

    words = vocabulary()
    model = ShapeFlowTransformer(num_tokens=4, latent_channels=4, width=16, heads=2, layers=1, vocabulary=words)
    ids = model.word_ids(["a cone on top of a box", "a box on top of a cone", ""])
    assert ids.shape == (3, 12) and ids[2].abs().sum() == 0 and (ids[0, 7:] == 0).all()
    assert words[ids[0, 1] - 1] == "cone" and words[ids[1, 1] - 1] == "box"  # 1-based: 0 is padding
    with pytest.raises(ValueError, match="'teapot'"):
        model.word_ids(["a teapot"])
    with torch.no_grad():
        model.out.weight.normal_(0, 0.1)
        x, t = torch.randn(3, 4, 4).expand(3, 4, 4), torch.full((3,), 500.0)
        v = model(x, t, words=ids)
    assert not torch.allclose(v[0], v[1])  # the same words in another order are another condition


@pytest.mark.parametrize("name", ["shapes3d-flow", "shapes3d-text"])
def test_the_shipped_pipelines_load_with_diffusers_and_match_their_cards(name):
    import json

    from safetensors import safe_open

    shipped = REPO / "pipelines" / name
    if not shipped.is_dir():
        pytest.skip(f"pipelines/{name} is made by `flowrl pretrain {name.replace('-flow', '')}`")
    files = list(shipped.rglob("*.safetensors"))
    assert {f.parent.name for f in files} == {"autoencoder", "transformer"}
    for f in files:
        with safe_open(f, "pt") as weights:
            assert all(weights.get_tensor(k).dtype == torch.float16 for k in list(weights.keys())[:5])
    assert sum(f.stat().st_size for f in files) < 12e6
    pipe = DiffusionPipeline.from_pretrained(shipped, torch_dtype=torch.float32)
    given = {"prompt": "a cone"} if name.endswith("text") else {"image": np.zeros((32, 32, 3), np.uint8)}
    out = pipe(**given, num_inference_steps=2, resolution=16, output_type="sdf")
    assert out.sdf.shape == (1, 16, 16, 16) and torch.isfinite(out.sdf).all()
    scores = json.loads((shipped / "eval.json").read_text())
    assert f"{scores['overall']['iou']:>10.3f}" in (shipped / "README.md").read_text()


def test_a_3d_policy_refuses_a_sample_size_other_than_its_grid():
    """`flowrl sample --height 64` on the 3D pipeline returned 32^3 grids recorded as 64: now one error."""
    from flowrl.errors import UserError
    from flowrl.policies import policy_for

    policy = policy_for(tiny_pipeline())
    grid = policy.grid_resolution
    assert policy.sample_spec(None, None, None) == policy.default_spec() == policy.sample_spec(grid, grid, None)
    with pytest.raises(UserError, match=rf"--height: {2 * grid}; .* samples SDF grids of {grid}\^3"):
        policy.sample_spec(2 * grid, None, None, ("--height", "--width"))


def test_the_text_recipe_refuses_autoencoder_steps_it_would_ignore(tmp_path):
    from run_helpers import run_flowrl

    result = run_flowrl("pretrain", "shapes3d-text", "--out", str(tmp_path / "t"), "--vae-steps", "5")
    assert (
        result.returncode == 2 and result.stderr.count("--vae-steps") == 1 and "reuses shapes3d-flow" in result.stderr
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "t").exists()
