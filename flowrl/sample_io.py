"""Typed sample batches that know how to write and preview themselves.

A policy's decoder returns a float tensor in [0, 1]; `as_samples` wraps it in
the right type (`ImageSamples` or `VideoSamples`), so the code that saves or
shows samples doesn't need to branch on the modality:

- `write(folder, stem, index)` saves one sample (images: PNG; video: an
  H.264 MP4 plus a looping GIF; 3D shapes: a GLB and a PLY mesh plus the
  SDF grid as .npy) and returns the names of the files it wrote.
- `preview()` gives one uint8 still per sample for grids (video: a strip of
  up to 5 evenly spaced frames, side by side; 3D: a turntable strip of
  renders from 4 directions, the condition's view first).
- `write_samples` / `read_samples` save a whole batch with a `samples.jsonl`
  index, and read it back.

Small videos in MP4: H.264 with yuv420p needs even frame sizes, and players
show tiny clips badly or not at all, so frames whose short side is under 16 px
or whose height or width is odd are upscaled by nearest neighbour with the
smallest integer factor k that makes the short side at least 64 px, raised
to the next even k when an odd k would leave a side odd (e.g. 8x8 -> x8 =
64x64, 15x20 -> x6 = 90x120). `read_samples` scales them back to the size
recorded in the jsonl ("height"/"width"). The GIF keeps the original size.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from flowrl.errors import UserError
from flowrl.images import to_uint8, to_unit

MIN_NATIVE_SIDE = 16  # MP4 frames with a shorter short side get upscaled...
MIN_VIDEO_SIDE = 64  # ...to at least this many pixels
PREVIEW_FRAMES = 5  # frames in a video preview strip
INDEX_FILE = "samples.jsonl"


class Samples:
    """A batch of samples as a float tensor in [0, 1], batch first."""

    modality: str = ""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def select(self, index) -> Samples:
        index = torch.as_tensor(index, dtype=torch.long, device=self.tensor.device)
        return self.like(self.tensor[index])

    def like(self, tensor: torch.Tensor) -> Samples:
        """A batch of the same kind holding `tensor`; subclasses with extra fields (fps) keep them."""
        return type(self)(tensor)

    def to_uint8(self) -> np.ndarray:
        raise NotImplementedError

    def decoded(self) -> torch.Tensor:
        """The tensor in the layout policies decode to and rewards take (images [B,3,H,W]; video [B,3,F,H,W])."""
        return self.tensor

    def preview(self) -> np.ndarray:
        raise NotImplementedError

    def write(self, folder: Path, stem: str, index: int) -> list[str]:
        raise NotImplementedError

    def size(self) -> tuple[int, int]:
        """(height, width) of one sample; stored so `read_samples` can undo MP4 upscaling."""
        return int(self.tensor.shape[-2]), int(self.tensor.shape[-1])


class ImageSamples(Samples):
    """Images, tensor [B, 3, H, W]."""

    modality = "image"

    def to_uint8(self) -> np.ndarray:
        return to_uint8(self.tensor)  # [N, H, W, 3]

    def preview(self) -> np.ndarray:
        return self.to_uint8()

    def write(self, folder: Path, stem: str, index: int) -> list[str]:
        name = f"{stem}.png"
        Image.fromarray(self.select([index]).to_uint8()[0]).save(Path(folder) / name)
        return [name]


class VideoSamples(Samples):
    """Videos, tensor [B, F, 3, H, W], played at `fps` frames per second."""

    modality = "video"

    def __init__(self, tensor: torch.Tensor, fps: int = 8) -> None:
        super().__init__(tensor)
        self.fps = fps

    def like(self, tensor: torch.Tensor) -> VideoSamples:
        return VideoSamples(tensor, fps=self.fps)

    def decoded(self) -> torch.Tensor:
        return self.tensor.movedim(2, 1)  # [B, 3, F, H, W]

    def to_uint8(self) -> np.ndarray:
        # images.to_uint8 takes videos channels-first ([B,3,F,H,W]) and moves channels last.
        return to_uint8(self.decoded())  # [N, F, H, W, 3]

    def preview(self) -> np.ndarray:
        video = self.to_uint8()
        n_frames = video.shape[1]
        picks = np.linspace(0, n_frames - 1, min(PREVIEW_FRAMES, n_frames)).round().astype(int)
        return np.concatenate([video[:, i] for i in picks], axis=2)  # strip along width

    def write(self, folder: Path, stem: str, index: int) -> list[str]:
        frames = self.select([index]).to_uint8()[0]  # [F, H, W, 3]
        mp4, gif = f"{stem}.mp4", f"{stem}.gif"
        _write_mp4(Path(folder) / mp4, frames, self.fps)
        _write_gif(Path(folder) / gif, frames, self.fps)
        return [mp4, gif]


TURNTABLE = (0, 90, 180, 270)  # degrees about the vertical axis, 0 = the condition image's view


class ShapeSamples(Samples):
    """3D shapes as signed distance fields on the world grid, tensor [B, R, R, R] over [-1, 1]^3 (x, y, z; negative
    inside); meshes by marching cubes."""

    modality = "3d"

    def meshes(self) -> list:
        """trimesh.Trimesh per sample (None where the field has no surface)."""
        from flowrl.sdf import mesh_from_grid

        return [mesh_from_grid(g) for g in self.grids()]

    def grids(self) -> np.ndarray:
        return self.tensor.detach().float().cpu().numpy()

    def to_uint8(self) -> np.ndarray:
        """Turntable renders, [N, V, H, W, 3] (V = len(TURNTABLE), H = W = 32)."""
        from flowrl.sdf import grid_field, render, turntable_view

        return np.stack(
            [np.stack([render(grid_field(g), 32, view=turntable_view(a))[0] for a in TURNTABLE]) for g in self.grids()]
        )

    def preview(self) -> np.ndarray:
        views = self.to_uint8()
        return np.concatenate([views[:, i] for i in range(views.shape[1])], axis=2)  # strip along width

    def write(self, folder: Path, stem: str, index: int) -> list[str]:
        import trimesh

        from flowrl.sdf import mesh_from_grid

        grid = self.select([index]).grids()[0]  # this sample's field only (write is called once per sample)
        mesh = mesh_from_grid(grid)
        names = [f"{stem}.glb", f"{stem}.ply", f"{stem}.npy"]
        if mesh is None:  # an empty field: an empty scene
            write_empty_glb(Path(folder) / names[0])
            trimesh.Trimesh().export(Path(folder) / names[1])
        else:
            for name in names[:2]:
                mesh.export(Path(folder) / name)
        np.save(Path(folder) / names[2], grid.astype(np.float16))  # the field itself, for scoring read-backs
        return names


def write_empty_glb(path: Path) -> None:
    """A valid glTF 2.0 binary of an empty scene: trimesh writes an empty mesh with a zero-length BIN chunk, which
    the spec forbids (viewers and the Khronos validator reject the file)."""
    import struct

    body = json.dumps({"asset": {"version": "2.0"}, "scene": 0, "scenes": [{}]}).encode()
    body += b" " * (-len(body) % 4)  # chunks are 4-byte aligned, JSON padded with spaces
    path.write_bytes(
        struct.pack("<4sII", b"glTF", 2, 12 + 8 + len(body)) + struct.pack("<I4s", len(body), b"JSON") + body
    )


def _mp4_scale(height: int, width: int) -> int:
    """Integer upscale factor giving an even frame size with short side >= MIN_VIDEO_SIDE."""
    odd = height % 2 or width % 2
    if min(height, width) >= MIN_NATIVE_SIDE and not odd:
        return 1
    k = -(-MIN_VIDEO_SIDE // min(height, width))  # ceil division
    if odd and k % 2:
        k += 1  # an even factor makes every side even
    return k


def _write_mp4(path: Path, frames: np.ndarray, fps: int) -> None:
    import av  # imported here so image-only use doesn't need PyAV loaded

    k = _mp4_scale(*frames.shape[1:3])
    if k > 1:
        frames = frames.repeat(k, axis=1).repeat(k, axis=2)  # nearest neighbour
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        # crf 10 is near-lossless: samples read back for scoring shouldn't carry
        # codec artefacts, and files stay small at sample sizes.
        stream.options = {"crf": "10"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())  # flush delayed frames


def gif_durations(count: int, fps: float) -> list[int]:
    """Per-frame GIF durations in ms for `count` frames at `fps`. GIF stores centiseconds, so one duration for all
    would play 16 fps at 16.7 and 24 at 25: frame k instead ends at round(100 (k + 1) / fps) cs, and the clip
    takes count / fps seconds to the centisecond."""
    ends = [round(100 * (k + 1) / fps) for k in range(count)]
    return [10 * (end - start) for start, end in zip([0, *ends[:-1]], ends)]


def _write_gif(path: Path, frames: np.ndarray, fps: int) -> None:
    # Pillow merges identical consecutive frames into one longer frame, so a
    # still video gives fewer GIF frames; playback time is unchanged.
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=gif_durations(len(images), fps), loop=0)


def _read_mp4(path: Path, height: int | None, width: int | None) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    video = np.stack(frames)  # [F, h, w, 3]
    h, w = video.shape[1:3]
    if height is None or width is None or (h, w) == (height, width):  # no recorded size: as stored
        return video
    if h % height == 0 and w % width == 0 and h // height == w // width:
        # Undo _write_mp4's integer nearest-neighbour upscale by averaging each
        # k x k block, which also smooths away a little codec noise.
        k = h // height
        blocks = video.reshape(len(video), height, k, width, k, 3)
        return blocks.mean(axis=(2, 4)).round().astype(np.uint8)
    # Not our upscale (a file made elsewhere): resize each frame.
    size = (width, height)
    return np.stack([np.asarray(Image.fromarray(f).resize(size, Image.BILINEAR)) for f in video])


def side_by_side_clips(columns: list[VideoSamples], folder: Path, stem: str) -> list[tuple[str, str]]:
    """Row k of every column, side by side in one clip (a 2-px black gap between), written as MP4 + GIF:
    [(mp4, gif)] per row, names relative to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    gap = torch.zeros(*columns[0].tensor.shape[:-1], 2, dtype=columns[0].tensor.dtype)
    parts = [t for c in columns for t in (c.tensor, gap)][:-1]
    joined = VideoSamples(torch.cat(parts, dim=-1), fps=columns[0].fps)
    return [tuple(joined.write(folder, f"{stem}_{k:02d}", k)) for k in range(len(joined))]


def as_samples(decoded: torch.Tensor, fps: int = 8, modality: str | None = None) -> Samples:
    """Wrap what a policy's decoder returns: [B,3,H,W] images, [B,3,F,H,W] videos, or with modality "3d" SDF grids
    [B,R,R,R]."""
    if modality == "3d":
        return ShapeSamples(decoded)
    if decoded.ndim == 4 and decoded.shape[1] == 3:
        return ImageSamples(decoded)
    if decoded.ndim == 5 and decoded.shape[1] == 3:
        # diffusers' video VAEs put channels before frames; we keep frames first.
        return VideoSamples(decoded.permute(0, 2, 1, 3, 4), fps=fps)
    raise ValueError(
        f"decoded samples have shape {tuple(decoded.shape)}; expected [B,3,H,W] images or [B,3,F,H,W] videos"
    )


def write_samples(folder, samples: Samples, records: list[dict]) -> Path:
    """Write every sample plus `samples.jsonl` (one line each); returns the jsonl path."""
    if len(records) != len(samples):
        raise ValueError(f"{len(records)} records for {len(samples)} samples")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(index_line(samples, record, samples.write(folder, f"{i:05d}", i)))
        for i, record in enumerate(records)
    ]
    path = folder / INDEX_FILE
    path.write_text("".join(line + "\n" for line in lines))
    return path


def index_line(samples: Samples, record: dict, files: list[str]) -> dict:
    """A sample's samples.jsonl line: its record, the files it was written to, and what reading it back needs."""
    height, width = samples.size()
    line = {
        **record,
        "file": files[0],
        "modality": samples.modality,
        "extra_files": files[1:],
        "height": height,
        "width": width,
    }
    if isinstance(samples, VideoSamples):
        line["fps"] = samples.fps
    return line


def read_records(folder) -> list[dict]:
    """The jsonl records of a samples folder, each checked to name a file and given its modality (folders written by
    hand may leave it out: the file's type says which it is)."""
    index = Path(folder) / INDEX_FILE
    if not index.is_file():
        raise UserError(
            f"{index} does not exist; expected a folder written by `flowrl sample` (sample files plus "
            f"{INDEX_FILE} with prompt, seed, file per line)"
        )
    try:
        records = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise UserError(f"{index} is not readable as JSON lines: {e}") from e
    if not records:
        raise UserError(f"{index} lists no samples")
    for n, record in enumerate(records):
        if not isinstance(record, dict) or "file" not in record:
            raise UserError(f"{index} line {n + 1}: expected a JSON object with a 'file' field (and 'prompt')")
        suffix = Path(str(record["file"])).suffix
        record.setdefault("modality", {".mp4": "video", ".glb": "3d", ".ply": "3d"}.get(suffix, "image"))
        if record["modality"] not in ("image", "video", "3d"):
            raise UserError(f"{index} line {n + 1}: modality {record['modality']!r}; expected image, video or 3d")
    return records


def read_samples(folder) -> tuple[Samples, list[dict]]:
    """Read back what `write_samples` wrote: the samples and their jsonl records."""
    records = read_records(folder)
    return load_samples(folder, records), records


def load_samples(folder, records: list[dict]) -> Samples:
    """The samples `records` (lines of the folder's index) name, read from their files; a caller can read a large
    folder a batch of records at a time."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    arrays = []
    for record in records:
        video = record["modality"] == "video"
        path = folder / record["file"]
        if record["modality"] == "3d":  # the SDF grid written beside the meshes
            path = path.with_suffix(".npy")
        try:
            if record["modality"] == "3d":
                arrays.append(np.load(path).astype(np.float32))
            elif video:
                arrays.append(_read_mp4(path, record.get("height"), record.get("width")))
            else:
                with Image.open(path) as image:
                    arrays.append(np.asarray(image.convert("RGB")))
        except Exception as e:  # missing, truncated or not decodable: all the user's to fix
            raise UserError(
                f"cannot read sample file {path} listed in {index}: expected "
                f"{ {'video': 'an MP4 video', '3d': 'an SDF grid (.npy)'}.get(record['modality'], 'a PNG image') } "
                f"({type(e).__name__}: {e})"
            ) from e
    try:
        pixels = np.stack(arrays)
    except ValueError as e:
        raise UserError(f"samples in {folder} differ in size or frame count: {e}") from e

    if records[0]["modality"] == "3d":
        return ShapeSamples(torch.from_numpy(pixels))
    if records[0]["modality"] == "video":
        b, f = pixels.shape[:2]
        frames = to_unit(pixels.reshape(b * f, *pixels.shape[2:]))  # [B*F, 3, H, W]
        fps = records[0].get("fps", 8)
        return VideoSamples(frames.reshape(b, f, *frames.shape[1:]), fps=fps)
    return ImageSamples(to_unit(pixels))


# fields a samples.jsonl line gives the sample itself (its seed, files, size, resume key and a steer's per-sample
# record), not its condition
SAMPLE_FIELDS = (
    "prompt",
    "seed",
    "file",
    "extra_files",
    "modality",
    "height",
    "width",
    "fps",
    "plan",
    "fk_reward",
    "probe_fired_at",
)


def read_conditions(folder: str, records: list[dict]) -> list:
    """The condition item of every sample record: its prompt, and the record's other fields but the sample's own
    (seed, files, size) as metadata, so the samples of one prompt-file line share one condition."""
    from flowrl.tasks.base import Condition

    items = []
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("prompt"), str):
            raise UserError(f"{Path(folder) / 'samples.jsonl'} line {number}: expected a 'prompt' string")
        items.append(Condition(record["prompt"], meta={k: v for k, v in record.items() if k not in SAMPLE_FIELDS}))
    return items
