"""flowrl.report.figure: the one place plots are laid out, written and closed."""

import matplotlib.pyplot as plt
import pytest
from PIL import Image

from flowrl.report import figure


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
