"""Across ranks: which rank holds the others back, by how much, where its extra time goes, and how much
of the job's step is communication that nothing overlaps.

Pure: each profiled rank's saved tables in (its analysis folder: `steps`, `step_waits`, `collectives`,
`step_accounting`), cross-rank tables and findings out (docs/RANKS.md).

Alignment. Ranks are lined up by step number (the trainer's `step N` ranges); only steps every rank
captured are compared. Nodes' clocks are not trusted, so durations are compared, never start times,
except where every capture was made on one host and knows its clock origin (`origin_ns`): then the
step table also says how late each rank entered each step.

Waiting. In synchronous data parallelism every rank leaves a collective when the last one has joined,
so the step takes as long on every rank and a slow rank's extra time shows on the fast ranks as
waiting: on the training thread's synchronization calls (step_waits: gloo, MPI, c10d work waits;
waits inside `data` ranges are the rank's own input pipeline and are not counted) and in NCCL kernel
time (collectives). A rank's *waiting* in a step is its wait beyond the least any rank waited there
(per phase for the OS waits, per step for NCCL time with no compute kernel beside it): the rank that
arrived last waited for the transfer only. NCCL time with compute beside it is not waiting (the rank
was working), and where NCCL runs, one wait shows both on the GPU and as the host's wait for it, so the
larger of the two counts, not their sum. Its *own* time is its step time less that waiting: the time it
would take if no rank had to wait for another.

The straggler model (STRAGGLER_*). A rank is slow when its own time exceeds the median of the other
ranks' by STRAGGLER_MIN_PCT of the median step or more, in STRAGGLER_STEPS_SHARE of the common steps. The job
moves at the pace of its slowest rank, so if that rank were as fast as the median of the others, each
step would shrink to the next-slowest rank's own time: the gain is the median over the steps of
max(0, own(rank) - max own(other ranks)), as a share of the job's median step (the slowest rank's
step time, per step). Where several ranks are slow, fixing one of them alone gains little, so one
more finding names them together, with the gain of making all of them as fast as the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sftprof.analysis import collectives
from sftprof.analysis.cpu import PHASES
from sftprof.analysis.findings import Finding, ms, ranked, severity_of
from sftprof.errors import SftprofError

# A rank whose own time exceeds the median of the others' by this share of the median step (median
# over the steps) is a straggler. Below it, two ranks of a clean run differ by scheduling noise: on
# the 2-core test machine, clean 2-rank CPU runs differed by up to ~3% (tests/fixtures/ranks).
STRAGGLER_MIN_PCT = 5.0
# ... in at least this share of the common steps: a straggler is slow step after step, while noise makes
# a different rank the slow one from step to step.
STRAGGLER_STEPS_SHARE = 0.75
# ... and only over at least this many common steps: one step says nothing about step after step.
STRAGGLER_MIN_STEPS = 2
# A straggler's extra time is named as a slow GPU (or its clock) when at least this share of it is
# more GPU kernel time than the other ranks'; otherwise as host (CPU) time.
GPU_SHARE_OF_EXCESS = 0.5
OWN_PHASES = (*PHASES, collectives.OTHER_PHASE)  # the step's phases, `other`: outside every phase range
WAITING_PHASES = tuple(p for p in OWN_PHASES if p != "data")  # waits counted as waiting for other ranks
REQUIRED_TABLES = ("steps", "step_waits")
# NCCL's bus-bandwidth factors (nccl-tests doc/PERFORMANCE.md): busbw = algbw x factor(n ranks).
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
BYTES_PER_GRADIENT = {"float32": 4, "bfloat16": 2, "float16": 2}
CAUSES = {
    "data": (
        "data/IO",
        "Look at this rank's input pipeline and its node's storage: more DataLoader workers and "
        "prefetch, pinned batches, the dataset on node-local disk or in the page cache, tokenization done "
        "ahead of training; compare the node's read throughput with the others'.",
    ),
    "gpu": (
        "a slow GPU, thermal throttling or a lower clock",
        "Check the node's GPUs: `nvidia-smi -q -d "
        "CLOCK,PERFORMANCE,TEMPERATURE` (clocks and throttle reasons), DCGM diagnostics, ECC errors and the "
        "PCIe link; keep the node out of the job if it stays slow.",
    ),
    "cpu": (
        "CPU contention or a slower CPU",
        "Look at what else runs on the node's cores (capture with "
        "--cpuctxsw=process-tree), the task's CPU binding (srun --cpu-bind, cpus_per_task), threads per rank "
        "(OMP_NUM_THREADS, torch.set_num_threads) and CPU frequency scaling.",
    ),
}


class RanksError(SftprofError, ValueError):
    """Ranks that cannot be compared: too few, the same rank twice, or no step in common."""


@dataclass(frozen=True)
class RankInput:
    """One profiled rank: its record's facts and its saved analysis tables (name -> frame).
    `run`: the trainer's run facts (metrics' `run`), for message sizes; `origin_ns`: the capture's
    time 0 on the host's clock (ns since the epoch), where known."""

    rank: int
    node: int
    host: str
    world_size: int
    tables: dict
    run: dict = field(default_factory=dict)
    origin_ns: int | None = None
    sources: tuple[str, ...] | None = None  # what the capture traced (osrt, cuda, ...), where known
    job_id: str | None = None  # the Slurm job the rank ran in (its record's slurm_job_id), None outside Slurm
    span_ns: int | None = None  # the capture's span: no step is longer

    @property
    def label(self) -> str:
        return f"rank {self.rank} (node {self.node}, host {self.host})"


@dataclass
class CrossRank:
    """The cross-rank analysis: tables by name, findings (ranked), headline, and the ranks compared."""

    ranks: list[dict]
    tables: dict[str, pd.DataFrame]
    findings: list[Finding]
    headline: dict


def _number(values) -> pd.Series:
    return pd.to_numeric(values, errors="coerce")


def _plausible(rank: RankInput) -> pd.Series:
    """Which of a rank's step ranges can be steps: longer than zero, and no longer than its capture."""
    duration = _number(rank.tables["steps"]["duration"])
    return (duration > 0) & (duration <= rank.span_ns if rank.span_ns else True)


def _steps(rank: RankInput) -> pd.DataFrame:
    """step -> duration and phase times of one rank (the first range of a step number that repeats; none that
    is not plausible)."""
    steps = rank.tables["steps"]
    if steps.empty or "step" not in steps:
        return pd.DataFrame(columns=["duration", *(f"{p}_ns" for p in OWN_PHASES)])
    steps = steps[_plausible(rank)]
    frame = steps.assign(step=_number(steps["step"])).dropna(subset=["step"])
    frame = frame.drop_duplicates("step")
    frame = frame.set_index(frame["step"].astype("int64").rename("step"))
    return frame[["duration", *(f"{p}_ns" for p in OWN_PHASES)]].apply(_number).fillna(0).astype("int64")


def _waits(rank: RankInput) -> pd.DataFrame:
    """step x phase -> the training thread's synchronization waits (ns)."""
    waits = rank.tables["step_waits"]
    if waits.empty:
        return pd.DataFrame(dtype="int64")
    frame = waits.assign(step=_number(waits["step"]).astype("Int64"), wait_ns=_number(waits["wait_ns"]))
    return frame.pivot_table(index="step", columns="phase", values="wait_ns", aggfunc="sum", fill_value=0)


def _comm(rank: RankInput) -> pd.DataFrame:
    """step x kind -> NCCL busy, exposed and blocking time, on the device with the most in the step."""
    columns = ["busy_ns", "exposed_ns", "blocking_ns"]
    table = rank.tables.get("collectives", pd.DataFrame())
    if table.empty:
        return pd.DataFrame(columns=["step", "kind", *columns])
    table = table.assign(step=_number(table["step"])).dropna(subset=["step"])
    table = table.assign(step=table["step"].astype("int64"))
    return table.groupby(["step", "kind"], as_index=False)[columns].max()


def _kernel_ns(rank: RankInput) -> pd.Series:
    """step -> GPU kernel time launched in the step (step_accounting), empty without a GPU."""
    table = rank.tables.get("step_accounting", pd.DataFrame())
    if table.empty or "kernel_ns" not in table:
        return pd.Series(dtype="float64")
    frame = table.assign(step=_number(table["step"])).dropna(subset=["step"]).drop_duplicates("step")
    return pd.Series(_number(frame["kernel_ns"]).to_numpy(), index=frame["step"].astype("int64"))


def _by_value(values: dict[int, object]) -> str:
    """`4101 (ranks 0, 2), 4102 (rank 1)`: each value with the ranks that have it."""
    groups: dict[object, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(value, []).append(rank)
    parts = []
    for value, ranks in groups.items():
        shown = ", ".join(map(str, ranks[:6])) + (", ..." if len(ranks) > 6 else "")
        parts.append(f"{'none' if value is None else value} (rank{'s' if len(ranks) > 1 else ''} {shown})")
    return ", ".join(parts)


def mixed_runs(inputs: list[RankInput]) -> list[str]:
    """What says that the ranks are not of one run: different Slurm job ids or world sizes (each record's rank
    is below its world size, and each rank is given once: read_record and _check see to that)."""
    problems = []
    if len({r.job_id for r in inputs}) > 1:
        problems.append(f"Slurm job ids {_by_value({r.rank: r.job_id for r in inputs})}")
    if len({r.world_size for r in inputs}) > 1:
        problems.append(f"world sizes {_by_value({r.rank: r.world_size for r in inputs})}")
    return problems


def refuse_mixed(inputs: list[RankInput]) -> None:
    """A RanksError where the ranks are not of one run (mixed_runs)."""
    problems = mixed_runs(inputs)
    if problems:
        raise RanksError(
            f"the ranks are not of one run ({'; '.join(problems)}): give the captures of one job, or --allow-mixed "
            "to compare them anyway"
        )


def _check(inputs: list[RankInput], allow_mixed: bool = False) -> list[int]:
    """The common step numbers, or a RanksError that says why there are none or why the ranks are not of one run
    (unless `allow_mixed`)."""
    if len(inputs) < 2:
        raise RanksError(f"a cross-rank analysis needs at least 2 profiled ranks; got {len(inputs)}")
    seen: dict[int, int] = {}
    for rank in inputs:
        seen[rank.rank] = seen.get(rank.rank, 0) + 1
        missing = [name for name in REQUIRED_TABLES if name not in rank.tables]
        if missing:
            raise RanksError(
                f"{rank.label}: its analysis has no {', '.join(missing)} table (made by an older "
                "sftprof?); analyse its capture again"
            )
    twice = sorted(r for r, count in seen.items() if count > 1)
    if twice:
        raise RanksError(f"rank(s) {twice} appear more than once; give each rank's capture once")
    if not allow_mixed:
        refuse_mixed(inputs)
    per_rank = {rank.rank: set(_steps(rank).index) for rank in inputs}
    common = set.intersection(*per_rank.values())
    if not common:

        def span(steps):
            return f"steps {min(steps)}-{max(steps)}" if steps else "no step ranges"

        ranges = "; ".join(f"rank {r}: {span(s)}" for r, s in sorted(per_rank.items()))
        raise RanksError(
            f"the ranks share no step number ({ranges}): were they captured in the same window of the same job?"
        )
    return sorted(common)


def _of_others(frame: pd.DataFrame, reduce=np.median) -> pd.DataFrame:
    """For each cell of a steps x ranks frame: `reduce` (median, max) of the other ranks' values in that step."""
    values = frame.to_numpy(dtype=float)
    out = np.empty_like(values)
    for j in range(values.shape[1]):
        out[:, j] = reduce(np.delete(values, j, axis=1), axis=1)
    return pd.DataFrame(out, index=frame.index, columns=frame.columns)


def _share(per_step, step_ns: float) -> float:
    return round(float(np.clip(100.0 * np.median(per_step) / step_ns, 0.0, 100.0)), 3) if step_ns else 0.0


def analyze_ranks(inputs: list[RankInput], allow_mixed: bool = False) -> CrossRank:
    """Every cross-rank table and finding (see the module docstring and docs/RANKS.md). Ranks of different runs
    are refused, or with `allow_mixed` compared under a finding that says so."""
    common = _check(inputs, allow_mixed)
    inputs = sorted(inputs, key=lambda r: r.rank)
    ids = [r.rank for r in inputs]
    by_rank = {r.rank: r for r in inputs}
    steps = {r.rank: _steps(r).reindex(common) for r in inputs}
    duration = pd.DataFrame({r: steps[r]["duration"] for r in ids})
    phase_ns = {p: pd.DataFrame({r: steps[r][f"{p}_ns"] for r in ids}) for p in OWN_PHASES}

    # waiting for other ranks: OS waits beyond the least any rank waited (per step and phase) ...
    waits = {r: _waits(by_rank[r]).reindex(index=common, columns=list(OWN_PHASES), fill_value=0) for r in ids}
    wait_ns = {p: pd.DataFrame({r: waits[r][p] for r in ids}).astype(float) for p in OWN_PHASES}
    waiting = {
        p: wait_ns[p].sub(wait_ns[p].min(axis=1), axis=0) if p in WAITING_PHASES else wait_ns[p] * 0 for p in OWN_PHASES
    }
    # ... and NCCL time with no compute beside it (exposed) beyond the least any rank had (per step)
    comm = {r: _comm(by_rank[r]) for r in ids}
    has_nccl = any(not c.empty for c in comm.values())

    def comm_frame(kind: str, column: str) -> pd.DataFrame:
        return (
            pd.DataFrame({r: comm[r][comm[r]["kind"] == kind].set_index("step")[column].reindex(common) for r in ids})
            .fillna(0)
            .astype(float)
        )

    comm_busy = comm_frame(collectives.ALL, "busy_ns")
    comm_exposed = comm_frame(collectives.ALL, "exposed_ns")
    comm_blocking = comm_frame(collectives.ALL, "blocking_ns")
    comm_waiting = comm_exposed.sub(comm_exposed.min(axis=1), axis=0)
    # One wait for a slower rank shows twice where NCCL runs: the GPU sits in the collective, and the host then
    # waits for the GPU (a synchronizing call, the autograd thread in backward). The larger of the two counts.
    total_waiting = np.maximum(sum(waiting[p] for p in WAITING_PHASES), comm_waiting)
    own = duration - total_waiting
    own_phase = {p: phase_ns[p] - waiting[p] for p in OWN_PHASES}
    excess = own - _of_others(own)
    job_step = duration.max(axis=1)
    step_ns = float(job_step.median())
    kernel = pd.DataFrame({r: _kernel_ns(by_rank[r]).reindex(common) for r in ids})

    tables = {
        "rank_steps": _rank_steps(
            inputs, common, duration, phase_ns, wait_ns, total_waiting, comm_busy, comm_exposed, own, excess
        ),
        "step_skew": _step_skew(inputs, common, duration, own),
        "rank_phases": _rank_phases(inputs, phase_ns, wait_ns, waiting, own_phase, comm_busy, comm_waiting, has_nccl),
        "rank_collectives": _rank_collectives(inputs, common, comm, has_nccl),
    }
    # per rank: the share of the steps where its own time exceeds the others' median by the threshold
    slow_steps = (excess >= STRAGGLER_MIN_PCT / 100.0 * step_ns).mean()
    enough = len(common) >= STRAGGLER_MIN_STEPS
    slow = [r for r in ids if enough and step_ns and slow_steps[r] >= STRAGGLER_STEPS_SHARE]
    findings = _stragglers(inputs, slow, own, own_phase, excess, kernel, step_ns)
    findings += _exposed(comm_exposed, comm_blocking, tables["rank_collectives"], step_ns, has_nccl)
    findings += _unmeasured(inputs, comm)
    findings += _mixed(inputs)
    findings += _untrusted_steps(inputs, common)
    findings = ranked(findings)
    gains = {f.title: f.gain_pct for f in findings if f.rule == "straggler"}
    top = max(slow, key=lambda r: float(excess[r].median()), default=None)
    headline = {
        "ranks": len(inputs),
        "nodes": len({r.node for r in inputs}),
        "hosts": len({r.host for r in inputs}),
        "common_steps": len(common),
        "median_step_ms": step_ns / 1e6,
        "median_skew_ms": float((duration.max(axis=1) - duration.median(axis=1)).median()) / 1e6,
        "median_own_skew_ms": float((own.max(axis=1) - own.median(axis=1)).median()) / 1e6,
        "straggler_rank": top,
        "straggler_node": next((r.node for r in inputs if r.rank == top), None),
        "straggler_gain_pct": next((g for t, g in gains.items() if t.startswith(f"Rank {top} ")), None),
        "exposed_comm_pct": next((f.gain_pct for f in findings if f.rule == "exposed_communication"), None),
        "warnings": sorted({f.rule for f in findings if f.severity == "warning"}),
    }
    ranks = [{"rank": r.rank, "node": r.node, "host": r.host, "world_size": r.world_size} for r in inputs]
    return CrossRank(ranks=ranks, tables=tables, findings=findings, headline=headline)


# ---------------------------------------------------------------- tables


def _rank_steps(inputs, common, duration, phase_ns, wait_ns, waiting, comm_busy, comm_exposed, own, excess):
    """One row per common step and rank: step time, phase times, waits, own time and excess."""
    origins = [r.origin_ns for r in inputs]
    aligned = len({r.host for r in inputs}) == 1 and all(o is not None for o in origins)
    rows = []
    for r in inputs:
        frame = pd.DataFrame(
            {"step": common, "rank": r.rank, "node": r.node, "host": r.host, "duration_ns": duration[r.rank].to_numpy()}
        )
        for p in OWN_PHASES:
            frame[f"{p}_ns"] = phase_ns[p][r.rank].to_numpy()
        frame["sync_wait_ns"] = sum(wait_ns[p][r.rank] for p in WAITING_PHASES).to_numpy()
        frame["nccl_ns"] = comm_busy[r.rank].to_numpy()
        frame["nccl_exposed_ns"] = comm_exposed[r.rank].to_numpy()
        frame["waiting_ns"] = waiting[r.rank].to_numpy()
        frame["own_ns"] = own[r.rank].to_numpy()
        frame["excess_ns"] = excess[r.rank].to_numpy()
        if aligned:
            start = _steps_start(r).reindex(common).to_numpy(dtype=float) + r.origin_ns
            frame["start_abs_ns"] = start
        rows.append(frame)
    table = pd.concat(rows, ignore_index=True)
    if aligned:
        earliest = table.groupby("step")["start_abs_ns"].transform("min")
        table["late_ns"] = table["start_abs_ns"] - earliest
        table = table.drop(columns="start_abs_ns")
    return table.sort_values(["step", "rank"]).reset_index(drop=True)


def _steps_start(rank: RankInput) -> pd.Series:
    steps = rank.tables["steps"]
    frame = steps.assign(step=_number(steps["step"])).dropna(subset=["step"]).drop_duplicates("step")
    return pd.Series(_number(frame["start"]).to_numpy(), index=frame["step"].astype("int64"))


def _step_skew(inputs, common, duration, own) -> pd.DataFrame:
    """Per common step: each rank's step time, the median, max and skew (max - median), the slowest rank
    and its node; and the same for own time (step time less waiting for others)."""
    node = {r.rank: r.node for r in inputs}
    table = pd.DataFrame({"step": common})
    table["median_ns"] = duration.median(axis=1).to_numpy()
    table["max_ns"] = duration.max(axis=1).to_numpy()
    table["skew_ns"] = table["max_ns"] - table["median_ns"]
    slowest = duration.idxmax(axis=1).to_numpy()
    table["slowest_rank"] = slowest
    table["slowest_node"] = [node[r] for r in slowest]
    table["own_skew_ns"] = (own.max(axis=1) - own.median(axis=1)).to_numpy()
    straggling = own.idxmax(axis=1).to_numpy()
    table["straggling_rank"] = straggling
    table["straggling_node"] = [node[r] for r in straggling]
    for r in duration.columns:
        table[f"rank{r}_ns"] = duration[r].to_numpy()
    return table


def _rank_phases(inputs, phase_ns, wait_ns, waiting, own_phase, comm_busy, comm_waiting, has_nccl) -> pd.DataFrame:
    """Per rank and phase, medians over the common steps: time, synchronization waits, waiting for other
    ranks, own time, and own time beyond the median of the other ranks' (a `collectives` row: NCCL time)."""
    rows = []
    excess = {p: own_phase[p] - _of_others(own_phase[p]) for p in OWN_PHASES}
    comm_excess = comm_busy - _of_others(comm_busy)
    for r in inputs:
        for p in OWN_PHASES:
            rows.append(
                {
                    "rank": r.rank,
                    "node": r.node,
                    "host": r.host,
                    "phase": p,
                    "time_ns": float(phase_ns[p][r.rank].median()),
                    "sync_wait_ns": float(wait_ns[p][r.rank].median()),
                    "waiting_ns": float(waiting[p][r.rank].median()),
                    "own_ns": float(own_phase[p][r.rank].median()),
                    "excess_ns": float(excess[p][r.rank].median()),
                }
            )
        if has_nccl:
            rows.append(
                {
                    "rank": r.rank,
                    "node": r.node,
                    "host": r.host,
                    "phase": "collectives (NCCL)",
                    "time_ns": float(comm_busy[r.rank].median()),
                    "sync_wait_ns": float("nan"),
                    "waiting_ns": float(comm_waiting[r.rank].median()),
                    "own_ns": float((comm_busy[r.rank] - comm_waiting[r.rank]).median()),
                    "excess_ns": float(comm_excess[r.rank].median()),
                }
            )
    return pd.DataFrame(rows)


def gradient_bytes(run: dict) -> int | None:
    """The bytes a DDP step all-reduces: every parameter's gradient, in the weights' dtype (the built-in
    trainer keeps float32 weights, so gradients too); None where the run facts do not say."""
    parameters, dtype = run.get("parameters"), run.get("weight_dtype")
    if not isinstance(parameters, int) or dtype not in BYTES_PER_GRADIENT:
        return None
    return parameters * BYTES_PER_GRADIENT[dtype]


def bus_bandwidth_gbps(kind: str, message_bytes: float, seconds: float, ranks: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in GB/s of one collective, as nccl-tests computes them:
    algbw = bytes / time, busbw = algbw x the kind's factor (BUS_FACTORS) for `ranks` ranks."""
    algbw = message_bytes / seconds / 1e9
    return algbw, algbw * BUS_FACTORS[kind](ranks)


def _rank_collectives(inputs, common, comm, has_nccl) -> pd.DataFrame:
    """Per common step and collective kind: busy time on the fastest, median and slowest rank, exposed
    time, and where the message size is known (all-reduce of a DDP run: its gradients) the bandwidth
    from the fastest rank's time (the rank that arrived last waited for the transfer only)."""
    columns = [
        "step",
        "kind",
        "ranks",
        "busy_min_ns",
        "busy_median_ns",
        "busy_max_ns",
        "exposed_min_ns",
        "exposed_max_ns",
        "bytes",
        "algbw_gbps",
        "busbw_gbps",
        "bytes_basis",
    ]
    if not has_nccl:
        return pd.DataFrame(columns=columns)
    ids = [r.rank for r in inputs]
    worlds = {r.world_size for r in inputs}
    world = worlds.pop() if len(worlds) == 1 else 0  # the factor needs the run's one world size
    sizes = {gradient_bytes(r.run) for r in inputs}
    message = sizes.pop() if len(sizes) == 1 else None
    rows = []
    for kind in (collectives.ALL, *collectives.KINDS):
        busy = pd.DataFrame(
            {r: comm[r][comm[r]["kind"] == kind].set_index("step")["busy_ns"].reindex(common) for r in ids}
        )
        exposed = pd.DataFrame(
            {r: comm[r][comm[r]["kind"] == kind].set_index("step")["exposed_ns"].reindex(common) for r in ids}
        )
        if busy.isna().all().all():
            continue
        busy, exposed = busy.fillna(0), exposed.fillna(0)
        for step in common:
            row = {
                "step": step,
                "kind": kind,
                "ranks": int((busy.loc[step] > 0).sum()),
                "busy_min_ns": float(busy.loc[step].min()),
                "busy_median_ns": float(busy.loc[step].median()),
                "busy_max_ns": float(busy.loc[step].max()),
                "exposed_min_ns": float(exposed.loc[step].min()),
                "exposed_max_ns": float(exposed.loc[step].max()),
                "bytes": float("nan"),
                "algbw_gbps": float("nan"),
                "busbw_gbps": float("nan"),
                "bytes_basis": "",
            }
            if kind == "all_reduce" and message and row["busy_min_ns"] > 0 and world > 1:
                algbw, busbw = bus_bandwidth_gbps(kind, message, row["busy_min_ns"] / 1e9, world)
                row.update(
                    bytes=float(message),
                    algbw_gbps=algbw,
                    busbw_gbps=busbw,
                    bytes_basis="DDP gradients: run.parameters x bytes of run.weight_dtype",
                )
            rows.append(row)
    return pd.DataFrame(rows, columns=columns)


# ---------------------------------------------------------------- findings


def _slowest_phase(rank: int, own_phase: dict) -> tuple[str, float]:
    """The phase where a rank's own time exceeds the median of the others' most, and by how much."""
    excess = {p: float((own_phase[p] - _of_others(own_phase[p]))[rank].median()) for p in OWN_PHASES}
    phase = max(excess, key=lambda phase: excess[phase])
    return phase, excess[phase]


def _cause(rank: int, phase: str, phase_excess: float, kernel: pd.DataFrame) -> str:
    if phase == "data":
        return "data"
    if kernel.notna().any().any():
        gpu_excess = float((kernel - _of_others(kernel.fillna(0)))[rank].median())
        if gpu_excess >= GPU_SHARE_OF_EXCESS * max(phase_excess, 1.0):
            return "gpu"
    return "cpu"


def _stragglers(inputs, slow, own, own_phase, excess, kernel, step_ns) -> list[Finding]:
    by_rank = {r.rank: r for r in inputs}
    others_max = _of_others(own, np.max)
    findings = []
    for r in slow:
        rank = by_rank[r]
        saving = (own[r] - others_max[r]).clip(lower=0)
        gain = _share(saving, step_ns)
        phase, phase_excess = _slowest_phase(r, own_phase)
        cause, advice = CAUSES[_cause(r, phase, phase_excess, kernel)]
        waiters = [q for q in own.columns if q != r]
        waited = {q: float((own[r] - own[q]).clip(lower=0).median()) for q in waiters}
        findings.append(
            Finding(
                rule="straggler",
                severity=severity_of(gain),
                title=(
                    f"Rank {r} (node {rank.node}, host {rank.host}) holds the other ranks back: its {phase} phase "
                    f"takes {ms(phase_excess, 1)} more per step than theirs ({cause})"
                ),
                evidence=(
                    f"Over {len(own)} common steps, rank {r}'s own time (step time less waiting for other ranks) "
                    f"is {ms(float(own[r].median()), 1)} per step against a median of "
                    f"{ms(float(own.drop(columns=r).median(axis=1).median()), 1)} for the others; the extra "
                    f"{ms(float(excess[r].median()), 1)} is mostly in its {phase} phase "
                    f"(+{ms(phase_excess, 1)}). The other ranks wait for it in their collectives: "
                    + ", ".join(f"rank {q} {ms(v, 1)}" for q, v in waited.items())
                    + " per step (median)."
                ),
                recommendation=f"Rank {r} on node {rank.node} ({rank.host}), cause {cause}: {advice}",
                gain_pct=gain,
                gain_basis=(
                    f"median over {len(own)} steps of rank {r}'s own time beyond the next-slowest rank's "
                    f"({ms(float(saving.median()))}) / {ms(step_ns)} median job step"
                ),
            )
        )
    if len(slow) > 1:
        rest = [q for q in own.columns if q not in slow]
        saving = (own[slow].max(axis=1) - (own[rest].max(axis=1) if rest else own[slow].min(axis=1))).clip(lower=0)
        gain = _share(saving, step_ns)
        findings.append(
            Finding(
                rule="stragglers",
                severity=severity_of(gain),
                title=f"Ranks {', '.join(map(str, slow))} are all slower than the rest of the job",
                evidence=(
                    f"Each has an own time at least {STRAGGLER_MIN_PCT:.0f}% of the median step above the median of "
                    f"the other ranks in {100 * STRAGGLER_STEPS_SHARE:.0f}% of the steps or more; fixing one alone "
                    "gains only down to the next slow one."
                ),
                recommendation="Look for what these ranks share (a node, a switch, a storage path) first.",
                gain_pct=gain,
                gain_basis=(
                    f"median over {len(own)} steps of the slowest of them beyond the slowest other rank "
                    f"({ms(float(saving.median()))}) / {ms(step_ns)} median job step"
                ),
            )
        )
    return findings


def _unmeasured(inputs, comm) -> list[Finding]:
    """Ranks whose waiting cannot be seen: no OS-runtime trace and no NCCL kernels. Their waits count as their
    own time, so a fast rank waiting for a slow one looks as slow as it."""
    blind = [r.rank for r in inputs if r.sources is not None and "osrt" not in r.sources and comm[r.rank].empty]
    if not blind:
        return []
    return [
        Finding(
            rule="waiting_not_measured",
            severity="info",
            title=f"Waiting for other ranks cannot be measured on rank(s) {', '.join(map(str, blind))}",
            evidence=(
                "Their captures traced no OS-runtime calls (osrt) and hold no NCCL kernels, so their waits in "
                "collectives count as their own time: a straggler among them cannot be told from the ranks "
                "that wait for it."
            ),
            recommendation="Capture with --trace including osrt (and cuda on GPUs): profile.trace in the config.",
        )
    ]


def _untrusted_steps(inputs, common) -> list[Finding]:
    """Step ranges left out as implausible, and too few common steps to name a straggler."""
    findings = []
    left_out = {r.rank: int((~_plausible(r)).sum()) for r in inputs if "duration" in r.tables["steps"]}
    left_out = {r: n for r, n in left_out.items() if n}
    if left_out:
        findings.append(
            Finding(
                rule="implausible_steps",
                severity="info",
                title="Step ranges left out as implausible: "
                + ", ".join(f"rank {r} {n}" for r, n in sorted(left_out.items())),
                evidence="A step of zero length, or longer than its rank's whole capture, cannot be a training "
                "step; the ranks are compared over the others.",
                recommendation="Check the step ranges the training loop pushes (a range closed at once, or a "
                "clock that jumped).",
            )
        )
    if len(common) < STRAGGLER_MIN_STEPS:
        findings.append(
            Finding(
                rule="too_few_steps",
                severity="info",
                title=f"The ranks share {len(common)} step(s): no straggler is named on fewer than "
                f"{STRAGGLER_MIN_STEPS}",
                evidence="A straggler is a rank that is slower step after step; one step cannot tell that from noise.",
                recommendation="Capture a window of more steps (profile.windows in the config).",
            )
        )
    return findings


def _mixed(inputs) -> list[Finding]:
    """Ranks of different runs, compared because the user asked to (--allow-mixed)."""
    problems = mixed_runs(inputs)
    if not problems:
        return []
    return [
        Finding(
            rule="mixed_runs",
            severity="warning",
            title=f"The ranks compared are not of one run: {'; '.join(problems)}",
            evidence=(
                "Compared anyway, as asked (--allow-mixed): a step number need not be the same work in two runs, "
                "ranks of different jobs do not wait for each other, and no bus bandwidth is derived where the "
                "world sizes differ."
            ),
            recommendation="Compare the ranks of one job: its capture folder, or one folder per node of it.",
        )
    ]


def _exposed(comm_exposed, comm_blocking, rank_collectives, step_ns, has_nccl) -> list[Finding]:
    """Communication every rank's compute waits for (the least any rank had in a step: collectives.py's
    blocking time), which overlapping could hide; waiting beyond it belongs to the straggler."""
    if not has_nccl or not step_ns:
        return []
    shared = comm_blocking.min(axis=1)
    gain = _share(shared, step_ns)
    bandwidth = rank_collectives.dropna(subset=["busbw_gbps"])
    bus = (
        f" All-reduce bus bandwidth {bandwidth['busbw_gbps'].median():.1f} GB/s (median over steps, from the "
        "gradient size and the fastest rank's all-reduce time)."
        if len(bandwidth)
        else ""
    )
    per_kind = rank_collectives[rank_collectives["kind"] != collectives.ALL].groupby("kind")["busy_median_ns"].median()
    kinds = "; ".join(f"{kind} {ms(v, 2)}" for kind, v in per_kind.sort_values(ascending=False).items())
    return [
        Finding(
            rule="exposed_communication",
            severity=severity_of(gain),
            title=f"Compute waits for collectives for {gain:.1f}% of the median job step on every rank",
            evidence=(
                f"Per step (median), NCCL kernels run {kinds or 'no time'} on the median rank; with no compute "
                f"kernel beside them: {ms(float(comm_exposed.min(axis=1).median()), 2)} on the least exposed rank, "
                f"{ms(float(comm_exposed.max(axis=1).median()), 2)} on the most (the difference is waiting for a "
                f"straggler); of that, with the next compute kernel already launched and waiting: "
                f"{ms(float(shared.median()), 2)} on the least blocked rank (the rest ran while the host had "
                f"not launched more work, and cost the step nothing).{bus}"
            ),
            recommendation=(
                "Overlap communication with compute (DDP gradient bucketing, bucket_cap_mb; FSDP "
                "forward/backward prefetch); if the transfer itself is slow, measure the fabric with "
                "nccl-tests (bus bandwidth against the link's) and check NCCL_DEBUG=INFO for the transport "
                "and algorithm NCCL chose."
            ),
            gain_pct=gain,
            gain_basis=(
                f"median over steps of the least blocked rank's blocking collective time / {ms(step_ns)} median job step"
            ),
        )
    ]
