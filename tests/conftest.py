import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_sd3_dir(tmp_path_factory):
    """A tiny random shapes-sd3 pipeline saved in diffusers format."""
    from tiny_pipelines import tiny_shapes_sd3

    folder = tmp_path_factory.mktemp("tiny_sd3")
    tiny_shapes_sd3().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory):
    """A tiny random Wan text-to-video pipeline saved in diffusers format."""
    from tiny_pipelines import tiny_wan

    folder = tmp_path_factory.mktemp("tiny_wan")
    tiny_wan().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_shapes3d_dir(tmp_path_factory):
    """A tiny random image-to-3D flow pipeline saved in diffusers format."""
    from tiny_pipelines import tiny_shapes3d

    folder = tmp_path_factory.mktemp("tiny_shapes3d")
    tiny_shapes3d().save_pretrained(folder)
    return folder
