"""Training steps inferred from the GPU timeline (sftprof.analysis.step_inference) on the committed H200 captures,
checked against the `step N` NVTX ranges their loops wrote (cpu.step_table), which the inference never reads.

What the captures hold (tests/fixtures/README.md, tests/fixtures/ranks/README.md, tests/fixtures/nemo/README.md),
and so what is asserted:
- each is a cudaProfilerStart/Stop window of whole steps (2; 3 in h200_tiny_llama_bf16; 4 in the NCCL ranks), so
  the inferred count equals the number of ranges, and the period divides the kernels exactly;
- an inferred step begins where the GPU fell idle before its first kernel (the first at the capture's first host
  call) and ends where the next begins, the last with its kernels; the loops' step ranges begin as the host
  starts a step and end after a sync on its last kernel, so each step agrees with its range within 5%: in
  data-bound steps (a planted sleep for data), GPU-bound ones, and in the elementwise and gemm plants, whose
  GPU runs a step's kernels well after the host launched them;
- NeMo's host works 125 ms after the last kernel of a step, inside its range: the GPU timeline cannot see that
  in the last step, which falls short of its range by as much.
"""

from __future__ import annotations

import lzma
import shutil
import sqlite3
import time
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import cpu
from sftprof.analysis.step_inference import MIN_MATCH, STEP_COLUMNS, InferredSteps, infer_steps, steps_from_kernels
from sftprof.step_names import step_pattern
from sftprof.trace import load_trace

from conftest import edited_export, unpack_xz

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = (
    "h200_sft_clean",
    "h200_sft_data_stall",  # 100 ms sleeping for data before each micro-batch: the GPU idles
    "h200_sft_foreach_adamw",
    "h200_sft_padding",
    "h200_sft_padding_fixed",  # batches of varied length: 91% of kernels match the next step's
    "h200_sft_pageable",
    "h200_tiny_llama_bf16",
    "h200_plant_clean",
    "h200_plant_cpu_starved",
    "h200_plant_device_sync",
    "h200_plant_sync_memcpy",
    "h200_plant_elementwise",  # the host builds a 64 MB batch per micro-step while the GPU runs behind
    "h200_plant_gemm",
    "nsys2025/h200_sft_clean",
    "nsys2025/h200_plant_pageable",
)
NCCL_RANK = FIXTURES / "ranks" / "nccl_slow_rank1" / "rank0.sqlite.xz"  # DDP on 2 H200s, the rank waiting
NEMO = FIXTURES / "nemo" / "h200_nemo_lora_llama2_7b.sqlite.xz"
KERNELS = (
    'SELECT start, "end", coalesce(name_id, -1) AS name_id, coalesce(stream_id, -1) AS stream_id '
    "FROM kernels ORDER BY start"
)


@cache
def inferred(path: Path) -> tuple[InferredSteps | None, pd.DataFrame, dict[str, np.ndarray]]:
    """What infer_steps finds in a capture, its step ranges (step_table's STEP_COLUMNS) and its kernels."""
    events = load_trace(path).events
    try:
        ranges = cpu.step_table(cpu.marked_ranges(events))[list(STEP_COLUMNS)].reset_index(drop=True)
        return infer_steps(events), ranges, events.arrays(KERNELS)
    finally:
        events.close()


def capture(name: str) -> Path:
    return FIXTURES / f"{name}.sqlite"


@pytest.fixture(scope="module")
def nccl_rank(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nccl") / "rank0.sqlite"
    with lzma.open(NCCL_RANK) as packed, open(path, "wb") as out:
        shutil.copyfileobj(packed, out)
    return path


def without_nvtx(source: Path, folder: Path) -> Path:
    """A copy of a capture with every NVTX range deleted, as a loop that names no steps leaves it."""
    path = folder / source.name
    shutil.copy(source, path)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM NVTX_EVENTS")
    return path


def assert_well_formed(found: InferredSteps) -> None:
    table = found.table
    assert list(table.columns) == list(STEP_COLUMNS)
    assert all(table[column].dtype == np.int64 for column in STEP_COLUMNS)
    assert table["step"].tolist() == list(range(len(table)))
    assert (table["duration"] == table["end"] - table["start"]).all() and (table["duration"] > 0).all()
    assert (table["start"].to_numpy()[1:] >= table["end"].to_numpy()[:-1]).all()  # in time order, apart
    assert MIN_MATCH * 100 <= found.match_pct <= 100
    assert "\n" not in found.how and f"{found.kernels_per_step:,} kernels" in found.how


# ---------------------------------------------------------------- the real captures


@pytest.mark.parametrize("name", CAPTURES)
def test_the_steps_of_the_real_captures_match_their_ranges(name):
    """As many steps as ranges, the period dividing the window's kernels, each step within 5% of its range."""
    found, ranges, kernels = inferred(capture(name))
    assert found is not None
    assert_well_formed(found)
    assert len(found.table) == len(ranges) >= 2
    assert found.kernels_per_step * len(ranges) == len(kernels["start"])
    ratios = found.table["duration"] / ranges["duration"]
    assert (abs(ratios - 1) < 0.05).all(), ratios.tolist()
    assert abs(found.table["duration"].median() / ranges["duration"].median() - 1) < 0.05


def test_host_work_after_the_last_kernel_of_the_last_step_is_not_seen(tmp_path):
    """NeMo (Llama 2 7B LoRA): the first step within 5% of its range; the last as much shorter than its range as
    the host worked after the GPU's last kernel."""
    path = tmp_path / "nemo.sqlite"
    with lzma.open(NEMO) as packed, open(path, "wb") as out:
        shutil.copyfileobj(packed, out)
    found, ranges, kernels = inferred(path)
    assert_well_formed(found)
    assert len(found.table) == len(ranges) == 2
    assert abs(found.table["duration"].iloc[0] / ranges["duration"].iloc[0] - 1) < 0.05
    host_after = ranges["end"].iloc[-1] - kernels["end"].max()
    shortfall = ranges["duration"].iloc[-1] - found.table["duration"].iloc[-1]
    assert host_after > 50_000_000 and abs(shortfall / host_after - 1) < 0.1, (shortfall, host_after)


def test_ddp_steps_are_read_from_the_compute_stream(nccl_rank):
    """NCCL kernels run beside the compute stream and interleave differently each step: ordered by start, all
    kernels match the next step's for under MIN_MATCH of them, the compute stream alone for all of them."""
    found, ranges, kernels = inferred(nccl_rank)
    assert found is not None
    assert_well_formed(found)
    assert len(found.table) == len(ranges) == 4
    assert found.match_pct == 100.0 and "busiest stream" in found.how
    compute = np.bincount(kernels["stream_id"]).max()
    assert found.kernels_per_step * 4 == compute < len(kernels["start"])
    median, expected = found.table["duration"].median(), ranges["duration"].median()
    assert abs(median / expected - 1) < 0.05, (median, expected)
    assert steps_from_kernels(kernels["start"], kernels["end"], kernels["name_id"]) is None  # as one stream


@pytest.mark.parametrize("name", ["h200_sft_clean", "h200_tiny_llama_bf16"])
def test_no_nvtx_is_read(name, tmp_path):
    """With every NVTX range deleted, the same steps."""
    path = without_nvtx(capture(name), tmp_path)
    found, ranges, _ = inferred(path)
    assert ranges.empty
    expected = inferred(capture(name))[0]
    pd.testing.assert_frame_equal(found.table, expected.table)
    assert (found.kernels_per_step, found.match_pct, found.how) == (
        expected.kernels_per_step,
        expected.match_pct,
        expected.how,
    )


def test_a_capture_without_kernels_has_no_steps():
    found, ranges, kernels = inferred(capture("cpu_lock_sched"))
    assert len(kernels["start"]) == 0 and len(ranges) == 5
    assert found is None


# ---------------------------------------------------------------- edited copies and odd input

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"


def copied_onto(gpu: int) -> list[str]:
    """SQL: the first 3,000 kernels copied onto `gpu`, beside the capture's 9,962 (each its own correlation id)."""
    return [
        f"CREATE TEMP TABLE extra AS SELECT * FROM {KERNEL_TABLE} ORDER BY start LIMIT 3000",
        f"UPDATE extra SET deviceId = {gpu}, correlationId = correlationId + 1000000000",
        f"INSERT INTO {KERNEL_TABLE} SELECT * FROM extra",
    ]


@pytest.mark.parametrize(
    ("edits", "busiest"),
    [(copied_onto(1), 0), ([f"UPDATE {KERNEL_TABLE} SET deviceId = 1", *copied_onto(0)], 1)],
)
def test_of_several_gpus_the_busiest_is_read(edits, busiest, tmp_path):
    found = inferred(edited_export(tmp_path, KERNEL_TABLE, edits))[0]
    expected = inferred(capture("h200_sft_clean"))[0]
    pd.testing.assert_frame_equal(found.table, expected.table)
    assert f"the timeline of GPU {busiest} (the busiest of 2)" in found.how


def test_kernels_without_a_name(tmp_path):
    """A name missing from some kernels is one name more; missing from all, no sequence."""
    name_of_some = f"(SELECT demangledName FROM {KERNEL_TABLE} ORDER BY start LIMIT 1 OFFSET 100)"
    some = inferred(
        edited_export(
            tmp_path,
            KERNEL_TABLE,
            [f"UPDATE {KERNEL_TABLE} SET demangledName = NULL WHERE demangledName = {name_of_some}"],
        )
    )
    assert (some[2]["name_id"] == -1).sum() > 0
    pd.testing.assert_frame_equal(some[0].table, inferred(capture("h200_sft_clean"))[0].table)
    (tmp_path / "all").mkdir()
    none = inferred(edited_export(tmp_path / "all", KERNEL_TABLE, [f"UPDATE {KERNEL_TABLE} SET demangledName = NULL"]))
    assert none[0] is None


def test_no_repeating_structure_gives_none():
    rng = np.random.default_rng(0)
    times = np.arange(100_000, dtype=np.int64) * 1_000
    for names in (
        np.zeros(0, dtype=np.int64),
        np.array([3]),
        np.full(5_000, 7),  # all one name
        rng.integers(0, 200, 100_000),  # no order
        np.tile([1, 2], 2_500),  # a period of 2 kernels: no training step
    ):
        assert steps_from_kernels(times[: len(names)], times[: len(names)] + 500, names) is None


def test_steps_with_other_work_between_some_of_them():
    """8 steps of 300 kernels, a 1 ms idle before each (the host's part), and after the 6th an evaluation of 600
    kernels (six passes over the step's first 100, a forward alone): no shift of the whole sequence matches 80% of it, yet the step recurs
    8 times, each to the next one's start, the evaluation inside the step before it. (With several whole cycles of
    an evaluation every N steps the sequence repeats with the cycle: each step found is N iterations.)"""
    rng = np.random.default_rng(1)
    step = rng.integers(0, 300, 300)
    names, gaps = [], []
    for i in range(8):
        names += [step] + ([np.concatenate([rng.permutation(step[:100]) for _ in range(6)])] if i == 5 else [])
        gaps += [1_000_000] + [0] * 299 + ([0] * 600 if i == 5 else [])
    names = np.concatenate(names)
    start = np.cumsum(np.array(gaps, dtype=np.int64) + 1_000)
    found = steps_from_kernels(start, start + 1_000, names)
    assert_well_formed(found)
    assert found.kernels_per_step == 300 and len(found.table) == 8
    kernels = np.diff(np.searchsorted(start, [*found.table["start"], start[-1] + 1]))
    assert kernels.tolist() == [900 if i == 5 else 300 for i in range(8)]
    assert "600 other kernels between recurrences" in found.how
    # a step's own kernels in another order between two recurrences are a step missed, not other work: no steps
    names[2400:2700] = rng.permutation(names[2400:2700])
    assert steps_from_kernels(start, start + 1_000, names) is None


def test_an_evaluation_every_fourth_step_recurs_between_the_steps(tmp_path):
    """The Gemma's evaluation over 4 batches every 4th iteration (tests/fixtures/foreign/gemma_blind), NVTX deleted:
    the steps of its `minibatch N` ranges, the evaluation's step too, with the same kernels and within 5%."""
    path = unpack_xz(FIXTURES / "foreign" / "gemma_blind" / "eval_every_4.sqlite.xz", tmp_path / "eval.sqlite")
    events = load_trace(path).events
    try:
        ranges = cpu.step_table(cpu.marked_ranges(events, step_pattern(r"minibatch (\d+)")))
    finally:
        events.close()
    found, _, kernels = inferred(
        without_nvtx(path, tmp_path / "stripped" if (tmp_path / "stripped").mkdir() else tmp_path / "stripped")
    )
    assert_well_formed(found)
    assert len(found.table) == len(ranges) == 4
    assert np.allclose(found.table["duration"], ranges["duration"], rtol=0.05)
    firsts = np.searchsorted(kernels["start"], [*found.table["start"], kernels["start"][-1] + 1])
    by_range = np.searchsorted(kernels["start"], [*ranges["start"], kernels["start"][-1] + 1])
    assert (np.diff(firsts) == np.diff(by_range)).all()


def test_a_long_capture_cut_mid_step():
    """h200_sft_data_stall's first step repeated 400 times (2M kernels, each step as long as its first), the
    capture cut 7 kernels into the first and 100 before the end of the last: 398 whole steps, each holding the
    step's own kernels from its first on, after the host's pause for data, in a few seconds at most."""
    found, _, kernels = inferred(capture("h200_sft_data_stall"))
    period, steps = found.kernels_per_step, 400
    spacing = kernels["start"][period] - kernels["start"][0]
    offsets = np.arange(steps, dtype=np.int64)[:, None] * spacing
    start = (kernels["start"][:period] + offsets).ravel()[7:-100]
    end = (kernels["end"][:period] + offsets).ravel()[7:-100]
    names = np.tile(kernels["name_id"][:period], steps)[7:-100]
    started = time.perf_counter()
    long = steps_from_kernels(start, end, names)
    assert time.perf_counter() - started < 5  # 0.15 s here (10M kernels: about 1 s)
    assert_well_formed(long)
    assert long.kernels_per_step == period and len(long.table) == steps - 2
    first_kernels = np.searchsorted(start, long.table["start"].to_numpy())
    assert ((first_kernels + 7) % period == 0).all()  # each step's own first kernel is the first in its window
    idle_before = start[first_kernels] - long.table["start"].to_numpy()
    assert (idle_before > 100_000_000).all()  # the host's 100 ms for data is in the step
    assert (long.table["duration"].iloc[:-1] == spacing).all()
    assert "longest recurring GPU idle gap" in long.how
