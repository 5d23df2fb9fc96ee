"""Training steps inferred from the GPU timeline, for captures whose loop writes no NVTX step ranges (a stock
Hugging Face Trainer, Lightning, a hand-written loop).

A training step launches the same kernels in the same order every time, so the sequence of kernel names repeats
with a period of one step. The sequence read is that of the busiest stream of the GPU with the most kernels: a
stream runs its kernels in the order they were launched, where kernels of two streams (NCCL beside compute)
interleave differently from step to step (ordered by start, the compute and NCCL kernels of DDP on two H200s
matched the next step's for 80% of kernels; the compute stream alone, for 100%). The method, in numpy over the
whole sequence, from name ids only:

1. Candidate periods. A name that occurs m times per step recurs at its m-th next occurrence exactly one step
   later. For every name, at three of its occurrences (a quarter, half and three quarters through, most likely
   in the steady part of the capture), the distance to its next 1..4 occurrences is a vote. Votes are ranked
   within each octave of distance (..., 1024..2047, 2048..4095, ...), so that the many short distances of
   per-layer kernels cannot crowd out the one long distance of the step.
2. The period. A candidate P scores the share of kernels i whose name is that of kernel i+P (on a fixed sample
   of positions). Multiples 2P, 3P of the step match as well as P does, and structure within a step matches
   less: a layer's distance only within the forward or the backward pass, a micro-batch's everywhere but across
   the optimizer. So the period is the shortest candidate whose mismatch is not clearly worse than the best
   candidate's; a best under MIN_MATCH means no repeating structure.
3. The repeating stretch. Periods matching the next one for under half of their kernels (warm-up,
   initialisation, an evaluation pass) are trimmed off; the longest run of matching periods is kept.
4. The phase: which kernel starts a step. A capture holding a whole number of periods (give or take a few
   kernels) was opened and closed between steps (a cudaProfilerStart/Stop window), so its first kernel is a
   step's first. Otherwise a step's first kernel is the one after the GPU idle gap (a kernel's start less the
   latest end of every kernel of the GPU that started before it) that is longest in median over the periods:
   loops typically end a step with a host sync (loss.item()) and start the next after CPU work. The capture's
   edges count as infinitely long gaps.
5. The steps, whole periods only. A step begins where the GPU fell idle before its first kernel (the latest end
   of every kernel that started before it), so that the host's part of a step (fetching its batch, launching)
   is in it, as in the loop's own step ranges; it ends where the next begins, and the last at the latest end of
   the GPU's kernels that start within it. Every kernel is in one step at most. A capture opened between steps
   holds the host's part of its first step before any kernel: that step begins at the capture's first CUDA API
   or OS runtime call (infer_steps), at most FIRST_IDLE_FACTOR times the longest idle before another step
   ahead of its first kernel.

6. Other work between some steps. Where work comes between a few steps (an evaluation every 4th step of a short
   capture), no shift of the whole sequence matches MIN_MATCH of it. Then each of the best matching periods is
   taken where it repeats at once (the `period` kernels that best match the next `period`) and found again
   wherever at least MIN_MATCH of its kernels recur in order, from kernels that come once in it; the period whose
   recurrences cover most kernels wins, unless kernels between two recurrences are the step's own in another order
   (a step missed: two streams' kernels interleaved differently), when it gives no steps. Each recurrence is a step,
   to the next one's start (the other work in the step before it), from the kernel after the longest GPU idle gap in
   median over the recurrences; where the capture begins with a recurrence and ends with one (a window opened and
   closed between steps), from each recurrence's first kernel, as step 4 does for a whole number of periods.

Limitations: a capture holding several whole cycles of work every N steps repeats with the cycle, so each step found
is N iterations (its shares are still right). Where the GPU idles before a micro-batch as long as before a step (a
loop that syncs per micro-batch, or pauses for data before each), a capture that is not a whole number of periods
may be cut at a micro-batch: each step is still one period long (its time is right), its start is not the
optimizer's end. A non-repeating stretch in a capture that otherwise repeats (one evaluation in a long capture)
leaves the longer repeating side only. The last step ends with its kernels: host work after them (a NeMo step's 125
ms on an H200) counts to no step. A step of many micro-batches whose optimizer launches few kernels matches itself
shifted by one micro-batch nearly as well as by a step: with every step alike, up to about 100 micro-batches are
told apart; where 5% of kernels vary at random, 16 were, and 32 were taken for 32 steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

STEP_COLUMNS = ("step", "start", "end", "duration")
MIN_MATCH = 0.8  # a period matching less is no repeating structure (batches of varied length gave 91% on an H200)
# A candidate is as good as the best one if its mismatch is at most this many times the best's, plus the slack:
# 2P, 3P match as well as the step P; a micro-batch or layer distance mismatches clearly more.
MISMATCH_FACTOR = 1.5
MISMATCH_SLACK = 0.01
MIN_KERNELS_PER_STEP = 8  # a shorter period (two kernels alternating) is no training step
MIN_STEPS = 2
PERIOD_MATCH_TO_KEEP = 0.5  # a period matching its next one less than this is not part of the loop (trimmed)
EDGE_SLACK_KERNELS = 4  # _edge_slack
# The host's part of a capture's first step (before its first kernel) is at most this many times the longest GPU
# idle time before any other step: a first host call earlier than that was set-up, not the step.
FIRST_IDLE_FACTOR = 2
VOTE_QUANTILES = (0.25, 0.5, 0.75)  # the occurrences of each name whose distances vote
MAX_OCCURRENCE_LAG = 4  # a name occurring up to this many times per step names the period
CANDIDATES_PER_OCTAVE = 4
SAMPLE_POSITIONS = 1 << 18  # positions a candidate period is scored on (all of them in a smaller capture)
SAMPLE_SEED = 0
# Step 6 (_recurring_steps): periods matching at least this much are tried where none matches MIN_MATCH (an
# evaluation every 4 steps gave the step's period 54%), the best RECURRING_CANDIDATES of them; ANCHORS kernels that
# come once a step find its recurrences, each checked on CHECKED_KERNELS of its kernels.
LOOSE_MATCH = 0.3
RECURRING_CANDIDATES = 6
ANCHORS = 8
CHECKED_KERNELS = 512


@dataclass(frozen=True)
class InferredSteps:
    """Steps found from the repeating kernel sequence: `table` has STEP_COLUMNS (int64), one row per whole
    step, numbered 0..n-1 in time order; `kernels_per_step` is the period, in kernels of the stream read;
    `match_pct` the percentage of the steps' kernels whose name is that of the kernel one period later; `how`
    says so in one line, for the report."""

    table: pd.DataFrame
    kernels_per_step: int
    match_pct: float
    how: str


def infer_steps(events) -> InferredSteps | None:
    """The training steps of an EventStore's GPU timeline (module docstring), on the GPU with the most kernels;
    None where they do not repeat over at least MIN_STEPS whole periods."""
    devices = events.query("SELECT device_id, count(*) AS kernels FROM kernels GROUP BY device_id")
    if devices.empty:
        return None
    devices = devices.sort_values(["kernels", "device_id"], ascending=[False, True], na_position="last")
    device = devices["device_id"].iloc[0]
    where = "device_id IS NULL" if pd.isna(device) else f"device_id = {int(device)}"
    kernels = events.sorted_arrays(
        "start",
        f"""SELECT start, "end", coalesce(name_id, -1)::BIGINT AS name_id, coalesce(stream_id, -1)::BIGINT AS stream_id
            FROM kernels WHERE {where}""",
    )
    found = steps_from_kernels(
        kernels["start"], kernels["end"], kernels["name_id"], kernels["stream_id"], _host_start(events)
    )
    if found is not None and len(devices) > 1:
        gpu = "no GPU" if pd.isna(device) else f"GPU {int(device)}"
        found = InferredSteps(
            found.table,
            found.kernels_per_step,
            found.match_pct,
            found.how.replace("the GPU timeline", f"the timeline of {gpu} (the busiest of {len(devices)})", 1),
        )
    return found


def _host_start(events) -> int | None:
    """When the capture's first CUDA API or OS runtime call began (None: there are none), the start of its
    first step where it was opened between steps: the host's part of a step (fetching a batch) comes before
    the step's first kernel."""
    first = events.query("SELECT least((SELECT min(start) FROM cuda_api), (SELECT min(start) FROM osrt)) AS t")
    value = first["t"].iloc[0]
    return None if pd.isna(value) else int(value)


def steps_from_kernels(
    start: np.ndarray,
    end: np.ndarray,
    name_id: np.ndarray,
    stream_id: np.ndarray | None = None,
    host_start: int | None = None,
) -> InferredSteps | None:
    """infer_steps on one GPU's kernels, in order of start (ties in a fixed order): their times, name ids and
    streams (None: one stream); `host_start`, where known, when the host's first call in the capture began."""
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    name_id = np.asarray(name_id, dtype=np.int64)
    if len(start) < MIN_STEPS * MIN_KERNELS_PER_STEP:
        return None
    streams = _dense_codes(np.asarray(stream_id, dtype=np.int64)) if stream_id is not None else None
    stream_kernels = np.bincount(streams) if streams is not None else np.array([len(start)])
    if len(stream_kernels) == 1:  # the sequence is every kernel (10M kernels: no copies of them)
        read = np.arange(len(start))
        codes = _dense_codes(name_id)
    else:  # the kernels of the sequence, as positions on the GPU (the lowest stream id of a tie)
        read = np.flatnonzero(streams == np.argmax(stream_kernels))
        codes = _dense_codes(name_id[read])
    n = len(codes)
    if n < MIN_STEPS * MIN_KERNELS_PER_STEP or codes.max() < 1:  # too few kernels, or all of one name
        return None
    candidates, matches = _scored_periods(codes)
    period = _period(candidates, matches)
    if period is None:
        note = _stream_note(stream_kernels, n, len(start))
        return _recurring_steps(start, end, codes, read, host_start, note, candidates, matches)
    first, stop = _repeating_stretch(codes, period)
    idle = _idle_before(start, end)
    idle = np.append(idle if len(read) == len(start) else idle[read], np.inf)  # and after the last kernel read
    spare = (stop - first) % period  # kernels beyond the whole periods
    if first == 0 and stop == n and spare == 0:
        phase, why = 0, "the capture is a whole number of periods, so it begins with a step"
    elif first == 0 and stop == n and spare <= _edge_slack(period):
        phase, gap = _phase(idle, first, stop, period, last_phase=spare)
        why = (
            f"the capture is a whole number of periods but {spare} kernels, so one of its first {spare + 1} kernels "
            f"is a step's first: the one after the longest GPU idle gap ({_gap(gap)})"
        )
    else:
        phase, gap = _phase(idle, first, stop, period, last_phase=period - 1)
        why = f"each step begins with the longest recurring GPU idle gap ({_gap(gap)}) before its first kernel"
    head = first + phase
    steps = (stop - head) // period
    if steps < MIN_STEPS:
        return None
    used = codes[head : head + steps * period]
    match = float(np.mean(used[:-period] == used[period:]))
    if match < MIN_MATCH:
        return None
    firsts = read[head + period * np.arange(steps)]  # each step's first kernel, as a position on the GPU
    after = read[head + steps * period] if head + steps * period < n else len(start)  # first kernel past them
    opened_between_steps = head == 0 and stop == n and spare <= _edge_slack(period)
    capture_start = host_start if opened_between_steps else None
    table = _step_table(start, end, firsts, after, capture_start)
    how = (
        f"inferred from the GPU timeline: the kernel sequence{_stream_note(stream_kernels, n, len(start))} repeats "
        f"every {period:,} kernels "
        f"({100 * match:.1f}% identical), {steps} whole steps; {why}"
    )
    return InferredSteps(table, int(period), round(100 * match, 2), how)


def _stream_note(stream_kernels: np.ndarray, read: int, kernels: int) -> str:
    """Which kernels the sequence is, for the report line: all of the GPU's, or its busiest stream's."""
    if len(stream_kernels) < 2:
        return ""
    return f" of the GPU's busiest stream (of {len(stream_kernels)}: {read:,} of its {kernels:,} kernels)"


def _recurring_steps(
    start: np.ndarray,
    end: np.ndarray,
    codes: np.ndarray,
    read: np.ndarray,
    host_start: int | None,
    stream_note: str,
    candidates: np.ndarray,
    matches: np.ndarray,
) -> InferredSteps | None:
    """Steps where other work comes between some of them (step 6 of the module docstring), so that no shift of the
    whole sequence matches it: of the candidate periods that match best, the one whose step, taken where it repeats
    at once, recurs over the most kernels; each recurrence a step, to the next one's start. None where no candidate
    matches LOOSE_MATCH or recurs MIN_STEPS times. `candidates`, `matches`: _scored_periods."""
    long_enough = candidates >= MIN_KERNELS_PER_STEP
    candidates, matches = candidates[long_enough], matches[long_enough]
    best = None  # (kernels covered, recurrences, period)
    for at in np.argsort(-matches, kind="stable")[:RECURRING_CANDIDATES]:
        if matches[at] < LOOSE_MATCH:
            break
        period = int(candidates[at])
        found = _recurrences(codes, period)
        if len(found) >= MIN_STEPS and (best is None or len(found) * period > best[0]):
            best = len(found) * period, found, period
    if best is None:
        return None
    _, found, period = best
    if found[0] == 0 and found[-1] + period == len(codes):  # the capture begins and ends with the step whole
        phase, where = 0, "the capture begins with a recurrence and ends with one, so each begins a step"
    else:
        idle = np.append(_idle_before(start, end)[read], np.inf)
        offsets = found[:, None] + np.arange(period)[None, :]  # each recurrence's kernels
        phase = int(np.argmax(np.median(idle[offsets], axis=0)))  # the longest median idle before a kernel: a first
        where = "the step begins after the longest GPU idle gap in median"
    heads = found + phase
    heads = heads[heads + period <= len(codes)]  # whole steps only
    if len(heads) < MIN_STEPS:
        return None
    after = read[heads[-1] + period] if heads[-1] + period < len(codes) else len(start)
    table = _step_table(start, end, read[heads], after, host_start if heads[0] == 0 else None)
    between = int((np.diff(heads) - period).sum())
    how = (
        f"inferred from the GPU timeline: a sequence of {period:,} kernels{stream_note} recurs {len(heads)} times "
        f"({between:,} other kernels between recurrences: work not every step does), each step to the next one's "
        f"start; {where}"
    )
    match = float(np.mean([np.mean(codes[h : h + period] == codes[heads[0] : heads[0] + period]) for h in heads]))
    return InferredSteps(table, period, round(100 * match, 2), how)


def _recurrences(codes: np.ndarray, period: int) -> np.ndarray:
    """Where the `period` kernels that best match the next `period` (the step, taken where it repeats at once)
    recur, at least MIN_MATCH of them the same, apart: found from kernels that come once in it (ANCHORS of them)."""
    same = np.concatenate(([0], np.cumsum(codes[:-period] == codes[period:])))
    if len(same) <= period:
        return np.zeros(0, np.int64)
    window = same[period:] - same[:-period]  # matches of each window of `period` with the next
    first = int(np.argmax(window))
    if window[first] < MIN_MATCH * period:
        return np.zeros(0, np.int64)
    step = codes[first : first + period]
    _, at, counts = np.unique(step, return_index=True, return_counts=True)
    once = np.sort(at[counts == 1])
    if len(once) == 0:
        return np.zeros(0, np.int64)
    anchors = once[np.linspace(0, len(once) - 1, min(ANCHORS, len(once))).astype(np.int64)]
    checked = np.linspace(0, period - 1, min(period, CHECKED_KERNELS)).astype(np.int64)
    starts = []
    for anchor in anchors:
        begins = np.flatnonzero(codes == step[anchor]) - anchor
        begins = begins[(begins >= 0) & (begins + period <= len(codes))]
        agree = (codes[begins[:, None] + checked[None, :]] == step[checked][None, :]).mean(axis=1)
        starts.append(begins[agree >= MIN_MATCH])
    kept: list[int] = []
    for begin in np.unique(np.concatenate(starts)):
        if not kept or begin >= kept[-1] + period:
            kept.append(int(begin))
    if any(_holds_a_step(codes[a + period : b], step) for a, b in zip(kept, kept[1:], strict=False)):
        return np.zeros(0, np.int64)
    return np.array(kept, dtype=np.int64)


def _holds_a_step(between: np.ndarray, step: np.ndarray) -> bool:
    """Whether kernels between two recurrences hold the step's own kernels in another order (MIN_MATCH of them): a
    step missed, as when two streams' kernels interleave differently, not other work (an evaluation runs the
    forward's kernels alone)."""
    if len(between) < MIN_MATCH * len(step):
        return False
    size = int(max(between.max(), step.max())) + 1
    shared = np.minimum(np.bincount(between, minlength=size), np.bincount(step, minlength=size)).sum()
    return bool(shared >= MIN_MATCH * len(step))


def _sample(n: int) -> np.ndarray:
    """The positions a candidate period is scored on: all, or SAMPLE_POSITIONS of them."""
    if n <= SAMPLE_POSITIONS:
        return np.arange(n)
    return np.unique(np.random.default_rng(SAMPLE_SEED).integers(0, n, SAMPLE_POSITIONS))


def _dense_codes(ids: np.ndarray) -> np.ndarray:
    """Ids as codes 0..K-1 in the ids' order, as uint16 where they fit (numpy's stable sort is then a radix sort:
    10M kernels sorted by name in 0.16 s, against 1 s for int32)."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.uint16)
    low, high = int(ids.min()), int(ids.max())
    if high - low < 1 << 24:  # string-table ids: a lookup, not a sort
        present = np.bincount(ids - low) > 0
        codes = (np.cumsum(present) - 1)[ids - low]
    else:
        codes = np.unique(ids, return_inverse=True)[1]
    return codes.astype(np.uint16 if codes.max() < 1 << 16 else np.int64)


def _candidate_periods(codes: np.ndarray) -> np.ndarray:
    """Distances in kernels that may be the step (step 1 of the module docstring), the best voted of each
    octave, in increasing order, up to 1 / MIN_STEPS of the sequence. Shorter than MIN_KERNELS_PER_STEP too:
    a sequence that repeats that fast has no training step, and its multiples must not pass for one."""
    n = len(codes)
    positions = np.argsort(codes, kind="stable")  # each name's occurrences, in order, one name after another
    counts = np.bincount(codes)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    votes = []
    for quantile in VOTE_QUANTILES:
        at = (quantile * (counts - 1)).astype(np.int64)  # which occurrence of each name
        for lag in range(1, MAX_OCCURRENCE_LAG + 1):
            has = at + lag < counts
            votes.append(positions[firsts[has] + at[has] + lag] - positions[firsts[has] + at[has]])
    distances = np.concatenate(votes)
    distances = distances[(distances >= 1) & (distances <= n // MIN_STEPS)]
    if len(distances) == 0:
        return distances
    values, tally = np.unique(distances, return_counts=True)
    octave = np.floor(np.log2(values)).astype(np.int64)
    order = np.lexsort((-values, -tally, octave))  # by octave, then most voted, then longest
    rank_in_octave = np.arange(len(order)) - np.searchsorted(octave[order], octave[order])
    return np.sort(values[order[rank_in_octave < CANDIDATES_PER_OCTAVE]])


def _match(codes: np.ndarray, positions: np.ndarray, period: int) -> float:
    """The share of the kernels at `positions` (sorted) whose name is that of the kernel `period` later."""
    positions = positions[: np.searchsorted(positions, len(codes) - period)]
    return float(np.mean(codes[positions] == codes[positions + period])) if len(positions) else 0.0


def _scored_periods(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidate periods (_candidate_periods) and the share of kernels each matches (_match, on _sample's
    positions)."""
    candidates = _candidate_periods(codes)
    positions = _sample(len(codes))
    return candidates, np.array([_match(codes, positions, int(c)) for c in candidates], dtype=float)


def _period(candidates: np.ndarray, matches: np.ndarray) -> int | None:
    """The step's length in kernels (step 2 of the module docstring), or None. `candidates`, `matches`:
    _scored_periods."""
    if len(candidates) == 0:
        return None
    best = matches.max()
    if best < MIN_MATCH:
        return None
    good_enough = (matches >= MIN_MATCH) & (1 - matches <= MISMATCH_FACTOR * (1 - best) + MISMATCH_SLACK)
    period = int(candidates[np.flatnonzero(good_enough)[0]])  # the shortest
    return period if period >= MIN_KERNELS_PER_STEP else None


def _repeating_stretch(codes: np.ndarray, period: int) -> tuple[int, int]:
    """The kernels [first, stop) of the longest run of periods that match their next period (step 3)."""
    same = codes[:-period] == codes[period:]  # kernel i matches kernel i + period
    blocks = -(-len(same) // period)
    padded = np.zeros(blocks * period, dtype=bool)
    padded[: len(same)] = same
    sizes = np.minimum(period, len(same) - np.arange(blocks) * period)
    kept = padded.reshape(blocks, period).sum(axis=1) >= PERIOD_MATCH_TO_KEEP * sizes
    if not kept.any():
        return 0, 0
    edges = np.flatnonzero(np.diff(np.concatenate(([0], kept.astype(np.int8), [0]))))
    run_starts, run_stops = edges[::2], edges[1::2]
    longest = int(np.argmax(run_stops - run_starts))
    first = int(run_starts[longest]) * period
    return first, min(int(run_stops[longest]) * period, len(same)) + period


def _idle_before(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each kernel, how long the GPU idled before it: its start less the latest end of every kernel before
    it (negative where kernels overlap); infinite for the first, at the capture's edge."""
    idle = np.full(len(start), np.inf)
    idle[1:] = start[1:] - np.maximum.accumulate(end)[:-1]
    return idle


def _edge_slack(period: int) -> int:
    """Stray kernels a capture may hold beyond whole periods and still be taken as opened and closed between
    steps (step 4 of the module docstring): a few, or 1% of a long step."""
    return max(EDGE_SLACK_KERNELS, period // 100)


def _phase(idle: np.ndarray, first: int, stop: int, period: int, last_phase: int) -> tuple[int, float]:
    """The offset from `first`, at most `last_phase`, of the kernel that starts a step, with the median idle gap
    before it (step 4): the offset whose gaps over the periods of [first, stop] are longest in median; of equal
    medians, the one giving more whole steps, then the smallest. `idle` has one more entry than there are
    kernels: the capture's end."""
    boundaries = idle[first : stop + 1]
    rows = -(-len(boundaries) // period)
    table = np.full(rows * period, np.nan)
    table[: len(boundaries)] = boundaries
    table = np.sort(table.reshape(rows, period), axis=0)  # NaN last, inf just before
    known = np.sum(~np.isnan(table), axis=0)
    columns = np.arange(period)
    median = (table[(known - 1) // 2, columns] + table[known // 2, columns]) / 2
    whole_steps = (stop - first - columns) // period
    allowed = columns <= last_phase
    phase = int(columns[allowed][np.lexsort((columns[allowed], -whole_steps[allowed], -median[allowed]))[0]])
    return phase, float(median[phase])


def _step_table(
    start: np.ndarray, end: np.ndarray, firsts: np.ndarray, after: int, capture_start: int | None
) -> pd.DataFrame:
    """One row per step (step 5 of the module docstring): `firsts`, the GPU position of each step's first
    kernel; `after`, that of the first kernel past the last step (len(start): none); `capture_start`, where the
    capture was opened between steps, when the host began (None: unknown, or not so opened)."""
    ended = np.maximum.accumulate(end)
    # where the GPU fell idle before each step's first kernel: the end of every kernel that started before it
    step_start = np.minimum(start[firsts], ended[np.maximum(firsts - 1, 0)])
    if capture_start is not None:  # from the capture's start, with every kernel before the first step's
        longest_idle = max(int((start[firsts[1:]] - ended[firsts[1:] - 1]).max()), 0)
        step_start[0] = min(start[0], max(capture_start, start[0] - FIRST_IDLE_FACTOR * longest_idle))
    elif firsts[0] == 0:
        step_start[0] = start[0]
    step_end = np.empty(len(firsts), dtype=np.int64)
    step_end[:-1] = step_start[1:]
    step_end[-1] = end[firsts[-1] : after].max()
    return pd.DataFrame(
        {
            "step": np.arange(len(firsts), dtype=np.int64),
            "start": step_start,
            "end": step_end,
            "duration": step_end - step_start,
        },
        columns=list(STEP_COLUMNS),
    )


def _gap(ns: float) -> str:
    """The median idle gap before a step, for the report line."""
    return "the capture's edge" if np.isinf(ns) else f"median {ns / 1e6:.2f} ms"
