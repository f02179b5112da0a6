"""QwenImageEditPipeline and QwenImageEditPlusPipeline adapters (Qwen-Image-Edit, -2509, -2511: instruction-based
editing on Qwen-Image's transformer).

The source image enters twice. Qwen2.5-VL reads it beside the instruction, so a prompt's embeddings depend on its
source: they are encoded per (instruction, source) pair, and the embedding cache keys on both. Its VAE latents go in
as packed tokens after the sample's (both listed in img_shapes; -2511's zero_cond_t marks them inside the
transformer), and the output keeps the sample's tokens. Guidance (norm-rescaled true CFG against " ", read with the
same source), the schedule and decoding are Qwen-Image's.

Deviation, as for FLUX Kontext: the VAE takes the source at the run's sample size (the pipelines take it at about
1024x1024 and make the output that size), so sources of any size share a batch and memory follows the size a run
sets. The reader (Qwen2.5-VL) sees the source as the pipeline shows it: resized with the pipeline's own image
processor to its area (1024x1024 for Qwen-Image-Edit, 384x384 for the Plus pipeline), from the original image.
`pipeline.max_sequence_length` has no effect here: the pipelines do not cut the prompt either.
"""
from __future__ import annotations

import hashlib
import importlib

import torch
import torch.nn.functional as F

from . import POLICIES
from .base import Conditioning, SampleSpec
from .qwen_image import QwenImagePolicy
from .wan import wan_vae_encode


@POLICIES.register("QwenImageEditPipeline")
class QwenImageEditPolicy(QwenImagePolicy):
    family = "qwen_image_edit"
    source_input = "source_image"
    source_world = "shapes_edit"
    reader_area = 1024 * 1024  # the area Qwen2.5-VL reads the source at: the pipeline's own (calculate_dimensions)
    pipeline_module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit"  # whose calculate_dimensions sizes it

    @property
    def patch_pixels(self) -> int:
        """Pixels per packed token's side: a source's sides must be multiples of this."""
        return self.pipeline.vae_scale_factor * 2

    @torch.no_grad()
    def encode(self, conditions: list, guidance_scale: float, spec: SampleSpec | None = None) -> Conditioning:
        """Condition items (an instruction and its source) -> the instruction read with the source (and, under CFG,
        " " read with it), padded and masked to one length, and the source's VAE latents as `image_latents`. Each
        distinct (instruction, source) is read once per call (a group's samples share one), and once per run with
        the embedding cache."""
        from ..images import resized
        from ..tasks.base import Condition

        items = [c if isinstance(c, Condition) else Condition(c) for c in conditions]
        found, rows = self.distinct_sources(items)  # a group repeats one item: resolve and hash it once
        hashed = [_digest(image) for image in found]
        originals, digests = [found[r] for r in rows], [hashed[r] for r in rows]
        if spec is None:  # the packing needs whole 2x2 patches of latents: the nearest size below that has them
            sources = self.stack_sources([resized(image, *(max(side - side % self.patch_pixels, self.patch_pixels)
                                                           for side in image.shape[-2:])) for image in originals])
        else:
            sources = self.stack_sources([resized(image, spec.height, spec.width) for image in originals])
        cfg = self.uses_cfg(guidance_scale)
        prompts = [(item.prompt, digest) for item, digest in zip(items, digests)]
        branches = [prompts, [(self.negative_prompt, digest) for digest in digests] if cfg else []]
        read = self._read(branches, dict(zip(digests, originals)))
        length = max(read[key][0].shape[0] for branch in branches for key in branch)

        def padded(branch):  # one branch's rows, padded (masked) to the common length
            rows = [read[key] for key in branch]
            return {"embeds": torch.stack([F.pad(embeds, (0, 0, 0, length - len(embeds))) for embeds, _ in rows]),
                    "mask": torch.stack([F.pad(mask, (0, length - len(mask))) for _, mask in rows])}

        cond = Conditioning(padded(branches[0]), padded(branches[1]) if cfg else {}, [item.prompt for item in items],
                            items)
        unique = list(dict.fromkeys(digests))  # the VAE encodes each distinct source once too
        latents = wan_vae_encode(self.pipeline.vae, sources[[digests.index(d) for d in unique]][:, :, None].to(
            self.device))[:, :, 0]
        cond.add_inputs({"image_latents": latents[[unique.index(d) for d in digests]]})
        return cond.to(self.device)

    def _read(self, branches: list[list[tuple[str, str]]], originals: dict) -> dict:
        """(prompt, source digest) -> (embeddings [L, D], mask [L]) on the host, for every pair of `branches`: from
        the embedding cache where it holds them, else read now, one pair per call (the Plus pipeline would take a
        list of images as one multi-image prompt)."""
        cache = getattr(self, "embedding_cache", None)
        read = {}
        with self._encode_lock:
            missing = [key for key in dict.fromkeys(k for branch in branches for k in branch)
                       if cache is None or key not in cache]
            if missing:
                with self.text_encoders_on_device():
                    for prompt, digest in missing:
                        read[(prompt, digest)] = self._read_one(prompt, originals[digest])
            if cache is not None:
                cache.update(read)
                read = {key: cache[key] for branch in branches for key in branch}
        return read

    def _read_one(self, prompt: str, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        from ..images import to_uint8

        image = Image.fromarray(to_uint8(source[None])[0])
        module = importlib.import_module(self.pipeline_module)  # the pipeline's calculate_dimensions, as it reads it
        width, height = module.calculate_dimensions(self.reader_area, image.width / image.height)[:2]
        image = self.pipeline.image_processor.resize(image, height, width)
        embeds, _ = self.pipeline.encode_prompt([prompt], image=image, device=self.device)
        embeds = embeds[0].cpu()
        return embeds, torch.ones(embeds.shape[0], dtype=torch.long)

    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        raise NotImplementedError("Qwen-Image-Edit reads each instruction with its source image: use `encode`")

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.packed_velocity(latents, sigma, tensors, context=tensors["image_latents"])


@POLICIES.register("QwenImageEditPlusPipeline")
class QwenImageEditPlusPolicy(QwenImageEditPolicy):
    """Qwen-Image-Edit-2509 / -2511: one source per instruction ("Picture 1: ..." in the pipeline's template), read
    at the Plus pipeline's condition area."""
    family = "qwen_image_edit_plus"
    reader_area = 384 * 384  # the Plus pipeline's CONDITION_IMAGE_SIZE
    pipeline_module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus"


def _digest(image: torch.Tensor) -> str:
    """A source image's identity for the reads and the cache: its size and pixels."""
    return hashlib.sha1(repr(tuple(image.shape)).encode() + image.numpy().tobytes()).hexdigest()
