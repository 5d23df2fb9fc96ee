"""Every nanosecond of GPU idle time inside the steps, attributed to what the thread feeding the GPU did then.

A rule that looks for one symptom (gaps over 1 ms, a `data` range) sees nothing it did not expect. Here
the idle time of each step (no device runs a kernel or a memory operation: gains.StepClock's union) is
cut into pieces, and each piece goes to exactly one cause, so the causes of a step add up to its idle time:

- the work that ended the idle stretch: the next kernel or memory operation. Where its launching call (a
  launch, an async copy or set) had returned before, the GPU had it queued and the time is `queued` (the
  GPU's own latency to start it, or a wait on another stream's event); otherwise the host had not yet
  launched it, and the time up to the launch belongs to the launching thread;
- what that thread was doing, in order of precedence: inside a CUDA API call (by name: allocation, free,
  synchronization, copies, launches), else inside an OS-runtime call (by name; lock, condition and poll
  waits are waiting for another thread or process), else running its own code, named by the innermost
  NVTX range open on it (or none; inside a `data` range at any depth, `data`, so that input work a loop
  marks more finely inside it still counts as input); pieces are cut at the thread's NVTX range boundaries,
  so each is in one innermost range;
- own code and launches in gaps shorter than HOST_GAP_NS are host overhead between launches (Python and
  framework dispatch); in longer gaps, own code is work on the critical path (input preparation, logging).
- idle that ended in a kernel the backward pass launched again, or came while the thread was in one of its
  stretches of recomputation (recompute.recomputed: activation checkpointing's forward run a second time, from
  the launch before a run of repeated kernels to the launch after it), is `recomputation` where the thread was
  in host overhead or host work: the CPU was preparing and launching work a fix removes, or handing back to the
  backward pass;
- then what a call delayed: an allocation or synchronization that held the thread while the GPU was busy made
  every later launch that much later, so up to that much of the host overhead after it, until the thread is
  ahead of the GPU again, is the call's (_Pieces.delayed_by).

Findings (idle_findings) are the largest causes; a cause's gain is its median share of the step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import cuda, intervals, nvtx, sched
from sftprof.analysis.cpu import PHASES
from sftprof.analysis.findings import Finding, ms, pct, severity_of
from sftprof.analysis.gains import HOST_GAP_NS, StepClock
from sftprof.analysis.overhead import Overhead, host_share
from sftprof.analysis.utilisation import UNNAMED_RANGE
from sftprof.trace.events import EventStore, sql_in

ALLOCATION_CALL = re.compile(
    r"^cu(?:da)?(?:Malloc|Free|MemAlloc|MemFree|MemCreate|MemRelease|MemMap|MemUnmap|MemSetAccess|MemAddress"
    r"|HostAlloc|MallocHost|FreeHost|HostRegister|HostUnregister|MemPool|DeviceGraphMemTrim)"
)
# OS calls in which a thread waits for another thread or process (a DataLoader queue, a lock, an event).
WAIT_CALL = re.compile(
    r"^(?:pthread_(?:cond_(?:timed)?wait|mutex_(?:timed)?lock|rwlock_\w*lock|join|barrier_wait)|sem_(?:timed)?wait"
    r"|futex|poll|ppoll|epoll_p?wait|select|pselect6?|wait4?|waitpid)$"
)
NO_RANGE = "(no NVTX range)"
DATA_PHASE = PHASES[0]  # own code or calls inside a range of this name, at any depth, are in it
# Host memory a copy or set call touched, named after the call ("cudaMemcpyAsync (pageable)"): in the name id as
# its index + 1 times HOST_MEMORY_STRIDE.
HOST_MEMORY = ("Pageable", "Pinned", "Managed")
HOST_MEMORY_STRIDE = 1 << 32
UNKNOWN_THREAD = "(no CUDA call traced)"
# Causes of idle time; the findings (CAUSES, below) name the largest with their remedies.
CAUSE_NAMES = (
    ALLOCATION := "allocation",
    SYNCHRONIZATION := "synchronization",
    COPY := "copy",
    HOST_OVERHEAD := "host overhead",
    HOST_WORK := "host work",
    THREAD_WAIT := "waiting for another thread",
    OS_CALL := "OS call",
    CPU_WAIT := "waiting for a CPU core",
    RECOMPUTATION := "recomputation",
    UNATTRIBUTED := "unattributed",
    QUEUED := "queued",
)
COLUMNS = ["step", "cause", "source", "name", "range", "idle_ns", "pieces"]
STEPS_A_BATCH = 256  # steps whose calls are fetched at once: memory holds their calls, not the capture's
# At most about this many rows (kernels, CUDA calls, NVTX ranges) a batch: fewer steps a batch where steps hold
# more (emit_nvtx writes a range per op, 60M at NeMo's shape of 10M kernels; a large model's step, 10k kernels).
ROWS_A_BATCH = 1_000_000


def call_cause(name: str) -> str:
    """The cause of idle time spent inside a CUDA API call of this name (long gaps)."""
    base = cuda.base_name(name)
    if ALLOCATION_CALL.search(base):
        return ALLOCATION
    if cuda.waits_for_gpu(base):
        return SYNCHRONIZATION
    if base.startswith(("cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset")):
        return COPY
    return HOST_OVERHEAD


def _overlaps(a_start, a_end, b_start, b_end):
    """intervals.overlaps of a and b, without the pieces of no length that a touching pair gives."""
    if not len(a_start) or not len(b_start):
        empty = np.empty(0, "int64")
        return empty, empty, empty, empty
    starts, ends, a_index, b_index = intervals.overlaps(a_start, a_end, b_start, b_end)
    keep = ends > starts
    return starts[keep], ends[keep], a_index[keep], b_index[keep]


def _disjoint(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Calls of one thread in start order, each cut where the next begins (nested calls: the outer keeps the
    time before the inner one only), and their positions in the input."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    ends = np.minimum(ends, np.r_[starts[1:], np.iinfo("int64").max])
    keep = ends > starts
    return starts[keep], ends[keep], order[keep]


def _minus(p_start, p_end, p_row, c_start, c_end):
    """Pieces (sorted disjoint) less the sorted disjoint intervals c: what is left of each, with its row."""
    if not len(c_start) or not len(p_start):
        return p_start, p_end, p_row
    holes_start = np.r_[np.iinfo("int64").min, c_end]
    holes_end = np.r_[c_start, np.iinfo("int64").max]
    starts, ends, _, b = _overlaps(holes_start, holes_end, p_start, p_end)
    return starts, ends, p_row[b]


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique by sorting: numpy's own hashes, several times slower on millions of int64 times."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def _split(starts: np.ndarray, ends: np.ndarray, cuts: np.ndarray):
    """Intervals cut at every time of sorted `cuts` strictly inside them: (starts, ends, the input's position
    of each)."""
    if not len(cuts):
        return starts, ends, np.arange(len(starts))
    first = np.searchsorted(cuts, starts, side="right")
    last = np.searchsorted(cuts, ends, side="left")
    inside = np.maximum(last - first, 0)
    position = np.repeat(np.arange(len(starts)), inside + 1)
    offset = np.arange(len(position)) - np.repeat(np.cumsum(inside + 1) - (inside + 1), inside + 1)
    left = np.where(offset == 0, starts[position], cuts[np.minimum(first[position] + offset - 1, len(cuts) - 1)])
    at_end = offset == inside[position]
    right = np.where(at_end, ends[position], cuts[np.minimum(first[position] + offset, len(cuts) - 1)])
    return left, right, position


def _idle_pieces(clock: StepClock, rows: np.ndarray):
    """The GPU's idle time inside steps `rows`: (starts, ends, step row), in time order, and the GPU's busy
    intervals around them (starts, ends)."""
    busy = clock.gpu_busy
    starts, ends = clock.starts[rows], clock.ends[rows]
    lo, hi = int(starts.min()), int(ends.max())
    if busy.empty:
        b_start, b_end = np.empty(0, "int64"), np.empty(0, "int64")
    else:
        b_start, b_end = busy.rows(busy.ending_by(lo), busy.starting_before(hi))
    idle_start, idle_end, row = _minus(starts, ends, rows, b_start, b_end)
    order = np.argsort(idle_start, kind="stable")
    return idle_start[order], idle_end[order], row[order], (b_start, b_end)


def _gap_lengths(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each idle piece, the length of the whole gap it belongs to (pieces that touch form one gap)."""
    new_gap = np.r_[True, starts[1:] > ends[:-1]]
    gap = np.cumsum(new_gap) - 1
    length = np.bincount(gap, weights=ends - starts)
    return length[gap]


class _NextWork:
    """For each idle piece, the GPU work that ended it: the first kernel or memory operation starting at or after
    the piece's end, when its launching call (a launch, an async copy or set) returned, and on which thread.
    Work launched before the idle began was queued: the GPU, not the host, took time to start it."""

    def __init__(self, events: EventStore, lo: int, hi: int):
        def launched(table: str, pid: str, where: str, last: str = "") -> dict:
            work = f'SELECT start, "end", correlation_id, {pid} AS pid FROM {table} WHERE {where} {last}'
            # the calls of these correlation ids only, as constants: DuckDB then skips the row groups of the
            # rest of cuda_api, which a join with the whole table scanned once a batch (27 s of 48 at 10M)
            ids = events.query(f"SELECT min(correlation_id) AS lo, max(correlation_id) AS hi FROM ({work})")
            low, high = ids["lo"].iloc[0], ids["hi"].iloc[0]
            calls = (
                f'SELECT correlation_id, pid, "end", global_tid FROM cuda_api '
                f"WHERE correlation_id BETWEEN {int(low)} AND {int(high)}"
                if pd.notna(low)
                else 'SELECT correlation_id, pid, "end", global_tid FROM cuda_api WHERE false'
            )
            return events.arrays(f"""
                SELECT o.start, o."end", coalesce(a."end", o.start) AS launched, coalesce(a.global_tid, -1) AS tid
                FROM ({work}) o LEFT JOIN ({calls}) a ON a.correlation_id = o.correlation_id AND a.pid = o.pid""")

        parts = []
        for table, pid in (("kernels", "pid"), ("memops", "pid")):
            parts.append(launched(table, pid, f"start >= {lo} AND start <= {hi}"))
            parts.append(launched(table, pid, f"start > {hi}", "ORDER BY start LIMIT 1"))
        starts = np.concatenate([p["start"] for p in parts]).astype("int64")
        order = np.argsort(starts, kind="stable")
        self.starts = starts[order]
        self.launched = np.concatenate([p["launched"] for p in parts]).astype("int64")[order]
        self.tids = np.concatenate([p["tid"] for p in parts]).astype("int64")[order]
        ends = np.concatenate([p["end"] for p in parts]).astype("int64")[order]
        # A thread was ahead of the GPU when it launched work while earlier work still ran: when, and which.
        running = np.maximum.accumulate(ends) if len(ends) else ends
        ahead = np.r_[False, self.launched[1:] < running[:-1]] if len(ends) else np.zeros(0, bool)
        self._ahead = pd.Series(self.launched[ahead]).groupby(self.tids[ahead])

    def next_start(self, piece_ends: np.ndarray) -> np.ndarray:
        """When the work that ended each piece started (-1 where none follows in the capture)."""
        if not len(self.starts):
            return np.full(len(piece_ends), -1, "int64")
        at = np.searchsorted(self.starts, piece_ends, side="left")
        return np.where(at < len(self.starts), self.starts[np.minimum(at, len(self.starts) - 1)], -1)

    def ahead_of(self, tid: int) -> np.ndarray:
        """The sorted times at which thread `tid` launched work while the GPU was still busy."""
        if tid not in self._ahead.groups:
            return np.zeros(0, "int64")
        return np.sort(self._ahead.get_group(tid).to_numpy("int64"))

    def after(self, piece_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(when the next work's launch returned, its launching thread) for each piece end. Where no work
        follows in the capture, the whole piece is the thread's that launched the last work before it."""
        if not len(self.starts):
            return piece_ends.copy(), np.full(len(piece_ends), -1, "int64")
        at = np.searchsorted(self.starts, piece_ends, side="left")
        found = at < len(self.starts)
        at = np.minimum(at, len(self.starts) - 1)
        return np.where(found, self.launched[at], piece_ends), self.tids[at]


class _Names:
    """The CUDA and OS call names of the store (a few dozen each) with the cause of each, and its NVTX range
    names: what the integer columns of _Pieces stand for."""

    def __init__(self, events: EventStore):
        self.api = cuda.call_names(events)
        self.osrt = {int(i): str(name) for i, name in events.query("SELECT id, name FROM osrt_names").itertuples(False)}
        self.os_traced = bool(self.osrt)  # OS-runtime calls were traced (nsys --trace osrt): some call has a name
        self.ranges = np.asarray(nvtx.range_names(events), dtype=object)
        data = np.flatnonzero(self.ranges == DATA_PHASE)
        self.data_code = int(data[0]) if len(data) else -1
        self._api_cause = {i: CAUSE_NAMES.index(call_cause(name)) for i, name in self.api.items()}
        self._os_cause = {
            i: CAUSE_NAMES.index(THREAD_WAIT if WAIT_CALL.match(name) else OS_CALL) for i, name in self.osrt.items()
        }

    def api_cause_of(self, ids: np.ndarray) -> np.ndarray:
        return pd.Series(ids).map(self._api_cause).fillna(CAUSE_NAMES.index(HOST_OVERHEAD)).to_numpy("int64")

    def os_cause_of(self, ids: np.ndarray) -> np.ndarray:
        return pd.Series(ids).map(self._os_cause).fillna(CAUSE_NAMES.index(OS_CALL)).to_numpy("int64")

    def range_label(self, codes: np.ndarray) -> np.ndarray:
        """Range codes as names: NO_RANGE for -1, UNNAMED_RANGE for a range without a name."""
        labels = np.full(len(codes), NO_RANGE, dtype=object)
        named = codes >= 0
        labels[named] = [UNNAMED_RANGE if pd.isna(name) else str(name) for name in self.ranges[codes[named]]]
        return labels

    def label(self, source: str, name: int) -> str:
        if source == SOURCES[DELAYED] and name < 0:
            return RECOMPUTED_NAME
        if source == SOURCES[CUDA_API] and name >= HOST_MEMORY_STRIDE:
            call = cuda.base_name(self.api.get(int(name) % HOST_MEMORY_STRIDE, "?"))
            return f"{call} ({HOST_MEMORY[int(name) // HOST_MEMORY_STRIDE - 1].lower()})"
        if source in (SOURCES[CUDA_API], SOURCES[DELAYED]):
            return self.api.get(int(name), "?")
        if source == SOURCES[OS_RUNTIME]:
            return self.osrt.get(int(name), "?")
        if source == SOURCES[OWN]:
            return str(self.range_label(np.array([name], "int64"))[0])
        return QUEUED_NAME if source == SOURCES[GPU] else UNKNOWN_THREAD


SOURCES = ("CUDA API", "OS runtime", "own code", "GPU", "none", "launches a call delayed")
CUDA_API, OS_RUNTIME, OWN, GPU, NONE, DELAYED = range(len(SOURCES))
QUEUED_NAME = "launched before the GPU started it"
RECOMPUTED_NAME = "launching recomputed kernels"  # the name of what recomputation delayed (source DELAYED)
# Calls that a fix removes outright, so the launches they delayed would have come earlier (_Pieces.delayed_by).
DELAYING = [CAUSE_NAMES.index(ALLOCATION), CAUSE_NAMES.index(SYNCHRONIZATION)]


def idle_causes(events: EventStore, clock: StepClock, steps: pd.DataFrame, recomputed=None) -> pd.DataFrame:
    """Per step, the GPU's idle time split by cause (module docstring): `cause`, `source` (CUDA API, OS
    runtime, own code), `name` (the call's, or the innermost NVTX range of own code), `range` (the innermost
    NVTX range open on the thread), `idle_ns`, and `pieces` (how many stretches of idle time it is).
    A step's rows add up to its idle time; without steps, the whole capture is step -1. Empty without GPU
    work. `recomputed` (recompute.Recomputed) gives the repeated kernels' starts; None: nothing repeats."""
    repeated = np.zeros(0, "int64") if recomputed is None else recomputed.starts
    recomputing = None if recomputed is None else recomputed.host.groupby("tid")
    if not clock.has_gpu:
        return pd.DataFrame(columns=COLUMNS)
    names = _Names(events)
    step_numbers = steps.sort_values("start")["step"].to_numpy("int64") if len(steps) else np.array([-1])
    parts = []
    captured = sum(events.count(table) for table in ("nvtx_rows", "kernel_rows", "cuda_api_rows"))
    steps_a_batch = int(max(1, min(STEPS_A_BATCH, ROWS_A_BATCH // max(1.0, captured / max(1, clock.steps)))))
    for first in range(0, clock.steps, steps_a_batch):
        rows = np.arange(first, min(first + steps_a_batch, clock.steps))
        p_start, p_end, p_row, busy = _idle_pieces(clock, rows)
        if not len(p_start):
            continue
        short = _gap_lengths(p_start, p_end) <= HOST_GAP_NS
        work = _NextWork(events, int(p_start.min()), int(p_end.max()))
        launched, owner = work.after(p_end)
        again = _in_sorted(work.next_start(p_end), repeated)
        # the part of each piece after the next work was launched: queued, waiting for the GPU to start it
        cut = np.clip(launched, p_start, p_end)
        queued = cut < p_end
        batch = [_Pieces.alike(p_row[queued], cut[queued], p_end[queued] - cut[queued], QUEUED, GPU)]
        host = cut > p_start
        p_start, p_end, p_row, short, owner = p_start[host], cut[host], p_row[host], short[host], owner[host]
        again = again[host]
        for tid in np.unique(owner):
            mine = owner == tid
            again_host = None if recomputing is None or tid not in recomputing.groups else recomputing.get_group(tid)
            pieces = _thread_causes(
                events, int(tid), p_start[mine], p_end[mine], p_row[mine], short[mine], names, busy, work, again_host
            )
            recomputing_then = again[mine]
            if again_host is not None:
                stretch_start, stretch_end = (
                    again_host["start"].to_numpy("int64"),
                    again_host["handed_back"].to_numpy("int64"),
                )
                recomputing_then |= _within(p_start[mine], p_end[mine], stretch_start, stretch_end)
            batch.append(pieces.recomputing(p_start[mine], recomputing_then))
        parts.append(_Pieces.joined(batch).summed())
    parts = [part for part in parts if len(part)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.concat(parts, ignore_index=True)
    summed = frame.groupby(["row", "cause", "source", "name", "range"], as_index=False, sort=False).agg(
        idle_ns=("idle_ns", "sum"), pieces=("pieces", "sum")
    )
    summed["step"] = step_numbers[summed["row"].to_numpy("int64")]
    summed["cause"] = np.asarray(CAUSE_NAMES, dtype=object)[summed["cause"].to_numpy("int64")]
    summed["source"] = np.asarray(SOURCES, dtype=object)[summed["source"].to_numpy("int64")]
    summed["range"] = names.range_label(summed["range"].to_numpy("int64"))
    summed["name"] = [names.label(source, name) for source, name in zip(summed["source"], summed["name"], strict=True)]
    summed["idle_ns"] = summed["idle_ns"].astype("int64")
    return summed.sort_values(["step", "idle_ns"], ascending=[True, False], kind="stable")[COLUMNS].reset_index(
        drop=True
    )


class _Pieces:
    """Idle pieces as integer columns (step row; cause and source, as indices of CAUSE_NAMES and SOURCES; the
    name's id in its source: a CUDA or OS call name id, or an NVTX range code; the innermost range's code),
    summed at once."""

    def __init__(self, row, cause, source, name, range_code, start, idle_ns):
        self.columns = tuple(np.asarray(c, dtype="int64") for c in (row, cause, source, name, range_code))
        self.start, self.idle_ns = np.asarray(start, dtype="int64"), np.asarray(idle_ns, dtype="int64")

    @classmethod
    def alike(cls, row: np.ndarray, start: np.ndarray, idle_ns: np.ndarray, cause: str, source: int) -> _Pieces:
        n, code = len(row), CAUSE_NAMES.index(cause)
        return cls(row, np.full(n, code), np.full(n, source), np.full(n, -1), np.full(n, -1), start, idle_ns)

    @classmethod
    def joined(cls, parts: list[_Pieces]) -> _Pieces:
        row, cause, source, name, range_code = (np.concatenate([part.columns[k] for part in parts]) for k in range(5))
        start, idle_ns = np.concatenate([p.start for p in parts]), np.concatenate([p.idle_ns for p in parts])
        return cls(row, cause, source, name, range_code, start, idle_ns)

    def delayed_by(self, calls_end, calls_delay, calls_cause, calls_name, ahead: np.ndarray) -> _Pieces:
        """One thread's pieces with the host overhead that its calls delayed moved to them (module docstring):
        a call that held the thread while the GPU was busy (`calls_delay`, ending at `calls_end`) made every
        launch after it that much later, so up to that much of the host-overhead idle after it, until the thread
        is next ahead of the GPU (`ahead`, sorted times), would not have been idle without it. The moved part
        takes the latest such call's cause and name, source DELAYED; a piece split so counts in both rows."""
        row, cause, source, name, range_code = (c.copy() for c in self.columns)
        start, idle_ns = self.start.copy(), self.idle_ns.copy()
        host = np.flatnonzero(cause == CAUSE_NAMES.index(HOST_OVERHEAD))
        if not len(calls_end) or not len(host):
            return self
        # calls and host-overhead pieces in one time line: the delay they accrue (D) and the idle they offer (C)
        times = np.r_[calls_end, start[host]]
        delay = np.r_[calls_delay, np.zeros(len(host), "int64")]
        offered = np.r_[np.zeros(len(calls_end), "int64"), idle_ns[host]]
        call_index = np.r_[np.arange(len(calls_end)), np.full(len(host), -1)]
        order = np.lexsort((np.r_[np.zeros(len(calls_end)), np.ones(len(host))], times))
        times, delay, offered, call_index = times[order], delay[order], offered[order], call_index[order]
        epoch = np.asarray(np.searchsorted(ahead, times, side="right"))  # runs of events between two times ahead
        first = np.r_[True, epoch[1:] != epoch[:-1]]
        d_sum, c_sum = _run_cumsum(delay, first), _run_cumsum(offered, first)
        # moved so far M = min(M_prev + offered, D): M_i = C_i + min(0, min over k <= i of (D_k - C_k))
        moved_so_far = c_sum + np.minimum(0, _run_cummin(d_sum - c_sum, first))
        moved = np.where(first, moved_so_far, np.diff(np.r_[0, moved_so_far]))
        latest = np.maximum.accumulate(np.where(call_index >= 0, np.arange(len(times)), -1))
        latest = np.where(
            (latest >= 0) & (epoch[np.maximum(latest, 0)] == epoch), call_index[np.maximum(latest, 0)], -1
        )
        piece_events = np.flatnonzero(call_index < 0)
        amount = moved[piece_events]
        take = (amount > 0) & (latest[piece_events] >= 0)
        at = host[order[piece_events] - len(calls_end)][take]
        by = latest[piece_events][take]
        amount = np.minimum(amount[take], idle_ns[at])
        kept = idle_ns[at] - amount
        rest = kept > 0
        keep = at[rest]
        extra = _Pieces(row[keep], cause[keep], source[keep], name[keep], range_code[keep], start[keep], kept[rest])
        cause[at], source[at], name[at], idle_ns[at] = calls_cause[by], DELAYED, calls_name[by], amount
        return _Pieces.joined([_Pieces(row, cause, source, name, range_code, start, idle_ns), extra])

    def between_reads(self, s_start: np.ndarray, s_end: np.ndarray, s_name: np.ndarray) -> _Pieces:
        """These pieces with the launch overhead and copy calls between two synchronizations of the thread less
        than HOST_GAP_NS apart (sorted calls `s_start`, `s_end`) moved to the later one, source DELAYED: a thread
        that reads values one after another (`.item()` in a loop) drains the GPU's queue at each, and cannot get
        ahead of the GPU before the next, so all of that idle is the reads'."""
        if len(s_start) < 2:
            return self
        gap = s_start[1:] - s_end[:-1]
        dense = np.flatnonzero((gap > 0) & (gap <= HOST_GAP_NS))
        if not len(dense):
            return self
        w_start, w_end, w_name = s_end[:-1][dense], s_start[1:][dense], s_name[1:][dense]
        row, cause, source, name, range_code = (c.copy() for c in self.columns)
        moved = np.isin(cause, [CAUSE_NAMES.index(HOST_OVERHEAD), CAUSE_NAMES.index(COPY)])
        at = np.searchsorted(w_start, self.start, side="right") - 1
        moved &= (at >= 0) & (self.start + self.idle_ns <= w_end[np.maximum(at, 0)])
        cause[moved], source[moved] = CAUSE_NAMES.index(SYNCHRONIZATION), DELAYED
        name[moved] = w_name[at[moved]]
        return _Pieces(row, cause, source, name, range_code, self.start, self.idle_ns)

    def recomputing(self, p_start: np.ndarray, again: np.ndarray) -> _Pieces:
        """These pieces with host overhead and host work moved to `recomputation` where the idle piece they were
        cut from (sorted disjoint starts `p_start`) ended in a recomputed kernel or lay in the thread's
        stretch of recomputation (`again`)."""
        if not again.any():
            return self
        cause = self.columns[1].copy()
        piece = np.searchsorted(p_start, self.start, side="right") - 1
        host = np.isin(cause, [CAUSE_NAMES.index(HOST_OVERHEAD), CAUSE_NAMES.index(HOST_WORK)])
        cause[host & again[np.maximum(piece, 0)] & (piece >= 0)] = CAUSE_NAMES.index(RECOMPUTATION)
        row, _, source, name, range_code = self.columns
        return _Pieces(row, cause, source, name, range_code, self.start, self.idle_ns)

    def summed(self) -> pd.DataFrame:
        """Summed by all five columns (`pieces`: how many): a launch-bound step has a piece per kernel."""
        keys = ["row", "cause", "source", "name", "range"]
        if not len(self.idle_ns):
            return pd.DataFrame(columns=[*keys, "idle_ns", "pieces"])
        codes = [pd.factorize(np.asarray(column, dtype="int64")) for column in self.columns]
        key = np.zeros(len(self.idle_ns), dtype="int64")  # the codes in one number: few of each per thread
        for code, label in codes:
            key = key * len(label) + code
        inverse, group = pd.factorize(key, sort=True)  # numpy's unique hashes: 2.5 s over 12M at NeMo's shape
        frame = {}
        for k in range(len(keys) - 1, -1, -1):
            label = codes[k][1]
            frame[keys[k]] = label[group % len(label)]
            group = group // len(label)
        frame = pd.DataFrame({k: frame[k] for k in keys})
        frame["idle_ns"] = np.bincount(inverse, weights=self.idle_ns, minlength=len(frame)).astype("int64")
        frame["pieces"] = np.bincount(inverse, minlength=len(frame))
        return frame


def _in_sorted(values: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Which of `values` are in `sorted_values` (sorted), by binary search."""
    if not len(sorted_values):
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return sorted_values[at] == values


def _host_memory(events: EventStore, pids, correlations, causes) -> np.ndarray:
    """For each call, the host memory its copy or set touched, as 1 + its index in HOST_MEMORY (0: none, or not
    a copy call). A copy from pageable memory is staged, a set of pinned or managed memory blocks the host: the
    copy and set rules count only the idle in such calls (views.py)."""
    kinds = np.zeros(len(causes), "int64")
    copying = np.flatnonzero((causes == CAUSE_NAMES.index(COPY)) & (correlations >= 0))
    if not len(copying):
        return kinds
    lo, hi = int(correlations[copying].min()), int(correlations[copying].max())
    ops = events.arrays(
        f"""SELECT pid, correlation_id,
                   CASE WHEN {sql_in("src_kind", HOST_MEMORY)} THEN src_kind ELSE dst_kind END AS kind
            FROM memops WHERE correlation_id BETWEEN {lo} AND {hi}
              AND ({sql_in("src_kind", HOST_MEMORY)} OR {sql_in("dst_kind", HOST_MEMORY)})"""
    )
    if not len(ops["pid"]):
        return kinds
    # (pid, correlation id) as one number, correlation ids being 32-bit: matched by binary search
    op_keys = (ops["pid"].astype("int64") << 32) | ops["correlation_id"].astype("int64")
    order = np.argsort(op_keys)
    op_keys, op_kinds = op_keys[order], np.asarray(ops["kind"], dtype=object)[order]
    keys = (pids[copying].astype("int64") << 32) | correlations[copying].astype("int64")
    at = np.minimum(np.searchsorted(op_keys, keys), len(op_keys) - 1)
    found = op_keys[at] == keys
    kinds[copying[found]] = [HOST_MEMORY.index(kind) + 1 for kind in op_kinds[at[found]]]
    return kinds


def _within(starts: np.ndarray, ends: np.ndarray, r_start: np.ndarray, r_end: np.ndarray) -> np.ndarray:
    """Which intervals lie inside one of the ranges r (any order, overlapping or nested)."""
    if not len(r_start):
        return np.zeros(len(starts), bool)
    order = np.argsort(r_start, kind="stable")
    r_start, reach = r_start[order], np.maximum.accumulate(r_end[order])
    at = np.searchsorted(r_start, starts, side="right") - 1
    return (at >= 0) & (reach[np.maximum(at, 0)] >= ends)


def _run_cumsum(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sums that restart where `first` is set (runs of consecutive elements)."""
    total = np.cumsum(values)
    restart = np.maximum.accumulate(np.where(first, np.arange(len(values)), 0))
    return total - (total - values)[restart]


def _run_cummin(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative minima that restart where `first` is set: each run lowered below every earlier one, so one
    pass of np.minimum.accumulate cannot carry a minimum across runs."""
    if not len(values):
        return values
    run = np.cumsum(first) - 1
    step = 2 * int(np.abs(values).max()) + 1
    return np.minimum.accumulate(values - run * step) + run * step


def _busy_within(starts: np.ndarray, ends: np.ndarray, busy: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """For each interval, how much of it the GPU was busy (`busy`: its sorted disjoint intervals)."""
    s, e, _, b = _overlaps(*busy, starts, ends)
    return np.bincount(b, weights=e - s, minlength=len(starts)).astype("int64")


# Time a thread spends switched out in these causes is not theirs: it was ready to run and waited for a core.
PREEMPTIBLE = np.array([CAUSE_NAMES.index(HOST_OVERHEAD), CAUSE_NAMES.index(HOST_WORK)])


def _switched_out(parts: list[tuple], off_start: np.ndarray, off_end: np.ndarray) -> list[tuple]:
    """Parts (start, end, piece, cause, source, name) with their host-overhead and host-work pieces cut where
    the thread was switched out (sched.off_cpu): outside any OS call, so not blocked waiting for something
    (lock, condition and I/O waits are OS calls), it was ready to run and waited for a CPU core. Those cuts
    become CPU_WAIT, keeping the part's source and name; synchronizations, allocations and copies keep their
    time, switched out or not (they block by design)."""
    if not len(off_start):
        return parts
    result = []
    for start, end, piece, cause, source, name in parts:
        cut = np.isin(cause, PREEMPTIBLE)
        order = np.flatnonzero(cut)[np.argsort(start[cut], kind="stable")]
        s, e, _, b = _overlaps(off_start, off_end, start[order], end[order])
        rest_s, rest_e, rest_b = _minus(start[order], end[order], np.arange(len(order)), off_start, off_end)
        kept = np.flatnonzero(~cut)
        for where, a, z in ((kept, start[kept], end[kept]), (order[rest_b], rest_s, rest_e)):
            result.append((a, z, piece[where], cause[where], source, None if name is None else name[where]))
        waited = np.full(len(s), CAUSE_NAMES.index(CPU_WAIT))
        result.append((s, e, piece[order[b]], waited, source, None if name is None else name[order[b]]))
    return result


def _thread_causes(events, tid, p_start, p_end, p_row, short, names, busy, work: _NextWork, again=None) -> _Pieces:
    """One thread's share of the idle pieces, cut by its CUDA calls, then its OS calls, then its own code;
    each cut piece with the innermost NVTX range open on the thread; then the host overhead its allocations,
    synchronizations and recomputation (`again`: its stretches, recompute.Recomputed.host) delayed moved to them.
    `names`: _Names; `busy`: the GPU's busy intervals."""
    if tid < 0:
        return _Pieces.alike(p_row, p_start, p_end - p_start, UNATTRIBUTED, NONE)
    lo, hi = int(p_start.min()), int(p_end.max())
    window = f'global_tid = {tid} AND start < {hi} AND "end" > {lo}'
    bounds = events.arrays(
        f'SELECT start AS t FROM nvtx WHERE {window} UNION ALL SELECT "end" FROM nvtx WHERE {window}'
    )
    p_start, p_end, keep = _split(p_start, p_end, _sorted_unique(bounds["t"]))
    p_row, short = p_row[keep], short[keep]
    piece = np.arange(len(p_start))
    api = events.arrays(
        f'SELECT start, "end", name_id, coalesce(correlation_id, -1) AS correlation_id, coalesce(pid, -1) AS pid '
        f"FROM cuda_api WHERE {window}"
    )
    a_start, a_end, order = _disjoint(api["start"], api["end"])
    s, e, a, b = _overlaps(a_start, a_end, p_start, p_end)
    call_ids = api["name_id"][order].astype("int64")
    call_cause = names.api_cause_of(call_ids)
    kinds = _host_memory(events, api["pid"][order], api["correlation_id"][order], call_cause)
    parts = [(s, e, b, call_cause[a], CUDA_API, call_ids[a] + kinds[a] * HOST_MEMORY_STRIDE)]
    delaying = np.isin(call_cause, DELAYING)
    d_start, d_end = a_start[delaying], a_end[delaying]
    d_cause, d_name = call_cause[delaying], call_ids[delaying]
    if again is not None:
        again = again[(again["end"] > lo) & (again["start"] < hi)]  # as the calls: this window's
    if again is not None and len(again):
        d_start, d_end = np.r_[d_start, again["start"].to_numpy("int64")], np.r_[d_end, again["end"].to_numpy("int64")]
        d_cause = np.r_[d_cause, np.full(len(again), CAUSE_NAMES.index(RECOMPUTATION))]
        d_name = np.r_[d_name, np.full(len(again), -1)]
    delay = _busy_within(d_start, d_end, busy)
    r_start, r_end, r_piece = _minus(p_start, p_end, piece, a_start, a_end)
    os_calls = events.arrays(f'SELECT start, "end", name_id FROM osrt WHERE {window}')
    o_start, o_end, order = _disjoint(os_calls["start"], os_calls["end"])
    s, e, a, b = _overlaps(o_start, o_end, r_start, r_end)
    ids = os_calls["name_id"][order][a].astype("int64")
    parts.append((s, e, r_piece[b], names.os_cause_of(ids), OS_RUNTIME, ids))
    s, e, own = _minus(r_start, r_end, r_piece, o_start, o_end)
    cause = np.where(short[own], CAUSE_NAMES.index(HOST_OVERHEAD), CAUSE_NAMES.index(HOST_WORK))
    parts.append((s, e, own, cause, OWN, None))
    if names.os_traced:  # without OS calls traced, a thread switched out may be blocked in one, not waiting
        parts = _switched_out(parts, *sched.off_cpu(events, tid, lo, hi))
    starts, ends, pieces = (np.concatenate([part[i] for part in parts]) for i in range(3))
    range_code = nvtx.innermost_range_codes(events, starts, ends, np.full(len(starts), tid))
    if names.data_code >= 0:  # inside a `data` range at any depth counts as `data` (the data_stall view)
        data = events.arrays(f'SELECT start, "end" FROM nvtx WHERE {window} AND name_id = {names.data_code}')
        range_code[_within(starts, ends, data["start"], data["end"])] = names.data_code
    sizes = np.cumsum([0] + [len(part[0]) for part in parts])
    syncs = np.flatnonzero(call_cause == CAUSE_NAMES.index(SYNCHRONIZATION))
    return (
        _Pieces(
            p_row[pieces],
            np.concatenate([part[3] for part in parts]),
            np.concatenate([np.full(len(part[0]), part[4]) for part in parts]),
            np.concatenate(  # own code is named by its innermost range
                [range_code[lo:hi] if part[5] is None else part[5] for part, lo, hi in zip(parts, sizes, sizes[1:])]
            ),
            range_code,
            starts,
            ends - starts,
        )
        .between_reads(a_start[syncs], a_end[syncs], call_ids[syncs])
        .delayed_by(d_end, delay, d_cause, d_name, work.ahead_of(tid))
    )


# ---------------------------------------------------------------- findings: the largest causes

# A cause below this share of the median step is not worth a finding of its own (the table still lists it).
MIN_SHARE_PCT = 1.0
# The column views.idle_views adds to the table: the finding each row's idle time counts toward. Idle time
# inside the trainer's `data` ranges can be the data_stall rule's, synchronization the sync rules', and some
# copies and lock waits the copy and lock rules' (views.py): each row counts toward one finding.
VIEW_COLUMN = "rule"
VIEW_ROW = "row"  # the step's position in the clock (StepClock's order, by start), which views add too
RECOMPUTATION_RULE = "recomputation"  # the finding (recompute.recompute_finding) the recomputation rows count toward
NAMES_LISTED = 3


@dataclass(frozen=True)
class Cause:
    rule: str
    cause: str  # of CAUSE_NAMES
    doing: str  # "the GPU idles X% of the step while the CPU ..."
    recommendation: str


CAUSES = (
    Cause(
        "allocator_churn",
        ALLOCATION,
        "allocates and frees device memory",
        "Keep PyTorch's caching allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING), set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where fragmentation makes it free and allocate again, "
        "and reuse buffers rather than allocating every step (no torch.cuda.empty_cache() in the loop).",
    ),
    Cause(
        "launch_bound",
        HOST_OVERHEAD,
        f"launches kernels and runs the framework's code between them, each gap under {HOST_GAP_NS / 1e6:g} ms",
        "Cut the CPU's cost per unit of GPU work: capture the step in CUDA graphs (torch.compile(mode="
        "'reduce-overhead'), torch.cuda.graphs), fuse small ops (torch.compile), use fused implementations (a fused "
        "optimizer, AdamW(fused=True), where the range named is the optimizer's), and give each kernel more work "
        "(a larger micro-batch, fewer accumulation steps).",
    ),
    Cause(
        "host_work",
        HOST_WORK,
        f"runs its own code for more than {HOST_GAP_NS / 1e6:g} ms at a time with nothing queued on the GPU",
        "Take that work off the training thread's critical path, by what the range named does: input work in "
        "DataLoader workers (num_workers > 0, prefetch_factor) or a background thread, or a pre-tokenized dataset; "
        "compute on the host (an optimizer stepped on the CPU, ZeRO-Offload style; statistics, a checkpoint, "
        "gc.collect()) back on the GPU where memory allows, less often, or overlapped with the GPU's next work; and "
        "let the CPU queue the next step while the GPU runs (no per-step .item() or other sync before it).",
    ),
    Cause(
        "thread_wait",
        THREAD_WAIT,
        "waits for another thread or process",
        "Give the producer more capacity (DataLoader num_workers, prefetch_factor, persistent_workers=True) or "
        "shorten what the threads hold each other up for (locks around logging, checkpointing, queues). A Python "
        "thread waiting in pthread_cond_timedwait is how CPython waits for its interpreter lock (the GIL): another "
        "thread of the same process running Python (a thread that tokenizes or prefetches, a logger) holds it, "
        "so move that work into processes (DataLoader workers, multiprocessing), not threads.",
    ),
    Cause(
        "cpu_contention",
        CPU_WAIT,
        "is ready to run but switched out, waiting for a CPU core",
        "Give the training process cores of its own: nothing else busy on the cores it may use (other jobs, "
        "a second training process, busy DataLoader workers or their augmentation), no more threads than cores "
        "(DataLoader num_workers, OMP_NUM_THREADS and torch.set_num_threads together), and a CPU quota that fits "
        "them (Slurm --cpus-per-task, the container's CPU limit, taskset or numactl bindings). The per-core "
        "table (cpu_cores) shows which cores its threads ran on and how busy they were. A thread also sleeps outside "
        "any OS call when it touches a page of a memory-mapped file not yet read (a dataset on a slow disk): where "
        "its cores were idle meanwhile, copy the data to local disk or memory.",
    ),
    Cause(
        "os_calls",
        OS_CALL,
        "is inside OS calls",
        "Move file, network and sleep calls off the training thread (a background thread, or between steps "
        "only every N steps).",
    ),
    Cause(
        "copy_calls",
        COPY,
        "issues memory copies and sets",
        "Copy from pinned memory with non_blocking=True, batch small copies into one, and keep data that is "
        "needed on the GPU there.",
    ),
)

CPU_CONTENTION = next(cause for cause in CAUSES if cause.cause == CPU_WAIT)  # claimed before the range-based views


# Launch overhead where the launches wait for their kernels (views.synchronous_launches): not in CAUSES, since
# views.idle_views gives it the host overhead rows only where that holds.
SYNCHRONOUS_LAUNCHES = Cause(
    "synchronous_launches",
    HOST_OVERHEAD,
    "launches kernels, each launch returning only once its kernel has finished",
    "Make launches asynchronous again: unset CUDA_LAUNCH_BLOCKING (a debugging switch: every launch waits for its "
    "kernel, so the CPU never queues work ahead of the GPU and its own time between launches adds to the GPU's), "
    "and do not time training under a tool that serializes kernels (compute-sanitizer, Nsight Compute).",
)
# Synchronizations and launch overhead where the step loops over groups of the data (views.idle_views claims them
# from GROUP_LOOP_GEMMS data-sized GEMMs a step): reading the groups' sizes drains the queue and the loop's small
# kernels keep it empty.
GROUP_LOOP = Cause(
    "group_loop",
    HOST_OVERHEAD,
    "loops over groups of the data, reading their sizes and launching each group's kernels one by one",
    "",  # GROUP_LOOP_ADVICE, with the data-sized GEMMs counted
)
FINDING_CAUSES = (*CAUSES, SYNCHRONOUS_LAUNCHES, GROUP_LOOP)  # every cause that idle_findings can report
# Where fills are this share of the launches or more, launch_bound names what makes them (on the committed captures
# without such a switch, fills are at most 11.4% of launches; with deterministic algorithms, 38.3%).
FILL_LAUNCH_PCT = 25.0
# From this many GEMM launches a step sized by the data (gains.data_sized_gemms_per_step), the step is a loop over
# groups of the data, each turn launching its own small kernels. The 66 foreign captures without such a loop
# (tests/fixtures/foreign) have none; the Mixtral's experts run one by one 38 to 56 (transformers' eager loop and
# DeepSeek's sorted one).
GROUP_LOOP_GEMMS = 16
GROUP_LOOP_ADVICE = (
    "{gemms:.0f} GEMMs a step take their size from the data (each shape launched once in its step and missing from "
    "another step): a Python loop over groups of the data, each turn launching its own small kernels for its "
    "group's rows, forward and backward. The loop reads the groups' sizes back from the GPU, which drains its queue; "
    "the small kernels cannot fill it again, and CUDA graphs cannot capture past such a read. A Mixture-of-Experts "
    "layer that runs its experts one by one does this (transformers' experts_implementation=\"eager\", DeepSeek's "
    'reference moe_infer): run the experts as one grouped GEMM (experts_implementation="grouped_mm", '
    "transformers' default; Megatron-LM's moe_grouped_gemm; torch._grouped_mm)."
)
# Where the threads that launch also waited for a core (cpu_contention found, its rivals named), launch_bound's
# remedy begins with it: the host time between launches is longer on a shared core.
CONTENDED_ADVICE = (
    "The threads that launch also waited for a CPU core while other threads ran on their cores (cpu_contention): "
    "between switches a thread that shares its cores runs slower too (its caches refilled after each), so give them "
    "cores of their own first (cpu_contention's remedy) and measure again; then "
)
FILL_ADVICE = (
    "{share:.0f}% of the kernels launched fill memory with one value (`FillFunctor`): "
    "torch.use_deterministic_algorithms(True) fills every new tensor (keep the algorithms without the fills: "
    "torch.utils.deterministic.fill_uninitialized_memory = False), as do torch.zeros or torch.full where "
    "torch.empty would do, and zero_grad(set_to_none=False). "
)


def per_step(rows: pd.DataFrame, clock: StepClock) -> np.ndarray:
    """The idle time per step (ns, in the clock's step order) that rows of views.idle_views hold."""
    if not len(rows):
        return np.zeros(clock.steps)
    return np.bincount(rows[VIEW_ROW].to_numpy("int64"), weights=rows["idle_ns"].to_numpy(float), minlength=clock.steps)


def _listed(rows: pd.DataFrame, column: str, steps: int) -> str:
    top = rows.groupby(column)["idle_ns"].sum().sort_values(ascending=False).head(NAMES_LISTED)
    return ", ".join(f"`{name}` {ms(ns / steps)}" for name, ns in top.items())


def profiler_time(views: pd.DataFrame, clock: StepClock, overhead: Overhead | None) -> dict[str, float]:
    """Per finding (views.idle_views' `rule`; a row no finding counts keeps its cause), the part of the
    profiler's added time per step (overhead.added_ns) that fell in its stretches. nsys costs the host per
    traced call, and every stretch of idle the host held the GPU up in ends with the traced call that fed it, so
    the added time is spread by share of those stretches (not over `queued` idle: the work was on the GPU
    already), at most each one's own idle per step."""
    if overhead is None or overhead.added_ns <= 0 or views.empty:
        return {}
    held = views[views["cause"] != QUEUED]
    owner = held[VIEW_COLUMN].where(held[VIEW_COLUMN].fillna("") != "", held["cause"])
    stretches = held.groupby(owner)["pieces"].sum()
    if not stretches.sum():
        return {}
    idle = held.groupby(owner)["idle_ns"].sum() / max(1, clock.steps)
    # Where the thread waited for a core, the profiler's own work ran on the cores it waited for: the added time
    # goes there first, up to that idle, and the rest by stretches.
    first = float(min(overhead.added_ns, idle.get(CPU_CONTENTION.rule, 0.0)))
    placed = (overhead.added_ns - first) * stretches / stretches.sum()
    if first:
        placed[CPU_CONTENTION.rule] = first
    return {str(key): float(min(placed[key], idle[key])) for key in placed.index}


def _rivals(rivals: pd.DataFrame | None, labels: dict, steps: int) -> str:
    """Which threads ran on the waiting threads' cores meanwhile, the busiest NAMES_LISTED, per step."""
    if rivals is None or rivals.empty:
        return ""
    ran = rivals.nlargest(NAMES_LISTED, "ns")
    named = ", ".join(
        f"`{labels.get(r.global_tid, f'pid {int(r.pid)}, tid {int(r.tid)}')}` {ms(r.ns / max(1, steps))}"
        for r in ran.itertuples()
    )
    return f" While the threads that launch GPU work were switched out, these ran on their cores: {named} per step."


def idle_findings(
    views: pd.DataFrame,
    clock: StepClock,
    overhead: Overhead | None = None,
    fill_pct: float = 0.0,
    data_sized_gemms: float = 0.0,
    rivals: pd.DataFrame | None = None,
    labels: dict | None = None,
) -> list[Finding]:
    """A finding for each cause of GPU idle time (CAUSES) whose rows of the idle_causes table (those no data,
    sync, copy or lock rule counts: views.idle_views) hold at least MIN_SHARE_PCT of the median step: the gain
    is their share (idle time that fixing it removes), with the calls and ranges that hold most, less the
    profiler's added time that fell in its stretches (profiler_time, overhead.host_share). `fill_pct`: the
    share of launches that fill memory (kernels.fill_share_pct); from FILL_LAUNCH_PCT, launch_bound names what
    makes them. `data_sized_gemms`: GEMM launches a step sized by the data (gains.data_sized_gemms_per_step),
    which group_loop's remedy counts; `rivals` (sched.core_rivals), the threads that ran on the feeding threads'
    cores while they waited for one, which cpu_contention names (`labels`: cpu.thread_labels), and where there are
    any, launch_bound's remedy begins with CONTENDED_ADVICE."""
    if views.empty:
        return []
    idle = per_step(views, clock)
    placed = profiler_time(views, clock, overhead)
    waited = clock.share(per_step(views[views[VIEW_COLUMN] == CPU_CONTENTION.rule], clock))
    contended = waited >= MIN_SHARE_PCT and rivals is not None and not rivals.empty
    findings = []
    for cause in FINDING_CAUSES:
        rows = views[views[VIEW_COLUMN] == cause.rule]
        cause_idle = per_step(rows, clock)
        gain = clock.share(cause_idle)
        if gain < MIN_SHARE_PCT:
            continue
        calls = rows[rows["source"] != "own code"]
        where = f" Calls: {_listed(calls, 'name', clock.steps)} per step." if len(calls) else ""
        delayed = per_step(rows[rows["source"] == SOURCES[DELAYED]], clock)
        if delayed.any():
            where += (
                f" Of it, {ms(float(np.median(delayed)))} per step is launches these calls delayed: they held the "
                "thread while the GPU still had work, so everything launched after them came that much later."
            )
        share = host_share(overhead, float(np.median(cause_idle)), clock, placed.get(cause.rule, 0.0))
        fills = cause.cause == HOST_OVERHEAD and fill_pct >= FILL_LAUNCH_PCT
        remedy = cause.recommendation
        if contended and cause.rule == "launch_bound":
            remedy = CONTENDED_ADVICE + remedy[0].lower() + remedy[1:]
        findings.append(
            Finding(
                cause.rule,
                severity_of(share.gain_pct if share else gain),
                f"The GPU idles {gain:.1f}% of the step while the CPU {cause.doing}" + (share.title if share else ""),
                f"{ms(float(np.median(cause_idle)))} per step (median of {clock.steps}) of the "
                f"{ms(float(np.median(idle)))} the GPU idles in a step ({pct(np.median(idle), clock.step_ns):.1f}% "
                f"of it), in {int(rows['pieces'].sum()):,} stretches.{where} Innermost NVTX ranges open on the "
                f"thread the GPU waited for: {_listed(rows, 'range', clock.steps)} per step."
                + (_rivals(rivals, labels or {}, clock.steps) if cause is CPU_CONTENTION else "")
                + (share.evidence if share else ""),
                (FILL_ADVICE.format(share=fill_pct) if fills else "")
                + (GROUP_LOOP_ADVICE.format(gemms=data_sized_gemms) if cause is GROUP_LOOP else remedy),
                share.gain_pct if share else gain,
                f"GPU idle (no device busy) while the thread that launched the next GPU work {cause.doing}: "
                f"idle_causes, {clock.scope(cause_idle)}" + (share.basis if share else ""),
            )
        )
    return findings
