"""The report's sections for the new analyses, with and without CUDA, after the CSV hand-off, and the
loader on a newer nsys export (META_DATA_EXPORT, enum labels, GPU_METRICS) built here."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof import results
from sftprof.analysis import analyze
from sftprof.report import RankReport, render_html
from sftprof.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
GPU_FIXTURE = FIXTURES / "h200_tiny_llama_bf16.sqlite"
SCHED_FIXTURE = FIXTURES / "cpu_lock_sched.sqlite"
QUESTIONS = [
    "Which kernels dominate?",
    "What share of GPU time is memory transfer?",
    "Is the GPU work compute- or memory-bound?",
    "Where is the GPU idle, and why?",
    "What do the threads do, and where do they block?",
    "How busy is each CPU core?",
    "CUDA API and synchronization",
    "NVTX ranges",
]


def plot_titles(html: str) -> list[str]:
    """Matplotlib writes each axes title as an SVG text element (svg.fonttype none)."""
    return re.findall(r"<text[^>]*>([^<]*)</text>", html)


@pytest.fixture(scope="module")
def gpu_analysis():
    return analyze(load_trace(GPU_FIXTURE))


def test_gpu_report_answers_every_question(gpu_analysis):
    html = render_html([RankReport("", gpu_analysis)], "h200")
    for question in QUESTIONS:
        assert question in html
    titles = " ".join(plot_titles(html))
    for plot in ("Kernel families", "Memory operations by kind", "GPU utilisation over time", "What each thread did"):
        assert plot in titles
    assert "gpumemsizesum" in html and "113.246" in html  # the DtoD total in MB, as nsys prints it
    assert "Host-bound: the GPU is busy 5.3%" in html
    assert "own code (no traced call)" in html  # the gap-cause table
    assert "(no NVTX range, pt_autograd_0 (autograd, tid 566))" in html
    assert "--cpuctxsw=process-tree" in html  # the CPU-core section says how to get it
    assert not re.search(r"""(src|href)=["']https?:""", html) and "<script" not in html  # nothing to fetch


def test_report_renders_the_same_from_saved_csv(gpu_analysis, tmp_path):
    direct = render_html([RankReport("", gpu_analysis)], "h200")
    reloaded = results.load(results.save(gpu_analysis, tmp_path / "analysis"))
    again = render_html([RankReport("", reloaded)], "h200")
    assert again.count('<div class="plot">') == direct.count('<div class="plot">') >= 9
    assert plot_titles(again) == plot_titles(direct)


def test_cpu_only_report_says_what_is_absent_and_how_to_get_it():
    analysis = analyze(load_trace(SCHED_FIXTURE))
    html = render_html([RankReport("", analysis)], "cpu")
    assert html.count("No CUDA calls were recorded") >= 4  # kernels, memory, verdict, idle, API sections
    titles = " ".join(plot_titles(html))
    assert "CPU cores: share of time running the profiled program" in titles and "What each thread did" in titles
    assert "running on a CPU" in titles  # scheduling data: the running share is drawn
    assert "waits for locks" in html


def test_report_of_an_older_analysis_without_the_new_tables(gpu_analysis):
    old = type(gpu_analysis)(
        source_path="old",
        span_ns=1,
        sources=["cuda"],
        tables={
            k: v
            for k, v in gpu_analysis.tables.items()
            if k in ("kernels", "memops", "cuda_api", "gpu_busy", "osrt", "nvtx", "steps", "phases", "threads")
        },
        findings=gpu_analysis.findings,
        headline={},
    )
    html = render_html([RankReport("", old)], "old")
    assert "Which kernels dominate?" in html and "Kernel time share" in " ".join(plot_titles(html))


# ---------------------------------------------------------------- a newer export, built here

NEWER_SCHEMA = """
CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2025.3.1.90'), ('EXPORT_SCHEMA_VERSION', '3.18.0');
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO StringIds VALUES (1, 'nvjet_sm90_tst_128x128_64x4_1x2_h_bz_TNT'), (2, 'cudaLaunchKernel_v7000'),
                             (3, 'cudaMemcpyAsync_v3020');
CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'CUDA_MEMCPY_KIND_HTOD', 'Host-to-Device');
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUDA_MEM_KIND VALUES (0, 'PAGEABLE', 'Pageable'), (2, 'DEVICE', 'Device');
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER,
    streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, shortName INTEGER,
    mangledName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, "end" INTEGER, deviceId INTEGER, contextId INTEGER,
    streamId INTEGER, correlationId INTEGER, globalPid INTEGER, bytes INTEGER, copyKind INTEGER, srcKind INTEGER,
    dstKind INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, "end" INTEGER, eventClass INTEGER, globalTid INTEGER,
    correlationId INTEGER, nameId INTEGER, returnValue INTEGER, callchainId INTEGER);
CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT, metricId INTEGER,
    metricName TEXT);
INSERT INTO TARGET_INFO_GPU_METRICS VALUES (65536, 0, 'GH100', 1, 'SM Issue [Throughput %]'),
    (65536, 0, 'GH100', 2, 'Tensor Active [Throughput %]'), (65536, 0, 'GH100', 3, 'DRAM Read Bandwidth [Throughput %]'),
    (65536, 0, 'GH100', 4, 'DRAM Write Bandwidth [Throughput %]');
CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);
"""
PID = 4242
GLOBAL_PID, GLOBAL_TID = (1 << 56) | (PID << 24), (1 << 56) | (PID << 24) | PID


@pytest.fixture
def newer_export(tmp_path) -> Path:
    path = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(NEWER_SCHEMA)
    for i in range(10):  # ten 90 µs GEMMs, 10 µs apart: busy 90%
        start = 1_000_000 + i * 100_000
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,0,1,7,?,?,1,1,NULL,8,8,1,128,1,1)",
            (start, start + 90_000, i + 1, GLOBAL_PID),
        )
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,0,?,?,2,0,0)",
            (start - 20_000, start - 12_000, GLOBAL_TID, i + 1),
        )
    conn.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (900000, 905000, 0, 1, 7, 99, ?, 65536, 1, 0, 2)", (GLOBAL_PID,)
    )
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (880000, 906000, 0, ?, 99, 3, 0, 0)", (GLOBAL_TID,))
    for t in range(1_000_000, 2_000_000, 10_000):  # sampled every 10 µs; values while busy and while idle
        busy = (t - 1_000_000) % 100_000 < 90_000
        for metric, value in ((1, 35), (2, 80), (3, 10), (4, 5)) if busy else ((1, 0), (2, 0), (3, 0), (4, 0)):
            conn.execute("INSERT INTO GPU_METRICS VALUES (?, ?, 65536, ?, ?)", (t, t, metric, value))
    conn.commit()
    conn.close()
    return path


def test_newer_export_names_and_gpu_metrics(newer_export):
    tables = load_trace(newer_export)
    [copy] = tables.memops.itertuples()
    assert (copy.operation, copy.copy_kind, copy.src_kind, copy.dst_kind) == (
        "[CUDA memcpy Host-to-Device]",
        "HtoD",
        "Pageable",
        "Device",
    )  # cuda_gpu_mem_time_sum's naming
    assert "gpu_metrics" in tables.sources and set(tables.gpu_metrics["device_id"]) == {0}
    assert tables.cuda_api["name"].tolist()[:2] == ["cudaMemcpyAsync", "cudaLaunchKernel"]
    result = analyze(tables)
    verdict = {f.rule: f for f in result.findings}["bound_verdict"]
    assert verdict.title == "The GPU work is compute-bound (confidence high)"
    assert "tensor cores 80%" in verdict.evidence
    evidence = result.tables["bound_evidence"].set_index("evidence")
    assert evidence.loc["tensor cores active, % of peak", "value"] == 80.0  # only samples while busy count
    assert evidence.loc["GPU busy, % of its active span", "value"] == pytest.approx(100 * 905_000 / 1_090_000)
    assert {f.rule for f in result.findings} >= {"pageable_memcpy", "interconnect"}


def test_damaged_metric_samples_are_left_out_and_counted(newer_export):
    with sqlite3.connect(newer_export) as conn:
        conn.execute(f"INSERT INTO GPU_METRICS VALUES (1, {2**60}, 65536, 2, 99)")  # beyond any capture
        conn.execute("INSERT INTO GPU_METRICS VALUES (1, NULL, 65536, 2, 99)")
        conn.execute("INSERT INTO GPU_METRICS VALUES (1050000, 1050000, 65536, 77, 99)")  # no such metric
    tables = load_trace(newer_export)
    assert tables.dropped_rows["gpu_metrics"] == 2
    assert len(tables.gpu_metrics) == 400 and tables.gpu_metrics["value"].max() == 80


def test_metric_means_read_in_batches_equal_pandas_over_every_sample(monkeypatch):
    """Two devices that ran kernels and one that did not, values while busy and idle, a sample without a value, two ids whose names differ only
    in case (one mean, as before), batches of one DuckDB vector (2,048 rows)."""
    from sftprof.analysis import boundness, gpu
    from sftprof.trace import events as events_module
    from sftprof.trace.events import EventStore

    rng = np.random.default_rng(7)
    n = 20_000
    samples = pd.DataFrame(
        {
            "timestamp": rng.integers(0, 1_000_000, n),
            "device_id": rng.integers(0, 3, n),  # device 2 ran nothing: its samples count for nothing
            "metric": rng.choice(["SM Issue [Throughput %]", "sm issue [throughput %]", "DRAM Read"], n),
            "value": rng.integers(0, 100, n).astype(float),
        }
    )
    starts = np.sort(rng.choice(1_000_000, 400, replace=False))
    samples.loc[5, ["timestamp", "device_id", "value"]] = [starts[0], 0, np.nan]  # while device 0 is busy
    kernels = pd.DataFrame({"start": starts, "end": starts + 700, "name": "k", "device_id": np.arange(400) % 2})
    store = EventStore.from_frames(kernels=kernels, gpu_metrics=samples)
    busy = gpu.busy_by_device(store)
    monkeypatch.setattr(events_module, "BATCH_VECTORS", 1)
    means = boundness.metric_means_while_busy(store, busy)

    inside = []
    for device, b in busy.items():
        mine = samples[samples["device_id"] == device]
        times = mine["timestamp"].to_numpy()
        merged = b.merged.frame()
        index = np.searchsorted(merged["start"].to_numpy(), times, side="right") - 1
        inside.append(mine[(index >= 0) & (times < merged["end"].to_numpy()[np.maximum(index, 0)])])
    inside = pd.concat(inside)
    expected = inside.groupby(inside["metric"].str.lower())["value"].mean().to_dict()
    assert len(inside) > 1000 and set(means) == set(expected) == {"sm issue [throughput %]", "dram read"}
    assert means == pytest.approx(expected, rel=1e-12)
