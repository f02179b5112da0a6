"""What an editor or an image-to-video pipeline takes besides its prompt: each sample's input images (a source or
first frame, then further reference images), found, sized, encoded and fed to the denoiser layout by layout. Mixed
into every policy (FlowPolicy); the families that take images set `source_input` and use these."""

from __future__ import annotations

import contextlib

import torch

from flowrl.policies.conditioning import SampleSpec


@contextlib.contextmanager
def untiled(vae):
    """The VAE with tiling off for the block (pipeline.vae_tiling tiles decoding): conditions are encoded whole, as
    the pipelines encode them; yields `vae`."""
    tiling = getattr(vae, "use_tiling", False)
    vae.use_tiling = False
    try:
        yield vae
    finally:
        vae.use_tiling = tiling


class InputImages:
    """Input images per sample: found (`reference_images`), sized (`sized_reference`, `pipeline_sized`), encoded
    (`pack_references`, `encode_first_frames`) and run (`by_reference_layout`)."""

    source_input: str | None = None  # the per-sample input an editing pipeline needs (e.g. "source_image")
    source_world: str | None = None  # the task (registered name) that makes a source for a prompt of its grammar
    source_needed_by = "an editing pipeline"  # what needs the source, in the error for a prompt without one
    max_references: int | None = 1  # input images one sample may take (a source, then references; None: any)
    # pipeline.reference_size: an editor's input images sized as its pipeline sizes them, for this side's square area
    # (`pipeline_sized`); None: each takes the sample size
    reference_size: int | None = None

    def reference_images(self, items: list) -> list[list[torch.Tensor]]:
        """Each condition item's input images, as given (float [3, H, W] in [0, 1]; `sized_reference` sizes them):
        its source (inputs[source_input], its meta["image"] file, or the `source_world` scene for a prompt of that
        world's grammar), then any further reference images (a list in either); a UserError naming the prompt where
        an item gives none, or more than this pipeline takes (`max_references`)."""
        from flowrl.errors import UserError
        from flowrl.images import item_images

        found = [item_images(item, self.source_input, self.source_world, self.source_needed_by) for item in items]
        for item, images in zip(items, found):
            if not images:
                raise UserError(
                    f"prompt {item.prompt!r} gives an empty list of images; {type(self.pipeline).__name__} "
                    "needs at least one"
                )
            if self.max_references is not None and len(images) > self.max_references:
                takes = "one" if self.max_references == 1 else f"at most {self.max_references}"
                raise UserError(
                    f"prompt {item.prompt!r} gives {len(images)} images; {type(self.pipeline).__name__} "
                    f"(adapter {type(self).__name__}) takes {takes}"
                )
        return found

    def distinct_sources(self, items: list) -> tuple[list[torch.Tensor], list[int]]:
        """Each distinct condition item's source, found once (a group repeats one item), as given (not resized), and
        for every item the index of its source in that list."""
        found, rows = self.distinct_references(items)
        return [images[0] for images in found], rows

    @torch.no_grad()
    def encode_first_frames(self, items: list, spec: SampleSpec) -> tuple[torch.Tensor, list[int]]:
        """Each distinct item's source (an image-to-video pipeline's first frame) at the sample size, encoded once by
        the VAE (untiled) as a one-frame video: the posterior's mode, fp32 [N, C, 1, h, w]; and each item's row in
        it."""
        from flowrl.images import resized

        frames, rows = self.distinct_sources(items)
        first = torch.stack([resized(frame, spec.height, spec.width) for frame in frames]).to(self.device)
        with untiled(self.pipeline.vae) as vae:
            return vae.encode((first * 2 - 1)[:, :, None].to(vae.dtype)).latent_dist.mode().float(), rows

    def by_reference_layout(self, latents: torch.Tensor, sigma, tensors: dict, call) -> torch.Tensor:
        """An editor's output when rows differ in their reference images' number or sizes (`pack_references`'
        tensors): `call(rows, sigma, references)` once per layout on its rows (sigma per row, `references` a list of
        their images' latents [n, C, h, w], each cut to its size), put back in row order.

        Under FSDP2 every call gathers the sharded denoiser's weights on every process, so all must call it equally
        often: a process with fewer layouts than the most any process has in this pass calls it again on its first
        row, and adds that output times zero to its own, so the extra calls' backward passes (FSDP2's gathers and
        gradient reductions) run on every process too while changing no number."""
        sigma = torch.as_tensor(sigma, device=latents.device).reshape(-1).expand(latents.shape[0])
        layouts: dict[tuple, list[int]] = {}
        for row, (count, shapes) in enumerate(
            zip(tensors["reference_count"].tolist(), tensors["reference_shapes"].tolist())
        ):
            layouts.setdefault(tuple(map(tuple, shapes[:count])), []).append(row)
        groups = [torch.tensor(rows, device=latents.device) for rows in layouts.values()]

        def run(layout, rows):
            return call(
                rows, sigma[rows], [tensors["image_latents"][rows, k, :, :h, :w] for k, (h, w) in enumerate(layout)]
            )

        # agreed before any call: a process still gathering for its own calls cannot answer a count
        padding = self.most_calls_of_any_process(len(layouts)) - len(layouts) if self.sharded() else 0
        outs = [run(layout, rows) for layout, rows in zip(layouts, groups)]
        for _ in range(padding):
            # (a non-finite padding output must not turn the real rows' zero into NaN)
            outs[0] = outs[0] + 0 * run(next(iter(layouts)), groups[0][:1]).sum().nan_to_num(0.0, 0.0, 0.0)
        return outs[0] if len(groups) == 1 else torch.cat(outs)[torch.cat(groups).argsort()]

    def most_calls_of_any_process(self, count: int) -> int:
        """The largest `count` any process passes here (a collective: every process calls it at the same point)."""
        from flowrl.sharding import most_calls_of_any_process

        return most_calls_of_any_process(count, self.device)

    def sharded(self) -> bool:
        """Whether the denoiser is sharded by FSDP2 (fully_shard makes the module an FSDPModule in place)."""
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # torch before 2.6: no FSDP2
            return False
        return isinstance(self.transformer, FSDPModule)

    def pack_references(self, found: list[list[torch.Tensor]], encode) -> dict[str, torch.Tensor]:
        """Conditioning tensors for each row's images `found` (float [3, H, W] in [0, 1], sizes may differ): images of
        one size are encoded together by `encode` ([N, 3, H, W] in [0, 1] on the device -> latents [N, C, h, w]);
        `image_latents` [B, K, C, h_max, w_max] holds each row's latents first (zero-padded to the largest), zeros
        after (K: the most images any row has), `reference_shapes` [B, K, 2] each one's (h, w), `reference_count`
        [B] how many are the row's own."""
        by_size: dict[tuple, list[tuple[int, int]]] = {}
        for row, images in enumerate(found):
            for k, image in enumerate(images):
                by_size.setdefault(tuple(image.shape[-2:]), []).append((row, k))
        encoded = {}
        for places in by_size.values():
            batch = torch.stack([found[row][k] for row, k in places]).to(self.device)
            encoded.update(zip(places, encode(batch)))
        first = next(iter(encoded.values()))
        rows, most = len(found), max(len(images) for images in found)
        height, width = (max(z.shape[-2 + axis] for z in encoded.values()) for axis in range(2))
        latents = first.new_zeros(rows, most, first.shape[0], height, width)
        shapes = torch.zeros(rows, most, 2, dtype=torch.long)
        for (row, k), z in encoded.items():
            latents[row, k, :, : z.shape[-2], : z.shape[-1]] = z
            shapes[row, k] = torch.tensor(z.shape[-2:])
        return {
            "image_latents": latents,
            "reference_shapes": shapes.to(self.device),
            "reference_count": torch.tensor([len(images) for images in found], device=self.device),
        }

    def sized_reference(self, image: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
        """An input image as the VAE takes it: sized as the pipeline sizes it (`pipeline_sized`) when
        pipeline.reference_size is set, else brought to `size` (height, width: the sample's)."""
        from flowrl.images import resized

        if self.reference_size is not None:
            return self.pipeline_sized(image)
        return image if size is None else resized(image, *size)

    def pipeline_sized(self, image: torch.Tensor) -> torch.Tensor:
        """An input image [3, H, W] in [0, 1] sized as this editor's pipeline sizes it for an area of reference_size
        squared; only the editors that take images of their own size implement it (`set_reference_size`)."""
        raise NotImplementedError

    def set_reference_size(self, value: int | None, where: str) -> None:
        """Size each input image as the pipeline does for an area of `value` squared pixels (None: the sample size);
        a ConfigError naming `where` for a pipeline that takes no images, or an editor that takes its source at the
        sample's size."""
        if value is None:
            return
        from flowrl.errors import ConfigError

        name = f"{type(self.pipeline).__name__} (adapter {type(self).__name__})"
        if value < 1:
            raise ConfigError(f"{where}: expected a positive number of pixels, got {value}")
        if self.source_input is None:
            raise ConfigError(f"{where}: {name} takes no input images")
        if type(self).pipeline_sized is InputImages.pipeline_sized:
            raise ConfigError(
                f"{where}: {name} takes its input image at the sample size; only editors whose "
                "pipelines size each image themselves (FLUX.2, Qwen-Image-Edit) take a reference size"
            )
        self.reference_size = value

    def distinct_references(self, items: list) -> tuple[list[list[torch.Tensor]], list[int]]:
        """`distinct_sources` with each item's every image (`reference_images`)."""
        distinct = {id(item): item for item in items}
        keys = list(distinct)
        return self.reference_images(list(distinct.values())), [keys.index(id(item)) for item in items]

    @staticmethod
    def stack_sources(sources: list[torch.Tensor]) -> torch.Tensor:
        """One batch [B, 3, H, W] of source images; a UserError when their sizes differ."""
        from flowrl.errors import UserError

        sizes = {tuple(source.shape[-2:]) for source in sources}
        if len(sizes) > 1:
            raise UserError(
                f"source images of one batch differ in size ({sorted(sizes)}); give sources of one size "
                "or the sample size to resize them to"
            )
        return torch.stack(sources)
