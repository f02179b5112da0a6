"""QwenImageEditPipeline and QwenImageEditPlusPipeline adapters (Qwen-Image-Edit, -2509, -2511: instruction-based
editing on Qwen-Image's transformer).

The source image enters twice. Qwen2.5-VL reads it beside the instruction, so a prompt's embeddings depend on its
source: they are encoded per (instruction, source) pair, and the embedding cache keys on both. Its VAE latents go in
as packed tokens after the sample's (both listed in img_shapes; -2511's zero_cond_t marks them inside the
transformer), and the output keeps the sample's tokens. Guidance (norm-rescaled true CFG against " ", read with the
same source), the schedule and decoding are Qwen-Image's. The Plus pipeline also takes several images per
instruction (the source first): read together as one multi-image prompt, each image's tokens after the sample's.

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
        found, rows = self.distinct_references(items)  # a group repeats one item: resolve and hash it once
        hashed = [_digest(images) for images in found]
        originals, digests = [found[r] for r in rows], [hashed[r] for r in rows]
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
        # the VAE encodes each distinct item's images once too; `image_latents` [B, K, C, h, w] holds each row's
        # images first, zeros after (K: the most any row has), `reference_count` [B] how many are its own
        unique = list(dict.fromkeys(digests))
        images = [originals[digests.index(d)] for d in unique]
        if spec is None:  # the packing needs whole 2x2 patches of latents: the nearest size below that has them
            flat = [resized(image, *(max(side - side % self.patch_pixels, self.patch_pixels)
                                     for side in image.shape[-2:])) for group in images for image in group]
        else:
            flat = [resized(image, spec.height, spec.width) for group in images for image in group]
        encoded = wan_vae_encode(self.pipeline.vae, self.stack_sources(flat)[:, :, None].to(self.device))[:, :, 0]
        counts = [len(group) for group in images]
        latents = encoded.new_zeros(len(unique), max(counts), *encoded.shape[1:])
        for row, part in enumerate(encoded.split(counts)):
            latents[row, :len(part)] = part
        picked = [unique.index(d) for d in digests]
        cond.add_inputs({"image_latents": latents[picked], "reference_count": torch.tensor(counts)[picked]})
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

    def _read_one(self, prompt: str, sources: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """One instruction read with its images (several: one multi-image prompt, "Picture 1: ... Picture 2: ...",
        as the Plus pipeline reads a list), each resized to the reader's area as the pipeline resizes it."""
        from PIL import Image

        from ..images import to_uint8

        module = importlib.import_module(self.pipeline_module)  # the pipeline's calculate_dimensions, as it reads it
        shown = []
        for source in sources:
            image = Image.fromarray(to_uint8(source[None])[0])
            width, height = module.calculate_dimensions(self.reader_area, image.width / image.height)[:2]
            shown.append(self.pipeline.image_processor.resize(image, height, width))
        embeds, _ = self.pipeline.encode_prompt([prompt], image=shown if len(shown) > 1 else shown[0],
                                                device=self.device)
        embeds = embeds[0].cpu()
        return embeds, torch.ones(embeds.shape[0], dtype=torch.long)

    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        raise NotImplementedError("Qwen-Image-Edit reads each instruction with its source image: use `encode`")

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.by_reference_count(latents, sigma, tensors, lambda rows, sigma, references: self.packed_velocity(
            latents[rows], sigma, {k: v[rows] for k, v in tensors.items()}, context=references))


@POLICIES.register("QwenImageEditPlusPipeline")
class QwenImageEditPlusPolicy(QwenImageEditPolicy):
    """Qwen-Image-Edit-2509 / -2511: an instruction with one image or several ("Picture 1: ... Picture 2: ..." in the
    pipeline's template: a .jsonl line's `image` as a list, the source first), each read at the Plus pipeline's
    condition area and each going in as packed tokens after the sample's, in order."""
    family = "qwen_image_edit_plus"
    max_references = None  # the Plus pipeline takes a list
    reader_area = 384 * 384  # the Plus pipeline's CONDITION_IMAGE_SIZE
    pipeline_module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus"


def _digest(images: list[torch.Tensor]) -> str:
    """An item's images' identity for the reads and the cache: their sizes and pixels, in order."""
    digest = hashlib.sha1()
    for image in images:
        digest.update(repr(tuple(image.shape)).encode() + image.numpy().tobytes())
    return digest.hexdigest()
