"""flowrl.report.figure: the one place plots are laid out, written and closed."""

import matplotlib.pyplot as plt
import pytest
from PIL import Image

from flowrl.report import figure, image_grid


def test_figure_writes_the_png_and_closes_it(tmp_path):
    path = tmp_path / "curves.png"
    with figure(path, 1, 2, figsize=(4, 2), dpi=50, title="two panels") as (fig, axes):
        assert len(axes) == 2
        axes[0].plot([0, 1], [1, 0])
        assert fig.get_suptitle() == ""  # the title is set when the block ends, before the layout
    assert fig.get_suptitle() == "two panels"
    assert Image.open(path).size == (200, 100)
    assert plt.get_fignums() == []


def test_figure_closes_but_writes_nothing_when_drawing_fails(tmp_path):
    path = tmp_path / "broken.png"
    with pytest.raises(KeyError):
        with figure(path, figsize=(2, 2)) as (fig, ax):
            ax.plot([0, 1], [{}["missing"], 0])
    assert not path.exists()
    assert plt.get_fignums() == []


@pytest.mark.parametrize("side,cell", [(32, 128), (1024, 256)])
def test_grid_cells_enlarge_small_samples_and_shrink_large_ones(tmp_path, side, cell):
    import numpy as np

    image = np.zeros((side, side, 3), np.uint8)
    image[: side // 2] = 255  # top half white: still there after resizing
    image_grid([[image, image], [image, image]], ["base", "tuned"], ["a", "b"], tmp_path / "g.png")
    grid = np.asarray(Image.open(tmp_path / "g.png"))
    assert grid.shape[:2] == (20 + 2 * (cell + 4), 260 + 2 * (cell + 4))  # title column, header row, 4 px gaps
    first = grid[20 : 20 + cell, 260 : 260 + cell]
    assert first[: cell // 2 - 4].min() >= 250 and first[cell // 2 + 4 :].max() <= 5  # (Lanczos rings at the edge)


def test_logged_sample_grids_are_shrunk_to_a_bounded_size():
    import torch

    from flowrl.experiment import log_samples
    from flowrl.sample_io import ImageSamples

    logged = []
    log = type("Log", (), {"add_image": lambda self, tag, image, step: logged.append(image)})()
    log_samples(log, ImageSamples(torch.rand(8, 3, 32, 32)), 0, per_prompt=2)  # 4 prompts: one row, untouched
    log_samples(log, ImageSamples(torch.rand(8, 3, 1024, 1024)), 0, per_prompt=1, longest=1024)
    assert logged[0].shape == (32, 4 * 32 + 3 * 2, 3)
    assert max(logged[1].shape[:2]) == 1024 and logged[1].dtype.name == "uint8"


def test_an_interrupted_write_leaves_the_runs_metrics_and_evaluations_whole(tmp_path, monkeypatch):
    """metrics.csv and eval.json are read back on resume: a write cut off halfway must leave the previous file."""
    import json
    import pathlib

    from flowrl.report import MetricsLog, save_json

    log = MetricsLog(tmp_path, tensorboard=False)
    log.append(1, {"reward": 0.5})
    log.append(2, {"reward": 0.6})
    save_json(tmp_path / "eval.json", {"0": {"overall": 0.3}})
    real_open = pathlib.Path.open

    class HalfWritten:  # writes half of what it is given, then the process is "killed"
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[: len(text) // 2])
            self.file.close()
            raise KeyboardInterrupt

    def interrupted_open(self, mode="r", *args, **kwargs):
        file = real_open(self, mode, *args, **kwargs)
        return HalfWritten(file) if "w" in mode else file

    monkeypatch.setattr(pathlib.Path, "open", interrupted_open)
    with pytest.raises(KeyboardInterrupt):
        log.append(3, {"reward": 0.7})
    with pytest.raises(KeyboardInterrupt):
        save_json(tmp_path / "eval.json", {"0": {"overall": 0.3}, "3": {"overall": 0.4}})
    monkeypatch.undo()
    assert [row["reward"] for row in MetricsLog(tmp_path, tensorboard=False).rows] == [0.5, 0.6]
    assert json.loads((tmp_path / "eval.json").read_text()) == {"0": {"overall": 0.3}}


def test_an_interval_nothing_estimates_is_shown_as_such_and_saved_as_json_null(tmp_path):
    """A tag with one prompt has no prompt-level standard error (NaN): the report says n/a, not "+- nan", and
    eval.json holds null (bare NaN is not JSON), read back to the same table."""
    import json
    import math

    from flowrl.report import save_json, write_report
    from flowrl.tasks.base import format_metrics, tag_metrics

    result = tag_metrics([1, 0, 1, 0, 1, 1, 0, 0], ["a"] * 4 + ["b"] * 4, clusters=["p"] * 4 + ["q", "r"] * 2)
    assert math.isnan(result["stderr"]["tags"]["a"]) and math.isnan(result["stderr"]["overall"])
    save_json(tmp_path / "eval.json", result)
    text = (tmp_path / "eval.json").read_text()
    assert "NaN" not in text and json.loads(text)["stderr"]["tags"]["a"] is None
    read_back = json.loads(text)
    assert format_metrics(read_back) == format_metrics(result)
    page = write_report(tmp_path, "config", result, read_back, [], grid=False).read_text()
    assert "nan" not in page.lower().replace("n/a", "") and "&plusmn; n/a" in page


def test_a_sample_its_reward_failed_on_is_left_out_and_counted_not_nan_everywhere(tmp_path):
    """One NaN score (a judge that answered neither yes nor no) once made its tag, the overall and every interval
    NaN; a report read back with a null overall (a tag whose every sample failed) once raised TypeError."""
    import json
    import math

    from flowrl.report import save_json, write_report
    from flowrl.tasks.base import format_metrics, tag_metrics

    nan = float("nan")
    result = tag_metrics([1, 0, nan, 1, 0, 0], ["a"] * 4 + ["b"] * 2, clusters=list("pqrstu"))
    assert result["tags"] == {"a": 2 / 3, "b": 0.0} and result["counts"] == {"a": 3, "b": 2}
    assert result["failed"] == {"a": 1} and math.isfinite(result["stderr"]["overall"])
    assert "left out, the reward failed on them: 1 a" in format_metrics(result)
    assert "failed" not in tag_metrics([1, 0], ["a", "a"])
    empty = tag_metrics([nan, nan, 1.0], ["a", "a", "b"])
    assert empty["tags"] == {"b": 1.0} and empty["failed"] == {"a": 2} and math.isnan(empty["overall"])
    assert math.isnan(tag_metrics([nan] * 3, ["a"] * 3)["overall"])  # not 0.000 +- 0.000
    save_json(tmp_path / "eval.json", {"overall": nan, "tags": {"a": nan}, "counts": {"a": 0}})
    read_back = json.loads((tmp_path / "eval.json").read_text())
    page = write_report(tmp_path, "config", result, read_back, [], grid=False).read_text()
    assert "<th>overall</th>" in page


def test_the_seed_interval_is_students_t_times_the_standard_error():
    """Three seeds 1, 2, 3: sample std 1 (n - 1 in the denominator), standard error 1 / sqrt(3), t(0.975, 2) = 4.303."""
    from flowrl.report import t_half_width

    assert t_half_width([1.0, 2.0, 3.0]) == pytest.approx(4.3027 / 3**0.5, rel=1e-4)
    assert t_half_width([5.0]) is None  # no interval over one seed
    columns = t_half_width([[1.0, 10.0], [2.0, 10.0], [3.0, 10.0]], axis=0)  # one interval per column (per update)
    assert columns == pytest.approx([4.3027 / 3**0.5, 0.0], rel=1e-4)
