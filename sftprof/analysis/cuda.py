"""CUDA API calls beyond the cudaapisum table: launch cost, and the calls in which the CPU waits for the GPU.

Names are matched without their `_vNNNN` suffix (nsys strips only 5-character versions such as
`_v7000`, so `cudaLaunchKernelExC_v11060` keeps its suffix in the summary).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from sftprof.analysis.spilled import SpilledUnion
from sftprof.analysis.stats import finish_summary, grouped_summary
from sftprof.trace.events import EventStore, sql_in

API_VERSION_SUFFIX = re.compile(r"_v\d+$")
# Calls that put a kernel on a stream (runtime and driver API).
LAUNCH_CALLS = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
}
# Calls in which the host thread blocks until GPU work has finished.
HOST_SYNC_CALLS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
}
# Calls that order streams on the GPU without blocking the host.
STREAM_WAIT_CALLS = {"cudaStreamWaitEvent", "cuStreamWaitEvent"}
# cudaMemcpy*/cudaMemset* without `Async`: synchronous with respect to the host (a memset only for
# pinned or managed memory, see rules.sync_memset).
SYNC_MEMCPY_CALL = re.compile(r"^cu(?:da)?Memcpy(?!.*Async)")
SYNC_MEMSET_CALL = re.compile(r"^cu(?:da)?Memset(?!.*Async)")
ASYNC_MEMCPY_CALL = re.compile(r"^cu(?:da)?Memcpy.*Async")


def base_name(name: str) -> str:
    """A call name without its version suffix."""
    return API_VERSION_SUFFIX.sub("", name)


def waits_for_gpu(name: str) -> bool:
    return base_name(name) in HOST_SYNC_CALLS or bool(SYNC_MEMCPY_CALL.search(base_name(name)))


def name_ids(events: EventStore, keep) -> list[int]:
    """Ids of the call names (a few dozen, whatever the trace size) for which `keep(name)` holds."""
    names = events.used_names("cuda_api")
    return [int(i) for i, name in zip(names["id"], names["name"], strict=True) if keep(str(name))]


def launch_ids(events: EventStore) -> list[int]:
    """Ids of the kernel launch calls' names (LAUNCH_CALLS)."""
    return name_ids(events, lambda name: base_name(name) in LAUNCH_CALLS)


def host_sync_ids(events: EventStore) -> list[int]:
    """Ids of the explicit synchronization calls' names (HOST_SYNC_CALLS)."""
    return name_ids(events, lambda name: base_name(name) in HOST_SYNC_CALLS)


# tables.py's cuda_api columns, the name as its id: EventStore.named gives it its text (CALL_NAMES)
CALL_COLUMNS = 'a.start, a."end", a.duration, a.name_id AS name, a.global_tid, a.pid, a.tid, a.correlation_id'
CALL_NAMES = {"name": "SELECT id, name AS label FROM api_names"}


def calls_during(events: EventStore, windows: pd.DataFrame, threads) -> pd.DataFrame:
    """The calls of `threads` (global_tids) that overlap any [start, end) of `windows`."""
    if windows.empty or not len(threads):
        return events.named(f"SELECT {CALL_COLUMNS} FROM cuda_api a LIMIT 0", CALL_NAMES)
    return events.named(
        f"""
        SELECT DISTINCT {CALL_COLUMNS} FROM cuda_api a JOIN api_names n ON n.id = a.name_id
        JOIN windows w ON a.start < w."end" AND a."end" > w.start
        WHERE {sql_in("a.global_tid", threads)}
        ORDER BY a.start""",
        CALL_NAMES,
        windows=windows[["start", "end"]].astype("int64"),
    )


def calls_by_thread(events: EventStore) -> pd.DataFrame:
    """Per calling thread (global_tid, pid, tid): how many CUDA API calls, and their time."""
    return events.query("""SELECT global_tid, any_value(pid) AS pid, any_value(tid) AS tid, count(*) AS calls,
                                  sum(duration)::BIGINT AS total_ns FROM cuda_api GROUP BY global_tid""")


# GPU work this long takes longer than any call that only queues it (a launch or an asynchronous copy returns
# in 5-30 µs, ~120 µs under tracing): a call that returns after it ended waited for it.
SYNCHRONOUS_PROBE_NS = 50_000
SYNCHRONOUS_COVER = 0.9  # share of a probe op's run its call must still be open for: queued work starts after


@dataclass(frozen=True)
class WaitCalls:
    """The API calls in which the calling thread waits for the GPU: explicit synchronization and synchronous
    memcpy by name (`ids`: their name ids), and the calls that wait for the work they issue on the threads that
    make them so (`synchronous`: (global_tid, name ids), synchronous_issuers), not their rows. A trainer that
    synchronizes after every launch makes one per kernel (8.6M at 10M kernels: 0.94 GB as a frame), so the
    analyses ask the store for what they need of them: sums (waited_by_thread), a union (calls_union) or
    batches (call_batches)."""

    ids: tuple[int, ...]
    synchronous: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def where(self, alias: str = "a") -> str:
        """SQL that holds for these calls of `cuda_api` (as `alias`)."""
        issued = [
            f"({alias}.global_tid = {tid} AND {sql_in(f'{alias}.name_id', ids)})" for tid, ids in self.synchronous
        ]
        return "(" + " OR ".join([sql_in(f"{alias}.name_id", self.ids), *issued]) + ")"


def host_wait_calls(events: EventStore) -> WaitCalls:
    """The API calls in which the calling thread waits for the GPU: explicit synchronization, synchronous
    memcpy, and the synchronous issuers' calls (synchronous_issuers)."""
    return WaitCalls(tuple(name_ids(events, waits_for_gpu)), synchronous_issuers(events))


def synchronous_issuers(events: EventStore) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Per thread, the calls (name ids) that wait for the work they issue: of the kernels and memory operations
    of SYNCHRONOUS_PROBE_NS or longer that a thread issued by a call of that name, the call was still open for
    most (SYNCHRONOUS_COVER) of the run of most of them. Launches are under CUDA_LAUNCH_BLOCKING=1, and copies
    from or to pageable memory always are (a staged copy's call returns once its last chunk is queued, a few
    microseconds before the copy ends); a queued launch returns microseconds after it is queued, before its work
    has run. Counted by the store: the work joined to its calls on (pid, correlation_id)."""
    long_work = f"""SELECT pid, correlation_id, start, duration FROM kernels WHERE duration >= {SYNCHRONOUS_PROBE_NS}
                    UNION ALL
                    SELECT pid, correlation_id, start, duration FROM memops WHERE duration >= {SYNCHRONOUS_PROBE_NS}"""
    covered = f'a."end" >= o.start + {SYNCHRONOUS_COVER} * o.duration'
    issuers = events.query(
        f"""SELECT a.global_tid, a.name_id
            FROM cuda_api a JOIN ({long_work}) o ON o.pid = a.pid AND o.correlation_id = a.correlation_id
            GROUP BY ALL HAVING count(*) >= 2 AND 2 * count(*) FILTER (WHERE {covered}) > count(*)
            ORDER BY ALL"""
    )
    by_thread: dict[int, list[int]] = {}
    for tid, name_id in zip(issuers["global_tid"].astype("int64"), issuers["name_id"].astype("int64"), strict=True):
        by_thread.setdefault(int(tid), []).append(int(name_id))
    return tuple((tid, tuple(ids)) for tid, ids in by_thread.items())


def waited_by_thread(events: EventStore, waits: WaitCalls) -> pd.Series:
    """Per calling thread (global_tid), the time its `waits` took."""
    summed = events.query(
        f"SELECT a.global_tid, sum(a.duration)::BIGINT AS duration FROM cuda_api a WHERE {waits.where()} GROUP BY ALL"
    )
    return summed.set_index("global_tid")["duration"]


def calls_union(events: EventStore, where: str) -> SpilledUnion:
    """The union of the calls of `cuda_api` (as `a`) for which `where` holds, merged a batch at a time in
    start order into files (spilled.SpilledUnion): memory holds a batch, whatever their number."""
    union = SpilledUnion()
    for batch in events.batches(f'SELECT a.start, a."end" FROM cuda_api a WHERE {where} ORDER BY a.start'):
        union.add(batch["start"].to_numpy("int64"), batch["end"].to_numpy("int64"))
    return union.finish()


def call_batches(events: EventStore, where: str):
    """The calls of `cuda_api` (as `a`) for which `where` holds (start, end, duration, global_tid, and name_id:
    call_names gives their text), by start, a batch at a time (EventStore.batches): for sums over more calls
    than memory should hold at once."""
    yield from events.batches(
        f'SELECT a.start, a."end", a.duration, a.global_tid, a.name_id FROM cuda_api a WHERE {where} ORDER BY a.start'
    )


def call_names(events: EventStore) -> dict[int, str]:
    """Each call name id's text (a few dozen)."""
    names = events.used_names("cuda_api")
    return dict(zip(names["id"].tolist(), names["name"].tolist(), strict=True))


def launch_overhead(api_summary: pd.DataFrame) -> pd.DataFrame:
    """Host time per kernel launch call: the CPU cost of putting one kernel on a stream.
    `api_summary`: gpu.cuda_api_summary (the same statistics, over the launch calls only)."""
    launches = api_summary[api_summary["name"].map(lambda name: base_name(str(name)) in LAUNCH_CALLS).astype(bool)]
    return finish_summary(launches.drop(columns=["time_pct", "avg_ns"]), ["name"])


def sync_calls(events: EventStore, span_ns: int) -> pd.DataFrame:
    """Synchronization calls: how often, and how long the calling threads were blocked in them (summed in
    SQL per name, then per name without its version: one call per launch makes millions)."""
    columns = ["name", "calls", "total_ns", "avg_ns", "max_ns", "capture_pct", "blocks_host"]
    ids = name_ids(events, lambda name: base_name(name) in STREAM_WAIT_CALLS or waits_for_gpu(name))
    by_name = events.query(f"""
        SELECT n.name AS base, t.calls, t.total_ns, t.max_ns
        FROM (SELECT name_id, count(*) AS calls, sum(duration)::BIGINT AS total_ns, max(duration) AS max_ns
              FROM cuda_api WHERE {sql_in("name_id", ids)} GROUP BY name_id) t
        JOIN api_names n ON n.id = t.name_id""")
    if by_name.empty:
        return pd.DataFrame(columns=columns)
    by_name["base"] = by_name["base"].map(base_name)
    frame = by_name.groupby("base").agg(calls=("calls", "sum"), total_ns=("total_ns", "sum"), max_ns=("max_ns", "max"))
    frame["avg_ns"] = frame["total_ns"] / frame["calls"]
    frame = frame.reset_index().rename(columns={"base": "name"})
    frame["capture_pct"] = 100.0 * frame["total_ns"] / span_ns if span_ns else float("nan")
    frame["blocks_host"] = ~frame["name"].isin(STREAM_WAIT_CALLS)
    return frame[columns].sort_values("total_ns", ascending=False).reset_index(drop=True)


def sync_activity(events: EventStore) -> pd.DataFrame:
    """CUDA synchronization activity (CUPTI) by kind: event, stream, context syncs and stream waits."""
    return finish_summary(grouped_summary(events, "sync", ["sync_type"]), ["sync_type"])
