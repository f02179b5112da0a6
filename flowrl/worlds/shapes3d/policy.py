"""Shapes3DFlowPipeline adapter (image-to-3D or text-to-3D): latents are a set of shape tokens [B, K, C]; the
condition is an image (CFG against the all-zero image, as the pipeline samples) or, for a transformer with a
vocabulary, the prompt's words (CFG against the empty prompt); decoding queries the autoencoder's SDF on the world
grid.

A condition item's image comes from, in order: its inputs["image"] (uint8 [H, W, 3] array, float tensor [3, H, W]
in [0, 1], or a PIL image), its meta["image"] (a path to an image file, e.g. from a .jsonl prompt file), or, for a
prompt of the 3D shapes world's grammar, the render of the solid it names (meta "solid_seed", else a fixed one),
asked of the `shapes3d` task through the task registry (the adapter knows no world itself).
"""

from __future__ import annotations

import torch

from flowrl.images import item_image
from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, FlowPolicy, SampleSpec

# nn.MultiheadAttention calls its projections' weights directly (no forward of out_proj), so LoRA goes on the
# Linear layers that are called: the MLPs and the adaLN modulation of every block
SHAPES3D_LORA_TARGETS = ["mlp.0", "mlp.2", "modulation"]


def condition_image(item, size: int) -> torch.Tensor:
    """The item's condition image as float [3, size, size] in [0, 1] (see the module docstring)."""
    return item_image(item, "image", "shapes3d", "an image-to-3D pipeline", size)


@POLICIES.register("Shapes3DFlowPipeline")
class Shapes3DPolicy(FlowPolicy):
    family = "shapes3d"
    modality = "3d"
    lora_targets = SHAPES3D_LORA_TARGETS
    grid_resolution = 32  # SDF grid the decoder is queried on (rewards, metrics, meshes)

    def __init__(self, pipeline, max_sequence_length: int | None = None):
        super().__init__(pipeline, max_sequence_length)
        pipeline.autoencoder.requires_grad_(False)

    def text_encoders(self) -> list[torch.nn.Module]:
        return []

    def encode(self, conditions: list, guidance_scale: float, spec: SampleSpec | None = None) -> Conditioning:
        """The condition images at the model's own image size, or the prompts' word ids for a text-to-3D model (a
        shape field's grid `spec` does not change them)."""
        from flowrl.errors import UserError
        from flowrl.tasks.base import Condition

        items = [c if isinstance(c, Condition) else Condition(c) for c in conditions]
        if self.transformer.condition == "text":
            try:
                tensors = {"words": self.transformer.word_ids([item.prompt for item in items]).to(self.device)}
            except ValueError as error:
                raise UserError(f"{error} (a text-to-3D pipeline reads prompts of the 3D shapes world)") from None
        else:
            size = self.transformer.config.image_size
            images = torch.stack([condition_image(item, size) for item in items])
            tensors = {"image": images.to(self.device, self.dtype)}
        negative = {k: torch.zeros_like(v) for k, v in tensors.items()} if self.uses_cfg(guidance_scale) else {}
        return Conditioning(tensors, negative, [item.prompt for item in items], items)

    def default_spec(self) -> SampleSpec:
        return SampleSpec(self.grid_resolution, self.grid_resolution)

    size_multiple = 1  # the spec is the SDF grid's resolution, not pixels

    def sample_spec(self, height, width, num_frames, names=("pipeline.height", "pipeline.width")):
        """The grid it decodes (grid_resolution cubed); a size asked for is a UserError unless it is that grid."""
        from flowrl.errors import UserError

        for name, side in zip(names, (height, width)):
            if side is not None and side != self.grid_resolution:
                raise UserError(
                    f"{name}: {side}; {type(self.pipeline).__name__} samples SDF grids of "
                    f"{self.grid_resolution}^3: leave it unset (or {self.grid_resolution})"
                )
        return self.default_spec()

    def noise_shape(self, spec: SampleSpec) -> tuple[int, ...]:
        config = self.transformer.config
        return (config.num_tokens, config.latent_channels)

    def _forward(self, latents, sigma, tensors, guidance_scale):
        if "words" in tensors:
            return self.net()(latents, sigma * 1000, words=tensors["words"])
        return self.net()(latents, sigma * 1000, tensors["image"].to(latents.dtype))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """SDF grids [B, R, R, R] (R = grid_resolution) of normalised latent tokens; not differentiable (marching
        cubes and the geometric rewards are not)."""
        autoencoder = self.pipeline.autoencoder
        tokens = autoencoder.denormalise(latents.to(autoencoder.dtype))
        return autoencoder.sdf_grid(tokens, self.grid_resolution).float()
