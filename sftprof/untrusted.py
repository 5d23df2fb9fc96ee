"""Names that come from outside (a server's listing, a record a job wrote on the cluster),
checked before they become local paths: a hostile or compromised cluster must not be able to
write anywhere but the folder a name is meant for."""

from __future__ import annotations

import re

from sftprof.errors import SftprofError

# C0 and C1 control characters and DEL (newline and tab included): a newline forges a log line or
# splits a rendered script's line, an escape drives the terminal.
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# The longest file name most local file systems take (ext4, xfs, NFS).
MAX_NAME_BYTES = 255


class UnsafeName(SftprofError, ValueError):
    """A name that would not stay a plain file in the folder it is meant for."""


def plain_file_name(name: object, what: str) -> str:
    """`name` if it is a plain file name, else UnsafeName naming `what`.

    Refused: separators, `.` and `..` (so no traversal and no absolute path), hidden names
    (sftprof's own `.NAME.part` files start with a dot), a leading `-` (an option to a
    command), control characters (a newline forges log lines), and names too long to write.
    """
    if not isinstance(name, str):
        raise UnsafeName(f"{what}: expected a file name, got {type(name).__name__}")
    unsafe = (
        not name
        or name.startswith((".", "-"))
        or "/" in name
        or "\\" in name
        or CONTROL_CHARACTER.search(name)
        or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES
    )
    if unsafe:
        raise UnsafeName(f"{what}: {ascii(name)[:200]} is not a plain file name; refusing to write it")
    return name
