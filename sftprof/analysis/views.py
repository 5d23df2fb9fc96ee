"""Which finding each row of the idle_causes table counts toward: the idle, sync, copy, data and lock rules
as views of that one table.

Every row (a step's idle time with one cause, call or range) goes to one finding at most, so no nanosecond of
idle time is in the gain of two findings, and each such finding's gain is the median share of the step its rows
hold. In order, the first that applies:

- `data_stall`: idle while the thread feeding the GPU was inside the trainer's `data` ranges (at any depth), where
  the data ranges take DATA_STALL_PCT of the step time or more;
- `sync_memcpy`: synchronization inside synchronous cudaMemcpy calls, and the launches they delayed;
- `synchronous_launches`: launch overhead, where a thread's launches return only once their kernels have finished
  (synchronous_launches: CUDA_LAUNCH_BLOCKING=1), so the CPU's time between launches adds to the GPU's;
- `anomaly_detection`: where most explicit synchronizations are made on PyTorch's autograd threads, node after
  node (backward_syncs: the backward pass itself reads values, as anomaly detection does), every other
  synchronization, launch overhead, copy call and queued start of the step: a loop that drains the GPU's queue
  after each backward node never gets ahead of the GPU, so all of that idle is the synchronizations';
- `interconnect`: where most synchronizations wait for host copies their thread just issued (copy_syncs: data
  moved through the host, as activation offloading does), the synchronization and what it delayed: without the
  copies there is nothing to wait for;
- `sync_in_steps`: the other synchronization (stream, event, device and context syncs, and what they delayed);
- `sync_memset`: idle inside synchronous cudaMemset calls that set pinned or managed memory (they block);
- `pageable_memcpy`: idle inside asynchronous copy calls that copy from or to pageable memory (staged);
- `lock_wait`: waits in lock calls (rules.LOCK_WAIT_CALLS);
- `recomputation`: the CPU preparing and launching kernels the backward pass runs again (recompute.py);
- the other causes' findings (idle.CAUSES): allocation, host overhead, host work, thread waits, OS calls, copies.

Queued and unattributed time goes to none (but to `anomaly_detection` where it applies). The rules keep their own
evidence (which call, where, which thread); their gain is their rows' share. Without GPU work the table is empty
and the data and lock rules keep their CPU-time measures.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sftprof.analysis import cuda, idle
from sftprof.analysis.cpu import AUTOGRAD_ROLE, PHASES
from sftprof.analysis.findings import pct
from sftprof.analysis.gains import HOST_GAP_NS, READ_BYTES, StepClock, short_names
from sftprof.analysis.memory import PAGEABLE
from sftprof.trace.events import MEMSET_KIND, EventStore, sql_in, sql_text

RULE = idle.VIEW_COLUMN  # the column views add to idle_causes
ROW = idle.VIEW_ROW  # and the step's position in the clock
DATA_PHASE = PHASES[0]
ANOMALY_RULE = "anomaly_detection"
INTERCONNECT_RULE = "interconnect"
# Loading data for longer than this share of the step starves the GPU (and the CPU-side model code).
DATA_STALL_PCT = 10.0
# OS calls in which a thread waits for a lock held by another thread. CPython's threading.Lock
# and queue.Queue block in sem_wait/sem_clockwait/sem_timedwait; C++ code in pthread_mutex_lock.
LOCK_WAIT_CALLS = frozenset(
    {
        "pthread_mutex_lock",
        "pthread_mutex_timedlock",
        "pthread_rwlock_rdlock",
        "pthread_rwlock_wrlock",
        "pthread_rwlock_timedrdlock",
        "pthread_rwlock_timedwrlock",
        "pthread_spin_lock",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
    }
)
# Memsets that block the host: on pinned or managed memory (device-memory memsets run asynchronously).
HOST_BLOCKING_MEMSET_KINDS = ("Pinned", "Managed")
BLOCKING_MEMSET_ROWS = f"m.copy_kind = {sql_text(MEMSET_KIND)} AND {sql_in('m.dst_kind', HOST_BLOCKING_MEMSET_KINDS)}"
PAGEABLE_ROWS = f"m.src_kind = {sql_text(PAGEABLE)} OR m.dst_kind = {sql_text(PAGEABLE)}"


def data_stalled(steps: pd.DataFrame) -> bool:
    """The `data` ranges take DATA_STALL_PCT of the steps' time or more: data_stall reports them."""
    if steps.empty or f"{DATA_PHASE}_ns" not in steps:
        return False
    return pct(int(steps[f"{DATA_PHASE}_ns"].sum()), int(steps["duration"].sum())) >= DATA_STALL_PCT


def backward_syncs(events: EventStore, threads: pd.DataFrame | None) -> bool:
    """Most explicit synchronizations (cuda.HOST_SYNC_CALLS) are made on PyTorch's autograd threads
    (cpu.AUTOGRAD_ROLE), and most of those within HOST_GAP_NS of the thread's previous one: no loop code runs there,
    so the backward pass itself reads values, node after node, and the GPU's queue never fills. Counted by the
    store, per thread: a trainer that synchronizes after every launch makes millions."""
    if threads is None or threads.empty:
        return False
    explicit = cuda.host_sync_ids(events)
    autograd = set(threads.loc[threads["role"] == AUTOGRAD_ROLE, "global_tid"].astype("int64"))
    if not explicit or not autograd:
        return False
    per_thread = events.query(
        f"""SELECT global_tid, count(*) AS calls,
                   count(*) FILTER (WHERE start - previous_end <= {HOST_GAP_NS}) AS close
            FROM (SELECT global_tid, start,
                         lag("end") OVER (PARTITION BY global_tid ORDER BY start) AS previous_end
                  FROM cuda_api WHERE {sql_in("name_id", explicit)})
            GROUP BY global_tid"""
    )
    mine = per_thread[per_thread["global_tid"].astype("int64").isin(autograd)]
    on_autograd = int(mine["calls"].sum())
    return on_autograd > int(per_thread["calls"].sum()) / 2 and int(mine["close"].sum()) > on_autograd / 2


# Each CUDA API call with the correlation id of its thread's call just before (`previous`): what a sync waits for.
CALLS_AFTER = """calls AS (SELECT pid, start, name_id,
                             lag(correlation_id) OVER (PARTITION BY global_tid ORDER BY start) AS previous
                      FROM cuda_api)"""


def copy_syncs(events: EventStore) -> bool:
    """Most explicit synchronizations (cuda.HOST_SYNC_CALLS) wait for a host copy of more than gains.READ_BYTES that
    their thread issued in its call just before (the copy still ran when the sync began): the loop moves data
    through the host and waits for each move, as activation offloading (`save_on_cpu`) does. Value reads (.item():
    a few bytes) are not such copies. Counted by the store, per call: the copy joined to its call."""
    explicit = cuda.host_sync_ids(events)
    if not explicit:
        return False
    counts = events.query(
        f"""WITH {CALLS_AFTER}
            SELECT count(*) AS syncs, count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM memops m WHERE m.pid = c.pid AND m.correlation_id = c.previous
                         AND m.copy_kind IN ('HtoD', 'DtoH') AND m.bytes > {READ_BYTES} AND m."end" > c.start))
                   AS after_copies
            FROM calls c WHERE {sql_in("c.name_id", explicit)}"""
    )
    syncs, after_copies = int(counts["syncs"].iloc[0]), int(counts["after_copies"].iloc[0])
    return after_copies > syncs / 2


UPLOAD_COLUMNS = ["start", "consumer"]


def upload_syncs(events: EventStore) -> pd.DataFrame:
    """The explicit synchronizations (cuda.HOST_SYNC_CALLS) whose thread's call just before copied a few bytes
    (gains.READ_BYTES or less) from pageable host memory to the GPU: a CPU value moved into an op on every call (an
    index list, x[..., [i]]; a CPU index or scalar tensor), a copy PyTorch waits for. One row per such sync: when it
    began (`start`) and the short name of the first kernel on the copy's stream after the copy (`consumer`: what
    took the value)."""
    explicit = cuda.host_sync_ids(events)
    small = f"m.copy_kind = 'HtoD' AND m.bytes <= {READ_BYTES} AND m.src_kind = {sql_text(PAGEABLE)}"
    if not explicit or not int(events.query(f"SELECT count(*) AS n FROM memops m WHERE {small}")["n"].iloc[0]):
        return pd.DataFrame({"start": pd.Series(dtype="int64"), "consumer": pd.Series(dtype=str)})
    rows = events.query(
        f"""WITH {CALLS_AFTER},
                 uploads AS (SELECT c.start, m.start AS copied, m.device_id, m.stream_id
                             FROM calls c JOIN memops m ON m.pid = c.pid AND m.correlation_id = c.previous
                             WHERE {sql_in("c.name_id", explicit)} AND {small})
            SELECT u.start, k.name_id FROM uploads u ASOF LEFT JOIN kernels k
              ON k.device_id = u.device_id AND k.stream_id = u.stream_id AND k.start >= u.copied
            ORDER BY u.start"""
    )
    consumer = rows["name_id"].map(short_names(events)).fillna("").astype(str)
    return pd.DataFrame({"start": rows["start"].astype("int64"), "consumer": consumer})[UPLOAD_COLUMNS]


def synchronous_launches(events: EventStore, waits: cuda.WaitCalls) -> bool:
    """Some thread's kernel launches wait for their kernels (cuda.synchronous_issuers): CUDA_LAUNCH_BLOCKING=1, or
    a tool that serializes kernels."""
    launches = set(cuda.launch_ids(events))
    return any(launches.intersection(ids) for _, ids in waits.synchronous)


def _matches(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Which names match, each distinct name tried once (a long capture's table repeats them per step)."""
    matched = {name: bool(pattern.search(cuda.base_name(str(name)))) for name in names.unique()}
    return names.map(matched).to_numpy(bool)


def idle_views(
    causes: pd.DataFrame,
    steps: pd.DataFrame,
    in_backward: bool = False,
    launches_wait: bool = False,
    after_copies: bool = False,
    data_sized_gemms: float = 0.0,
) -> pd.DataFrame:
    """idle_causes with `rule`: the finding whose gain each row counts toward ("" for none), module docstring.
    `in_backward`: most synchronizations are the backward pass's own (backward_syncs); `launches_wait`: some
    thread's launches wait for their kernels (synchronous_launches); `after_copies`: most synchronizations wait
    for the host copies just issued (copy_syncs); `data_sized_gemms`: GEMM launches a step sized by
    the data (gains.data_sized_gemms_per_step), from idle.GROUP_LOOP_GEMMS a loop over groups whose syncs and launch
    overhead are group_loop's."""
    rules = np.full(len(causes), "", dtype=object)
    if causes.empty:
        return causes.assign(**{RULE: pd.Series(dtype=object), ROW: pd.Series(dtype="int64")})
    cause, names = causes["cause"].to_numpy(object), causes["name"].astype(str)
    free = np.ones(len(causes), bool)

    def claim(rule: str, rows: np.ndarray) -> None:
        rows = rows & free
        rules[rows] = rule
        free[rows] = False

    claim(idle.CPU_CONTENTION.rule, cause == idle.CPU_WAIT)  # a thread switched out: not the work it was doing
    if data_stalled(steps):
        claim("data_stall", causes["range"].to_numpy(object) == DATA_PHASE)
    syncing = cause == idle.SYNCHRONIZATION
    claim("sync_memcpy", syncing & _matches(names, cuda.SYNC_MEMCPY_CALL))
    if launches_wait:
        claim(idle.SYNCHRONOUS_LAUNCHES.rule, cause == idle.HOST_OVERHEAD)
    if in_backward:
        drained = [idle.SYNCHRONIZATION, idle.HOST_OVERHEAD, idle.COPY, idle.QUEUED]
        claim(ANOMALY_RULE, np.isin(cause, drained))
    if after_copies:
        claim(INTERCONNECT_RULE, syncing)
    if data_sized_gemms >= idle.GROUP_LOOP_GEMMS:
        claim(idle.GROUP_LOOP.rule, syncing | (cause == idle.HOST_OVERHEAD))
    claim("sync_in_steps", syncing)
    copying = cause == idle.COPY  # copy and set calls are named with the host memory they touched (idle.HOST_MEMORY)
    blocking = names.str.endswith(tuple(f"({kind.lower()})" for kind in HOST_BLOCKING_MEMSET_KINDS)).to_numpy(bool)
    claim("sync_memset", copying & blocking & _matches(names, cuda.SYNC_MEMSET_CALL))
    staged = names.str.endswith(f"({PAGEABLE.lower()})").to_numpy(bool)
    claim("pageable_memcpy", copying & staged & _matches(names, cuda.ASYNC_MEMCPY_CALL))
    os_calls = (causes["source"] == idle.SOURCES[idle.OS_RUNTIME]).to_numpy(bool)
    claim("lock_wait", os_calls & names.isin(LOCK_WAIT_CALLS).to_numpy(bool))
    claim(idle.RECOMPUTATION_RULE, cause == idle.RECOMPUTATION)
    for finding in idle.CAUSES:
        claim(finding.rule, cause == finding.cause)
    numbers = steps.sort_values("start")["step"].to_numpy("int64") if len(steps) else np.array([-1])
    order = {int(s): i for i, s in enumerate(numbers)}  # a repeated number: its last
    return causes.assign(**{RULE: rules, ROW: [order.get(int(s), 0) for s in causes["step"]]})


def per_step(views: pd.DataFrame, rule: str, clock: StepClock) -> np.ndarray:
    """The idle time per step (ns, in the clock's step order) that the rows of `rule` hold."""
    return idle.per_step(rows_of(views, rule), clock)


def rows_of(views: pd.DataFrame, rule: str) -> pd.DataFrame:
    return views[views[RULE] == rule] if len(views) else views
