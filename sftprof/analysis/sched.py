"""CPU scheduling (nsys `--cpuctxsw`): when each thread ran, and on which core.

SCHED_EVENTS holds point events, a thread switched in or out on a core; pairing them gives the
thread's on-CPU intervals. With `--cpuctxsw=process-tree` only the profiled process tree is
recorded, so a core's utilisation here is the share of its time spent running the profiled program.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import intervals
from sftprof.trace.events import EventStore, sql_in
from sftprof.trace.tables import TraceTables

CPU_SCHED_SWITCH = "--cpuctxsw=process-tree"
CORE_CHUNKS = 50  # time chunks per core in the utilisation timeline


def runs_sql(span_ns: int) -> str:
    """SQL for one row per stretch a thread ran on a core (global_tid, pid, tid, cpu, start, end,
    duration), from the event store's `sched`: each switch-in paired with the thread's next event when
    that is a switch-out. A thread already running when the capture began (its first event a
    switch-out) ran from 0; one still running at the end, until span_ns (or the last switch, if later).
    Switches of one thread at the same nanosecond: the switch-out first."""
    return f"""
        WITH e AS (
            SELECT global_tid, pid, tid, cpu, start, is_sched_in,
                   lead(is_sched_in) OVER w AS next_in, lead(start) OVER w AS next_start,
                   row_number() OVER w = 1 AS first_of_thread
            FROM sched WINDOW w AS (PARTITION BY global_tid ORDER BY start, is_sched_in)),
        runs AS (
            SELECT global_tid, pid, tid, cpu, start, next_start AS "end" FROM e WHERE is_sched_in AND NOT next_in
            UNION ALL
            SELECT global_tid, pid, tid, cpu, start, greatest({int(span_ns)}, (SELECT max(start) FROM sched))
            FROM e WHERE is_sched_in AND next_in IS NULL
            UNION ALL
            SELECT global_tid, pid, tid, cpu, 0, start FROM e WHERE NOT is_sched_in AND first_of_thread)
        SELECT global_tid, pid, tid, cpu, greatest(start, 0) AS start, "end", "end" - greatest(start, 0) AS duration
        FROM runs WHERE "end" > greatest(start, 0)"""


def off_cpu(events: EventStore, global_tid: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """When one thread was switched out between lo and hi: sorted disjoint (starts, ends), each from a
    switch-out to the thread's next switch-in, clipped to [lo, hi]. Empty where the thread has no switches
    (not traced, or it ran throughout)."""
    rows = events.arrays(
        f"""SELECT start, is_sched_in FROM sched WHERE global_tid = {int(global_tid)} AND start < {int(hi)}
            AND start >= coalesce((SELECT max(start) FROM sched WHERE global_tid = {int(global_tid)}
                                   AND start <= {int(lo)}), {int(lo)})
            ORDER BY start, is_sched_in"""
    )
    times, switched_in = rows["start"].astype("int64"), rows["is_sched_in"].astype(bool)
    if not len(times):
        return np.empty(0, "int64"), np.empty(0, "int64")
    # an interval opens at each switch-out and closes at the next switch-in; a first switch-in closes one
    # that opened before lo, a last switch-out one that lasts past hi
    out_at = np.flatnonzero(~switched_in)
    next_in = np.searchsorted(np.flatnonzero(switched_in), out_at, side="right")
    first = np.diff(next_in, prepend=-1) != 0  # two switch-outs in a row: the first opens the interval
    out_at, next_in = out_at[first], next_in[first]
    starts, ends = times[out_at], np.r_[times[switched_in], hi][next_in]  # no switch-in after: off until hi
    if switched_in[0]:
        starts, ends = np.r_[lo, starts], np.r_[times[0], ends]
    starts, ends = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
    keep = ends > starts
    return starts[keep], ends[keep]


def core_rivals(events: EventStore, span_ns: int, feeders: dict, clock) -> pd.DataFrame:
    """While a thread that launches GPU work (`feeders`: cpu.feeders) was switched out inside the steps
    (`clock`: gains.StepClock), the threads other than the feeders that ran on the cores the feeders ran on: per
    such thread (`global_tid`, `pid`, `tid`), its time there while any feeder was switched out (`ns`, over the
    steps). Only the profiled process tree's threads are seen under `--cpuctxsw=process-tree`."""
    columns = ["global_tid", "pid", "tid", "ns"]
    if not feeders or not clock.has_steps or not events.count("sched"):
        return pd.DataFrame(columns=columns)
    lo, hi = int(clock.starts.min()), int(clock.ends.max())
    off = [off_cpu(events, int(feeder), lo, hi) for feeder in feeders]
    waited = intervals.union(
        pd.DataFrame({"start": np.concatenate([o[0] for o in off]), "end": np.concatenate([o[1] for o in off])})
    )
    if waited.empty:
        return pd.DataFrame(columns=columns)
    ids = sql_in("global_tid", [int(feeder) for feeder in feeders])
    # the overlaps summed in SQL (a range join): a system-wide capture runs millions of threads' runs on those cores
    rivals = events.query(
        f"""WITH r AS ({runs_sql(span_ns)})
            SELECT r.global_tid, r.pid, r.tid,
                   sum(least(r."end", w."end") - greatest(r.start, w.start))::BIGINT AS ns
            FROM r JOIN waited w ON r.start < w."end" AND r."end" > w.start
            WHERE NOT {ids} AND r.start < {hi} AND r."end" > {lo}
              AND r.cpu IN (SELECT DISTINCT cpu FROM sched WHERE {ids})
            GROUP BY r.global_tid, r.pid, r.tid""",
        waited=waited,
    )
    return rivals.sort_values("ns", ascending=False)[columns].reset_index(drop=True)


@dataclass
class CoreUse:
    """What the threads' on-CPU runs (runs_sql) give: `cores` (per core: busy time and share, threads),
    `timeline` (per core and time chunk) and `running` (time on a core, by global_tid)."""

    cores: pd.DataFrame
    timeline: pd.DataFrame
    running: pd.Series


class _Core:
    """One core's runs as they stream by in start order: their union, and the threads seen."""

    def __init__(self, cpu: int):
        self.cpu, self.union = cpu, intervals.RunningUnion()
        self.threads: set[int] = set()

    def add(self, starts: np.ndarray, ends: np.ndarray, threads: np.ndarray) -> None:
        self.union.add(starts, ends)
        self.threads.update(np.unique(threads).tolist())


def core_use(events: EventStore, span_ns: int, chunks: int = CORE_CHUNKS) -> CoreUse:
    """Per core: busy time over the capture (the union of the runs on it), the threads that ran on it,
    and its busy share in each of `chunks` time chunks; per thread, its time on a core. One pass over the
    runs, ordered by core and start a batch at a time (a system-wide `--cpuctxsw` capture holds tens of
    millions of switches): memory holds one core's union."""
    columns = {
        "cores": ["cpu", "busy_ns", "busy_pct", "threads"],
        "timeline": ["cpu", "chunk", "start", "end", "busy_pct"],
    }
    chunk_starts, chunk_ends = intervals.chunk_edges(0, span_ns, chunks) if span_ns > 0 else (None, None)
    cores: list[list] = []
    timeline: list[pd.DataFrame] = []
    running: dict[int, int] = {}
    core = None

    def finish(core: _Core) -> None:
        merged = core.union.result()
        busy = intervals.total_length(merged)
        cores.append([core.cpu, busy, 100.0 * busy / span_ns if span_ns else np.nan, len(core.threads)])
        if chunk_starts is not None:
            covered = intervals.covered_ns(merged, chunk_starts, chunk_ends)
            timeline.append(
                pd.DataFrame(
                    {
                        "cpu": core.cpu,
                        "chunk": np.arange(chunks),
                        "start": chunk_starts,
                        "end": chunk_ends,
                        "busy_pct": 100.0 * covered / np.maximum(chunk_ends - chunk_starts, 1),
                    }
                )
            )

    sql = f'SELECT cpu, start, "end", duration, global_tid FROM ({runs_sql(span_ns)}) ORDER BY cpu, start'
    for batch in events.batches(sql):
        cpu, starts, ends, threads = (batch[c].to_numpy("int64") for c in ("cpu", "start", "end", "global_tid"))
        ids, where = np.unique(threads, return_inverse=True)
        for tid, total in zip(ids.tolist(), np.bincount(where, weights=batch["duration"].to_numpy("float64"))):
            running[tid] = running.get(tid, 0) + int(total)
        edges = np.flatnonzero(np.diff(cpu)) + 1
        for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(cpu)], strict=True):
            if core is None or core.cpu != cpu[lo]:
                if core is not None:
                    finish(core)
                core = _Core(int(cpu[lo]))
            core.add(starts[lo:hi], ends[lo:hi], threads[lo:hi])
    if core is not None:
        finish(core)
    return CoreUse(
        pd.DataFrame(cores, columns=columns["cores"]),
        pd.concat(timeline, ignore_index=True) if timeline else pd.DataFrame(columns=columns["timeline"]),
        pd.Series(running, dtype="int64"),
    )


def cpu_cores(use: CoreUse) -> pd.DataFrame:
    """Each core's busy share: the saved table of core_use."""
    return use.cores


def cpu_timeline(use: CoreUse) -> pd.DataFrame:
    """Each core's busy share over time: the saved table of core_use."""
    return use.timeline


def sched_traced(tables: TraceTables, events: EventStore) -> bool:
    """Whether CPU scheduling was traced: asked for (cpuctxsw), or its events are there."""
    return "cpuctxsw" in tables.sources or events.count("sched") > 0
