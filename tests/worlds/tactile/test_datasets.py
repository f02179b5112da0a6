"""Each real collection's loader reads a small fixture in its published layout; a folder in another layout is one
error naming what is missing."""

import json

import numpy as np
import pytest
from PIL import Image

from flowrl.errors import UserError
from flowrl.worlds.tactile.datasets import load_ssvtp, load_tarf, load_touch_and_go, read_pair


def _jpg(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((20, 24, 3), value, np.uint8)).save(path)


def test_ssvtp_layout(tmp_path):
    base = tmp_path / "ssvtp"
    for pair_id, value in (("0", 10), ("1", 20), ("7", 30)):
        _jpg(base / "images_rgb" / f"image_{pair_id}_rgb.jpg", value)
        _jpg(base / "images_tac" / f"image_{pair_id}_tac.jpg", value + 100)
    _jpg(base / "images_rgb" / "image_9_rgb.jpg", 0)  # no touch: skipped
    (base / "text").mkdir()
    (base / "text" / "labels_1.txt").write_text("smooth, hard, cool")
    (base / "train.csv").write_text("url,tactile\nimages_rgb/image_0_rgb.jpg,images_tac/image_0_tac.jpg\n")
    (base / "test.csv").write_text("7\n")
    pairs = load_ssvtp(tmp_path)
    assert [p.id for p in pairs] == ["0", "1", "7"]
    assert [p.split for p in pairs] == ["train", None, "test"]
    assert pairs[1].labels == ["smooth", "hard", "cool"]
    images = read_pair(pairs[2], 16)
    assert images["rgb"].shape == (3, 16, 16) and images["tactile"][0, 0, 0] == pytest.approx(130 / 255, abs=0.02)
    with pytest.raises(UserError, match="images_rgb"):
        load_ssvtp(tmp_path / "elsewhere")


def test_touch_and_go_layout(tmp_path):
    for folder in ("20220410_031604", "20220410_031700"):
        for frame in ("0000000010", "0000000020"):
            _jpg(tmp_path / folder / "video_frame" / f"{frame}.jpg", 50)
            _jpg(tmp_path / folder / "gelsight_frame" / f"{frame}.jpg", 60)
    split = tmp_path / "train.txt"
    split.write_text("20220410_031604/0000000020.jpg,3\n20220410_031700/0000000010.jpg,11\n")
    everything = load_touch_and_go(tmp_path)
    assert len(everything) == 4 and everything[0].id == "20220410_031604/0000000010"
    listed = load_touch_and_go(tmp_path, {"train": split})
    assert [(p.id, p.split, p.labels) for p in listed] == [
        ("20220410_031604/0000000020", "train", ["3"]),
        ("20220410_031700/0000000010", "train", ["11"]),
    ]


def test_tarf_layout(tmp_path):
    for index in range(5):
        _jpg(tmp_path / "vision" / f"{index}.jpg", 10 * index)
        _jpg(tmp_path / "touch" / f"{index}.jpg", 5 * index)
        (tmp_path / "depth").mkdir(exist_ok=True)
        np.save(tmp_path / "depth" / f"{index}.npy", np.arange(20 * 24, dtype=np.float32).reshape(20, 24))
    _jpg(tmp_path / "touch_bg" / "bg.jpg", 200)
    (tmp_path / "split_interval.json").write_text(json.dumps({"train": [0, 3], "test": [3, 5]}))
    pairs = load_tarf(tmp_path)
    assert [p.split for p in pairs] == ["train"] * 3 + ["test"] * 2
    images = read_pair(pairs[4], 8)
    assert images["depth"].shape == (8, 8) and images["depth"].min() == 0 and images["depth"].max() == 1
    assert images["background"][0, 0, 0] == pytest.approx(200 / 255, abs=0.02)
    with pytest.raises(UserError, match="vision/"):
        load_tarf(tmp_path / "vision")
