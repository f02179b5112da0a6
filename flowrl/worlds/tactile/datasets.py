"""Real visuo-tactile collections read from local folders, in their published layouts, as records of file paths
(images are read on demand by `read_pair`):

- SSVTP, as bundled with TVL (DIGIT): `ssvtp/images_rgb/image_<id>_rgb.jpg`, `ssvtp/images_tac/image_<id>_tac.jpg`,
  `ssvtp/text/labels_<id>.txt` (comma-separated adjectives); optional `train.csv` / `test.csv` whose rows name the
  pairs (any field holding `image_<id>_...` or the bare id).
- Touch and Go (GelSight): `<root>/<YYYYMMDD_HHMMSS>/video_frame/<10 digits>.jpg` beside
  `gelsight_frame/<same>.jpg`; split files with lines `folder/frame.jpg,<label>`.
- TaRF (DIGIT): `vision/`, `depth/*.npy`, `touch/` with files of the same stem, `touch_bg/bg.jpg` (the sensor's
  untouched image), `split_interval.json` mapping each split to [first, last) indices of the stems in sorted order.

A folder that is not in the layout is a UserError naming what is missing.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flowrl.errors import UserError


@dataclass
class RealPair:
    """One recorded pair: the camera image and tactile image files, optional depth (.npy) and touch background
    files, the words describing it, its split, and its id in the collection."""

    rgb: Path
    tactile: Path
    id: str
    split: str | None = None
    labels: list[str] = field(default_factory=list)
    depth: Path | None = None
    background: Path | None = None


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise UserError(f"{path}: not found ({what})")
    return path


def _split_ids(files: dict[str, Path]) -> dict[str, str]:
    """id -> split from SSVTP's split files (any field naming image_<id> or holding the bare id)."""
    found = {}
    for split, path in files.items():
        with open(path, newline="") as handle:
            for row in csv.reader(handle):
                for value in row:
                    match = re.search(r"image_(\d+)", value) or re.fullmatch(r"\s*(\d+)\s*", value)
                    if match:
                        found[match.group(1)] = split
                        break
    return found


def load_ssvtp(root: str | Path) -> list[RealPair]:
    """SSVTP pairs under `root` (the folder holding `ssvtp/`, or `ssvtp/` itself)."""
    root = Path(root)
    base = root / "ssvtp" if (root / "ssvtp").is_dir() else root
    rgb_dir = _require(base / "images_rgb", "SSVTP's images_rgb/ folder")
    tac_dir = _require(base / "images_tac", "SSVTP's images_tac/ folder")
    splits = _split_ids({s: base / f"{s}.csv" for s in ("train", "test") if (base / f"{s}.csv").is_file()})
    pairs = []
    for rgb in sorted(rgb_dir.glob("image_*_rgb.jpg")):
        pair_id = rgb.name[len("image_") : -len("_rgb.jpg")]
        tactile = tac_dir / f"image_{pair_id}_tac.jpg"
        if not tactile.is_file():
            continue  # an image without its touch
        labels_file = base / "text" / f"labels_{pair_id}.txt"
        labels = [w.strip() for w in labels_file.read_text().split(",") if w.strip()] if labels_file.is_file() else []
        pairs.append(RealPair(rgb, tactile, pair_id, splits.get(pair_id), labels))
    if not pairs:
        raise UserError(f"{base}: no image_<id>_rgb.jpg with its image_<id>_tac.jpg (SSVTP layout)")
    return pairs


def load_touch_and_go(root: str | Path, split_files: dict[str, str | Path] | None = None) -> list[RealPair]:
    """Touch and Go pairs under `root`; `split_files` (split -> file of `folder/frame.jpg,<label>` lines) give
    each listed frame its split and label (only listed frames are returned when given)."""
    root = Path(root)
    _require(root, "the Touch and Go root folder")
    listed: dict[tuple[str, str], tuple[str, str]] = {}
    for split, path in (split_files or {}).items():
        for line in Path(_require(Path(path), f"the {split} split file")).read_text().splitlines():
            if not line.strip():
                continue
            frame, _, label = line.strip().partition(",")
            folder, _, name = frame.partition("/")
            listed[(folder, Path(name).stem)] = (split, label.strip())
    pairs = []
    for video in sorted(root.glob("*/video_frame/*.jpg")):
        folder = video.parent.parent.name
        tactile = video.parent.parent / "gelsight_frame" / video.name
        if not tactile.is_file():
            continue
        key = (folder, video.stem)
        if split_files and key not in listed:
            continue
        split, label = listed.get(key, (None, ""))
        pairs.append(RealPair(video, tactile, f"{folder}/{video.stem}", split, [label] if label else []))
    if not pairs:
        raise UserError(f"{root}: no <folder>/video_frame/*.jpg with its gelsight_frame/ twin (Touch and Go layout)")
    return pairs


def load_tarf(root: str | Path) -> list[RealPair]:
    """TaRF pairs under `root`: vision, touch and depth files matched by stem, the touch background, the splits of
    split_interval.json (when present)."""
    root = Path(root)
    vision = _require(root / "vision", "TaRF's vision/ folder")
    touch = _require(root / "touch", "TaRF's touch/ folder")
    background = root / "touch_bg" / "bg.jpg"
    touches = {p.stem: p for p in touch.iterdir() if p.suffix.lower() in (".jpg", ".png")}
    stems = sorted(p.stem for p in vision.iterdir() if p.suffix.lower() in (".jpg", ".png") and p.stem in touches)
    intervals = {}
    split_file = root / "split_interval.json"
    if split_file.is_file():
        intervals = json.loads(split_file.read_text())
    pairs = []
    for index, stem in enumerate(stems):
        split = next((s for s, (lo, hi) in intervals.items() if lo <= index < hi), None)
        depth = root / "depth" / f"{stem}.npy"
        pairs.append(
            RealPair(
                next(vision.glob(f"{stem}.*")),
                touches[stem],
                stem,
                split,
                depth=depth if depth.is_file() else None,
                background=background if background.is_file() else None,
            )
        )
    if not pairs:
        raise UserError(f"{root}: no vision/ and touch/ files with the same name (TaRF layout)")
    return pairs


def read_pair(pair: RealPair, size: int) -> dict:
    """The pair's images as float [3, size, size] arrays in [0, 1] (`rgb`, `tactile`, and `background` when
    recorded), and its depth as [size, size] (relative: 0 nearest) when recorded."""
    from PIL import Image

    def image(path):
        with Image.open(path) as opened:
            resized = opened.convert("RGB").resize((size, size), Image.BILINEAR)
        return np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) / 255

    out = {"rgb": image(pair.rgb), "tactile": image(pair.tactile)}
    if pair.background is not None:
        out["background"] = image(pair.background)
    if pair.depth is not None:
        depth = np.load(pair.depth).astype(np.float32)
        resized = np.asarray(Image.fromarray(depth).resize((size, size), Image.BILINEAR))
        span = resized.max() - resized.min()
        out["depth"] = (resized - resized.min()) / span if span > 0 else np.full_like(resized, 0.5)
    return out
