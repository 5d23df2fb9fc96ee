"""Across ranks on real NCCL: 2 H200s, DDP over NVLink, each rank under Nsight Systems 2025.3.1.

tests/fixtures/ranks/nccl_*/ (README.md there) are three 2-rank captures of the built-in trainer on Llama
3.2 1B's shapes, made by tests/gpu_programs/nccl_ranks.sh: `nccl_clean` (DDP overlaps its bucketed
all-reduce with the backward pass), `nccl_no_overlap` (sft.ddp_overlap off: the same buckets all-reduced
after the backward pass) and `nccl_slow_rank1` (rank 1's data path sleeps 30 ms a micro-batch). Each rank's
export is checked against what nsys itself printed of it (cuda_gpu_kern_sum), and exposed and blocking
communication against a count made here from the export with sqlite3 alone.
"""

from __future__ import annotations

import bisect
import csv
import lzma
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from sftprof import pipeline, results
from sftprof.analysis.collectives import ALL
from sftprof.report import suggest
from sftprof.text import read_csv
from sftprof.trace.metrics import read_metrics

from conftest import merged

FIXTURES = Path(__file__).parent / "fixtures" / "ranks"
sys.path.insert(0, str(FIXTURES))
import make_nccl_captures  # noqa: E402  (the plant's sleep)

CASES = tuple(make_nccl_captures.CASES)
MS = 1_000_000


def _unpacked(case: str, folder: Path) -> Path:
    """The case's capture folder with its exports decompressed, as the capture left it."""
    shutil.copytree(FIXTURES / case, folder, ignore=shutil.ignore_patterns("*.xz"))
    for packed in (FIXTURES / case).glob("*.sqlite.xz"):
        with lzma.open(packed) as source, open(folder / packed.name.removesuffix(".xz"), "wb") as out:
            shutil.copyfileobj(source, out)
    return folder


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """case -> (capture folder, output folder, cross-rank result), each analysed once."""
    done = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case)
        capture = _unpacked(case, root / "capture")
        done[case] = (capture, root / "out", pipeline.cross_rank_dirs([capture], root / "out", case))
    return done


def _nsys_kernels(path: Path) -> list[dict]:
    with open(path, newline="") as table:
        return list(csv.DictReader(table))


@pytest.mark.ci_sample(2)
@pytest.mark.parametrize("case", CASES)
def test_collectives_are_found_by_kind_as_nsys_counted_them(analysed, case):
    """Every NCCL kernel nsys 2025.3.1's own summary lists, by the collective its name says, with the same
    count and time."""
    capture, out, _ = analysed[case]
    for number in (0, 1):
        expected: dict[str, list[int]] = {}
        for row in _nsys_kernels(capture / f"rank{number}_cuda_gpu_kern_sum.csv"):
            match = re.match(r"ncclDevKernel_([A-Za-z]+)", row["Name"])
            if match:
                kind = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()  # AllReduce -> all_reduce
                counted = expected.setdefault(kind, [0, 0])
                counted[0] += int(row["Instances"])
                counted[1] += int(row["Total Time (ns)"])
        table = read_csv(out / "analysis" / f"rank{number}" / "collectives.csv")
        whole = table[table["step"].isna() & (table["kind"] != ALL)]
        assert {r.kind: [int(r.kernels), int(r.time_ns)] for r in whole.itertuples()} == expected
    kinds = set(expected)
    assert "all_reduce" in kinds
    # DDP broadcasts its buffers in a forward that syncs; with the overlap off every forward runs in no_sync
    assert ("broadcast" in kinds) == (case != "nccl_no_overlap")


def _independent_exposed_and_blocking(export: Path) -> tuple[int, int]:
    """From the export alone: the time NCCL kernels run with no other kernel on the GPU (exposed), and of
    it the time after the launch call of the next other kernel began (blocking; of kernels starting together,
    the earliest launched); unknown launches count whole."""
    db = sqlite3.connect(export)
    launched: dict[tuple[int, int], int] = {}
    for correlation, pid, start in db.execute(
        "SELECT correlationId, globalTid >> 24, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"
    ):
        launched[correlation, pid] = min(start, launched.get((correlation, pid), start))
    kernels = db.execute("""
        SELECT k.start, k."end", s.value LIKE 'nccl%', k.correlationId, k.globalPid >> 24
        FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName""").fetchall()
    db.close()
    rows = [(start, end, nccl, launched.get((correlation, pid))) for start, end, nccl, correlation, pid in kernels]
    comm = merged([(s, e) for s, e, nccl, _ in rows if nccl])
    compute = sorted((s, e, launch) for s, e, nccl, launch in rows if not nccl)
    compute_starts = [c[0] for c in compute]
    covered = merged([(s, e) for s, e, _ in compute])
    covered_ends = [e for _, e in covered]
    exposed = blocking = 0
    for start, end in comm:
        pieces, at = [], start
        for c_start, c_end in covered[bisect.bisect_right(covered_ends, start) :]:
            if c_start >= end:
                break
            if c_start > at:
                pieces.append((at, c_start))
            at = max(at, c_end)
        if at < end:
            pieces.append((at, end))
        for p_start, p_end in pieces:
            exposed += p_end - p_start
            first = bisect.bisect_left(compute_starts, p_end)
            launch = p_start if first == len(compute) else None  # nothing follows: unknown, counted whole
            i = first
            while i < len(compute) and compute_starts[i] == compute_starts[first]:
                candidate = compute[i][2] if compute[i][2] is not None else p_start
                launch = candidate if launch is None else min(launch, candidate)
                i += 1
            blocking += max(0, p_end - max(p_start, launch))
    return exposed, blocking


@pytest.mark.parametrize("case", ["nccl_clean", "nccl_no_overlap"])
def test_exposed_and_blocking_time_equal_an_independent_count(analysed, case):
    capture, out, _ = analysed[case]
    for number in (0, 1):
        table = read_csv(out / "analysis" / f"rank{number}" / "collectives.csv")
        whole = table[table["step"].isna() & (table["kind"] == ALL)].iloc[0]
        exposed, blocking = _independent_exposed_and_blocking(capture / f"rank{number}.sqlite")
        assert (int(whole["exposed_ns"]), int(whole["blocking_ns"])) == (exposed, blocking)
        assert 0 < blocking <= exposed <= whole["busy_ns"]


def _finding(result, rule):
    return next((f for f in result.findings if f.rule == rule), None)


def test_without_overlap_compute_waits_for_the_whole_all_reduce(analysed):
    """With the overlap off the all-reduce runs after the backward pass with the optimizer queued behind it:
    nearly all of its exposed time blocks compute, and the finding warns. DDP's overlap hides most of the same
    all-reduce: what still blocks compute is a fraction, and only informs."""
    _, _, without = analysed["nccl_no_overlap"]
    _, _, clean = analysed["nccl_clean"]
    steps = without.tables["rank_steps"]
    assert (steps["nccl_exposed_ns"] > 0).all()
    hidden, exposed = _finding(clean, "exposed_communication"), _finding(without, "exposed_communication")
    assert exposed.severity == "warning" and hidden.severity == "info"
    assert hidden.gain_pct < exposed.gain_pct / 2
    for case in ("nccl_no_overlap", "nccl_clean"):
        _, out, _ = analysed[case]
        table = read_csv(out / "analysis" / "rank0" / "collectives.csv")
        whole = table[table["step"].isna() & (table["kind"] == ALL)].iloc[0]
        share = whole["blocking_ns"] / whole["exposed_ns"]
        assert share > 0.95 if case == "nccl_no_overlap" else share < 0.9


def test_the_slow_rank_is_named_with_its_data_phase(analysed):
    _, _, result = analysed["nccl_slow_rank1"]
    [finding] = [f for f in result.findings if f.rule == "straggler"]
    assert finding.severity == "warning" and finding.title.startswith("Rank 1 (node 0")
    assert "its data phase" in finding.title and "(data/IO)" in finding.title
    planted = make_nccl_captures.SLOW_S * make_nccl_captures.GPU["sft"]["grad_accum_steps"] * 1e3
    excess = float(re.search(r"takes ([0-9.]+) ms more per step", finding.title).group(1))
    assert planted * 0.9 < excess < planted * 1.2
    assert result.headline["straggler_rank"] == 1


def test_the_clean_run_raises_no_warning(analysed):
    _, _, result = analysed["nccl_clean"]
    assert [f.title for f in result.findings if f.severity == "warning"] == []
    assert _finding(result, "straggler") is None


def test_bus_bandwidth_sits_within_what_nccl_measured_on_the_link(analysed):
    """The all-reduce's bus bandwidth, from the gradient size and the fastest rank's all-reduce time, against
    tests/gpu_programs/allreduce_bandwidth.py's on the same machine: at least half of what 25 MiB messages
    (DDP's buckets) reached, at most what any size reached."""
    measured = {}
    for line in (FIXTURES / "nccl_device" / "allreduce_bandwidth.txt").read_text().splitlines()[1:]:
        size, _, _, busbw = line.split("\t")
        measured[int(size)] = float(busbw)
    _, _, result = analysed["nccl_no_overlap"]
    table = result.tables["rank_collectives"]
    busbw = table[table["kind"] == "all_reduce"]["busbw_gbps"].astype(float)
    assert len(busbw) and busbw.notna().all()
    assert (busbw >= measured[25 << 20] / 2).all() and (busbw <= max(measured.values()) * 1.02).all()


def test_suggest_turns_the_overlap_on_only_where_it_was_off(analysed):
    for case, expected in (("nccl_no_overlap", ["ddp-overlap"]), ("nccl_clean", [])):
        capture, out, _ = analysed[case]
        analysis = results.load(out / "analysis" / "rank0")
        run = {"backend": "torch", **read_metrics(capture / "profile.rank0.metrics.jsonl").run}
        names = [name for name, *_ in suggest.suggest(analysis, top=10, run=run)]
        assert [name for name in names if name == "ddp-overlap"] == expected


def test_the_straggler_gain_predicts_the_measured_saving(analysed):
    """The straggler's predicted gain against what the clean run (the same job without the sleep) measured:
    the slow job's median step less the clean one's, as a share of the slow one. On these captures the
    prediction was 25.1% and the saving 20.8%; counting a wait once as the GPU's NCCL time and again as the
    host's wait for the GPU, it had been 49.4%."""
    _, _, slow = analysed["nccl_slow_rank1"]
    _, _, clean = analysed["nccl_clean"]
    [finding] = [f for f in slow.findings if f.rule == "straggler"]

    def median_step(result) -> float:
        return float(result.tables["step_skew"]["max_ns"].median())

    measured = 100 * (1 - median_step(clean) / median_step(slow))
    assert measured > 10 and abs(finding.gain_pct - measured) < 10
