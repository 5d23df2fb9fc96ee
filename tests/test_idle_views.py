"""The sync, copy, data and lock rules as views of the idle_causes table (analysis/views.py): each row of the
table counts toward one finding at most, and each such finding's gain is the median share of the step its rows
hold, on committed captures where the old rules measured the same idle time in models of their own."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import analyze, gains, idle, views
from sftprof.analysis.registry import RULES
from sftprof.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = ("h200_sft_data_stall", "h200_plant_sync_memcpy", "h200_tiny_llama_bf16")
# The rules whose gain is their rows of the table, and the cause each can take rows of.
VIEW_RULES = {
    "data_stall": set(idle.CAUSE_NAMES),
    "sync_memcpy": {idle.SYNCHRONIZATION},
    "sync_in_steps": {idle.SYNCHRONIZATION},
    "sync_memset": {idle.COPY},
    "pageable_memcpy": {idle.COPY},
    "lock_wait": {idle.THREAD_WAIT, idle.OS_CALL},
} | {cause.rule: {cause.cause} for cause in idle.FINDING_CAUSES}
VIEW_RULES[idle.GROUP_LOOP.rule] = {idle.SYNCHRONIZATION, idle.HOST_OVERHEAD}


@pytest.fixture(scope="module")
def analysed() -> dict:
    """Each capture's analysis and its idle_views, computed again from the saved idle_causes and steps, and the
    time of the kernels that made the values its host read (gains.read_work)."""
    results = {}
    for name in CAPTURES:
        tables = load_trace(FIXTURES / f"{name}.sqlite")
        try:
            analysis = analyze(tables)
            table = views.idle_views(analysis.tables["idle_causes"], analysis.tables["steps"])
            results[name] = (analysis, table, int(gains.read_work(tables.events)["ns"].sum()))
        finally:
            tables.events.close()
    return results


def share(analysis, rows) -> float:
    """The median over steps of the rows' idle time, as % of the median step."""
    steps = analysis.tables["steps"].sort_values("start")
    per_step = rows.groupby("step")["idle_ns"].sum().reindex(steps["step"], fill_value=0)
    return 100 * float(np.median(per_step)) / statistics.median(steps["duration"])


@pytest.mark.parametrize("name", CAPTURES)
def test_each_idle_finding_is_its_rows_share_and_no_row_counts_twice(analysed, name):
    analysis, table, read_ns = analysed[name]
    causes = analysis.tables["idle_causes"]
    # the same rows as the saved table, each with one rule at most: a step's rows still add up to its idle
    assert len(table) == len(causes) and table["idle_ns"].sum() == causes["idle_ns"].sum()
    assert table.groupby("step")["idle_ns"].sum().equals(causes.groupby("step")["idle_ns"].sum())
    assert set(table["rule"]) <= {"", *VIEW_RULES}
    for rule, rows in table.groupby("rule"):
        if rule:
            assert set(rows["cause"]) <= VIEW_RULES[rule], rule
    assert set(table.loc[table["rule"] == "", "cause"]) <= {idle.QUEUED, idle.UNATTRIBUTED}
    found = {f.rule: f for f in analysis.findings}
    viewed = [rule for rule in VIEW_RULES if rule in found]
    assert viewed
    for rule in viewed:
        rows_share = share(analysis, table[table["rule"] == rule])
        if rule == "sync_in_steps":  # and the kernels that made the values read, in no step more than all of them
            most = 100 * read_ns / statistics.median(analysis.tables["steps"]["duration"])
            assert rows_share - 1e-3 <= found[rule].gain_pct <= rows_share + most + 1e-3
        else:
            assert found[rule].gain_pct == pytest.approx(rows_share, abs=1e-3), rule
    # findings of disjoint rows: their per-step idle adds up to no more than the step's
    steps = analysis.tables["steps"].sort_values("start")["step"]
    claimed = table[table["rule"].isin(viewed)].groupby("step")["idle_ns"].sum().reindex(steps, fill_value=0)
    assert (claimed <= causes.groupby("step")["idle_ns"].sum().reindex(steps, fill_value=0)).all()


def test_the_sync_finding_is_the_sync_share_the_data_ranges_do_not_hold(analysed):
    """h200_sft_data_stall: the step's three syncs leave the GPU idle mostly while the thread is in `data` (the
    data stall's rows); the sync finding's gain is the rest, not the idle after each call by a model of its own
    (2.95% of the step before, counting what the data stall counted too)."""
    analysis, _, _ = analysed["h200_sft_data_stall"]
    causes = analysis.tables["idle_causes"]
    found = {f.rule: f for f in analysis.findings}
    syncs = causes[(causes["cause"] == idle.SYNCHRONIZATION) & (causes["range"] != "data")]
    in_data = causes[causes["range"] == "data"]
    assert found["sync_in_steps"].gain_pct == pytest.approx(share(analysis, syncs), abs=1e-3)
    assert found["data_stall"].gain_pct == pytest.approx(share(analysis, in_data), abs=1e-3)
    assert found["sync_in_steps"].gain_pct < 0.5 and found["data_stall"].gain_pct > 30
    assert (causes.loc[causes["range"] == "data", "cause"] == idle.SYNCHRONIZATION).any()  # not counted twice


def test_every_view_rule_reads_the_views_and_the_idle_rule_no_longer_reads_the_raw_table():
    inputs = {rule.name: rule.inputs for rule in RULES}
    for rule in ("sync_memcpy", "sync_memset", "sync_in_steps", "pageable_memcpy", "data_stall", "lock_wait"):
        assert "idle_views" in inputs[rule], rule
    [idle_rule] = [rule for rule in RULES if rule.check is idle.idle_findings]
    assert idle_rule.inputs[0] == "idle_views" and views.RULE == idle.VIEW_COLUMN


@pytest.mark.parametrize("gemms, expected", [(15, ["sync_in_steps", "launch_bound"]), (16, ["group_loop"] * 2)])
def test_a_loop_over_groups_takes_the_syncs_and_the_launch_overhead(gemms, expected):
    """From idle.GROUP_LOOP_GEMMS GEMMs a step sized by the data, a step's synchronizations and launch overhead are
    one loop's: group_loop's rows, not sync_in_steps' and launch_bound's."""
    causes = pd.DataFrame(
        {
            "step": [1, 1],
            "cause": [idle.SYNCHRONIZATION, idle.HOST_OVERHEAD],
            "source": [idle.SOURCES[idle.CUDA_API], idle.SOURCES[idle.OWN]],
            "name": ["cudaStreamSynchronize", "loss_fn"],
            "range": ["loss_fn", "loss_fn"],
            "idle_ns": [10, 20],
            "pieces": [1, 1],
        }
    )
    steps = pd.DataFrame({"step": [1], "start": [0], "end": [100], "duration": [100]})
    table = views.idle_views(causes, steps, data_sized_gemms=gemms)
    assert table[views.RULE].tolist() == expected
