"""Forward work run again in the backward pass: activation checkpointing's recomputation, found by its order.

Checkpointing saves memory by dropping a segment's activations in the forward pass and running that segment's
forward again when the backward pass reaches it. PyTorch runs the backward pass on the autograd engine's own
thread, so the recomputation is the forward's kernels launched again from another thread. It is found by
order, not by names that tell forward from backward: a run of RUN kernels in a row (the same kernels in the
same order) that the thread which launched the step's first kernel (in its process) launched, launched again in
the same step from another thread of that process. Backward kernels differ from the forward's: on every
committed capture without checkpointing the longest such run is 4 kernels (NeMo's rotary embedding), while a
checkpointed layer's forward repeats whole, dozens of kernels.

Removing the recomputation saves what the GPU spent on the repeated kernels and the idle time while the CPU
prepared and launched them and then handed back to the backward pass (the thread's stretches of recomputation:
idle.idle_causes gives that idle the cause `recomputation`, so no other finding counts it), less the profiler's
added time that fell there.

The same runs count forward passes. A layer's forward repeats its runs once per layer in each pass: runs the step's
first forward (the first thread's kernels before the backward thread's first) repeats several times. The stretches
of the first thread's kernels such runs cover, over the step, are the forward passes (_layer_stretches); the first
forward may hold two (a frozen teacher's before the student's). A pass after which the backward thread launches
nothing before the next pass (or the step's end) has no backward: an evaluation, a teacher's or a reference model's
forward, work the step repeats (`extra_forward`). Gradient accumulation's micro-batches each have their backward.
Dropout's kernels (TRAIN_ONLY) are left out of the passes' runs: an evaluation in eval mode launches none, and
its layers then repeat the trained forward's runs.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from sftprof.analysis import gains, idle, views
from sftprof.analysis.findings import Finding, ms, severity_of
from sftprof.analysis.gains import ChainTotals, StepClock, short_names
from sftprof.analysis.kernels import GEMM_FAMILY
from sftprof.analysis.nvtx import launch_slices
from sftprof.analysis.overhead import Overhead, host_share
from sftprof.trace.events import EventStore

RUN = 12  # kernels in a row that must repeat the forward's: clean backward passes repeat runs of up to 4 (NeMo's)
NAMES_LISTED = 3
# Kernels a model runs in train mode only (dropout's mask and scale), by name: eval mode launches none.
TRAIN_ONLY = re.compile(r"dropout|bernoulli", re.IGNORECASE)
GEMM_KEY = 2**63  # the one key of every GEMM kernel in the passes' runs (name ids are far smaller)
LAYER_RUNS = 3  # a run the step's first forward repeats this often is a layer's: a head repeats twice at most
COLUMNS = ["step_row", "kernels", "repeated", "gpu_ns"]
PASS_COLUMNS = ["step_row", "forward", "followed", "extra_kernels", "extra_ns"]
NAME_COLUMNS = ["kernel", "gpu_ns"]
HOST_COLUMNS = ["tid", "start", "end", "handed_back"]


class Recomputed(NamedTuple):
    """recomputed's result: per step and per kernel name; the start times of the repeated kernels (sorted), by
    which idle_causes knows the idle that ends in one; and the host's stretches of recomputation (`tid`,
    `start`, `end`: from the end of the thread's launch before a run of repeated kernels to the end of the run's
    last launch), which delayed every launch after them as an allocation or a sync does (idle._Pieces.delayed_by),
    and `handed_back`: the start of the thread's launch after the run, until which its idle is recomputation's
    (_host_stretches)."""

    by_step: pd.DataFrame
    by_name: pd.DataFrame
    starts: np.ndarray
    host: pd.DataFrame
    passes: pd.DataFrame  # per step: forward passes, those a backward follows, and the others' kernels and GPU time


def _runs(shape: np.ndarray) -> np.ndarray:
    """A key for each run of RUN kernels starting at each position (len(shape) - RUN + 1 of them)."""
    key = np.zeros(len(shape) - RUN + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for offset in range(RUN):
            key = key * np.uint64(1_000_003) + shape[offset : offset + len(key)]
    return key


def _processes(tids: np.ndarray):
    """The positions of each process's kernels among one step's (`tids`: global thread ids, pid << 24): ranks
    captured in one report each launch their own forward and backward."""
    process = (tids >> 24) & 0xFFFFFF
    for pid in np.unique(process):
        yield np.flatnonzero(process == pid)


# How _passes' counts combine over a step's processes (each counted alone), and over parts of one step: the passes
# are each process's own, the extra passes' kernels and time add up.
PASS_TOTALS = {"forward": "max", "followed": "max", "extra_kernels": "sum", "extra_ns": "sum"}


def _repeated(tids: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Which kernels of one step (launch order) belong to a run of RUN that the first thread of their process
    to launch in the step launched too, on another thread of that process. Per process: ranks captured in one
    report each launch the same forward, which is not recomputation."""
    repeated = np.zeros(len(shape), dtype=bool)
    for own in _processes(tids):
        repeated[own] = _repeated_in_process(tids[own], shape[own])
    return repeated


def _repeated_in_process(tids: np.ndarray, shape: np.ndarray) -> np.ndarray:
    repeated = np.zeros(len(shape), dtype=bool)
    first = tids[0]
    mine = np.flatnonzero(tids == first)
    if len(mine) < RUN:
        return repeated
    forward = np.unique(_runs(shape[mine]))
    for tid in np.unique(tids[tids != first]):
        theirs = np.flatnonzero(tids == tid)
        if len(theirs) < RUN:
            continue
        hit = np.isin(_runs(shape[theirs]), forward)
        covered = np.zeros(len(theirs) + 1, dtype=np.int64)  # each hit covers its RUN kernels
        np.add.at(covered, np.flatnonzero(hit), 1)
        np.add.at(covered, np.flatnonzero(hit) + RUN, -1)
        repeated[theirs[np.cumsum(covered)[:-1] > 0]] = True
    return repeated


def _layer_stretches(keys: np.ndarray, first_forward: int) -> list[tuple[int, int]]:
    """The forward passes among the first thread's kernels (`keys`: _runs over them), as [start, stop) stretches of
    its kernels: kernels covered by a run that the step's first forward (its first `first_forward` kernels) repeats
    at least LAYER_RUNS times, a layer's; a kernel no such run covers (a pass's head and loss, the next one's
    embedding) ends a pass, and one in which no run repeats LAYER_RUNS times is none (a mask built of repeated
    kernels before the first layer, a piece of one layer). A frozen model's layers count too where its kernels are
    not the trained model's (eval mode has no dropout kernels): each model's own runs repeat once a layer."""
    values, counts = np.unique(keys[: max(first_forward - RUN + 1, 0)], return_counts=True)
    hit = np.flatnonzero(np.isin(keys, values[counts >= LAYER_RUNS]))
    covered = np.zeros(len(keys) + RUN, dtype=np.int64)  # each hit covers its RUN kernels
    np.add.at(covered, hit, 1)
    np.add.at(covered, hit + RUN, -1)
    inside = np.concatenate(([0], (np.cumsum(covered)[: len(keys) + RUN - 1] > 0).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(inside))
    stretches = zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True)
    return [(start, stop) for start, stop in stretches if _layers_repeat(keys[start : stop - RUN + 1])]


def _layers_repeat(keys: np.ndarray) -> bool:
    """Whether a stretch holds layers: some run in it LAYER_RUNS times or more. A stretch that holds each run once
    is part of one layer, cut where its kernels vary from layer to layer (a Mixture-of-Experts layer's GEMMs,
    sized by the tokens each expert got), not a pass."""
    return len(keys) > 0 and int(np.unique(keys, return_counts=True)[1].max()) >= LAYER_RUNS


def _passes(tids: np.ndarray, shape: np.ndarray, took: np.ndarray, train_only: np.ndarray) -> tuple[int, int, int, int]:
    """One step's forward passes in one process, how many of them the backward thread's work follows, and the
    kernels and GPU time (`took`) of the others (module docstring). A pass without a backward spans the first
    thread's kernels from the same offset before its first layer run as the step's first forward up to the next
    pass's; the step's last pass, its share of the first forward's kernels (by layer runs). Kernels only a model in
    train mode runs (`train_only`: dropout's) are left out, so that a pass in eval mode repeats the training
    forward's layer runs. (0, 0, 0, 0) where there is no second thread or no run repeats in the first forward."""
    first = tids[0]
    mine = np.flatnonzero((tids == first) & ~train_only)
    others = tids[tids != first]
    if len(mine) < 2 * RUN or len(others) < 2 * RUN:
        return 0, 0, 0, 0
    theirs = np.flatnonzero(tids == pd.Series(others).value_counts().index[0])  # the backward thread's kernels
    forward_len = int(np.searchsorted(mine, theirs[0]))  # the first thread's kernels before the backward's first
    if forward_len < 2 * RUN:
        return 0, 0, 0, 0
    passes = _layer_stretches(_runs(shape[mine]), forward_len)
    in_first = sum(stop - start for start, stop in passes if start < forward_len)  # the first forward's layers
    if not in_first:
        return 0, 0, 0, 0
    offset = passes[0][0]  # the first forward's kernels before its first layer
    followed = kernels = ns = 0
    for (start, stop), after in zip(passes, [*(p[0] for p in passes[1:]), None], strict=True):
        until = len(tids) if after is None else mine[after]
        if np.searchsorted(theirs, until) - np.searchsorted(theirs, mine[stop - 1]) >= RUN:  # a backward follows
            followed += 1
            continue
        begins = max(start - offset, 0)
        ends = begins + forward_len * (stop - start) // in_first if after is None else after - offset
        span = mine[begins:ends]
        kernels += len(span)
        ns += int(took[span].sum())
    return len(passes), followed, kernels, ns


def _host_stretches(tids, launched, returned, repeated) -> pd.DataFrame:
    """Per launching thread, each run of consecutive repeated kernels (launch order) as the host's stretch of
    recomputation: from the end of the thread's launch before it (the run's first launch's start, for a thread's
    first) to the end of the run's last launch, and on to the start of its launch after it (`handed_back`; the
    end, for a thread's last). That last part is the checkpoint handing back to the backward pass (a nested
    backward call, or the saved-tensor hook returning), which a backward without checkpointing does not do;
    it counts as idle, not as a delay, as a wait the thread made there keeps its own cause."""
    parts = []
    for tid in np.unique(tids[repeated]):
        own = np.flatnonzero(tids == tid)
        edges = np.diff(np.concatenate(([0], repeated[own].astype(np.int8), [0])))
        firsts, lasts = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
        begin = np.where(firsts > 0, returned[own[np.maximum(firsts - 1, 0)]], launched[own[firsts]])
        end = returned[own[lasts]]
        handed_back = np.where(lasts + 1 < len(own), launched[own[np.minimum(lasts + 1, len(own) - 1)]], end)
        parts.append(pd.DataFrame({"tid": tid, "start": begin, "end": end, "handed_back": handed_back}))
    return pd.concat(parts, ignore_index=True).astype("int64")


def _in_steps(part: dict[str, np.ndarray], clock: StepClock) -> dict[str, np.ndarray]:
    """A slice of launched kernels (nvtx.launch_slices) cut to those launched inside a step window, with the
    window's row."""
    row = np.searchsorted(clock.starts, part["launch_start"], "right") - 1
    inside = (part["launch_tid"] >= 0) & (row >= 0)
    inside &= part["launch_start"] < clock.ends[np.maximum(row, 0)]
    return {
        "row": row[inside],
        "launched": part["launch_start"][inside],
        "returned": part["launch_end"][inside],
        "tid": part["launch_tid"][inside],
        "start": part["start"][inside],
        "end": part["start"][inside] + part["duration"][inside],
        "name_id": part["name_id"][inside],
    }


def _joined(held: dict[str, np.ndarray] | None, more: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The kernels held from earlier slices and a new slice's, in (row, launch) order."""
    both = more if held is None else {column: np.concatenate((held[column], more[column])) for column in more}
    order = np.lexsort((both["launched"], both["row"]))
    return {column: values[order] for column, values in both.items()}


def recomputed(events: EventStore, clock: StepClock) -> Recomputed:
    """Per step window (row of the clock's windows): its kernels, how many repeat the forward's from another
    thread (module docstring) and their GPU time; the repeated kernels' time by kernel name; and their start
    times. Kernels come with their launches a slice at a time (nvtx.launch_slices); a step's kernels are held
    until a later slice starts another step."""
    empty = Recomputed(
        pd.DataFrame(columns=COLUMNS),
        pd.DataFrame(columns=NAME_COLUMNS),
        np.zeros(0, "int64"),
        pd.DataFrame(columns=HOST_COLUMNS, dtype="int64"),
        pd.DataFrame(columns=PASS_COLUMNS, dtype="int64"),
    )
    if not clock.has_gpu or not clock.has_steps:
        return empty
    rows: list[tuple[int, int, int, int]] = []
    passes: list[tuple[int, int, int, int, int]] = []
    names: list[pd.DataFrame] = []
    starts: list[np.ndarray] = []
    host: list[pd.DataFrame] = []

    known = gains._names(events)  # each name id with its names and family
    dropout_ids = known["name_id"][known["name"].fillna(known["short_name"]).astype(str).str.contains(TRAIN_ONLY)]
    dropout_ids = dropout_ids.to_numpy("int64")
    gemm_ids = known.loc[known["family"] == GEMM_FAMILY, "name_id"].to_numpy("int64")

    def count(kernels: dict[str, np.ndarray]) -> None:
        bounds = np.flatnonzero(np.diff(kernels["row"])) + 1
        for part in np.split(np.arange(len(kernels["row"])), bounds):
            if not len(part):
                continue
            row, tids, start = int(kernels["row"][part[0]]), kernels["tid"][part], kernels["start"][part]
            durations = kernels["end"][part] - start
            shape = kernels["name_id"][part].astype(np.uint64)
            repeated = _repeated(tids, shape)
            took = durations[repeated]
            rows.append((row, len(part), int(repeated.sum()), int(took.sum())))
            train_only = np.isin(kernels["name_id"][part], dropout_ids)
            # passes read every GEMM as one kernel: cuBLAS picks a GEMM's kernel by its shape, which varies from
            # layer to layer where tokens are routed (a Mixture of Experts' per-expert GEMMs)
            layer_shape = np.where(np.isin(shape, gemm_ids), np.uint64(GEMM_KEY), shape)
            passes.extend(
                (row, *_passes(tids[own], layer_shape[own], durations[own], train_only[own]))
                for own in _processes(tids)
            )
            if repeated.any():
                names.append(pd.DataFrame({"name_id": kernels["name_id"][part][repeated], "gpu_ns": took}))
                starts.append(start[repeated])
                host.append(_host_stretches(tids, kernels["launched"][part], kernels["returned"][part], repeated))

    held = None
    for part in launch_slices(events):
        held = _joined(held, _in_steps(part, clock))
        if not len(held["row"]):
            continue
        done = held["row"] < held["row"][-1]  # the last step may go on in the next slice
        count({column: values[done] for column, values in held.items()})
        held = {column: values[~done] for column, values in held.items()}
    if held is not None and len(held["row"]):
        count(held)
    by_step = pd.DataFrame(rows, columns=COLUMNS).groupby("step_row", as_index=False).sum()
    # one row a step: its processes, and its parts where its kernels came in two slices (processes' correlation ids
    # overlap), as by_step sums them
    by_pass = pd.DataFrame(passes, columns=PASS_COLUMNS).groupby("step_row", as_index=False).agg(PASS_TOTALS)
    if not names:
        return empty._replace(by_step=by_step, passes=by_pass)
    label = short_names(events)
    by_name = pd.concat(names).groupby("name_id", as_index=False)["gpu_ns"].sum()
    by_name["kernel"] = [str(label.get(i) or f"kernel {i}") for i in by_name["name_id"]]
    by_name = by_name.sort_values("gpu_ns", ascending=False)[NAME_COLUMNS].reset_index(drop=True)
    return Recomputed(by_step, by_name, np.sort(np.concatenate(starts)).astype("int64"), pd.concat(host), by_pass)


def recompute_finding(
    recomputed: Recomputed, clock: StepClock, idle_views: pd.DataFrame, overhead: Overhead | None = None
) -> list[Finding]:
    """Activation checkpointing recomputes the forward (recomputed found repeated runs): their GPU time and the
    idle while the CPU prepared and launched them and handed back (idle_causes' `recomputation` rows) are what
    turning it off, or checkpointing less, saves, less the profiler's added time that fell in that idle."""
    by_step, by_name = recomputed.by_step, recomputed.by_name
    if by_step.empty or not by_step["repeated"].any():
        return []
    gpu = np.zeros(clock.steps)
    gpu[by_step["step_row"].to_numpy("int64")] = by_step["gpu_ns"].to_numpy(float)
    rows = views.rows_of(idle_views, idle.RECOMPUTATION_RULE)
    waited = idle.per_step(rows, clock)
    delayed = idle.per_step(rows[rows["source"] == idle.SOURCES[idle.DELAYED]] if len(rows) else rows, clock)
    placed = idle.profiler_time(idle_views, clock, overhead).get(idle.RECOMPUTATION_RULE, 0.0)
    share = host_share(overhead, float(np.median(waited)), clock, placed)
    saved = gpu + waited
    gain = clock.share(saved) if share is None else round(min(100.0, clock.share(gpu) + share.gain_pct), 3)
    steps = clock.steps
    top = by_name.head(NAMES_LISTED)
    listed = ", ".join(f"`{k}` {ms(t / steps)}" for k, t in zip(top["kernel"], top["gpu_ns"], strict=True))
    return [
        Finding(
            "recomputation",
            severity_of(gain),
            "The backward pass runs forward kernels again (activation checkpointing)",
            f"{int(by_step['repeated'].sum()) / steps:,.0f} of {int(by_step['kernels'].sum()) / steps:,.0f} kernels a "
            f"step repeat, from another thread, runs of {RUN} the step's first thread launched (the same kernels in "
            f"order): {ms(float(np.median(gpu)))} of GPU time a step; the GPU idled "
            f"{ms(float(np.median(waited - delayed)))} a step while the CPU prepared and launched them and handed back "
            "to the backward pass, "
            f"and {ms(float(np.median(delayed)))} while it launched the work they had delayed (the CPU spent that "
            f"long on them while the GPU still ran). Most: {listed}." + (share.evidence if share else ""),
            "Turn activation checkpointing off where memory allows (Hugging Face: gradient_checkpointing=False; "
            "NeMo/Megatron: recompute_granularity=None), or recompute less: checkpoint fewer layers "
            "(recompute_num_layers) or only attention (recompute_granularity='selective'); free memory for it "
            "with a smaller micro-batch and more accumulation steps, or a distributed optimizer.",
            gain,
            "the repeated kernels' GPU time and the idle while the CPU launched them (idle_causes' recomputation "
            "rows): "
            f"{clock.scope(saved)}" + (share.basis if share else ""),
        )
    ]


def extra_forward_finding(recomputed: Recomputed, clock: StepClock, chains: ChainTotals) -> list[Finding]:
    """More forward passes a step than backward passes (recomputed's `passes`): the passes no backward follows are
    work the step repeats, an evaluation or a frozen model's forward; removing them, or running them every N steps,
    saves their kernels' GPU time, at most the CPU's wait for the GPU plus the host's launch path in the share of
    launches removed (`chains`: gains.ChainTotals.host_freed, as for fused attention)."""
    passes = recomputed.passes
    extra = passes[passes["extra_ns"] > 0] if len(passes) else passes
    if extra.empty:
        return []
    rows = extra["step_row"].to_numpy("int64")
    saved, removed = np.zeros(clock.steps), np.zeros(clock.steps)
    saved[rows], removed[rows] = extra["extra_ns"].to_numpy(float), extra["extra_kernels"].to_numpy(float)
    per_step = clock.gpu_side(saved, chains.host_freed(clock, removed))
    gain = clock.recurring_share(per_step)
    steps = clock.steps
    forward, followed = int(extra["forward"].median()), int(extra["followed"].median())
    return [
        Finding(
            "extra_forward",
            severity_of(gain),
            f"{forward} forward passes a step"
            + (f" in {len(extra)} of {steps} steps" if len(extra) < steps else "")
            + f", {followed} of them with a backward: a forward no backward follows",
            f"In {len(extra)} of {steps} steps the thread that starts the step runs its layers' kernels {forward} "
            f"times (stretches of its kernels covered by runs of {RUN} that the step's first forward repeats once a "
            f"layer), and the backward thread's work follows {followed} of those passes: "
            f"{int(extra['extra_kernels'].sum()) / steps:,.0f} kernels a step, {ms(float(np.median(saved)))} of "
            "GPU time, in the others. An evaluation every step, "
            "or a frozen teacher's or reference model's forward, looks like this.",
            "Evaluate every N steps, not every step (Hugging Face: eval_strategy='steps' with a larger eval_steps; "
            "Lightning: val_check_interval); for a frozen model's outputs (a teacher's logits, DPO's reference "
            "log-probabilities), compute them once ahead of training, or batch them with the step's forward.",
            gain,
            "the GPU time of each forward pass no backward follows (the first thread's kernels from its head to the "
            "next pass's, or for the step's last pass its share of the first forward's); at most the CPU's wait for "
            f"the GPU plus the host's launch path in the share of launches removed; {clock.recurring_scope(per_step)}",
            few_steps=clock.in_few_steps(np.asarray(per_step, dtype=float)),
        )
    ]
