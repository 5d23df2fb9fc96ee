"""What fixing a finding could save, as a share of the median step, read off the timeline.

Each model is an upper bound (or, where the trace cannot bound it, an estimate whose basis says
so) taken from when the GPUs ran and when the CPU waited for them, never from how long the symptom
took on the CPU: a CPU that waits 150 ms for a busy GPU costs the GPU nothing.

Two quantities carry the models:
- GPU idle: no device runs a kernel or a memory operation (the union over devices);
- the CPU's wait for the GPU: time in calls that return only once GPU work has finished
  (cuda.host_wait_calls: synchronization, synchronous copies, and the calls of a thread that waits for the work
  it issues) and in launches held up by a full launch queue. A step cannot get shorter
  than the CPU's own work, so work taken off the GPU shortens it by at most this wait.
Amounts are summed per step range; a gain is their median over the steps divided by the median
step. A capture without step ranges counts as one step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sftprof.analysis import cuda, gpu, kernels
from sftprof.analysis.spilled import SpilledUnion
from sftprof.trace.events import EventStore, sql_in

# A kernel launch that takes longer than this waited for a free slot in the full launch queue (a
# launch costs the CPU 5-30 µs, up to ~120 µs under tracing; the queue holds ~1,000 launches).
LAUNCH_QUEUE_WAIT_NS = 200_000
# Gaps up to this long are the host's per-launch overhead (a launch costs the CPU 5-30 µs, Python op dispatch
# tens more); longer ones are work the CPU did instead of feeding the GPU. utilisation.IDLE_GAP_NS's 1 ms.
HOST_GAP_NS = 1_000_000
# Bytes per parameter of one AdamW step on fp32 parameters and moments. Fused (AdamW(fused=True)):
# read param, grad, exp_avg, exp_avg_sq (16), write param and both moments (12), in one pass.
# PyTorch's foreach AdamW: 8 passes: mul_(params) 8, lerp_(exp_avg, grad) 12, mul_(exp_avg_sq) 8,
# addcmul_(exp_avg_sq, grad, grad) 12, sqrt 8, div_ 8, add_(eps) 8, addcdiv_(params, exp_avg, denom) 16.
FUSED_ADAMW_BYTES, FOREACH_ADAMW_BYTES = 28, 80
# PyTorch's multi-tensor kernels: foreach ops (_foreach_*) and the fused optimizers' kernels.
MULTI_TENSOR_KERNEL = re.compile(r"multi_tensor_apply", re.IGNORECASE)
FUSED_OPTIMIZER_KERNEL = re.compile(r"fused", re.IGNORECASE)
# Foreach kernels that are not the optimizer's update: _foreach_norm (gradient clipping).
NOT_OPTIMIZER_UPDATE = re.compile(r"norm", re.IGNORECASE)
# Kernels a fusing compiler (torch.compile's Inductor, XLA) joins into one: pointwise ops and the reductions
# and norms they feed or follow (softmax, layer norm, sums). GEMMs, attention and copies keep their own kernels.
FUSABLE_FAMILIES = ("elementwise", "reduction/norm")
# A fused kernel holds one reduction with the pointwise work around it: each reduction still makes its pass.
REDUCTION_FAMILY = "reduction/norm"


@dataclass(frozen=True)
class StepClock:
    """The windows gains are measured in (the step ranges, or the whole capture as one), when any GPU
    ran (`gpu_busy`, gpu.all_devices_busy) and when a CPU thread waited for one (`cpu_wait`); `host_slack_ns`,
    the host time per step the profiler added (overhead.unprofiled_clock): without it the CPU waits that much
    longer for the GPU."""

    starts: np.ndarray
    ends: np.ndarray
    has_steps: bool
    gpu_busy: SpilledUnion
    cpu_wait: SpilledUnion
    host_slack_ns: float = 0.0

    @classmethod
    def of(cls, steps: pd.DataFrame, span_ns: int, gpu_busy: SpilledUnion, cpu_wait: SpilledUnion) -> StepClock:
        starts, ends = step_windows(steps, span_ns)
        return cls(starts, ends, bool(len(steps)), gpu_busy, cpu_wait)

    @property
    def steps(self) -> int:
        return len(self.starts)

    @property
    def step_ns(self) -> float:
        """The median step (the capture, without steps): what every gain is a share of."""
        return float(np.median(self.ends - self.starts))

    @property
    def has_gpu(self) -> bool:
        return not self.gpu_busy.empty

    def share(self, per_step) -> float:
        """The median over the steps of a per-step amount (ns), as % of the median step."""
        if not self.step_ns:
            return 0.0
        return round(float(np.clip(100.0 * np.median(per_step) / self.step_ns, 0.0, 100.0)), 3)

    def in_few_steps(self, amounts: np.ndarray) -> bool:
        """Whether an amount is one the median step lacks (work every few steps: an evaluation, a checkpoint)."""
        return bool(self.step_ns) and not np.median(amounts) > 0

    def recurring_share(self, per_step) -> float:
        """share, or for an amount that most steps lack, which the median step leaves out, its sum over the steps
        as % of theirs: what removing it saves over the run."""
        amounts = np.asarray(per_step, dtype=float)
        if not self.in_few_steps(amounts):
            return self.share(amounts)
        return round(float(np.clip(100.0 * amounts.sum() / (self.ends - self.starts).sum(), 0.0, 100.0)), 3)

    def recurring_scope(self, per_step) -> str:
        """scope, for a gain taken by recurring_share: the sum over the steps where the median step lacks it."""
        amounts = np.asarray(per_step, dtype=float)
        if not self.in_few_steps(amounts):
            return self.scope(amounts)
        total = float((self.ends - self.starts).sum())
        return (
            f"{amounts.sum() / 1e6:,.3f} ms over the {self.steps} steps (in {int(np.count_nonzero(amounts))} of them) "
            f"/ their {total / 1e6:,.3f} ms"
        )

    def scope(self, per_step) -> str:
        """How a gain was taken, for its basis: "0.958 ms per step (median of 2) / 44.045 ms median step"."""
        amount, whole = f"{np.median(per_step) / 1e6:,.3f} ms", f"{self.step_ns / 1e6:,.3f} ms"
        if not self.has_steps:
            return f"{amount} over the whole capture (no step ranges) / its {whole}"
        return f"{amount} per step (median of {self.steps}) / {whole} median step"

    def by_step(self, times, amounts) -> np.ndarray:
        """Per step, the sum of the amounts whose time falls inside it (the rest belongs to no step)."""
        return sum_by_window(self.starts, self.ends, times, amounts)

    def waited(self) -> np.ndarray:
        """Per step, the time some CPU thread waited for the GPU."""
        return self.cpu_wait.covered_ns(self.starts, self.ends).astype(float)

    def host_busy(self) -> np.ndarray:
        """Per step, the time no CPU thread waited for the GPU: the host's own path through the step."""
        return (self.ends - self.starts) - self.waited()

    def gpu_side(self, saved, host_freed=0.0) -> np.ndarray:
        """Per step, what GPU time saved (per step) can take off the step: at most the CPU's wait (with the
        host time the profiler added, which the run without it waits too), plus the host time the same fix
        frees (`host_freed` per step). The step is the longer of the host's path and the GPU's, so shortening
        the GPU's alone stops paying once the host's is the longer."""
        room = self.waited() + self.host_slack_ns + np.asarray(host_freed, dtype=float)
        return np.minimum(np.asarray(saved, dtype=float), room)

    def idle_in(self, starts, ends) -> np.ndarray:
        """GPU idle inside each window [starts[i], ends[i])."""
        starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
        return (ends - starts) - self.gpu_busy.covered_ns(starts, ends)


def step_windows(steps: pd.DataFrame, span_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """The windows gains are measured in, as start and end arrays: the step ranges in time order, or
    the whole capture as one."""
    if len(steps):
        ordered = steps.sort_values("start")
        return ordered["start"].to_numpy("int64"), ordered["end"].to_numpy("int64")
    return np.array([0], "int64"), np.array([max(int(span_ns), 0)], "int64")


def sum_by_window(starts: np.ndarray, ends: np.ndarray, times, amounts) -> np.ndarray:
    """Per window (step_windows), the sum of the amounts whose time falls inside it."""
    times = np.asarray(times, dtype="int64")
    amounts = np.asarray(amounts, dtype=float)
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times < ends[np.maximum(index, 0)])
    return np.bincount(index[inside], weights=amounts[inside], minlength=len(starts)).astype(float)


def cpu_waits(events: EventStore, waits: cuda.WaitCalls) -> SpilledUnion:
    """When a CPU thread waited for the GPU: the union of the host-waiting calls (`waits`:
    cuda.host_wait_calls, with the synchronous issuers' calls) and the launches longer than LAUNCH_QUEUE_WAIT_NS."""
    launches = sql_in("a.name_id", cuda.launch_ids(events))
    return cuda.calls_union(events, f"{waits.where()} OR ({launches} AND a.duration > {LAUNCH_QUEUE_WAIT_NS})")


# A device-to-host copy this small reads values for the host (.item(), a handful of statistics), not data.
READ_BYTES = 1024
READ_COLUMNS = ["start", "kernels", "ns", "producer"]


def read_work(events: EventStore) -> pd.DataFrame:
    """The GPU work done only for values the host reads: per small device-to-host copy (READ_BYTES or less) that
    follows a reduction on its stream (the kernel that made the value), that reduction and the elementwise
    kernels right before it (a conversion, an abs, an isnan: what the value was computed from), memsets aside;
    one row per such read, when it began (`start`), its `kernels`, their time (`ns`) and the reduction's short
    name (`producer`: what was counted or summed for the host). Not reading the value
    removes this work as well as the synchronization. Only kernels within HOST_GAP_NS before the read are
    looked at, so a capture that reads after every kernel joins a few kernels per read."""
    names = _names(events)
    if not len(names):
        return _no_reads()
    ids = lambda family: [int(i) for i in names.loc[names["family"] == family, "name_id"]]  # noqa: E731
    reduction = f"coalesce({sql_in('name_id', ids(REDUCTION_FAMILY))}, false)"
    elementwise = f"coalesce({sql_in('name_id', ids('elementwise'))}, false)"
    stream = (
        f"coalesce(device_id::BIGINT, {NULL_LAST}) AS device_id, coalesce(stream_id::BIGINT, {NULL_LAST}) AS stream_id"
    )
    # each read joins the ops of its stream in its HOST_GAP_NS bucket of time and the one before (an equality join:
    # one on the stream alone compares every read with every op of its stream)
    rows = events.query(
        f"""WITH reads AS (SELECT row_number() OVER (ORDER BY start) AS read, {stream}, start,
                                  start // {HOST_GAP_NS} AS bucket FROM memops
                           WHERE copy_kind = 'DtoH' AND bytes <= {READ_BYTES}),
                 near AS (SELECT *, bucket AS near FROM reads UNION ALL SELECT *, bucket - 1 FROM reads),
                 ops AS (SELECT {stream}, start, duration, {reduction} AS reduction, {elementwise} AS elementwise,
                                name_id FROM kernels
                         UNION ALL SELECT {stream}, start, duration, false, false, NULL FROM memops
                         WHERE copy_kind <> 'memset')
            SELECT r.read, r.start AS read_start, o.duration, o.reduction, o.elementwise, o.name_id
              FROM near r JOIN ops o
              ON o.device_id = r.device_id AND o.stream_id = r.stream_id AND o.start // {HOST_GAP_NS} = r.near
                 AND o.start < r.start AND o.start >= r.start - {HOST_GAP_NS}
            ORDER BY r.read, o.start DESC"""
    )
    if rows.empty:
        return _no_reads()
    read = rows["read"].to_numpy("int64")
    first = np.r_[True, read[1:] != read[:-1]]  # the op right before each read: its producer where a reduction
    heads = np.flatnonzero(first)
    produced = np.repeat(rows["reduction"].to_numpy(bool)[heads], np.diff(np.r_[heads, len(read)]))
    # each op after the producer stays in the chain while every op between them is elementwise
    breaks = pd.Series((~rows["elementwise"].to_numpy(bool) & ~first).astype("int64")).groupby(read).cumsum()
    chained = produced & (first | (breaks.to_numpy() == 0))
    work = (
        rows[chained]
        .groupby("read")
        .agg(
            start=("read_start", "first"),
            kernels=("duration", "size"),
            ns=("duration", "sum"),
            producer=("name_id", "first"),
        )
        .reset_index(drop=True)
    )
    work = work.astype({"start": "int64", "kernels": "int64", "ns": "int64"})
    return work.assign(producer=work["producer"].map(short_names(events)).fillna("").astype(str))[READ_COLUMNS]


# CUB's device-wide kernels, whose result a small read right after fetches: the size of an output that depends on the
# data (torch.nonzero's count, and so x[mask], masked_select and one-argument torch.where; unique; repeat_interleave
# without output_size).
DATA_DEPENDENT_READ = re.compile(r"Device(?:Reduce|Select|Scan|RadixSort|Segmented)|nonzero", re.IGNORECASE)


def size_reads_per_step(reads: pd.DataFrame | None, clock: StepClock) -> float:
    """How many of read_work's reads a step fetch a data-dependent size (their producer is one of CUB's
    device-wide kernels, DATA_DEPENDENT_READ): the median over the clock's steps; 0 without steps or reads."""
    if reads is None or not len(reads) or not clock.has_steps:
        return 0.0
    sized = reads[reads["producer"].astype(str).str.contains(DATA_DEPENDENT_READ)]
    return float(np.median(clock.by_step(sized["start"], np.ones(len(sized))))) if len(sized) else 0.0


def data_sized_gemms_per_step(events: EventStore, clock: StepClock) -> float:
    """How many GEMM launches a step take their size from the data: a shape (kernel and grid) launched once in its
    step and missing from another step. A model's own GEMMs repeat their shapes every step (and every layer of a
    step); a loop over groups of the data whose sizes vary (a Mixture of Experts' experts run one by one) launches
    a GEMM for each group whose rows set its grid. The median over the clock's steps; 0 with fewer than two."""
    names = _names(events)
    gemms = names.loc[names["family"] == kernels.GEMM_FAMILY, "name_id"] if len(names) else []
    if clock.steps < 2 or not clock.has_steps or not len(gemms):
        return 0.0
    windows = pd.DataFrame({"step": np.arange(clock.steps), "lo": clock.starts, "hi": clock.ends})
    counts = events.query(
        f"""WITH launched AS (SELECT w.step, k.name_id, k.grid_x, k.grid_y, k.grid_z, count(*) AS n
                              FROM kernels k JOIN windows w ON k.start >= w.lo AND k.start < w.hi
                              WHERE {sql_in("k.name_id", [int(i) for i in gemms])}
                              GROUP BY ALL),
                 shaped AS (SELECT *, count(*) OVER (PARTITION BY name_id, grid_x, grid_y, grid_z) AS in_steps
                            FROM launched)
            SELECT step, sum(n) AS n FROM shaped WHERE n = 1 AND in_steps < {clock.steps} GROUP BY step""",
        windows=windows,
    )
    per_step = np.zeros(clock.steps)
    per_step[counts["step"].to_numpy("int64")] = counts["n"].to_numpy(float)
    return float(np.median(per_step))


def _no_reads() -> pd.DataFrame:
    return pd.DataFrame({"start": [], "kernels": [], "ns": [], "producer": []}).astype(
        {"start": "int64", "kernels": "int64", "ns": "int64", "producer": str}
    )


def short_names(events: EventStore) -> dict[int, str]:
    """Each kernel name id's short name, else its demangled name: how evidence names a kernel."""
    names = events.used_names("kernels").drop_duplicates("name_id")
    return dict(zip(names["name_id"], names["short_name"].fillna(names["name"]), strict=True))


def _names(events: EventStore) -> pd.DataFrame:
    """Every kernel name id with its names and family (kernels.KERNEL_FAMILIES): a few dozen rows."""
    names = events.used_names("kernels")
    names = names.loc[names["name_id"] >= 0, ["name_id", "name", "short_name"]].drop_duplicates(ignore_index=True)
    return names.assign(family=kernels.kernel_families(names)) if len(names) else names.assign(family=[])


NULL_LAST = 2**62  # NULL device or stream ids sort after every other, as in SQL's ORDER BY


@dataclass
class ChainTotals:
    """Runs of two or more fusable kernels back to back on a stream, summed: how many (and how many with the
    device's next kernel queued behind them), their kernels, their time, their time fused, and per step window
    (`starts`, `ends`: step_windows) the time fusing each queued run would save, the launches fusing every run
    would remove, every kernel launched, each run counted in the window it starts in, and the host's launch
    path (launch_path). Fused, a run keeps one kernel per reduction or norm in it (each still makes its pass
    over its input, with the pointwise work around it) and takes as long as those, or as its longest kernel."""

    starts: np.ndarray
    ends: np.ndarray
    runs: int = 0
    queued_runs: int = 0
    kernels: int = 0
    total_ns: int = 0
    fused_ns: int = 0
    saved_by_step: np.ndarray = field(init=False)
    removed_by_step: np.ndarray = field(init=False)
    kernels_by_step: np.ndarray = field(init=False)
    launch_path_by_step: np.ndarray = field(init=False)

    def __post_init__(self):
        self.saved_by_step = np.zeros(len(self.starts))
        self.removed_by_step = np.zeros(len(self.starts))
        self.kernels_by_step = np.zeros(len(self.starts))
        self.launch_path_by_step = np.zeros(len(self.starts))

    def launched(self, starts: np.ndarray) -> None:
        """Count kernels starting at `starts`, fusable or not, in their step windows."""
        self.kernels_by_step += sum_by_window(self.starts, self.ends, starts, np.ones(len(starts)))

    def removed_share(self, removed_by_step: np.ndarray | None = None) -> np.ndarray:
        """Per step, the share of its kernel launches that a fix removes: `removed_by_step` launches, by default
        those fusing the runs removes (a run that goes on into the next step counts in the one it starts in, so
        at most all of them)."""
        removed = self.removed_by_step if removed_by_step is None else np.asarray(removed_by_step, dtype=float)
        share = np.divide(removed, self.kernels_by_step, out=np.zeros(len(self.starts)), where=self.kernels_by_step > 0)
        return np.minimum(share, 1.0)

    def host_freed(self, clock: StepClock, removed_by_step: np.ndarray | None = None) -> np.ndarray:
        """Per step, the host time a fix that removes kernel launches frees: the host's launch path (launch_path)
        in the share of launches removed, at most the host's own time. One model for every fix that launches
        fewer kernels (fusion, fused attention): checked against torch.compile on two loops (docs/DIAGNOSIS.md)."""
        return np.minimum(self.launch_path_by_step, clock.host_busy()) * self.removed_share(removed_by_step)

    def add(self, runs: np.ndarray, queued: np.ndarray) -> None:
        """Fold in finished runs (_Runs' rows, a column each), and whether the device's next kernel was queued
        behind each (queued_after): only there does a shorter run end the GPU's work sooner; before idle the GPU
        waited for the host, and it would wait longer."""
        start, kernels, total = runs[START], runs[KERNELS], runs[TOTAL]
        fused = np.maximum(runs[LONGEST], runs[REDUCED])  # the longest kernel, or the reductions' own passes
        self.runs += len(start)
        self.queued_runs += int(queued.sum())
        self.kernels += int(kernels.sum())
        self.total_ns += int(total.sum())
        self.fused_ns += int(fused.sum())
        self.saved_by_step += sum_by_window(self.starts, self.ends, start, np.where(queued, total - fused, 0))
        self.removed_by_step += sum_by_window(self.starts, self.ends, start, kernels - np.maximum(runs[REDUCTIONS], 1))


# A device starts a kernel already queued behind another within a few microseconds of its end: between kernels on
# seven GPU-bound H100 and H200 captures (tests/fixtures: foreign clean, eager_attention and fp32; h200_sft_clean
# and h200_sft_padding; the elementwise and GEMM plants) the gaps are 1.0-4.6 us from the 10th to the 90th
# percentile. A longer gap is the GPU waiting for the host to launch.
QUEUED_GAP_NS = 5_000
# _Runs' rows of a run, one column each
START, KERNELS, TOTAL, LONGEST, DEVICE, STREAM, FIRST_END, LAST_END, QUEUED, UNDECIDED, REDUCED, REDUCTIONS = range(12)
RUN_ROWS = 12


def queued_after(ends: np.ndarray, next_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each run ending at `ends`: whether the device started another kernel (`next_starts`, sorted: a
    window's) within QUEUED_GAP_NS of it, and whether that is still undecided (no kernel of the window starts
    at or after its end)."""
    at = np.searchsorted(next_starts, ends, side="left")
    undecided = at >= len(next_starts)
    following = next_starts[np.minimum(at, len(next_starts) - 1)] if len(next_starts) else ends
    return ~undecided & (following - ends <= QUEUED_GAP_NS), undecided


# Kernels put in stream order at a time: a window holds them about six times over (columns, orders, runs).
# Half the busy pass's: the trainer at 40M kernels peaked at 1.18 GB with 1M, beside the step accounting.
CHAIN_WINDOW_ROWS = 1 << 19


def launch_path(events: EventStore, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per window, the host time spent on the way to kernel launches: each launch call with the stretch since
    its thread's previous launch ended, where that is at most HOST_GAP_NS (the op's dispatch and launch; a
    longer stretch is the host's own work, which fewer kernels would not shorten)."""
    launches = sql_in("a.name_id", cuda.launch_ids(events))
    path = np.zeros(len(starts))
    for batch in events.batches(f"""SELECT start, cost FROM (
                                        SELECT a.start, a."end" - lag(a."end") OVER (PARTITION BY a.global_tid
                                                                                     ORDER BY a.start) AS cost
                                        FROM cuda_api a WHERE {launches})
                                    WHERE cost BETWEEN 0 AND {HOST_GAP_NS} ORDER BY start"""):
        path += sum_by_window(starts, ends, batch["start"], batch["cost"])
    return path


KERNEL_GRID = ["grid_x", "grid_y", "grid_z"]
# From this many zero-fills of one size between two GEMMs, with at least one add fewer and no more adds than fills, a
# tensor is used a slice at a time: each slice's backward writes a zero-filled gradient as large as the tensor, and
# autograd adds them. A tensor used twice (a tied embedding) gets one add and no fill.
SLICED_FILLS = 3
# More such bursts of one shape a step than this, and they are a layer's own (rotary embeddings fill and add their
# halves' gradients in every attention: 24 bursts a step of 3-4 fills in the GPT-NeoX and the Falcon).
SLICED_BURSTS = 2


@dataclass
class SlicedGradients:
    """Kernel shapes (`shapes`: grid_x, grid_y, grid_z, with the median `fills` and `adds` a step) that a step
    zero-fills SLICED_FILLS times or more between two GEMMs, and adds at most as often (one tensor's slices summed),
    in at most SLICED_BURSTS such stretches: the gradients of a tensor used a slice at a time. `saved_by_step`: per
    step window (step_windows), the time of those fills and adds; `fill_ids` and `add_ids`: the kernel names that
    fill and add (kernels.FILL, kernels.ADD)."""

    shapes: pd.DataFrame
    saved_by_step: np.ndarray
    fill_ids: list[int]
    add_ids: list[int]

    def chained_sql(self) -> str:
        """SQL true for a kernel of these fills and adds (over the kernels table's columns): fusion leaves them."""
        if self.shapes.empty:
            return "false"
        grids = " OR ".join(
            f"(grid_x = {int(r.grid_x)} AND grid_y = {int(r.grid_y)} AND grid_z = {int(r.grid_z)})"
            for r in self.shapes.itertuples()
        )
        return f"(coalesce({sql_in('name_id', self.fill_ids + self.add_ids)}, false) AND ({grids}))"


def sliced_gradients(events: EventStore, steps: pd.DataFrame, span_ns: int) -> SlicedGradients:
    """The zero-fills and adds of one size that a step repeats between two GEMMs (SlicedGradients): a Python loop
    that reads a tensor a slice at a time (a loss a sample or a chunk at a time) gives each slice, in the backward, a
    gradient as large as the tensor, zero-filled, and autograd adds them one by one, with no GEMM between. A layer
    whose backward fills and adds a gradient or two (rotary embeddings' halves) repeats that once a layer, with the
    layer's GEMMs between: not counted. Only with two steps or more."""
    starts, ends = step_windows(steps, span_ns)
    names = _names(events)
    ids = lambda pattern: [int(i) for i in names.loc[names["name"].str.contains(pattern), "name_id"]]  # noqa: E731
    fill_ids, add_ids = (ids(kernels.FILL), ids(kernels.ADD)) if len(names) else ([], [])
    gemm_ids = [int(i) for i in names.loc[names["family"] == kernels.GEMM_FAMILY, "name_id"]] if len(names) else []
    none = SlicedGradients(pd.DataFrame(columns=[*KERNEL_GRID, "fills", "adds"]), np.zeros(len(starts)), [], [])
    if len(steps) < 2 or not fill_ids or not add_ids:
        return none
    windows = pd.DataFrame({"step": np.arange(len(starts)), "lo": starts, "hi": ends})
    filled, gemm = sql_in("name_id", fill_ids), sql_in("name_id", gemm_ids) if gemm_ids else "false"
    device = f"coalesce(device_id::BIGINT, {NULL_LAST})"
    # each fill or add in the burst of kernels since its device's last GEMM (a running count of GEMMs)
    bursts = events.query(
        f"""WITH k AS (SELECT {device} AS device, start, duration, grid_x, grid_y, grid_z,
                              coalesce({gemm}, false) AS gemm, coalesce({filled}, false) AS fill
                       FROM kernels
                       WHERE {gemm} OR ({sql_in("name_id", fill_ids + add_ids)} AND grid_x IS NOT NULL)),
                 b AS (SELECT *, sum(gemm::INT) OVER (PARTITION BY device ORDER BY start
                                                      ROWS UNBOUNDED PRECEDING) AS burst FROM k)
            SELECT w.step, device, burst, grid_x, grid_y, grid_z, sum(fill::INT) AS fills,
                   sum((NOT fill)::INT) AS adds, sum(duration) AS ns
            FROM b JOIN windows w ON b.start >= w.lo AND b.start < w.hi
            WHERE NOT gemm GROUP BY ALL""",
        windows=windows,
    )
    chained = (bursts["fills"] >= SLICED_FILLS) & bursts["adds"].between(SLICED_FILLS - 1, bursts["fills"])
    kept = bursts[chained]
    # a shape whose bursts recur in every layer is the layers' own code (each attention's rotary halves)
    per_layer = kept.groupby([*KERNEL_GRID, "step"]).size().groupby(KERNEL_GRID).median() > SLICED_BURSTS
    kept = kept.merge(per_layer[~per_layer].reset_index()[KERNEL_GRID], on=KERNEL_GRID)
    if kept.empty:
        return none
    per_step = kept.groupby(["step", *KERNEL_GRID])[["fills", "adds"]].sum().unstack("step", fill_value=0)
    shapes = pd.DataFrame(
        {
            kind: per_step[kind].reindex(columns=range(len(starts)), fill_value=0).median(axis=1)
            for kind in ("fills", "adds")
        }
    ).reset_index()
    saved = np.bincount(kept["step"].to_numpy("int64"), weights=kept["ns"].to_numpy(float), minlength=len(starts))
    return SlicedGradients(shapes, saved, fill_ids, add_ids)


def fusable_chains(
    events: EventStore, steps: pd.DataFrame, span_ns: int, sliced: SlicedGradients | None = None
) -> ChainTotals:
    """Runs of two or more fusable kernels (FUSABLE_FAMILIES) one after another on a stream (no other kernel
    between them there), summed as they are found (ChainTotals), per step of `steps` (or the capture).

    Each device's kernels are fetched a window of start times at a time (gpu.device_windows), put in
    stream order in numpy, and cut into runs; a run still open at a window's end on its stream is
    carried into the next window. Memory holds one window and the runs open at its end (a window
    function, or one sorted fetch of every kernel, cost several times as much at ten million
    kernels; keeping every run took +0.96 GB at 40M). The fills and adds of `sliced` (sliced_gradients) are not
    fusable: their fix removes them."""
    totals = ChainTotals(*step_windows(steps, span_ns))
    names = _names(events)
    fusable = names.loc[names["family"].isin(FUSABLE_FAMILIES), "name_id"] if len(names) else []
    if not len(fusable):
        return totals
    reductions = names.loc[names["family"] == REDUCTION_FAMILY, "name_id"]
    source = f"""(SELECT coalesce(device_id::BIGINT, {NULL_LAST}) AS device_id, start, "end", duration,
                         coalesce(stream_id::BIGINT, {NULL_LAST}) AS stream,
                         coalesce({sql_in("name_id", [int(i) for i in fusable])}, false)
                             AND NOT {sliced.chained_sql() if sliced is not None else "false"} AS chained,
                         coalesce({sql_in("name_id", [int(i) for i in reductions])}, false) AS reduction
                  FROM kernels)"""
    totals.launch_path_by_step = launch_path(events, totals.starts, totals.ends)
    runs = _Runs(totals)
    for device, _, _, windows in gpu.device_windows(events, source, CHAIN_WINDOW_ROWS):
        for lo, hi in windows:
            rows = events.arrays(f"""SELECT start, "end", duration, stream, chained, reduction FROM {source}
                                     WHERE device_id = {int(device)} AND start >= {lo} AND start < {hi}""")
            runs.add(int(device), rows)
    return runs.result()


class _Runs:
    """Runs of fusable kernels per stream, fed windows of one device's kernels in start order; those of
    2 or more kernels are summed into `totals` as they end. A run's rows (START ... REDUCTIONS): start,
    kernels, total, longest, device, stream, first kernel's end, last kernel's end, whether the device's next
    kernel was queued behind it and whether that is still undecided (queued_after), and its reductions' time
    and count."""

    def __init__(self, totals: ChainTotals):
        self.totals = totals
        self.open: dict[tuple[int, int], np.ndarray] = {}  # (device, stream) -> the run that reached the window's end
        self.undecided: dict[int, np.ndarray] = {}  # device -> ended runs after which no window started anything yet

    def _finish(self, device: int, ended: np.ndarray) -> None:
        """Sum the ended runs (2 or more kernels) whose next kernel is known; keep the others for the device's
        next window."""
        ended = ended[:, ended[KERNELS] > 1]
        waiting = ended[UNDECIDED].astype(bool)
        self.totals.add(ended[:, ~waiting], ended[QUEUED, ~waiting].astype(bool))
        if waiting.any():
            held = self.undecided.pop(device, np.zeros((RUN_ROWS, 0), dtype="int64"))
            self.undecided[device] = np.concatenate([held, ended[:, waiting]], axis=1)

    def add(self, device: int, rows: dict[str, np.ndarray]) -> None:
        # stream order: by stream, then start, then end (ties in start are rare: two passes cost little)
        order = np.argsort(rows["end"], kind="stable")
        order = order[np.argsort(rows["start"][order], kind="stable")]
        order = order[np.argsort(rows["stream"][order], kind="stable")]
        start, end, duration = rows["start"][order], rows["end"][order], rows["duration"][order]
        stream, chained = rows["stream"][order], rows["chained"][order].astype(bool)
        reduction = rows["reduction"][order].astype(bool)
        if not len(start):
            return
        self.totals.launched(start)
        next_kernels = np.sort(rows["start"])  # what the device started after a run: queued work, or idle
        # runs of earlier windows still waiting to learn what came after them
        for key, run in self.open.items():
            if key[0] == device and run[UNDECIDED]:
                run[QUEUED], run[UNDECIDED] = (
                    int(x[0]) for x in queued_after(run[LAST_END : LAST_END + 1], next_kernels)
                )
        if device in self.undecided:
            held = self.undecided.pop(device)
            held[QUEUED], held[UNDECIDED] = queued_after(held[LAST_END], next_kernels)
            self._finish(device, held)
        new_stream = np.r_[True, stream[1:] != stream[:-1]]
        at = np.flatnonzero(chained)
        run = np.cumsum(~chained | new_stream)[at]  # a run ends at another kernel or another stream
        first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]]) if len(at) else at
        last = np.r_[first[1:] - 1, len(at) - 1] if len(at) else at
        first_at, last_at = at[first], at[last]
        durations, reduced = duration[at], np.where(reduction[at], duration[at], 0)
        found = (
            np.stack(
                [
                    start[first_at],
                    np.diff(np.r_[first, len(at)]),
                    np.add.reduceat(durations, first),
                    np.maximum.reduceat(durations, first),
                    np.full(len(first), device),
                    stream[first_at],
                    end[first_at],
                    end[last_at],
                    *queued_after(end[last_at], next_kernels),
                    np.add.reduceat(reduced, first),
                    np.add.reduceat(reduction[at].astype("int64"), first),
                ]
            )
            if len(at)
            else np.zeros((RUN_ROWS, 0), dtype="int64")
        )
        keep = np.ones(found.shape[1], dtype=bool)
        # a stream's first run may continue the one open at the last window's end; its last may go on
        stream_first = np.flatnonzero(new_stream)
        stream_last = np.r_[stream_first[1:] - 1, len(start) - 1]
        for s, a, b in zip(stream[stream_first], stream_first, stream_last, strict=True):
            key = (device, int(s))
            carried = self.open.pop(key, None)
            ra, rb = np.searchsorted(first_at, a, side="left"), np.searchsorted(first_at, b, side="right")
            if carried is not None:
                if ra < rb and first_at[ra] == a:
                    found[START, ra], found[FIRST_END, ra] = carried[START], carried[FIRST_END]
                    for row in (KERNELS, TOTAL, REDUCED, REDUCTIONS):
                        found[row, ra] += carried[row]
                    found[LONGEST, ra] = max(found[LONGEST, ra], carried[LONGEST])
                else:
                    self._finish(device, carried[:, None])
            if ra < rb and last_at[rb - 1] == b:
                self.open[key] = found[:, rb - 1].copy()
                keep[rb - 1] = False
        self._finish(device, found[:, keep])

    def result(self) -> ChainTotals:
        # the runs still open or undecided: no kernel of their device started after them
        for ended in [run[:, None] for run in self.open.values()] + list(self.undecided.values()):
            ended = ended[:, ended[KERNELS] > 1]
            self.totals.add(ended, ended[QUEUED].astype(bool) & ~ended[UNDECIDED].astype(bool))
        self.undecided = {}
        self.open = {}
        return self.totals


def foreach_optimizer_kernels(events: EventStore) -> pd.DataFrame:
    """The optimizer's foreach (multi-tensor, not fused) update kernels: start, duration. None where
    a fused optimizer ran: its few foreach kernels are bookkeeping (step counters), not the update."""
    names = _names(events)
    if names.empty:
        return pd.DataFrame(columns=["start", "duration"], dtype="int64")
    full = names["name"].fillna(names["short_name"]).astype(str)
    multi_tensor = full.str.contains(MULTI_TENSOR_KERNEL) & (names["family"] == "optimizer")
    fused = multi_tensor & full.str.contains(FUSED_OPTIMIZER_KERNEL)
    foreach = names.loc[multi_tensor & ~fused & ~full.str.contains(NOT_OPTIMIZER_UPDATE), "name_id"]
    ids = [] if fused.any() else [int(i) for i in foreach]
    return events.query(f"""SELECT start, duration FROM kernels WHERE name_id IN ({", ".join(map(str, ids or [-1]))})
                            ORDER BY start""")


def step_clock(
    steps: pd.DataFrame, span_ns: int, busy: dict[int, gpu.DeviceBusy], events: EventStore, waits: cuda.WaitCalls
) -> StepClock:
    """The clock every gain is measured by: the steps, when any GPU was busy and when the CPU waited for one."""
    return StepClock.of(steps, span_ns, gpu.all_devices_busy(busy), cpu_waits(events, waits))
