"""Atomic file writes: a failed step must never leave a file that looks complete, and two runs
writing the same output never mix."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from sftprof.errors import SftprofError


class OutputError(SftprofError):
    """An output folder that cannot be written: another run is writing it, it is not sftprof's to
    replace, or its parent is not writable."""


def _no_file_above(path: Path) -> None:
    """Refuse `path` below a file (`-o notes.txt/out`) naming the file, where mkdir says only "File exists"
    or "Not a directory"."""
    for folder in path.parents:
        if os.path.isdir(folder):
            return
        if os.path.lexists(folder):
            raise OutputError(f"cannot write {path}: {folder} is a file, not a folder")


def make_parent(path: Path) -> None:
    """Create the folders above `path` (see _no_file_above)."""
    _no_file_above(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror or error}") from None


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it into place only if the block succeeds. The block may
    put a folder in the temporary's place (nsys writes a parquetdir so): it then replaces a folder at `path`."""
    path = Path(path)
    make_parent(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial" + path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; finished files get the usual permissions
    try:
        try:
            yield tmp
        except OSError as error:
            raise _full(error, path) or error from None
        if tmp.is_dir() and not tmp.is_symlink() and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # os.replace puts a folder only where none is, or an empty one
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


class InputError(SftprofError):
    """A file to read that is not a regular file (a folder, a FIFO, a device) or is larger than it may be."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: cannot read it: {reason}")
        self.reason = reason


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def open_regular(path: str | Path, limit: int | None = None) -> BinaryIO:
    """`path` opened for reading if what it names is a regular file of at most `limit` bytes: a folder fails
    on reading, a FIFO blocks, a device such as /dev/zero never ends. Opened without blocking and checked on
    what was opened, so a FIFO is refused at once and a swapped link cannot slip past. Other errors (no such
    file, no permission) are the OSError open gives."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(path, f"{_kind(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise InputError(path, f"{info.st_size:,} bytes, more than the {limit:,} it may hold")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_limited(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (open_regular), also where it grows while read."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(path, f"more than the {limit:,} bytes it may hold")
    return data


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold `.NAME.lock` beside `path`, or refuse at once if another process holds it. The lock
    file goes when the holder is done; a process that locked a file removed meanwhile tries again."""
    lock_path = path.with_name(f".{path.name}.lock")
    while True:
        make_parent(path)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            raise OutputError(f"cannot write {path}: {error.strerror or error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(
                f"another sftprof is writing {path}; wait for it to finish or choose another output folder"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock_path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        os.unlink(lock_path)
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _temporary_prefix(path: Path) -> str:
    """How the temporaries of `path`'s atomic_dir begin: `.NAME.sftprof-PID-`, mkdtemp's random part and
    `.partial` or `.old` follow. The tag tells them from a user's own `.NAME.x.old`."""
    return f".{path.name}.sftprof-{os.getpid()}-"


def _clear_leftovers(path: Path) -> None:
    """Remove what runs killed mid-write left beside `path` (they held the lock, so none is still
    running), and only what they made, named by `_temporary_prefix`. A run killed between its two renames
    left only `.old`: that is the previous output."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.sftprof-[0-9]+-[a-z0-9_]+\.(partial|old)")
    for leftover in path.parent.iterdir():
        match = pattern.fullmatch(leftover.name)
        if match and match[1] == "old" and not os.path.lexists(path):
            leftover.rename(path)
        elif match:
            _remove(leftover)


def _full(error: OSError, path: Path) -> OutputError | None:
    """The error for an output whose disk (or quota) is full; None for any other."""
    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return OutputError(
        f"no space left on the disk of {path.parent} to write {path} ({error.strerror}): free space there or "
        "choose another output folder; the previous output is kept"
    )


def check_output(path: str | Path, owned: Collection[str] | None = None) -> Path:
    """`path` as an absolute path if it can be an output folder (see atomic_dir), else an OutputError: a path
    below a file or at one, or with `owned`, a folder holding anything else. Called before any work too, so
    that a run of hours is not refused at its end."""
    path = Path(os.path.abspath(path))
    if not path.name:
        raise OutputError(f"{path} cannot be an output folder")
    _no_file_above(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputError(f"cannot write {path}: it is a file, not a folder")
    if (
        owned is not None
        and os.path.lexists(path)
        and (path.is_symlink() or not {p.name for p in path.iterdir()} <= set(owned))
    ):
        raise OutputError(f"{path} exists and is not an output folder of sftprof: give a new or empty folder")
    return path


@contextmanager
def atomic_dir(path: str | Path, owned: Collection[str] | None = None) -> Iterator[Path]:
    """Yield a fresh folder private to this run; swap it in for `path` only if the block succeeds.

    One writer at a time (another is refused, see `_exclusive`). The swap renames the old folder
    aside, the new one in, then deletes the old: `path` is always wholly old or wholly new. With
    `owned` (the names this output consists of), a `path` holding anything else is refused
    rather than replaced: it is not sftprof's output.
    """
    path = check_output(path)
    with _exclusive(path):
        _clear_leftovers(path)
        check_output(path, owned)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(path), suffix=".partial", dir=path.parent))
        except OSError as error:
            raise _full(error, path) or error from None
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700; finished folders get the usual permissions
            try:
                yield tmp
            except OSError as error:
                raise _full(error, path) or error from None
            old = tmp.with_suffix(".old")
            if os.path.lexists(path):
                path.rename(old)
            tmp.rename(path)
            if os.path.lexists(old):
                _remove(old)
        finally:
            if os.path.lexists(tmp):
                _remove(tmp)
