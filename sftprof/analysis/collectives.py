"""Collective communication in one capture: NCCL kernels by collective kind, the time they run with no
compute kernel beside them (exposed), and the training thread's waits in synchronization calls.

Kinds come from the kernel names (NCCL_PATTERNS, one per NCCL naming scheme). NCCL's maintainers warn
that a name only hints at the first operation a kernel runs: since NCCL 2.2 one launch can run several
grouped operations, `ncclDevKernel_Generic` runs whatever its work list says, and since 2.19 an
AllGather or ReduceScatter kernel is named `..._RING_LL` whatever protocol it uses
(github.com/NVIDIA/nccl issues 739, 2196). So a kind is the kernel's, not a count of collective calls;
a kernel whose name holds "nccl" but no known pattern is kind `other` (still communication).

Exposed communication: per GPU, the time some collective kernel runs and no other (compute) kernel
runs on that GPU, by interval union arithmetic: the union of a kind's kernels less what the union of
compute kernels covers of it. Only compute kernels overlapping a collective are fetched (a range join
in DuckDB), so a capture of millions of kernels costs a join, not a pass in Python.

Blocking communication, what the findings' gains count: the exposed time during which compute waited for
it, i.e. after the launch call of the GPU's next compute kernel had begun. Where the host launches late
(a launch-bound run), the GPU would have idled without the collective, and that exposed time costs the
step nothing: on two H200s, DDP's overlapped all-reduce left 10-13 ms a step exposed but only 4-5 ms
blocking, where the same gradients all-reduced after the backward pass blocked all their 17.6 ms. Where
the next kernel's launch is unknown, the piece counts whole.

Message sizes are not in the loader's tables (NCCL's NVTX payloads are not read), so this table has no
bandwidth; the cross-rank analysis (ranks.py) estimates it from the gradient size of a DDP run.

Synchronization waits (step_waits): on a CPU collective backend (gloo, MPI) and for c10d work objects,
the training thread blocks in the OS: pthread_cond_wait and its kin (SYNC_WAIT_CALLS, from the
OS-runtime trace). A rank that waits for a slower one shows the slower rank's extra time here.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sftprof.analysis import cpu, intervals
from sftprof.analysis.findings import Finding, ms, severity_of
from sftprof.analysis.gpu import NAME_PAIR_SQL, is_communication
from sftprof.trace.events import EventStore, sql_in

# Collective kinds, in the order tables list them. `generic`: ncclDevKernel_Generic, which runs any
# operation; `other`: an NCCL kernel no pattern names. ALL: every collective kernel together.
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "send_recv", "generic", "other")
ALL = "all"
_KIND_OF_NAME = {
    "allreduce": "all_reduce",
    "reducescatter": "reduce_scatter",
    "allgather": "all_gather",
    "allgatherv": "all_gather",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
    "generic": "generic",
}
_COLLECTIVE = r"(?P<coll>AllReduce|ReduceScatter|AllGatherV|AllGather|Broadcast|Reduce|SendRecv{extra})(?![A-Za-z])"
# NCCL's device-kernel names, newest first (case-insensitive: some traces lower-case them, HTA issue 247).
NCCL_PATTERNS: dict[str, re.Pattern] = {
    # NCCL 2.19 and later (src/device/generate.py): ncclDevKernel_AllReduce_Sum_bf16_RING_LL,
    # ncclDevKernel_AllGather_RING_LL, ncclDevKernel_SendRecv, ncclDevKernel_Generic
    "nccl_dev_kernel": re.compile(r"\bncclDevKernel_" + _COLLECTIVE.format(extra="|Generic"), re.IGNORECASE),
    # NCCL 2.27 and later, symmetric-memory kernels: ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32
    "nccl_symmetric_kernel": re.compile(r"\bncclSymkDevKernel_" + _COLLECTIVE.format(extra=""), re.IGNORECASE),
    # NCCL 2.8 to 2.18: ncclKernel_AllReduce_RING_LL_Sum_float, ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t
    "nccl_kernel": re.compile(r"\bncclKernel_" + _COLLECTIVE.format(extra=""), re.IGNORECASE),
    # NCCL 2.7 and earlier: ncclAllReduceRingLLKernel_sum_f32
    "nccl_legacy_kernel": re.compile(
        r"\bnccl" + _COLLECTIVE.format(extra="").replace("(?![A-Za-z])", "") + r"(?:Ring|Tree|CollNet)\w*Kernel",
        re.IGNORECASE,
    ),
}
# The OS-runtime calls a thread blocks in while it waits for another thread or process to finish
# collective work: condition variables and semaphores (c10d and gloo work objects, MPI progress
# threads), futexes and barriers, and waits on sockets. Sleeps, file I/O and mutexes are not counted
# (a mutex is lock contention: the lock_waits rule's).
SYNC_WAIT_CALLS = frozenset(
    {
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
        "pthread_barrier_wait",
        "futex",
        "poll",
        "ppoll",
        "epoll_wait",
        "epoll_pwait",
        "select",
        "pselect",
        "pselect6",
        "recv",
        "recvfrom",
        "recvmsg",
    }
)
OTHER_PHASE = "other"
WAIT_PHASES = (*cpu.PHASES, OTHER_PHASE)
COLLECTIVE_COLUMNS = ["step", "device_id", "kind", "kernels", "time_ns", "busy_ns", "exposed_ns", "blocking_ns"]
WAIT_COLUMNS = ["step", "phase", "waits", "wait_ns"]
_EMPTY = np.zeros(0, dtype="int64")
UNKNOWN_LAUNCH = np.iinfo("int64").min  # a launch not known: the exposed piece counts whole


def collective_kind(name) -> str | None:
    """A kernel's collective kind (KINDS) from its name; None for a kernel that is not NCCL's."""
    text = "" if name is None or name is pd.NA or name != name else str(name)
    for pattern in NCCL_PATTERNS.values():
        match = pattern.search(text)
        if match:
            return _KIND_OF_NAME[match.group("coll").lower()]
    return "other" if is_communication(pd.Series([text]), pd.Series([None]))[0] else None


def kinds_of(names: pd.DataFrame) -> pd.Series:
    """Per row of (name, short_name): its kind, from the short name first (None: not communication)."""
    short = names["short_name"].map(collective_kind)
    full = names["name"].map(collective_kind)
    kinds = short.where(short.notna() & (short != "other"), full.where(full.notna(), short)).astype(object)
    return kinds.where(kinds.notna(), None)


def _kernel_pairs(events: EventStore) -> pd.DataFrame:
    """Each distinct (name, short name) pair of the kernels: `pair` (its code), name, short_name."""
    return events.query(f"""
        SELECT t.pair, n.name, s.name AS short_name
        FROM (SELECT DISTINCT {NAME_PAIR_SQL} AS pair, name_id, short_name_id FROM kernels) t
        LEFT JOIN kernel_names n ON n.id = t.name_id LEFT JOIN kernel_names s ON s.id = t.short_name_id""")


def collective_kernels(events: EventStore) -> pd.DataFrame:
    """Every collective kernel: device_id, start, end, kind; by device and start."""
    names = _kernel_pairs(events)
    columns = {"device_id": "int64", "start": "int64", "end": "int64", "kind": "object"}
    if names.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})
    names = names.assign(kind=kinds_of(names)).dropna(subset=["kind"])
    if names.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})
    kernels = events.query(
        f"""SELECT device_id::BIGINT AS device_id, start, "end", {NAME_PAIR_SQL} AS pair
                               FROM kernels WHERE start > 0 AND {NAME_PAIR_SQL} IN (SELECT pair FROM comm)""",
        comm=names[["pair"]],
    )
    kernels["kind"] = kernels["pair"].map(dict(zip(names["pair"], names["kind"], strict=True)))
    kernels = kernels.drop(columns="pair").sort_values(["device_id", "start"], kind="stable").reset_index(drop=True)
    return kernels.astype(columns)


def compute_beside(
    events: EventStore, device: int, spans: pd.DataFrame, collective_pairs: pd.DataFrame
) -> pd.DataFrame:
    """The union of one device's other (compute) kernels where they overlap `spans` (sorted, disjoint
    start/end: a union of collective kernels), fetched by a range join so that only those come back;
    `collective_pairs`: _collective_pairs, found once per table."""
    if spans.empty:
        return intervals.RunningUnion().result()
    rows = events.query(
        f"""
        SELECT k.start, k."end" FROM (SELECT start, "end" FROM kernels
                                      WHERE device_id = {int(device)} AND start > 0
                                        AND {NAME_PAIR_SQL} NOT IN (SELECT pair FROM comm)) k, spans s
        WHERE k.start < s."end" AND k."end" > s.start""",
        comm=collective_pairs,
        spans=spans,
    )
    return intervals.union(rows.drop_duplicates())


def _collective_pairs(events: EventStore) -> pd.DataFrame:
    """The (name, short name) pairs of collective kernels, as `pair` rows for SQL's NOT IN."""
    names = _kernel_pairs(events)
    comm = names.loc[kinds_of(names).notna(), ["pair"]] if len(names) else pd.DataFrame({"pair": []})
    return comm.astype("int64")


def next_launches(events: EventStore, device: int, times: np.ndarray, collective_pairs: pd.DataFrame) -> np.ndarray:
    """For each time in `times`, when the launch call of the device's first compute kernel starting at or after
    it began (of kernels that start together, the earliest launched); UNKNOWN_LAUNCH where none follows in the
    capture or its call is not traced."""
    launch = np.full(len(times), UNKNOWN_LAUNCH)
    if not len(times):
        return launch
    # Three queries, each join built on its small side (the times, the kernels that follow them), so that a
    # capture of millions of kernels and launch calls streams through DuckDB's share of the memory budget.
    compute = f"""(SELECT start, correlation_id, pid FROM kernels WHERE device_id = {int(device)} AND start > 0
                  AND {NAME_PAIR_SQL} NOT IN (SELECT pair FROM comm))"""
    following = events.query(
        f"""SELECT p.i, k.start AS next_start
            FROM pieces p ASOF LEFT JOIN (SELECT start FROM {compute}) k ON p.piece_end <= k.start""",
        pieces=pd.DataFrame({"i": np.arange(len(times)), "piece_end": times}),
        comm=collective_pairs,
    ).dropna()
    kernels = events.query(
        f"SELECT c.* FROM {compute} c SEMI JOIN following f ON c.start = f.next_start",
        following=following[["next_start"]].astype("int64").drop_duplicates(),
        comm=collective_pairs,
    )
    calls = events.query(
        """SELECT a.correlation_id, a.pid, min(a.start) AS launch
           FROM cuda_api a SEMI JOIN kernels k ON a.correlation_id = k.correlation_id AND a.pid = k.pid
           GROUP BY a.correlation_id, a.pid""",
        kernels=kernels[["correlation_id", "pid"]],
    )
    # a kernel whose launch call is not traced makes its start's launch unknown
    launched = kernels.merge(calls, on=["correlation_id", "pid"], how="left")
    by_start = launched["launch"].fillna(UNKNOWN_LAUNCH).astype("int64").groupby(launched["start"]).min()
    found = following["next_start"].astype("int64").map(by_start)
    launch[following["i"].to_numpy("int64")] = found.fillna(UNKNOWN_LAUNCH).astype("int64").to_numpy()
    return launch


def blocking_pieces(exposed: tuple[np.ndarray, np.ndarray], launch: np.ndarray) -> pd.DataFrame:
    """Of each exposed piece [start, end) (sorted, disjoint), the part during which the device's next compute
    kernel had been launched (`launch`, per piece: next_launches of its end) and so waited:
    [max(start, launch), end). Where that launch is unknown the piece counts whole, as exposed."""
    starts, ends = exposed
    begin = np.maximum(starts, launch)
    keep = begin < ends
    return pd.DataFrame({"start": begin[keep], "end": ends[keep]})


def uncovered(merged: pd.DataFrame, cover: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of sorted disjoint `merged` that sorted disjoint `cover` leaves uncovered."""
    if merged.empty:
        return _EMPTY, _EMPTY
    bounds = np.iinfo("int64")
    gaps = pd.DataFrame(
        {
            "start": np.concatenate([[bounds.min], cover["end"].to_numpy("int64")]),
            "end": np.concatenate([cover["start"].to_numpy("int64"), [bounds.max]]),
        }
    )
    gaps = gaps[gaps["start"] < gaps["end"]].reset_index(drop=True)
    starts, ends, _ = cut(gaps, merged["start"], merged["end"])
    return starts, ends


def length_in(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """Per window [starts[i], ends[i]) (sorted, disjoint): the length of sorted disjoint `merged` inside it."""
    piece_start, piece_end, window = cut(merged, starts, ends)
    return np.bincount(window, weights=piece_end - piece_start, minlength=len(np.asarray(starts))).astype("int64")


def cut(merged: pd.DataFrame, starts, ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of sorted, disjoint `merged` inside each window [starts[i], ends[i]) (windows sorted and
    disjoint): (piece starts, piece ends, window index), by binary search."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty or not len(starts):
        return _EMPTY, _EMPTY, _EMPTY
    m_start, m_end = merged["start"].to_numpy("int64"), merged["end"].to_numpy("int64")
    first = np.searchsorted(m_end, starts, side="right")
    last = np.searchsorted(m_start, ends, side="left")
    counts = np.maximum(last - first, 0)
    index = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    window = np.repeat(np.arange(len(starts)), counts)
    return np.maximum(m_start[index], starts[window]), np.minimum(m_end[index], ends[window]), window


def exposed_in(comm: pd.DataFrame, compute: pd.DataFrame, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Per window: (busy, exposed) ns of the sorted disjoint `comm` union: its length inside the window,
    and the part of that no interval of the sorted disjoint `compute` union covers."""
    piece_start, piece_end, window = cut(comm, starts, ends)
    n = len(np.asarray(starts))
    busy = np.bincount(window, weights=piece_end - piece_start, minlength=n)
    covered = np.bincount(window, weights=intervals.covered_ns(compute, piece_start, piece_end), minlength=n)
    return busy.astype("int64"), (busy - covered).astype("int64")


def collective_table(events: EventStore, steps: pd.DataFrame) -> pd.DataFrame:
    """NCCL collective kernels per step, device and kind (KINDS, and `all` for every collective kernel
    together): kernels and their summed time (by start), busy time (their union inside the step) and
    exposed time (busy with no compute kernel on that device); rows with an empty step are the whole
    capture. Empty without NCCL kernels (a CPU capture, one GPU without collectives)."""
    kernels = collective_kernels(events)
    if kernels.empty:
        return pd.DataFrame({c: pd.Series(dtype="object" if c == "kind" else "int64") for c in COLLECTIVE_COLUMNS})
    ordered = steps.sort_values("start") if len(steps) else steps
    step_start = ordered["start"].to_numpy("int64") if len(steps) else _EMPTY
    step_end = ordered["end"].to_numpy("int64") if len(steps) else _EMPTY
    step_number = ordered["step"].to_numpy("int64") if len(steps) else _EMPTY
    rows = []
    collective_pairs = _collective_pairs(events)
    for device, on_device in kernels.groupby("device_id", sort=True):
        everything = intervals.union(on_device[["start", "end"]])
        compute = compute_beside(events, int(device), everything, collective_pairs)
        span = (int(everything["start"].iat[0]), int(everything["end"].iat[-1]))
        groups = [(ALL, on_device)] + [(k, on_device[on_device["kind"] == k]) for k in KINDS]
        groups = [(kind, group) for kind, group in groups if not group.empty]
        merged_of = {
            kind: everything if kind == ALL else intervals.union(group[["start", "end"]]) for kind, group in groups
        }
        exposed_of = {kind: uncovered(merged, compute) for kind, merged in merged_of.items()}
        # one lookup of the next compute kernel's launch for every kind's exposed pieces together
        ends = np.unique(np.concatenate([piece_ends for _, piece_ends in exposed_of.values()]))
        launches = next_launches(events, int(device), ends, collective_pairs)
        for kind, group in groups:
            merged, exposed_pieces = merged_of[kind], exposed_of[kind]
            blocking = blocking_pieces(exposed_pieces, launches[np.searchsorted(ends, exposed_pieces[1])])
            busy, exposed = exposed_in(merged, compute, [span[0]], [span[1]])
            rows.append(
                {
                    "step": pd.NA,
                    "device_id": int(device),
                    "kind": kind,
                    "kernels": len(group),
                    "time_ns": int((group["end"] - group["start"]).sum()),
                    "busy_ns": int(busy[0]),
                    "exposed_ns": int(exposed[0]),
                    "blocking_ns": int(length_in(blocking, [span[0]], [span[1]])[0]),
                }
            )
            if not len(step_start):
                continue
            busy, exposed = exposed_in(merged, compute, step_start, step_end)
            blocking_in_step = length_in(blocking, step_start, step_end)
            at = np.searchsorted(step_start, group["start"].to_numpy("int64"), side="right") - 1
            inside = (at >= 0) & (group["start"].to_numpy("int64") < step_end[np.maximum(at, 0)])
            durations = (group["end"] - group["start"]).to_numpy("int64")
            count = np.bincount(at[inside], minlength=len(step_start))
            time = np.bincount(at[inside], weights=durations[inside], minlength=len(step_start)).astype("int64")
            for i in np.flatnonzero((count > 0) | (busy > 0)):
                rows.append(
                    {
                        "step": int(step_number[i]),
                        "device_id": int(device),
                        "kind": kind,
                        "kernels": int(count[i]),
                        "time_ns": int(time[i]),
                        "busy_ns": int(busy[i]),
                        "exposed_ns": int(exposed[i]),
                        "blocking_ns": int(blocking_in_step[i]),
                    }
                )
    table = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)
    table["step"] = table["step"].astype("Int64")
    order = {kind: i for i, kind in enumerate((ALL, *KINDS))}
    return (
        table.assign(_k=table["kind"].map(order), _capture=table["step"].notna())
        .sort_values(["_capture", "step", "device_id", "_k"])
        .drop(columns=["_k", "_capture"])
        .reset_index(drop=True)
    )


def exposed_per_step(collectives: pd.DataFrame, column: str = "exposed_ns") -> pd.Series:
    """step -> exposed (or `column`: blocking) collective time of kind `all`, on the device that had the most
    in that step."""
    if collectives.empty or "kind" not in collectives:
        return pd.Series(dtype="int64")
    rows = collectives[(collectives["kind"] == ALL) & collectives["step"].notna()]
    return rows.groupby(rows["step"].astype("int64"))[column].max().astype("int64")


def exposed_communication(collectives: pd.DataFrame, steps: pd.DataFrame, clock) -> list[Finding]:
    """NCCL collectives that compute waits for on their GPU (blocking: exposed, with the next compute
    kernel launched): time the step waits for the network, which overlapping with compute could hide."""
    if collectives.empty or not clock.has_steps:
        return []
    per_step = exposed_per_step(collectives, "blocking_ns")
    # per step in the clock's order (steps by start); the collectives table names steps by number
    numbers = steps.sort_values("start", kind="stable")["step"].astype("int64")
    exposed = np.array([per_step.get(int(n), 0) for n in numbers], dtype=float)
    totals = collectives[collectives["step"].isna()]
    whole = totals[totals["kind"] == ALL]
    kinds = (
        totals[totals["kind"] != ALL]
        .groupby("kind")[["time_ns", "exposed_ns", "blocking_ns"]]
        .sum()
        .sort_values("exposed_ns", ascending=False)
    )
    gain = clock.share(exposed)
    by_kind = "; ".join(
        f"{kind}: {ms(r.time_ns)} in kernels, {ms(r.exposed_ns)} exposed, {ms(r.blocking_ns)} blocking"
        for kind, r in kinds.iterrows()
    )
    return [
        Finding(
            rule="exposed_communication",
            severity=severity_of(gain),
            title=f"Compute waits for collectives for {gain:.1f}% of the median step",
            evidence=(
                f"NCCL kernels ran {ms(int(whole['busy_ns'].sum()))} in the capture, "
                f"{ms(int(whole['exposed_ns'].sum()))} of it with no other kernel on their GPU (exposed), "
                f"{ms(int(whole['blocking_ns'].sum()))} of that with the next compute kernel already launched "
                f"and waiting (blocking; the rest cost the step nothing); by kind: {by_kind}."
            ),
            recommendation=(
                "Overlap communication with compute: for DDP keep gradient bucketing on (bucket_cap_mb; "
                "no no_sync plus one final all-reduce), for FSDP prefetch the next all-gather "
                "(forward_prefetch, backward_prefetch); if the exposed time is the transfer itself, "
                "check the link with nccl-tests (bus bandwidth against the fabric's) and the run's "
                "cross-rank report for a straggler that the others wait for."
            ),
            gain_pct=gain,
            gain_basis=f"blocking collective time, {clock.scope(exposed)}",
        )
    ]


# ---------------------------------------------------------------- synchronization waits


def _step_ranges(nvtx: pd.DataFrame) -> pd.DataFrame:
    """The step ranges (cpu.step_ranges) with their thread: step, start, end, global_tid."""
    steps = cpu.step_ranges(nvtx)
    return pd.DataFrame(
        {
            "step": steps["step"],
            "start": steps["start"].astype("int64"),
            "end": steps["end"].astype("int64"),
            "global_tid": steps["global_tid"],
        }
    )


def step_waits(nvtx: pd.DataFrame, events: EventStore) -> pd.DataFrame:
    """Per step and phase (data, forward, backward, optimizer, other: inside the step, outside every
    phase range): how often and how long the training thread (its process's thread with the most step
    ranges) blocked in synchronization calls
    (SYNC_WAIT_CALLS: c10d/gloo/MPI waits on condition variables, futexes, sockets), each call placed by
    its start in the innermost phase range open on that thread and cut at that range's end. Needs the
    OS-runtime trace (the store's osrt); empty without step ranges. `nvtx`: the step and phase ranges at least
    (cpu.marked_ranges). The calls are read a batch at a time (EventStore.batches) and summed into a table per
    step: a trainer waits millions of times (NeMo's shape, 1.9M at 40M kernels)."""
    steps = _step_ranges(nvtx)
    if len(steps):  # each process's training thread: the one with the most step ranges (as accounting)
        counts = steps.groupby("global_tid").size().rename("n").reset_index()
        counts["pid"] = (counts["global_tid"].to_numpy("int64") >> 24) & 0xFFFFFF
        training = counts.sort_values(["n", "global_tid"], ascending=[False, True]).drop_duplicates("pid")
        steps = steps[steps["global_tid"].isin(training["global_tid"])]
    if steps.empty:
        return pd.DataFrame({c: pd.Series(dtype="object" if c == "phase" else "int64") for c in WAIT_COLUMNS})
    step_numbers = np.sort(steps["step"].unique()).astype("int64")
    waits = np.zeros((len(step_numbers), len(WAIT_PHASES)), dtype="int64")
    wait_ns = np.zeros_like(waits)
    other = WAIT_PHASES.index(OTHER_PHASE)
    phases = nvtx[nvtx["name"].isin(cpu.PHASES)]
    for tid, thread_steps in steps.groupby("global_tid"):
        thread_steps = thread_steps.sort_values("start")
        s_start, s_end = thread_steps["start"].to_numpy("int64"), thread_steps["end"].to_numpy("int64")
        s_row = np.searchsorted(step_numbers, thread_steps["step"].to_numpy("int64"))
        thread_phases = phases[phases["global_tid"] == tid].sort_values("start")
        p_start, p_end = thread_phases["start"].to_numpy("int64"), thread_phases["end"].to_numpy("int64")
        p_column = np.array([WAIT_PHASES.index(name) for name in thread_phases["name"]], dtype="int64")
        calls = f"""SELECT start, "end" FROM osrt
                    WHERE global_tid = {int(tid)} AND {sql_in("name", sorted(SYNC_WAIT_CALLS))}"""
        for batch in events.batches(calls):
            call_start, call_end = batch["start"].to_numpy("int64"), batch["end"].to_numpy("int64")
            at = np.searchsorted(s_start, call_start, side="right") - 1
            inside = (at >= 0) & (call_start < s_end[np.maximum(at, 0)])
            call_start, call_end, at = call_start[inside], call_end[inside], at[inside]
            limit = s_end[at]
            column = np.full(len(at), other, dtype="int64")
            if len(p_start) and len(at):
                p = np.searchsorted(p_start, call_start, side="right") - 1
                in_phase = (p >= 0) & (call_start < p_end[np.maximum(p, 0)])
                column[in_phase] = p_column[p[in_phase]]
                limit = np.where(in_phase, np.minimum(limit, p_end[np.maximum(p, 0)]), limit)
            length = np.clip(np.minimum(call_end, limit) - call_start, 0, None)
            np.add.at(waits, (s_row[at], column), 1)
            np.add.at(wait_ns, (s_row[at], column), length)
    return pd.DataFrame(
        {
            "step": np.repeat(step_numbers, len(WAIT_PHASES)),
            "phase": np.tile(np.array(WAIT_PHASES, dtype=object), len(step_numbers)),
            "waits": waits.ravel(),
            "wait_ns": wait_ns.ravel(),
        }
    )[WAIT_COLUMNS]
