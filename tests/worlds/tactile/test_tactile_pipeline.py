"""The visual-to-tactile generator: a real StableDiffusionXLControlNetPipeline with two ControlNets that round-trips
through save_pretrained / from_pretrained, and a tokenizer that knows every word of every description."""

import itertools
import math

import torch
from diffusers import MultiControlNetModel, StableDiffusionXLControlNetPipeline

from flowrl.worlds.tactile.materials import KINDS, Material
from flowrl.worlds.tactile.pipeline import build_pipeline


def draw_tactile(pipe, description: str, rgb: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
    """A 2-step 32 px tactile image from the camera image and depth controls, seed 0."""
    return pipe(
        description,
        image=[rgb, depth],
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images


def test_every_description_tokenizes_without_unknown_words():
    tokenizer = build_pipeline().tokenizer
    unknown = tokenizer.convert_tokens_to_ids("<unk>")
    for kind, frequency, degrees, roughness in itertools.product(KINDS, (3, 6, 10), (0, 45, 90), (0.1, 0.9)):
        text = Material(kind, frequency, math.radians(degrees), 0.3, roughness).description()
        ids = tokenizer(text, padding="max_length", max_length=tokenizer.model_max_length).input_ids
        assert unknown not in ids and len(ids) == tokenizer.model_max_length, text


def test_the_generator_round_trips_and_reads_both_controls(tmp_path):
    pipe = build_pipeline(seed=1)
    assert isinstance(pipe.controlnet, MultiControlNetModel) and len(pipe.controlnet.nets) == 2
    depth_net, g = pipe.controlnet.nets[1], torch.Generator().manual_seed(2)
    with torch.no_grad():  # a ControlNet starts with zero convolutions in and out (no effect); open the depth one's
        for module in (depth_net.controlnet_cond_embedding.conv_out, depth_net.controlnet_mid_block):
            for param in module.parameters():
                param.normal_(0, 0.2, generator=g)
    rgb, depth = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)

    def draw(p, depth_image):
        return draw_tactile(p, "woven, fine pitch, diagonal, soft, low friction", rgb, depth_image)

    first = draw(pipe, depth)
    pipe.save_pretrained(tmp_path / "tactile")
    again = StableDiffusionXLControlNetPipeline.from_pretrained(tmp_path / "tactile")
    assert isinstance(again.controlnet, MultiControlNetModel)
    assert first.shape == (1, 3, 32, 32) and torch.equal(first, draw(again, depth))
    assert not torch.equal(first, draw(again, 1 - depth))  # the depth control reaches the sample


def test_the_task_serves_its_pairs_as_conditions_and_splits_materials():
    from flowrl.tasks.base import build_task
    from flowrl.worlds.tactile.scenes import combination, world_pairs

    task = build_task("tactile")
    evaluation = task.condition_set("eval").items
    assert len(evaluation) == 64
    item = evaluation[0]
    assert item.inputs["rgb"].shape == (32, 32, 3) and item.inputs["depth"].dtype.name == "uint8"
    pair = world_pairs("eval", 1)[0]
    assert item.prompt == pair.description and item.meta["pair_seed"] == pair.meta["seed"]
    train_combos = {combination(p.material) for p in world_pairs("train", 64)}
    assert not train_combos & {combination(p.material) for p in world_pairs("eval")}
