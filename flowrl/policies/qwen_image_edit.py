"""QwenImageEditPipeline and QwenImageEditPlusPipeline adapters (Qwen-Image-Edit, -2509, -2511: instruction-based
editing on Qwen-Image's transformer).

The source image enters twice. Qwen2.5-VL reads it beside the instruction, so a prompt's embeddings depend on its
source: they are encoded per (instruction, source) pair, and the embedding cache keys on both. Its VAE latents go in
as packed tokens after the sample's (both listed in img_shapes; -2511's zero_cond_t marks them inside the
transformer), and the output keeps the sample's tokens. Guidance (norm-rescaled true CFG against " ", read with the
same source), the schedule and decoding are Qwen-Image's. The Plus pipeline also takes several images per
instruction (the source first): read together as one multi-image prompt, each image's tokens after the sample's.

Image sizes: by default the VAE takes each image at the run's sample size, as FLUX Kontext's source, where the
pipelines take it at about 1024x1024 pixels at its own aspect ratio (and make the output that size without one
given): sources of any size share a batch and memory follows the size a run sets. `pipeline.reference_size: N`
sizes each as the pipelines do for an N x N area (1024: theirs); rows whose images differ in size then take one
transformer call per layout. The reader (Qwen2.5-VL) sees the source as the pipeline shows it, either way: resized
with the pipeline's own image processor to its area (1024x1024 for Qwen-Image-Edit, 384x384 for the Plus pipeline),
from the original image.
`pipeline.max_sequence_length` has no effect here: the pipelines do not cut the prompt either.
"""

from __future__ import annotations

import hashlib
import importlib

import torch
import torch.nn.functional as F

from flowrl.policies import POLICIES
from flowrl.policies.base import Conditioning, SampleSpec
from flowrl.policies.qwen_image import QwenImagePolicy
from flowrl.policies.wan import wan_vae_encode


@POLICIES.register("QwenImageEditPipeline")
class QwenImageEditPolicy(QwenImagePolicy):
    family = "qwen_image_edit"
    source_input = "source_image"
    source_world = "shapes_edit"
    reader_area = 1024 * 1024  # the area Qwen2.5-VL reads the source at: the pipeline's own (calculate_dimensions)
    pipeline_module = "diffusers.pipelines.qwenimage.pipeline_qwenimage_edit"  # whose calculate_dimensions sizes it

    @torch.no_grad()
    def encode(self, conditions: list, guidance_scale: float, spec: SampleSpec | None = None) -> Conditioning:
        """Condition items (an instruction and its source) -> the instruction read with the source (and, under CFG,
        " " read with it), padded and masked to one length, and the source's VAE latents as `image_latents`. Each
        distinct (instruction, source) is read once per call (a group's samples share one), and once per run with
        the embedding cache."""
        from flowrl.tasks.base import Condition

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
            return {
                "embeds": torch.stack([F.pad(embeds, (0, 0, 0, length - len(embeds))) for embeds, _ in rows]),
                "mask": torch.stack([F.pad(mask, (0, length - len(mask))) for _, mask in rows]),
            }

        cond = Conditioning(
            padded(branches[0]), padded(branches[1]) if cfg else {}, [item.prompt for item in items], items
        )
        # the VAE encodes each distinct item's images once too (`pack_references`' tensors)
        unique = list(dict.fromkeys(digests))
        images = [originals[digests.index(d)] for d in unique]

        def vae_sized(image):  # without a sample size, the nearest size below with whole 2x2 patches of latents
            size = None if spec is None else (spec.height, spec.width)
            if size is None and self.reference_size is None:
                size = tuple(max(side - side % self.size_multiple, self.size_multiple) for side in image.shape[-2:])
            return self.sized_reference(image, size)

        packed = self.pack_references(
            [[vae_sized(image) for image in group] for group in images],
            lambda batch: wan_vae_encode(self.pipeline.vae, batch[:, :, None])[:, :, 0],
        )
        picked = [unique.index(d) for d in digests]
        cond.add_inputs({name: tensor[picked] for name, tensor in packed.items()})
        return cond.to(self.device)

    def pipeline_sized(self, image: torch.Tensor) -> torch.Tensor:
        """As the pipelines take an image into the VAE (for an area of reference_size squared in place of their 1024
        x 1024): resized (Lanczos, the pipeline's image processor) to that area at its aspect ratio, sides rounded to
        multiples of 32 (the pipeline's calculate_dimensions)."""
        from flowrl.images import to_pil

        module = importlib.import_module(self.pipeline_module)
        shown = to_pil(image)
        width, height = module.calculate_dimensions(self.reference_size**2, shown.width / shown.height)[:2]
        if not width or not height:
            from flowrl.errors import UserError

            raise UserError(
                f"pipeline.reference_size {self.reference_size}: an image of {shown.width}x{shown.height} "
                f"would become {width}x{height} (sides in multiples of 32); choose a larger size"
            )
        return (self.pipeline.image_processor.preprocess(shown, height, width)[0].float() + 1) / 2

    def _read(self, branches: list[list[tuple[str, str]]], originals: dict) -> dict:
        """(prompt, source digest) -> (embeddings [L, D], mask [L]) on the host, for every pair of `branches`: from
        the embedding cache where it holds them, else read now, one pair per call (the Plus pipeline would take a
        list of images as one multi-image prompt)."""
        cache = getattr(self, "embedding_cache", None)
        read = {}
        with self._encode_lock:
            missing = [
                key
                for key in dict.fromkeys(k for branch in branches for k in branch)
                if cache is None or key not in cache
            ]
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
        from flowrl.images import to_pil

        module = importlib.import_module(self.pipeline_module)  # the pipeline's calculate_dimensions, as it reads it
        shown = []
        for source in sources:
            image = to_pil(source)
            width, height = module.calculate_dimensions(self.reader_area, image.width / image.height)[:2]
            shown.append(self.pipeline.image_processor.resize(image, height, width))
        embeds, _ = self.pipeline.encode_prompt(
            [prompt], image=shown if len(shown) > 1 else shown[0], device=self.device
        )
        embeds = embeds[0].cpu()
        return embeds, torch.ones(embeds.shape[0], dtype=torch.long)

    def encode_prompts(self, prompts: list[str], guidance_scale: float) -> Conditioning:
        raise NotImplementedError("Qwen-Image-Edit reads each instruction with its source image: use `encode`")

    def _forward(self, latents, sigma, tensors, guidance_scale):
        return self.by_reference_layout(
            latents,
            sigma,
            tensors,
            lambda rows, sigma, references: self.packed_velocity(
                latents[rows], sigma, {k: v[rows] for k, v in tensors.items()}, context=references
            ),
        )


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
