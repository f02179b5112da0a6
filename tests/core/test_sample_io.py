"""flowrl.sample_io: modality dispatch, writing (PNG / MP4 + GIF), reading back, previews."""

import json
import re

import av
import numpy as np
import pytest
import torch
from PIL import Image

from flowrl.errors import UserError
from flowrl.sample_io import (
    ImageSamples,
    VideoSamples,
    as_samples,
    read_samples,
    write_samples,
)


def squares_video(b=2, f=6, h=16, w=24):
    """[B, F, 3, H, W]: a solid coloured square moving over black (easy for H.264)."""
    video = torch.zeros(b, f, 3, h, w)
    colours = torch.tensor([[1.0, 0.2, 0.0], [0.0, 0.6, 1.0], [0.9, 0.9, 0.1]])
    side = min(h, w) // 2
    for i in range(b):
        for t in range(f):
            x = (2 * t) % (w - side + 1)
            video[i, t, :, 1 : 1 + side, x : x + side] = colours[(i + t) % 3, :, None, None]
    return video


def test_as_samples_picks_type_and_permutes():
    images = torch.zeros(2, 3, 5, 7)
    images[1, 2, 3, 4] = 1.0
    s = as_samples(images)
    assert type(s) is ImageSamples and s.modality == "image" and len(s) == 2
    assert s.to_uint8()[1, 3, 4].tolist() == [0, 0, 255]

    # diffusers video layout [B, C, F, H, W] -> [B, F, C, H, W]
    decoded = torch.zeros(2, 3, 4, 5, 7)
    decoded[1, 2, 3, 0, 6] = 1.0  # sample 1, blue, frame 3, row 0, col 6
    v = as_samples(decoded, fps=12)
    assert type(v) is VideoSamples and v.modality == "video" and v.fps == 12
    assert v.tensor.shape == (2, 4, 3, 5, 7)
    assert v.tensor[1, 3, 2, 0, 6] == 1.0 and v.tensor.sum() == 1.0
    assert v.to_uint8().shape == (2, 4, 5, 7, 3)
    assert v.to_uint8()[1, 3, 0, 6].tolist() == [0, 0, 255]

    for bad in (torch.zeros(3, 5, 7), torch.zeros(2, 4, 5, 7), torch.zeros(1, 3, 2, 2, 2, 2)):
        with pytest.raises(ValueError, match=re.escape(str(tuple(bad.shape)))):
            as_samples(bad)


def test_select_keeps_type():
    v = VideoSamples(squares_video(b=3), fps=5)
    picked = v.select([2, 0])
    assert type(picked) is VideoSamples and picked.fps == 5 and len(picked) == 2
    assert torch.equal(picked.tensor[0], v.tensor[2])
    i = ImageSamples(torch.rand(4, 3, 6, 6))
    picked = i.select(torch.tensor([3]))
    assert type(picked) is ImageSamples and torch.equal(picked.tensor, i.tensor[3:4])


def test_preview_shapes():
    assert ImageSamples(torch.rand(2, 3, 6, 9)).preview().shape == (2, 6, 9, 3)
    video = squares_video(b=2, f=9, h=8, w=10)
    strip = VideoSamples(video).preview()
    assert strip.shape == (2, 8, 50, 3) and strip.dtype == np.uint8
    # first and last tiles are the first and last frames
    frames = VideoSamples(video).to_uint8()
    assert np.array_equal(strip[:, :, :10], frames[:, 0])
    assert np.array_equal(strip[:, :, 40:], frames[:, -1])
    assert VideoSamples(squares_video(f=3, h=8, w=10)).preview().shape == (2, 8, 30, 3)


def test_image_round_trip_exact(tmp_path):
    images = ImageSamples(torch.rand(3, 3, 7, 5))
    records = [{"prompt": f"p{i}", "reward": float(i)} for i in range(3)]
    jsonl = write_samples(tmp_path / "out", images, records)
    assert jsonl == tmp_path / "out" / "samples.jsonl"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [line["file"] for line in lines] == ["00000.png", "00001.png", "00002.png"]
    assert lines[1]["prompt"] == "p1" and lines[1]["modality"] == "image"
    assert lines[1]["extra_files"] == []

    back, back_records = read_samples(tmp_path / "out")
    assert type(back) is ImageSamples
    assert back_records == lines
    assert np.array_equal(back.to_uint8(), images.to_uint8())


@pytest.mark.parametrize("fps, count", [(16, 33), (24, 121), (15, 9), (8, 6)])
def test_gif_frames_keep_the_clips_frame_rate_in_centiseconds(fps, count, tmp_path):
    """GIF durations are centiseconds: one rounded duration for every frame played Wan's 16 fps at 16.7 and 24 at
    25. Per-frame durations keep the clip's length to the centisecond, each frame within 1 cs of 1 / fps."""
    from flowrl.sample_io import _write_gif, gif_durations

    durations = gif_durations(count, fps)
    assert sum(durations) == 10 * round(100 * count / fps)
    assert all(abs(d - 1000 / fps) < 10 for d in durations)
    frames = np.stack([np.full((4, 4, 3), 40 * (k % 6), np.uint8) for k in range(count)])  # no two neighbours alike
    _write_gif(tmp_path / "clip.gif", frames, fps)
    with Image.open(tmp_path / "clip.gif") as gif:
        played = []
        for k in range(gif.n_frames):
            gif.seek(k)
            played.append(gif.info["duration"])
    assert sum(played) == sum(durations)


# (16, 24) is written as is; (13, 15) is tiny and odd, so it is upscaled, by 6 not 5
@pytest.mark.parametrize("size", [(16, 24), (13, 15)])
def test_video_writes_mp4_and_gif(tmp_path, size):
    video = VideoSamples(squares_video(b=2, f=6, h=size[0], w=size[1]), fps=8)
    jsonl = write_samples(tmp_path, video, [{"prompt": "a"}, {"prompt": "b"}])
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert lines[0]["file"] == "00000.mp4" and lines[0]["extra_files"] == ["00000.gif"]
    assert lines[0]["modality"] == "video" and (lines[0]["height"], lines[0]["width"]) == size

    with av.open(str(tmp_path / "00001.mp4")) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = list(container.decode(video=0))
    assert len(frames) == 6
    h, w = frames[0].height, frames[0].width
    assert (h, w) == (size if size == (16, 24) else (78, 90))

    with Image.open(tmp_path / "00001.gif") as gif:
        assert gif.n_frames == 6 and gif.size == (size[1], size[0])
        assert gif.info.get("loop") == 0

    back, _ = read_samples(tmp_path)
    assert type(back) is VideoSamples and back.fps == 8
    assert back.tensor.shape == video.tensor.shape
    error = np.abs(back.to_uint8().astype(float) - video.to_uint8().astype(float))
    assert error.mean() < 8, error.mean()  # < 8/255 on the [0, 1] scale


def test_read_samples_errors_name_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(UserError, match="nowhere"):
        read_samples(missing)

    write_samples(tmp_path / "imgs", ImageSamples(torch.rand(2, 3, 4, 4)), [{}, {}])
    (tmp_path / "imgs" / "00001.png").unlink()
    with pytest.raises(UserError, match="00001.png"):
        read_samples(tmp_path / "imgs")

    (tmp_path / "imgs" / "00001.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match="PNG"):
        read_samples(tmp_path / "imgs")

    write_samples(tmp_path / "vids", VideoSamples(squares_video(b=1, f=2, h=8, w=8)), [{}])
    (tmp_path / "vids" / "00000.mp4").write_bytes(b"garbage")
    with pytest.raises(UserError, match="00000.mp4"):
        read_samples(tmp_path / "vids")


def test_a_sample_jobs_progress_survives_a_cut_line_and_counts_only_the_planned_samples(tmp_path):
    """A progress line cut short by an interruption is skipped and the next one starts on its own line; a written
    sample whose prompt-file fields differ from the plan (an edited .jsonl) is drawn again."""
    import json

    import torch

    from flowrl.resumable_sampling import draw_into, plan_key, written_samples
    from flowrl.tasks.base import Condition

    items = [Condition("a", meta={"image": "x.png"}), Condition("b", meta={"image": "y.png"})]

    def plan(items):
        return [plan_key(i, s) for i, s in zip(items, (1, 2))]

    draw_into(tmp_path, iter([(torch.rand(1, 3, 8, 8), [{"prompt": "a", "seed": 1}])]), [0], items[:1], 0, 8, "image")
    progress = tmp_path / ".progress-0.jsonl"
    progress.write_text(progress.read_text() + '{"index": 1, "prompt": "b", "se')  # killed mid-line
    draw_into(tmp_path, iter([(torch.rand(1, 3, 8, 8), [{"prompt": "b", "seed": 2}])]), [1], items[1:], 0, 8, "image")
    assert sorted(written_samples(tmp_path, plan(items))) == [0, 1]
    assert json.loads(progress.read_text().splitlines()[-1])["index"] == 1
    edited = [items[0], Condition("b", meta={"image": "z.png"})]
    assert sorted(written_samples(tmp_path, plan(edited))) == [0]
    # an earlier samples.jsonl as the prompt file: its file / size fields are overwritten in the line, still matched
    reused = [Condition("a", meta={"file": "old.png", "height": 64, "modality": "image"})]
    draw_into(tmp_path, iter([(torch.rand(1, 3, 8, 8), [{"prompt": "a", "seed": 1}])]), [0], reused, 0, 8, "image")
    assert sorted(written_samples(tmp_path, plan(reused))) == [0]


def test_a_finished_sample_folder_with_non_json_metadata_is_not_drawn_again(tmp_path, monkeypatch):
    """Prompt-file fields that JSON changes (a tuple becomes a list, a numpy number a number, a path text) still match
    the plan on a rerun."""
    from pathlib import Path
    from types import SimpleNamespace

    import numpy as np
    import torch

    from flowrl.resumable_sampling import draw_samples
    from flowrl.tasks.base import Condition

    class OnePixel:  # a policy stand-in: sample_chunks' calls, one flat image per sample
        fps, modality = 8, "image"

        def default_spec(self):
            return SimpleNamespace(height=4, width=4, num_frames=None)

        def noise_shape(self, spec):
            return (3, 4, 4)

    calls = []
    import flowrl.resumable_sampling as job

    def chunks(policy, items, *args, seeds, **kwargs):
        calls.append(len(items))
        yield torch.rand(len(items), 3, 4, 4), [{"prompt": i.prompt, "seed": s} for i, s in zip(items, seeds)]

    state = SimpleNamespace(is_main_process=True, process_index=0, num_processes=1, wait_for_everyone=lambda: None)
    item = Condition("a", meta={"box": (1, 2), "weight": np.float32(0.5), "where": Path("x.png")})
    monkeypatch.setattr(job, "sample_chunks", chunks)
    for _ in range(2):
        draw_samples(OnePixel(), [item], 2, 0, tmp_path, {"steps": 2}, state)
    assert calls == [2, 0]  # the rerun found both samples written
