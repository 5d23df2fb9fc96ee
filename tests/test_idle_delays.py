"""The launches a call delayed (idle._Pieces.delayed_by): moved to the call up to its delay, until the thread
is ahead of the GPU again, with the step's idle time unchanged."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import idle

HOST, ALLOCATION = idle.CAUSE_NAMES.index(idle.HOST_OVERHEAD), idle.CAUSE_NAMES.index(idle.ALLOCATION)
FREE = 7  # a CUDA call name id


def host_pieces(starts, lengths) -> idle._Pieces:
    n = len(starts)
    return idle._Pieces(
        np.zeros(n), np.full(n, HOST), np.full(n, idle.OWN), np.full(n, -1), np.full(n, -1), starts, lengths
    )


def moved(pieces: idle._Pieces) -> list[tuple[int, int, int]]:
    """(start, idle_ns, cause) of every piece, in start order, the moved part before what is kept."""
    rows = zip(pieces.start.tolist(), pieces.idle_ns.tolist(), pieces.columns[1].tolist(), strict=True)
    return sorted(rows, key=lambda r: (r[0], r[2] == HOST))


def delayed(ahead=()) -> idle._Pieces:
    """A free that held the thread 10 ns while the GPU ran, ending at 100, then three pieces of 4 ns."""
    return host_pieces([110, 120, 130], [4, 4, 4]).delayed_by(
        np.array([100]), np.array([10]), np.array([ALLOCATION]), np.array([FREE]), np.asarray(ahead, "int64")
    )


def test_the_pieces_after_a_call_take_its_delay_and_no_more():
    pieces = delayed()
    assert moved(pieces) == [(110, 4, ALLOCATION), (120, 4, ALLOCATION), (130, 2, ALLOCATION), (130, 2, HOST)]
    assert pieces.idle_ns.sum() == 12 and set(pieces.columns[3][pieces.columns[1] == ALLOCATION]) == {FREE}
    assert set(pieces.columns[2][pieces.columns[1] == ALLOCATION]) == {idle.DELAYED}


def test_once_the_thread_is_ahead_again_its_launches_are_its_own():
    assert moved(delayed(ahead=[115])) == [(110, 4, ALLOCATION), (120, 4, HOST), (130, 4, HOST)]


def test_pieces_before_the_call_stay_host_overhead():
    pieces = host_pieces([50, 110], [5, 5]).delayed_by(
        np.array([100]), np.array([3]), np.array([ALLOCATION]), np.array([FREE]), np.zeros(0, "int64")
    )
    assert moved(pieces) == [(50, 5, HOST), (110, 3, ALLOCATION), (110, 2, HOST)]


@pytest.mark.parametrize("seed", range(5))
def test_run_sums_and_minima_restart_with_each_run(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-(10**9), 10**9, 500)
    first = rng.random(500) < 0.1
    first[0] = True
    runs = pd.Series(values).groupby(np.cumsum(first))
    assert (idle._run_cumsum(values, first) == runs.cumsum().to_numpy()).all()
    assert (idle._run_cummin(values, first) == runs.cummin().to_numpy()).all()


SYNC, STREAM_SYNC = idle.CAUSE_NAMES.index(idle.SYNCHRONIZATION), 9  # a synchronizing call's name id


def between(starts, ends) -> idle._Pieces:
    """Host-overhead pieces of 4 ns at 110, 120 and 5_000_130, with synchronizations at `starts`-`ends`."""
    pieces = host_pieces([110, 120, 5_000_130], [4, 4, 4])
    ids = np.full(len(starts), STREAM_SYNC)
    return pieces.between_reads(np.asarray(starts, "int64"), np.asarray(ends, "int64"), ids)


def test_launches_between_two_close_synchronizations_are_theirs():
    pieces = between([100, 200, 5_000_140], [105, 210, 5_000_150])
    assert moved(pieces) == [(110, 4, SYNC), (120, 4, SYNC), (5_000_130, 4, HOST)]
    assert set(pieces.columns[2][pieces.columns[1] == SYNC]) == {idle.DELAYED}
    assert set(pieces.columns[3][pieces.columns[1] == SYNC]) == {STREAM_SYNC}


def test_launches_after_a_lone_synchronization_stay_host_overhead():
    """Synchronizations more than HOST_GAP_NS apart: the thread can run ahead between them."""
    assert moved(between([100, 5_000_140], [105, 5_000_150])) == [(110, 4, HOST), (120, 4, HOST), (5_000_130, 4, HOST)]


def test_host_time_switched_out_waits_for_a_core_and_blocking_calls_keep_theirs():
    """Own code from 0 to 100 and a synchronization from 100 to 200, the thread switched out 50-150: the own code's
    switched-out half waits for a core, the synchronization keeps all its time."""
    sync = idle.CAUSE_NAMES.index(idle.SYNCHRONIZATION)
    api = (np.array([100]), np.array([200]), np.array([0]), np.array([sync]), idle.CUDA_API, np.array([3]))
    own = (np.array([0]), np.array([100]), np.array([0]), np.array([HOST]), idle.OWN, None)
    parts = idle._switched_out([api, own], np.array([50]), np.array([150]))
    cut = sorted((int(s), int(e), int(c)) for p in parts for s, e, c in zip(p[0], p[1], p[3], strict=True))
    assert cut == [(0, 50, HOST), (50, 100, idle.CAUSE_NAMES.index(idle.CPU_WAIT)), (100, 200, sync)]
    assert [p[5] for p in parts if p[4] == idle.OWN] == [None, None, None]  # own code stays named by its range
    assert idle._switched_out([own], np.zeros(0, "int64"), np.zeros(0, "int64")) == [own]


def test_a_thread_switched_out_waits_for_a_core_only_where_os_calls_were_traced():
    """Without OS calls traced a thread switched out may be blocked in one (a queue, a lock, a read): then no
    time is read as waiting for a core."""
    from sftprof.trace.events import EventStore

    call = pd.DataFrame(
        {"start": [0], "end": [5], "duration": [5], "name": ["sem_wait"], "global_tid": [1], "pid": [0], "tid": [1]}
    )
    assert idle._Names(EventStore.from_frames(osrt=call)).os_traced
    assert not idle._Names(EventStore.from_frames()).os_traced
