import os
import sys
from pathlib import Path

import pytest
import torch

# the shared fixtures (tiny pipelines, toy models, run helpers, workers, plug-ins) are importable by name from every
# test folder
sys.path.insert(0, str(Path(__file__).parent / "support"))
# pytest runs on two xdist workers (pyproject's addopts), one per core of the project's 2-core machine: each worker,
# and every process a test starts, keeps to one thread, since two workers with two threads each oversubscribe the
# cores and OpenMP's waiting threads then made single tests up to 9x slower
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST_WORKER:
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # inherited by subprocesses
torch.set_num_threads(1 if XDIST_WORKER else 2)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread_per_worker(monkeypatch):
    """Code under test that sets its own thread count (benchmark scripts, recipes' `threads`) keeps one per worker."""
    if XDIST_WORKER:
        monkeypatch.setattr(torch, "set_num_threads", lambda n: None)


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


@pytest.fixture(scope="session")
def tiny_shapes3d_text_dir(tmp_path_factory):
    """A tiny random text-to-3D flow pipeline saved in diffusers format."""
    from tiny_pipelines import tiny_shapes3d

    folder = tmp_path_factory.mktemp("tiny_shapes3d_text")
    tiny_shapes3d(text=True).save_pretrained(folder)
    return folder


@pytest.fixture
def fresh_accelerator_state():
    """accelerate keeps one process-wide state; a test with another mixed precision needs it reset (and reset back)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
