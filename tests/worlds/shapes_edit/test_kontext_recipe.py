"""The shapes-kontext pretraining recipe: its training triples are the world's exact edits, and a whole tiny run
writes a FluxKontextPipeline that diffusers loads unmodified, around shapes-sd3's VAE left as it was."""

import numpy as np
import torch
from diffusers import FluxKontextPipeline
from PIL import Image

from flowrl.worlds.shapes.pretrain_sd3 import save_pipeline
from flowrl.worlds.shapes_edit.instructions import is_held_out, parse_instruction, train_instruction_set
from flowrl.worlds.shapes_edit.model_kontext import ShapesKontextSize, edit_vocabulary
from flowrl.worlds.shapes_edit.pretrain_kontext import KontextPretrainConfig, edit_triples, pretrain_shapes_kontext

TINY = ShapesKontextSize(num_layers=1, num_single_layers=1, num_heads=2, head_dim=16, text_hidden=16, text_layers=1)


def test_training_triples_are_exact_edits_and_held_out_instructions_only_when_asked():
    pairs, texts = edit_triples(12, np.random.default_rng(0))
    assert pairs.shape == (12, 2, 32, 32, 3)
    assert len({parse_instruction(t).kind for t in texts}) > 1
    # a quarter of all instructions are held out: 120 draws include some unless they are excluded
    _, everything = edit_triples(120, np.random.default_rng(2), held_out=True)
    assert any(is_held_out(parse_instruction(t)) for t in everything)
    _, train_only = edit_triples(120, np.random.default_rng(2))
    allowed = {t for texts_of_kind in train_instruction_set().values() for t in texts_of_kind}
    assert set(train_only) <= allowed
    vocabulary = set(edit_vocabulary())
    for (source, target), text in zip(pairs, texts):
        assert set(text.split()) <= vocabulary
        assert not np.array_equal(source, target)  # every edit changes the scene


def test_a_tiny_run_writes_an_editor_diffusers_loads(tmp_path):
    cfg = KontextPretrainConfig(flow_steps=2, flow_batch=4, warmup_steps=1, threads=1)
    pipe, facts = pretrain_shapes_kontext(cfg, size=TINY)
    assert np.isfinite(facts["flow_final_loss"]) and facts["vae_from"] == "pipelines/shapes-sd3"
    from diffusers import AutoencoderKL

    shipped = AutoencoderKL.from_pretrained("pipelines/shapes-sd3", subfolder="vae", torch_dtype=torch.float16)
    for (name, mine), theirs in zip(pipe.vae.state_dict().items(), shipped.state_dict().values()):
        assert torch.equal(mine, theirs), name  # the VAE is frozen: training leaves it as shipped
    save_pipeline(pipe, tmp_path, facts)
    loaded = FluxKontextPipeline.from_pretrained(tmp_path, torch_dtype=torch.float32)
    loaded.set_progress_bar_config(disable=True)
    pairs, texts = edit_triples(1, np.random.default_rng(1))
    out = loaded(
        image=Image.fromarray(pairs[0, 0]),
        prompt=texts[0],
        height=32,
        width=32,
        max_area=32 * 32,
        _auto_resize=False,
        num_inference_steps=2,
        max_sequence_length=16,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert out.shape == (1, 32, 32, 3) and np.isfinite(out).all()
