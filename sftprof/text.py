"""Untrusted text on its way out. Kernel, thread and NVTX names come from the traced program and
file names from the user: on a terminal they must not act as control sequences, and in a CSV
opened by a spreadsheet they must not act as formulas."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import BinaryIO

import pandas as pd

# C0, DEL and C1 controls (ESC, CSI, OSC, BEL, CR, backspace...), line and paragraph separators
# (str.splitlines breaks there), bidirectional overrides (they reorder what is shown) and lone
# surrogates (undecodable bytes of a file name, which a strict stdout cannot even encode).
_NOT_C0 = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_NOT_C0}]")
_UNSAFE_KEEPING_NEWLINES = re.compile(f"[\x00-\x09\x0b-\x1f{_NOT_C0}]")
# An HTML page's own whitespace (tab, line feed, carriage return) is markup, not a name's.
_UNSAFE_IN_PAGE = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{_NOT_C0}]")

# A cell starting with one of these is a formula to Excel, LibreOffice or Google Sheets (OWASP
# "CSV injection"); a leading quote makes it text. A cell that starts with a quote already gets
# one more, so that reading back removes exactly one.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")
_QUOTE = "'"


def _escape(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def terminal_safe(text: str, multiline: bool = False) -> str:
    """`text` with every control character written as a visible escape (`\\x1b`, `\\r`, `\\u202e`):
    one line, unless `multiline` keeps its newlines."""
    return (_UNSAFE_KEEPING_NEWLINES if multiline else _UNSAFE).sub(_escape, str(text))


def page_safe(page: str) -> str:
    """A rendered HTML page with every control character but tab, line feed and carriage return
    written as a visible escape: a bidirectional override or NUL from a name cannot reorder or cut
    what a browser shows."""
    return _UNSAFE_IN_PAGE.sub(_escape, page)


def _cell_out(value):
    return _QUOTE + value if isinstance(value, str) and value.startswith(_FORMULA_STARTS) else value


def _cell_in(value):
    return value[1:] if isinstance(value, str) and value.startswith(_QUOTE) else value


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    """The one CSV writer: string cells (and column names) that a spreadsheet would run as a
    formula get a leading quote; numbers, negative ones included, stay numbers. Every string is
    in double quotes: a lone carriage return in a name would otherwise end its row for readers."""
    text = frame.select_dtypes(exclude="number").columns
    safe = frame.copy()
    if len(text):
        safe[text] = safe[text].map(_cell_out)
    safe.columns = [_cell_out(column) for column in frame.columns]
    safe.to_csv(path, index=False, quoting=csv.QUOTE_NONNUMERIC)


def read_csv(path: str | Path | BinaryIO) -> pd.DataFrame:
    """What `write_csv` wrote, with the quotes it added taken off again."""
    frame = pd.read_csv(path)
    text = frame.select_dtypes(exclude="number").columns
    if len(text):
        frame[text] = frame[text].map(_cell_in)
    frame.columns = [_cell_in(column) for column in frame.columns]
    return frame
