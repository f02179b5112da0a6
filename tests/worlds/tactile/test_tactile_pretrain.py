"""The tactile generator's recipe, in miniature: both stages run, the ControlNets learn to read their controls (their
zero-initialised convolutions move, so the depth image changes the sample), and the result loads as saved."""

import dataclasses

import torch
from diffusers import StableDiffusionXLControlNetPipeline
from test_tactile_pipeline import draw_tactile

from flowrl.worlds.tactile.pretrain import TactilePretrainConfig, pretrain_tactile


def test_a_few_steps_of_the_recipe_make_a_generator_whose_controls_matter(tmp_path):
    cfg = TactilePretrainConfig(
        vae_steps=3, vae_batch=4, flow_steps=6, flow_batch=4, warmup_steps=2, pool=12, flow_lr=5e-3
    )
    pipe, facts = pretrain_tactile(cfg)
    assert facts["denoiser_final_loss"] > 0 and facts["config"] == dataclasses.asdict(cfg)
    assert pipe.vae.config.shift_factor is None  # SDXL pipelines decode with the scale alone
    depth_net = pipe.controlnet.nets[1]
    assert depth_net.controlnet_cond_embedding.conv_out.weight.abs().max() > 0  # zero-initialised, now trained
    pipe.to(torch.float32).save_pretrained(tmp_path / "tactile")
    again = StableDiffusionXLControlNetPipeline.from_pretrained(tmp_path / "tactile")
    rgb, depth = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)

    def draw(depth_image):
        return draw_tactile(again, "ridged, fine pitch, vertical, rough, high friction", rgb, depth_image)

    assert not torch.equal(draw(depth), draw(1 - depth))
