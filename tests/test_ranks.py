"""Across ranks: the straggler, the skew per step, waiting, and `sftprof ranks`.

Real parts: tests/fixtures/ranks/ holds two 2-rank captures of sftprof's own trainer as DDP over gloo on
this CPU machine, each rank launched like a Slurm task through `python -m sftprof.capture.rank` under
nsys (README.md there): `clean`, and `slow_rank1` with a 50 ms sleep per micro-batch in rank 1's data
path. tests/fixtures/ranks/four_*/ holds three 4-rank captures, each one srun job step on the loopback
Slurm: `four_clean`, `four_slow_data_rank2` (100 ms sleep per micro-batch in rank 2's data path) and
`four_busy_rank3` (busy loops pinned to rank 3's core). NCCL cannot run here: the NCCL paths (waiting in
collective kernels, exposed time, bus bandwidth) are tested on synthetic per-rank tables below, and on
real 2-GPU captures in test_nccl_ranks.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof import pipeline, results
from sftprof.analysis import ranks
from sftprof.analysis.ranks import RankInput, RanksError, analyze_ranks
from sftprof.capture import rank as rank_records
from sftprof.errors import SftprofError

from conftest import assert_refused, run_sftprof

FIXTURES = Path(__file__).parent / "fixtures" / "ranks"
MS = 1_000_000


# ---------------------------------------------------------------- real 2-rank CPU captures


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    out = tmp_path_factory.mktemp("slow") / "out"
    return out, pipeline.cross_rank_dirs([FIXTURES / "slow_rank1"], out, "slow")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    return out, pipeline.cross_rank_dirs([FIXTURES / "clean"], out, "clean")


def test_the_slow_rank_is_named_with_its_node_host_and_phase(slow):
    _, result = slow
    [finding] = [f for f in result.findings if f.rule == "straggler"]
    record = json.loads((FIXTURES / "slow_rank1" / "rank1.json").read_text())
    assert finding.severity == "warning"
    assert finding.title.startswith(f"Rank 1 (node {record['node']}, host {record['host']}) holds the other ranks back")
    assert "its data phase" in finding.title and "(data/IO)" in finding.title
    assert "input pipeline" in finding.recommendation and f"node {record['node']}" in finding.recommendation
    assert result.headline["straggler_rank"] == 1 and result.headline["straggler_node"] == record["node"]
    assert result.headline["warnings"] == ["straggler"]


def test_the_gain_is_computed_as_documented(slow):
    """Gain = median over the common steps of max(0, own(rank 1) - max own(the others)) / the median job
    step (per step, the slowest rank's step time), recomputed here from the saved per-step table."""
    out, result = slow
    steps = pd.read_csv(out / "ranks" / "rank_steps.csv")
    own = steps.pivot(index="step", columns="rank", values="own_ns")
    duration = steps.pivot(index="step", columns="rank", values="duration_ns")
    # own = step time less waiting, waiting = sync waits beyond the least any rank had, per step and phase
    assert (own <= duration).all().all() and np.allclose(
        own + steps.pivot(index="step", columns="rank", values="waiting_ns"), duration
    )
    expected = 100 * np.median((own[1] - own[0]).clip(lower=0)) / np.median(duration.max(axis=1))
    [finding] = [f for f in result.findings if f.rule == "straggler"]
    assert finding.gain_pct == pytest.approx(expected, abs=1e-3)
    # the sleep is 2 x 50 ms per step: rank 1's own time is about 100 ms more than rank 0's
    assert 80 * MS < np.median(own[1] - own[0]) < 120 * MS
    assert finding.gain_pct > 40


def test_the_fast_rank_shows_the_slow_ranks_extra_time_as_waiting(slow):
    _, result = slow
    phases = result.tables["rank_phases"].set_index(["rank", "phase"])
    # rank 0 waits in gloo's collectives (DDP's buffer broadcast in forward, the gradient all-reduce in
    # backward): together about rank 1's 100 ms of sleep per step; rank 1 hardly waits
    waited = phases.loc[(0, "forward"), "waiting_ns"] + phases.loc[(0, "backward"), "waiting_ns"]
    assert 70 * MS < waited < 130 * MS
    assert phases.xs(1, level="rank")["waiting_ns"].sum() < 10 * MS
    # the sleep is rank 1's own time, in data: not counted as waiting (a sleep is no synchronization call)
    assert phases.loc[(1, "data"), "own_ns"] > 95 * MS and phases.loc[(1, "data"), "sync_wait_ns"] == 0
    assert phases.loc[(1, "data"), "excess_ns"] > 90 * MS


def test_skew_table_per_step(slow, clean):
    for _, result in (slow, clean):
        skew = result.tables["step_skew"]
        per_rank = result.tables["rank_steps"].pivot(index="step", columns="rank", values="duration_ns")
        assert list(skew["step"]) == list(range(3, 11)) == list(per_rank.index)  # the window's 8 steps
        assert np.allclose(skew["skew_ns"], skew["max_ns"] - skew["median_ns"])
        assert np.allclose(skew["max_ns"], per_rank.max(axis=1)) and np.allclose(skew["rank1_ns"], per_rank[1])
        assert set(skew["slowest_rank"]) <= {0, 1} and set(skew["slowest_node"]) == {0}
    skew = slow[1].tables["step_skew"]
    assert (skew["straggling_rank"] == 1).all()  # the rank the others waited for, every step
    # synchronous DP: both ranks take about as long per step, whoever is slow
    assert (skew["skew_ns"] < 0.1 * skew["median_ns"]).all()


def test_the_clean_pair_raises_no_straggler(clean):
    _, result = clean
    assert result.findings == [] and result.headline["straggler_rank"] is None
    assert result.headline["warnings"] == []


def test_captures_of_one_host_are_lined_up_in_time(slow):
    _, result = slow
    steps = result.tables["rank_steps"]
    assert "late_ns" in steps and (steps.groupby("step")["late_ns"].min() == 0).all()


# ---------------------------------------------------------------- real 4-rank CPU captures under Slurm

FOUR = ("four_clean", "four_slow_data_rank2", "four_busy_rank3")


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """The three 4-rank captures (one srun step of 4 tasks each on the loopback Slurm), compared."""
    return {
        case: pipeline.cross_rank_dirs([FIXTURES / case], tmp_path_factory.mktemp(case) / "out", case) for case in FOUR
    }


def _stragglers(result):
    return [f for f in result.findings if f.rule in ("straggler", "stragglers")]


def test_four_ranks_of_one_slurm_job_each(four):
    for case, result in four.items():
        records = [json.loads((FIXTURES / case / f"rank{r}.json").read_text()) for r in range(4)]
        assert [r["rank"] for r in records] == [0, 1, 2, 3] and {r["world_size"] for r in records} == {4}
        assert len({r["slurm_job_id"] for r in records}) == 1 and {r["node"] for r in records} == {0}
        assert result.headline["ranks"] == 4 and result.headline["common_steps"] == 6  # the window: steps 3-8
        assert list(result.tables["step_skew"]["step"]) == list(range(3, 9))


def test_four_ranks_sleep_in_rank2_data_path_is_named(four):
    result = four["four_slow_data_rank2"]
    [finding] = _stragglers(result)
    record = json.loads((FIXTURES / "four_slow_data_rank2" / "rank2.json").read_text())
    assert finding.rule == "straggler" and finding.severity == "warning"
    assert finding.title.startswith(f"Rank 2 (node {record['node']}, host {record['host']}) holds the other ranks back")
    assert "its data phase" in finding.title and "(data/IO)" in finding.title
    assert "input pipeline" in finding.recommendation
    assert result.headline["straggler_rank"] == 2 and result.headline["warnings"] == ["straggler"]
    # 2 x 100 ms of sleep per step: rank 2's data phase is ~200 ms above the others', and each other rank
    # waits for it in its collectives about as long
    phases = result.tables["rank_phases"].set_index(["rank", "phase"])
    assert 180 * MS < phases.loc[(2, "data"), "excess_ns"] < 220 * MS
    for other in (0, 1, 3):
        waited = phases.xs(other, level="rank")["waiting_ns"].sum()
        assert 150 * MS < waited < 250 * MS, (other, waited)
    assert phases.xs(2, level="rank")["waiting_ns"].sum() < 20 * MS
    assert finding.gain_pct > 50


def test_four_ranks_busy_loop_beside_rank3_is_named_as_cpu_contention(four):
    result = four["four_busy_rank3"]
    [finding] = _stragglers(result)
    record = json.loads((FIXTURES / "four_busy_rank3" / "rank3.json").read_text())
    assert finding.rule == "straggler" and finding.severity == "warning"
    assert finding.title.startswith(f"Rank 3 (node {record['node']}, host {record['host']}) holds the other ranks back")
    assert "(CPU contention or a slower CPU)" in finding.title
    assert "data phase" not in finding.title and "data/IO" not in finding.title
    assert "--cpu-bind" in finding.recommendation and "input pipeline" not in finding.recommendation
    assert result.headline["straggler_rank"] == 3 and result.headline["warnings"] == ["straggler"]
    # the busy loops take rank 3's compute time, not its data time
    phases = result.tables["rank_phases"].set_index(["rank", "phase"])
    assert abs(phases.loc[(3, "data"), "excess_ns"]) < 2 * MS
    assert phases.loc[(3, "forward"), "excess_ns"] + phases.loc[(3, "backward"), "excess_ns"] > 20 * MS
    assert finding.gain_pct > 10


def test_four_ranks_clean_run_raises_nothing(four):
    result = four["four_clean"]
    assert result.findings == [] and result.headline["straggler_rank"] is None
    assert result.headline["warnings"] == []


def test_workflow_step_reads_saved_analyses_and_links_each_rank(tmp_path):
    capture = FIXTURES / "slow_rank1"
    analysis = tmp_path / "analysis"
    for record in rank_records.profiled_records(capture):
        results.save(
            pipeline.analyze_trace(capture / f"rank{record['rank']}.sqlite"), analysis / f"rank{record['rank']}"
        )
    result = pipeline.cross_rank_capture(
        capture, capture, analysis, "profile", tmp_path / "ranks", tmp_path / "ranks.html", "window"
    )
    html = (tmp_path / "ranks.html").read_text()
    assert 'href="report.html#r0-rank"' in html and 'href="report.html#r1-rank"' in html
    assert "holds the other ranks back" in html
    summary = json.loads((tmp_path / "ranks" / "ranks.json").read_text())
    assert [f["rule"] for f in summary["findings"]] == ["straggler"] == [f.rule for f in result.findings]
    assert set(summary["tables"]) == {"rank_steps", "step_skew", "rank_phases", "rank_collectives"}


# ---------------------------------------------------------------- the CLI


def test_cli_ranks_over_two_node_folders(tmp_path):
    """`sftprof ranks DIR DIR`: each rank's files fetched into a folder of its own, as per node."""
    dirs = []
    for r in (0, 1):
        folder = tmp_path / f"node{r}"
        folder.mkdir()
        for name in (f"rank{r}.json", f"rank{r}.sqlite", f"profile.rank{r}.metrics.jsonl"):
            shutil.copy(FIXTURES / "slow_rank1" / name, folder / name)
        dirs.append(folder)
    result = run_sftprof("ranks", *dirs, "-o", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Rank 1 (node 0, host" in result.stdout and "[gain" in result.stdout
    for path in (
        "ranks.html",
        "report.html",
        "ranks/ranks.json",
        "ranks/step_skew.csv",
        "analysis/rank1/analysis.json",
    ):
        assert (tmp_path / "out" / path).exists(), path
    assert "Rank 1 (node 0" in (tmp_path / "out" / "ranks.html").read_text()


def test_cli_refuses_a_folder_without_records(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_refused(run_sftprof("ranks", tmp_path / "empty", "-o", tmp_path / "out"), contains="no rank records")
    assert not (tmp_path / "out").exists()


def test_cli_refuses_ranks_without_common_steps(tmp_path):
    folder = tmp_path / "capture"
    shutil.copytree(FIXTURES / "clean", folder)
    with sqlite3.connect(folder / "rank1.sqlite") as con:  # rank 1's steps renumbered: 103..110
        con.execute(
            "UPDATE NVTX_EVENTS SET text = 'step ' || (CAST(substr(text, 6) AS INTEGER) + 100) WHERE text LIKE 'step %'"
        )
    message = assert_refused(run_sftprof("ranks", folder, "-o", tmp_path / "out"), contains="share no step number")
    assert "rank 0: steps 3-10" in message and "rank 1: steps 103-110" in message


# ---------------------------------------------------------------- the model, on synthetic tables


def _rank(number, node, own, waiting, data=None, kernel_ns=None, comm=None, run=None) -> RankInput:
    """A rank whose steps 1..n take own + waiting; its waiting is in backward sync waits (or, with `comm`,
    in NCCL all-reduce time: (busy, exposed, blocking) per step)."""
    n = len(own)
    data = data if data is not None else [5 * MS] * n
    duration = [o + w for o, w in zip(own, waiting, strict=True)]
    steps = pd.DataFrame(
        {
            "step": range(1, n + 1),
            "start": [i * 10**9 for i in range(n)],
            "end": [i * 10**9 + d for i, d in enumerate(duration)],
            "duration": duration,
            "data_ns": data,
            "forward_ns": [10 * MS] * n,
            "backward_ns": [d - dt - 10 * MS for d, dt in zip(duration, data, strict=True)],
            "optimizer_ns": [0] * n,
            "other_ns": [0] * n,
        }
    )
    wait_rows = [
        {"step": s, "phase": p, "waits": 1, "wait_ns": (w if comm is None and p == "backward" else 0)}
        for s, w in zip(range(1, n + 1), waiting, strict=True)
        for p in ranks.OWN_PHASES
    ]
    tables = {"steps": steps, "step_waits": pd.DataFrame(wait_rows)}
    if comm is not None:
        tables["collectives"] = pd.DataFrame(
            [
                {
                    "step": s,
                    "device_id": 0,
                    "kind": kind,
                    "kernels": 1,
                    "time_ns": busy,
                    "busy_ns": busy,
                    "exposed_ns": exposed,
                    "blocking_ns": blocking,
                }
                for s, (busy, exposed, blocking) in zip(range(1, n + 1), comm, strict=True)
                for kind in ("all", "all_reduce")
            ]
        )
    if kernel_ns is not None:
        tables["step_accounting"] = pd.DataFrame({"step": range(1, n + 1), "kernel_ns": kernel_ns})
    return RankInput(rank=number, node=node, host=f"h{node}", world_size=3, tables=tables, run=run or {})


def test_gain_model_on_three_ranks():
    own = {0: [100, 100, 100, 100], 1: [100, 102, 98, 100], 2: [150, 160, 140, 150]}
    own = {r: [v * MS for v in values] for r, values in own.items()}
    job = [max(own[r][i] for r in own) for i in range(4)]
    inputs = [
        _rank(
            r,
            node=r // 2,
            own=own[r],
            waiting=[j - o for j, o in zip(job, own[r], strict=True)],
            data=[(5 + (o - own[0][i]) // MS) * MS for i, o in enumerate(own[r])],
        )
        for r in own
    ]
    result = analyze_ranks(inputs)
    [finding] = result.findings
    # median over steps of own(2) - max(own(0), own(1)): (50, 58, 42, 50) -> 50 ms; median job step 150 ms
    assert finding.rule == "straggler" and finding.gain_pct == pytest.approx(100 * 50 / 150, abs=1e-3)
    assert finding.title.startswith("Rank 2 (node 1, host h1)") and "data phase" in finding.title
    assert result.headline["median_step_ms"] == 150
    assert list(result.tables["step_skew"]["straggling_rank"]) == [2, 2, 2, 2]
    steps = result.tables["rank_steps"].set_index(["step", "rank"])
    assert steps.loc[(2, 0), "waiting_ns"] == 60 * MS and steps.loc[(2, 2), "own_ns"] == 160 * MS


def test_cause_is_the_gpu_when_its_kernels_take_the_extra_time():
    own = {0: [100 * MS] * 3, 1: [100 * MS] * 3, 2: [140 * MS] * 3}
    kernel = {0: [80 * MS] * 3, 1: [80 * MS] * 3, 2: [118 * MS] * 3}
    inputs = [_rank(r, node=r, own=own[r], waiting=[140 * MS - o for o in own[r]], kernel_ns=kernel[r]) for r in own]
    [finding] = analyze_ranks(inputs).findings
    assert "(a slow GPU, thermal throttling or a lower clock)" in finding.title
    assert "nvidia-smi" in finding.recommendation
    inputs = [
        _rank(r, node=r, own=own[r], waiting=[140 * MS - o for o in own[r]], kernel_ns=[80 * MS] * 3) for r in own
    ]
    [finding] = analyze_ranks(inputs).findings
    assert "(CPU contention or a slower CPU)" in finding.title


def test_two_slow_ranks_are_named_together():
    own = {0: [100 * MS] * 3, 1: [100 * MS] * 3, 2: [150 * MS, 150 * MS, 151 * MS], 3: [151 * MS, 150 * MS, 150 * MS]}
    inputs = [_rank(r, node=r, own=own[r], waiting=[151 * MS - o for o in own[r]]) for r in own]
    findings = analyze_ranks(inputs).findings
    assert sorted(f.rule for f in findings) == ["straggler", "straggler", "stragglers"]
    # alone, each gains only down to the other (0 or 1 ms); together 51, 50, 51 ms of a 151 ms job step
    group = next(f for f in findings if f.rule == "stragglers")
    assert group.title == "Ranks 2, 3 are all slower than the rest of the job" and group.severity == "warning"
    assert group.gain_pct == pytest.approx(100 * 51 / 151, abs=1e-3)
    assert all(f.gain_pct < 1 and f.severity == "info" for f in findings if f.rule == "straggler")


def test_nccl_waiting_exposed_time_and_bus_bandwidth():
    """Waiting inside NCCL kernels: rank 1 arrives last, so its all-reduce is the transfer (8 ms) and the
    others' kernels spin 40 ms longer; 3 ms of each all-reduce has no compute beside it on every rank, and
    compute waits for 2 ms of that on every rank."""
    run = {"parameters": 1_000_000, "weight_dtype": "float32"}
    own = {0: [60 * MS] * 4, 1: [100 * MS] * 4, 2: [60 * MS] * 4}
    comm = {
        0: [(48 * MS, 43 * MS, 30 * MS)] * 4,
        1: [(8 * MS, 3 * MS, 2 * MS)] * 4,
        2: [(48 * MS, 45 * MS, 40 * MS)] * 4,
    }
    inputs = [
        _rank(
            r,
            node=0,
            own=[o + c[0] - 8 * MS for o, c in zip(own[r], comm[r], strict=True)],
            waiting=[0] * 4,
            comm=comm[r],
            run=run,
        )
        for r in own
    ]
    # step time: own + its NCCL time; the 40 ms beyond rank 1's 8 ms is waiting
    result = analyze_ranks(inputs)
    findings = {f.rule: f for f in result.findings}
    steps = result.tables["rank_steps"].set_index(["step", "rank"])
    assert steps.loc[(1, 0), "waiting_ns"] == 40 * MS and steps.loc[(1, 1), "waiting_ns"] == 0
    assert findings["straggler"].title.startswith("Rank 1 (node 0")
    # the gain: the least blocked rank's 2 ms of a 100 ms job step; the evidence names the 3 ms exposed too
    assert findings["exposed_communication"].gain_pct == pytest.approx(2.0)
    assert "3.00 ms on the least exposed rank" in findings["exposed_communication"].evidence
    assert findings["exposed_communication"].severity == "info"
    bandwidth = result.tables["rank_collectives"].set_index(["step", "kind"]).loc[(1, "all_reduce")]
    assert bandwidth["busy_min_ns"] == 8 * MS and bandwidth["bytes"] == 4_000_000
    algbw = 4_000_000 / 0.008 / 1e9
    assert bandwidth["algbw_gbps"] == pytest.approx(algbw) and bandwidth["busbw_gbps"] == pytest.approx(algbw * 4 / 3)
    phases = result.tables["rank_phases"].set_index(["rank", "phase"])
    assert phases.loc[(0, "collectives (NCCL)"), "waiting_ns"] == 40 * MS


def test_ranks_whose_waiting_is_not_traced_are_named():
    inputs = [_rank(r, node=0, own=[100 * MS] * 3, waiting=[0] * 3) for r in (0, 1)]
    inputs[1] = RankInput(1, 0, "h0", 3, inputs[1].tables, sources=("nvtx",))
    [finding] = analyze_ranks(inputs).findings
    assert finding.rule == "waiting_not_measured" and "rank(s) 1" in finding.title and finding.gain_pct is None


def test_bus_bandwidth_factors_are_nccl_tests():
    assert ranks.bus_bandwidth_gbps("all_reduce", 8e9, 1.0, 8) == (8.0, pytest.approx(14.0))
    assert ranks.bus_bandwidth_gbps("all_gather", 8e9, 1.0, 8)[1] == pytest.approx(7.0)
    assert ranks.bus_bandwidth_gbps("send_recv", 8e9, 1.0, 8)[1] == 8.0
    assert ranks.gradient_bytes({"parameters": 10, "weight_dtype": "bfloat16"}) == 20
    assert ranks.gradient_bytes({}) is None


def test_inputs_that_cannot_be_compared():
    one = _rank(0, 0, [MS] * 2, [0] * 2)
    with pytest.raises(RanksError, match="at least 2 profiled ranks"):
        analyze_ranks([one])
    with pytest.raises(RanksError, match=r"rank\(s\) \[0\] appear more than once"):
        analyze_ranks([one, one])
    later = _rank(1, 0, [MS] * 2, [0] * 2)
    later.tables["steps"]["step"] += 100
    with pytest.raises(RanksError, match="share no step number"):
        analyze_ranks([one, later])
    old = RankInput(2, 0, "h", 2, {"steps": one.tables["steps"]})
    with pytest.raises(RanksError, match="no step_waits table"):
        analyze_ranks([one, old])


def test_a_step_captured_twice_on_one_rank_counts_once(tmp_path):
    """A step range recorded twice on one rank (as `analyze` of the same export takes it): its first range."""
    folder = tmp_path / "capture"
    shutil.copytree(FIXTURES / "clean", folder)
    with sqlite3.connect(folder / "rank1.sqlite") as con:
        con.execute("INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS WHERE text = 'step 5'")
    result = pipeline.cross_rank_dirs([folder], tmp_path / "out", "twice")
    assert result.headline["common_steps"] == 8 and list(result.tables["step_skew"]["step"]) == list(range(3, 11))


def _node_folders(tmp_path, sources: dict[int, str], edit=None) -> list[Path]:
    """Rank N's files from FIXTURES/SOURCE, each in a folder of its own, its record edited by `edit`."""
    dirs = []
    for r, source in sources.items():
        folder = tmp_path / f"node{r}"
        folder.mkdir()
        for name in (f"rank{r}.json", f"rank{r}.sqlite", f"profile.rank{r}.metrics.jsonl"):
            shutil.copy(FIXTURES / source / name, folder / name)
        if edit:
            record = json.loads((folder / f"rank{r}.json").read_text())
            (folder / f"rank{r}.json").write_text(json.dumps({**record, **edit(r)}))
        dirs.append(folder)
    return dirs


@pytest.mark.parametrize(
    "sources, edit, message",
    [
        ({0: "clean", 1: "slow_rank1"}, None, "Slurm job ids 4101 (rank 0), 4102 (rank 1)"),
        ({0: "clean", 1: "clean"}, lambda r: {"world_size": 2 + 2 * r}, "world sizes 2 (rank 0), 4 (rank 1)"),
        ({0: "clean", 1: "clean"}, lambda r: {"world_size": 2 if r else 2**20}, "world sizes 1048576 (rank 0), 2"),
        ({0: "clean", 1: "clean"}, lambda r: {"world_size": 0}, "rank 0 cannot be in a world of 0 rank(s)"),
        ({0: "clean", 1: "clean"}, lambda r: {"rank": 2**20, "world_size": 2**20}, "cannot be in a world of 1048576"),
        ({0: "clean", 1: "clean"}, lambda r: {"rank": 0}, "records rank 0, whose record is named rank0.json"),
    ],
)
def test_ranks_of_different_runs_are_refused_before_any_analysis(tmp_path, sources, edit, message):
    dirs = _node_folders(tmp_path, sources, edit)
    assert_refused(run_sftprof("ranks", *dirs, "-o", tmp_path / "out", timeout=60), contains=message)
    assert not (tmp_path / "out").exists()


def test_a_rank_recorded_twice_is_named_by_its_files(tmp_path):
    dirs = _node_folders(tmp_path, {0: "clean"})
    message = assert_refused(run_sftprof("ranks", dirs[0], dirs[0], "-o", tmp_path / "out"), contains="twice")
    assert f"{dirs[0] / 'rank0.json'} and {dirs[0] / 'rank0.json'}" in message


def test_mixed_runs_compared_only_when_asked_and_said_so_without_bus_bandwidth():
    """--allow-mixed: a mixed_runs warning, and no bus bandwidth from world sizes that disagree."""
    run = {"parameters": 1_000_000, "weight_dtype": "float32"}
    comm = [(8 * MS, 3 * MS, 2 * MS)] * 4
    inputs = [_rank(r, node=0, own=[60 * MS] * 4, waiting=[0] * 4, comm=comm, run=run) for r in (0, 1)]
    inputs[1] = RankInput(1, 0, "h0", 2**20, inputs[1].tables, run=run)
    with pytest.raises(RanksError, match=r"world sizes 3 \(rank 0\), 1048576 \(rank 1\).*--allow-mixed"):
        analyze_ranks(inputs)
    result = analyze_ranks(inputs, allow_mixed=True)
    [mixed] = [f for f in result.findings if f.rule == "mixed_runs"]
    assert mixed.severity == "warning" and "world sizes 3 (rank 0), 1048576 (rank 1)" in mixed.title
    assert result.tables["rank_collectives"]["busbw_gbps"].isna().all()
    assert result.tables["rank_collectives"]["busy_min_ns"].notna().all()


def test_no_straggler_on_one_common_step_and_the_report_says_why():
    """A clean pair cut to one step, one rank 40% slower in it: too few steps to call it a straggler."""
    inputs = [_rank(r, node=0, own=[(100 + 40 * r) * MS], waiting=[0]) for r in (0, 1)]
    result = analyze_ranks(inputs)
    assert [f.rule for f in result.findings] == ["too_few_steps"] and result.headline["straggler_rank"] is None
    assert "share 1 step(s): no straggler is named on fewer than 2" in result.findings[0].title


def test_implausible_steps_are_left_out_and_named():
    """Zero-length steps on one rank (which made a 70.5% straggler) and a 27.8-hour step in a 0.3 s capture."""
    steps = 6
    inputs = [_rank(r, node=0, own=[100 * MS] * steps, waiting=[0] * steps) for r in (0, 1, 2)]
    inputs = [RankInput(r.rank, r.node, r.host, r.world_size, r.tables, span_ns=300 * 10**7) for r in inputs]
    zero = inputs[1].tables["steps"]
    zero.loc[zero["step"] <= 3, ["duration", "data_ns", "forward_ns", "backward_ns"]] = 0
    long = inputs[2].tables["steps"]
    long.loc[long["step"] == 6, "duration"] = 100_000 * 10**9
    result = analyze_ranks(inputs)
    assert result.headline["common_steps"] == 2 and result.headline["straggler_rank"] is None
    [note] = [f for f in result.findings if f.rule == "implausible_steps"]
    assert note.title.endswith("rank 1 3, rank 2 1")


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_rank_export_that_is_no_regular_file_is_refused_as_such(tmp_path, kind):
    """rankN.sqlite as a FIFO, a link to /dev/zero or a folder was passed over, and the refusal said that neither
    it nor the report was there."""
    folder = tmp_path / "capture"
    shutil.copytree(FIXTURES / "clean", folder)
    export = folder / "rank1.sqlite"
    export.unlink()
    {"fifo": lambda: os.mkfifo(export), "device": lambda: export.symlink_to("/dev/zero"), "folder": export.mkdir}[
        kind
    ]()
    with pytest.raises(SftprofError, match=r"rank1\.sqlite: not a regular file"):
        pipeline.cross_rank_dirs([folder], tmp_path / "out", "t")
    assert not (tmp_path / "out").exists()
