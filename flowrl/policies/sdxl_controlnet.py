"""StableDiffusionXLControlNetPipeline adapter: SDXL's epsilon-prediction UNet, sampled with DDIM (SDPolicy's steps),
guided by the pipeline's ControlNet (or MultiControlNetModel) reading per-sample control images.

Conditioning: both text encoders' hidden states side by side and the second one's pooled embedding, SDXL's six size
ids (original size, crop (0, 0), target size: the sample's), and the control images, one input per ControlNet in the
order `controls` names them (from each condition's `inputs`, uint8 [H, W, 3] or float [3, H, W] in [0, 1], resized to
the sample as condition images are), each at
conditioning scale `control_scales[i]`. The ControlNets are frozen: RL adapts the UNet, as the pipeline's UNet LoRAs
do. Deviation from the pipeline's own call: no control guidance window (every step takes every control) and no
guess mode.
"""

from __future__ import annotations

import torch

from flowrl.images import as_image_batch, resized
from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.policies.sd import SDPolicy


@POLICIES.register("StableDiffusionXLControlNetPipeline")
class SDXLControlNetPolicy(SDPolicy):
    family = "sdxl-controlnet"
    controls: tuple[str, ...] = ("rgb", "depth")  # the condition inputs the ControlNets read, in their order
    control_scales: tuple[float, ...] = (1.0, 1.0)

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        super().__init__(pipeline, max_sequence_length)
        pipeline.controlnet.requires_grad_(False)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        cfg = self.uses_cfg(guidance_scale)
        embeds, neg, pooled, neg_pooled = self.pipeline.encode_prompt(
            prompts,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=cfg,
            negative_prompt=[""] * len(prompts) if cfg else None,
        )
        negative = {"embeds": neg, "pooled": neg_pooled} if cfg else {}
        return Conditioning({"embeds": embeds, "pooled": pooled}, negative, list(prompts))

    def encode_inputs(self, cond: Conditioning, items: list, spec: SampleSpec | None = None) -> Conditioning:
        from flowrl.errors import UserError

        size = (spec.height, spec.width) if spec is not None else None
        for name in self.controls:
            images = []
            for item in items:
                if name not in item.inputs:
                    raise UserError(
                        f"prompt {item.prompt!r} has no {name!r} input; {type(self.pipeline).__name__} reads "
                        f"{', '.join(self.controls)}"
                    )
                image = as_image_batch(item.inputs[name])[0]
                images.append(resized(image, *size) if size else image)
            stacked = torch.stack(images).to(self.device)
            cond.tensors[name] = stacked
            if cond.negative:
                cond.negative[name] = stacked
        return cond

    def _forward(self, latents, timestep, tensors, guidance_scale):
        embeds = tensors["embeds"].to(latents.dtype)
        height, width = (side * self.pipeline.vae_scale_factor for side in latents.shape[-2:])
        time_ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=embeds.dtype, device=latents.device)
        extra = {"text_embeds": tensors["pooled"].to(latents.dtype), "time_ids": time_ids.expand(len(latents), -1)}
        images = [tensors[name].to(latents.dtype) for name in self.controls]
        down, mid = self.pipeline.controlnet(
            latents,
            timestep,
            encoder_hidden_states=embeds,
            controlnet_cond=images if len(images) > 1 else images[0],
            conditioning_scale=list(self.control_scales) if len(images) > 1 else self.control_scales[0],
            added_cond_kwargs=extra,
            return_dict=False,
        )
        out = self.net()(
            latents,
            timestep,
            encoder_hidden_states=embeds,
            added_cond_kwargs=extra,
            down_block_additional_residuals=down,
            mid_block_additional_residual=mid,
            return_dict=False,
        )[0]
        return self.as_epsilon(out, latents, timestep)
