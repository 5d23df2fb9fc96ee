"""The temporary folders an analysis holds under $TMPDIR while it runs (the event store, the export reader's
spill, an export that cannot go beside its report). Each is named with its host and process id, so that a
later run on the host removes those of a process that ended without removing them (kill -9, a lost node):
a 1M-kernel store is tens of MB, and nothing else would ever remove it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import tempfile

_NAME = re.compile(r"sftprof-[a-z]+-(?P<host>.+)-(?P<pid>[0-9]+)-[A-Za-z0-9_]{8}")
_swept = False


def prefix(kind: str) -> str:
    """The prefix of this process's temporary folders of `kind` (`sftprof-KIND-HOST-PID-`, tempfile adds 8
    characters); the first call of a process sweeps what dead ones left."""
    global _swept
    if not _swept:
        _swept = True
        sweep()
    return f"sftprof-{kind}-{socket.gethostname()}-{os.getpid()}-"


def folder(kind: str) -> str:
    """A new private folder under $TMPDIR (prefix)."""
    return tempfile.mkdtemp(prefix=prefix(kind))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: running
        return True
    return True


def sweep(own: bool = False) -> list[str]:
    """Remove this user's folders (`folder`) of processes on this host that no longer run: what runs ended by
    kill -9 left. A folder of another host (a shared $TMPDIR) is left to that host. `own`: this process's
    instead, for a run stopped by a signal, which may have come before a folder's owner could remove it."""
    root, host = tempfile.gettempdir(), socket.gethostname()
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _NAME.fullmatch(name)
        if not match or match["host"] != host:
            continue
        pid = int(match["pid"])
        if (pid != os.getpid()) if own else (pid == os.getpid() or _running(pid)):
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
