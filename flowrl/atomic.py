"""Files and folders written whole or not at all: an interruption (Ctrl-C, a kill, a lost machine) leaves the old
version or the new one, never half of one."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


def write_whole(path: Path, text: str) -> None:
    """`text` to `path`: written beside it, then renamed over it (a run's metrics and evaluations are read back on
    resume; a sample folder's index is read by every evaluation)."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


@contextmanager
def new_folder(dst: Path, flag: str):
    """A work folder that becomes `dst` when the block ends without an error (else it is removed). `dst` must be new
    or empty (`flag` names the setting in the error): writing into a model folder, or over an earlier output, would
    mix two outputs' files."""
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UserError(f"{flag} {dst} exists and is not empty; pick a new folder")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as partial:
        work = Path(partial) / "out"
        work.mkdir()
        yield work
        if dst.exists():
            dst.rmdir()
        work.rename(dst)
