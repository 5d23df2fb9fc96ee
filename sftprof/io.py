"""Atomic file writes: a failed step must never leave a file that looks complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial" + path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; finished files get the usual permissions
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a fresh `path`.partial folder; swap it in for `path` only if the block succeeds."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
