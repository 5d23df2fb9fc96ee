"""Unfused attention is found a window of kernels at a time (excess.unfused_attention): a run cut by a window's
end is the same run, whatever the window size."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sftprof.analysis import excess, gains
from sftprof.trace import load_trace

from conftest import unpack_xz

EAGER = Path(__file__).parent / "fixtures" / "foreign" / "eager_attention.sqlite.xz"


def test_runs_are_the_same_in_windows_of_2048_kernels(tmp_path, monkeypatch):
    tables = load_trace(unpack_xz(EAGER, tmp_path / "eager.sqlite"))
    try:
        whole = excess.unfused_attention(tables.events)
        monkeypatch.setattr(gains, "CHAIN_WINDOW_ROWS", 2048)  # runs cut at every window's end
        batched = excess.unfused_attention(tables.events)
    finally:
        tables.events.close()
    assert len(whole) == 192  # 48 attention softmaxes an iteration (24 layers, forward and backward), 4 iterations
    pd.testing.assert_frame_equal(whole, batched)
