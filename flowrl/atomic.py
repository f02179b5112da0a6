"""Files and folders written whole or not at all: an interruption (Ctrl-C, a kill, a lost machine) leaves the old
version or the new one, never half of one."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from flowrl.errors import UserError


@contextmanager
def written_whole(path: Path):
    """`with written_whole(path) as partial:` write to `partial` (beside `path`); once the block ends, it is renamed
    over `path`. A block that raises leaves `path` as it was."""
    partial = path.with_name(path.name + ".tmp")
    yield partial
    partial.replace(path)


def write_whole(path: Path, text: str) -> None:
    """`text` to `path`: written beside it, then renamed over it (a run's metrics and evaluations are read back on
    resume; a sample folder's index is read by every evaluation)."""
    with written_whole(path) as partial:
        partial.write_text(text, newline="")  # the text's own line ends (csv writes \r\n itself)


@contextmanager
def replaced_folder(dst: Path):
    """A work folder beside `dst` that takes its place when the block ends without an error (the previous `dst`,
    if any, kept until then and removed after); on an error or an interruption the work folder goes and `dst` is as
    it was: a recipe rebuilding a shipped pipeline never leaves new weights beside an old card."""
    dst = Path(dst)
    if dst.exists() and not dst.is_dir():
        raise UserError(f"{dst} is a file, not a folder; pick a folder")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as partial:
        work = Path(partial) / "out"
        work.mkdir()
        yield work
        if dst.exists():
            dst.rename(Path(partial) / "previous")  # removed with the work folder's parent
        work.rename(dst)


@contextmanager
def new_folder(dst: Path, flag: str):
    """`replaced_folder` for a `dst` that must be new or empty (`flag` names the setting in the error): writing
    into a model folder, or over an earlier output, would mix two outputs' files."""
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UserError(f"{flag} {dst} exists and is not empty; pick a new folder")
    with replaced_folder(dst) as work:
        yield work
