"""nsys 2025.3.1 as a target: its exports (tests/fixtures/nsys2025/README.md) load, and sftprof's
summaries of them equal, row for row and in order, the CSVs that 2025.3.1's own `nsys stats` wrote
on the same files (committed beside them: CI has only nsys 2022.4, which cannot run 2025's reports).
Numbers are compared as nsys prints them (conftest.as_nsys_rows: times in ns, averages, medians and
standard deviations to 0.1, shares to 0.1%; sizes in MB of 10^6 bytes to 0.001).

NVTX names, a documented mapping: 2025.3's nvtx_sum and nvtx_gpu_proj_sum print every range as
DOMAIN:NAME, the default domain's name being empty, so the trainer's `step 10` (NVTX_EVENTS.domainId
0, no domain-create row) is `:step 10`; a range of a named domain is `CCCL:cub::DeviceRadixSort` in
both releases (2022.4 prints the default domain's ranges without a prefix). The exports themselves
hold the same NVTX rows under both releases. sftprof keeps 2022.4's naming whatever nsys captured:
it is the name the program gave, the analyses find steps and phases (`data`, `forward`, ...) by it,
and `sftprof compare` lines up captures made by different nsys releases. The tests map sftprof's
default-domain names to 2025's with `printed_by_2025` below, the domain read from the export.
"""

from __future__ import annotations

import csv
import functools
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from sftprof.analysis import analyze, nvtx
from sftprof.analysis.stats import sqlite_round
from sftprof.capture import nsys
from sftprof.trace import load_trace
from sftprof.trace.nsys import sqlite_pages, store
from sftprof.trace.nsys.nsys_export import EXPORT_KERNEL_COLUMNS

from conftest import as_nsys_rows, assert_refused, run_sftprof

FIXTURES = Path(__file__).parent / "fixtures" / "nsys2025"
CAPTURES = sorted(path.stem for path in FIXTURES.glob("*.sqlite"))
RELEASE = 2025
# sftprof table -> the columns that name its rows, in the order 2025's CSV prints them.
SUMMARIES = {
    "kernels_by_name": ["kernel"],
    "memops": ["operation"],
    "cuda_api": ["name"],
    "osrt": ["name"],
    "nvtx": ["style", "name"],
}
# The columns of CUPTI_ACTIVITY_KIND_KERNEL and _RUNTIME that store.from_nsys_sqlite copies.
KERNEL_COLUMNS = list(EXPORT_KERNEL_COLUMNS)
RUNTIME_COLUMNS = ["start", "end", "nameId", "globalTid", "correlationId"]


def sqlite_path(name: str) -> Path:
    return FIXTURES / f"{name}.sqlite"


def stats_csv(name: str, report: str) -> list[dict]:
    """The rows of 2025.3.1's `nsys stats -r REPORT` on capture `name` (NAME.REPORT.csv)."""
    with open(FIXTURES / f"{name}.{report}.csv", newline="") as f:
        return list(csv.DictReader(f))


def query(name: str, sql: str) -> list[tuple]:
    with sqlite3.connect(f"{sqlite_path(name).resolve().as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


@functools.cache
def tables(name: str):
    return load_trace(sqlite_path(name))


@functools.cache
def analysis(name: str):
    return analyze(tables(name))


def default_domain_names(name: str) -> set[str]:
    """Names of the export's NVTX ranges in the default domain (domainId 0 or none)."""
    return {
        text
        for (text,) in query(
            name,
            """
        SELECT coalesce(s.value, e.text) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
        WHERE e.eventType IN (59, 60, 70, 71) AND coalesce(e.domainId, 0) = 0""",
        )
    }


def printed_by_2025(name: str, capture: str) -> str:
    """sftprof's name of an NVTX range as nsys 2025.3's reports print it (see the module docstring)."""
    return f":{name}" if name in default_domain_names(capture) else name


def instance_sum(name: str, report: str, column: str) -> int:
    return sum(int(row[column]) for row in stats_csv(name, report))


# ---------------------------------------------------------------- equal to 2025.3.1's nsys stats


@pytest.mark.parametrize("table", list(SUMMARIES))
@pytest.mark.parametrize("name", CAPTURES)
def test_summary_equals_nsys_2025_stats_row_for_row(name, table):
    """kernels_by_name = cuda_gpu_kern_sum (one row per kernel name), memops = cuda_gpu_mem_time_sum
    (`[CUDA memcpy Host-to-Device]`: the naming of the release that wrote the export), cuda_api =
    cuda_api_sum, osrt = osrt_sum, nvtx = nvtx_sum (names mapped: module docstring); in nsys's order."""
    report = nsys.stats_report(table, RELEASE)
    summary = analysis(name).tables[table]
    if table == "nvtx":
        summary = summary.assign(name=[printed_by_2025(n, name) for n in summary["name"]])
    theirs = [tuple(row.values()) for row in stats_csv(name, report)]
    ours = as_nsys_rows(summary, SUMMARIES[table])
    assert ours == set(theirs) and len(ours) == len(theirs) > 0
    assert list(summary[SUMMARIES[table][-1]]) == [row[-1] for row in theirs]  # and in the same order


@pytest.mark.parametrize("name", CAPTURES)
def test_memory_sizes_equal_cuda_gpu_mem_size_sum(name):
    """Bytes per memory operation, every column as 2025 prints it (MB of 10^6 bytes, three decimals)."""

    def megabytes(value):
        return f"{value / 1e6:.3f}"

    ours = [
        (
            megabytes(r.total_bytes),
            str(r.count),
            megabytes(r.avg_bytes),
            megabytes(r.med_bytes),
            megabytes(r.min_bytes),
            megabytes(r.max_bytes),
            megabytes(r.stddev_bytes),
            r.operation,
        )
        for r in analysis(name).tables["memops_by_size"].itertuples()
    ]
    assert ours == [tuple(row.values()) for row in stats_csv(name, nsys.stats_report("memops_by_size", RELEASE))]


def _gpu_ops_by_range(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every kernel and memory operation with the NVTX ranges its launching call lies in (the call joined on
    (pid, correlation_id), its ranges as sftprof assigns them, nvtx.enclosing_ranges): (operations, (call,
    range) pairs)."""
    t = tables(name)
    columns = ["start", "end", "pid", "correlation_id"]
    ops = pd.concat([t.kernels[columns].assign(kernel=True), t.memops[columns].assign(kernel=False)], ignore_index=True)
    calls = ops.merge(t.cuda_api[[*columns, "global_tid"]], on=["pid", "correlation_id"], suffixes=("", "_call"))
    calls = calls.assign(op_start=calls["start"], op_end=calls["end"], start=calls["start_call"], end=calls["end_call"])
    return calls, nvtx.enclosing_ranges(t.events, calls)


@pytest.mark.parametrize("name", CAPTURES)
def test_nvtx_gpu_ops_per_range_equal_nvtx_gpu_proj_sum(name):
    """Total GPU Ops of nvtx_gpu_proj_sum: the kernels the saved `nvtx_gpu` table counts in each range
    (inclusive_kernels) plus the memory operations launched in it; the same ranges have GPU work."""
    calls, pairs = _gpu_ops_by_range(name)
    memops = pairs[~calls.loc[pairs["call"], "kernel"].to_numpy()]
    memops_by_name = memops["name"].value_counts()
    projection = analysis(name).tables["nvtx_gpu"]
    named = projection[~projection["range"].str.startswith("(")].set_index("range")["inclusive_kernels"]
    ours = named.add(memops_by_name, fill_value=0).astype("int64")
    ours = {printed_by_2025(r, name): int(n) for r, n in ours.items() if n}
    theirs = {row["Range"]: int(row["Total GPU Ops"]) for row in stats_csv(name, "nvtx_gpu_proj_sum")}
    assert ours == theirs and theirs


@pytest.mark.parametrize("name", CAPTURES)
def test_range_projection_from_sftprofs_launch_assignment_equals_nvtx_gpu_proj_sum(name):
    """Each range instance projected onto the GPU (first operation's start to last one's end, of the
    operations launched in it), from sftprof's assignment of launches to ranges: every column of
    nvtx_gpu_proj_sum but the two about nesting (Avg Range Lvl, Avg Num Child). sftprof saves no
    projection table: this checks, per range instance, the assignment its nvtx_gpu table is built on."""
    calls, pairs = _gpu_ops_by_range(name)
    # a range instance: its thread, times and name (the tables' ranges have no two alike)
    ranges = tables(name).nvtx
    instance = ["global_tid", "start", "end", "name"]
    assert not ranges.duplicated(instance).any()
    ops = pd.DataFrame(
        {
            "global_tid": calls.loc[pairs["call"], "global_tid"].to_numpy(),
            "start": pairs["start"].to_numpy(),
            "end": pairs["end"].to_numpy(),
            "name": pairs["name"].to_numpy(),
            "op_start": calls.loc[pairs["call"], "op_start"].to_numpy(),
            "op_end": calls.loc[pairs["call"], "op_end"].to_numpy(),
        }
    )
    instances = ops.groupby(instance).agg(first=("op_start", "min"), last=("op_end", "max"), ops=("op_start", "size"))
    instances = instances.reset_index().merge(ranges.astype({"name": object}), on=instance, validate="one_to_one")
    instances = instances.assign(proj=instances["last"] - instances["first"])

    def rounded(value: float) -> str:
        return f"{sqlite_round(pd.Series([value])).iloc[0]:.1f}"

    ours = set()
    for (range_name, style), group in instances.groupby(["name", "style"]):
        proj = group["proj"]
        ours.add(
            (
                printed_by_2025(range_name, name),
                style,
                str(proj.sum()),
                str(group["duration"].sum()),
                str(len(group)),
                rounded(proj.mean()),
                rounded(proj.median()),
                str(proj.min()),
                str(proj.max()),
                rounded(proj.std() if len(proj) > 1 else 0.0),
                str(group["ops"].sum()),
            )
        )
    theirs = {tuple(row.values())[:11] for row in stats_csv(name, "nvtx_gpu_proj_sum")}
    assert ours == theirs and theirs


def test_nvtx_naming_rule_holds_in_the_exports():
    """The mapping's ground: 2025 prefixes `:` exactly to the default domain's ranges, and prints a
    named domain's ranges as DOMAIN:NAME; the trainer's own ranges are all in the default domain."""
    for name in CAPTURES:
        printed = {row["Range"] for row in stats_csv(name, "nvtx_sum")}
        default = default_domain_names(name)
        assert {f":{n}" for n in default} <= printed and {"data", "forward", "backward", "optimizer"} <= default
        named = printed - {f":{n}" for n in default}
        assert all(not n.startswith(":") and ":" in n for n in named), named
        assert named == {n for n in analysis(name).tables["nvtx"]["name"] if n not in default}
    assert any(row["Range"].startswith("CCCL:") for row in stats_csv("h200_sft_clean", "nvtx_sum"))


# ---------------------------------------------------------------- the 2025 schema, through both readers


@pytest.mark.parametrize("name", CAPTURES)
def test_export_has_the_2025_schema_differences(name):
    """What the fixtures README lists, present in every file, so that the tests below exercise it."""
    names = {n for (n,) in query(name, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"META_DATA_EXPORT", "ENUM_CUDA_KERNEL_LAUNCH_TYPE"} <= names
    assert not {"EXPORT_META_DATA", "ENUM_CUDA_KRENEL_LAUNCH_TYPE"} & names
    kernel = [c for (c,) in query(name, "SELECT name FROM pragma_table_info('CUPTI_ACTIVITY_KIND_KERNEL')")]
    assert kernel.index("contextId") < kernel.index("greenContextId") < kernel.index("demangledName")  # mid-table
    sync = {c for (c,) in query(name, "SELECT name FROM pragma_table_info('CUPTI_ACTIVITY_KIND_SYNCHRONIZATION')")}
    assert {"greenContextId", "deprecatedSyncType", "eventSyncId", "syncType"} <= sync
    assert dict(query(name, "SELECT name, value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'")) == {
        "EXPORT_PRODUCT_VERSION": "2025.3.2.0"
    }


@pytest.mark.parametrize("name", CAPTURES)
def test_page_decoder_reads_the_2025_tables(name):
    """sqlite_pages decodes KERNEL past greenContextId and RUNTIME (no fallback): as many rows as the
    CSVs count kernels and CUDA API calls."""
    for table, columns, report, column in (
        ("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLUMNS, "cuda_gpu_kern_sum", "Instances"),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", RUNTIME_COLUMNS, "cuda_api_sum", "Num Calls"),
    ):
        chunks = list(sqlite_pages.int_columns(sqlite_path(name), table, columns))
        assert sum(len(chunk) for chunk in chunks) == instance_sum(name, report, column)
        assert all((chunk["end"] >= chunk["start"]).all() for chunk in chunks)


@pytest.mark.parametrize("name", CAPTURES)
def test_duckdb_fallback_loads_the_same_events(name, monkeypatch):
    """With the page decoder refusing (as it does for a file it does not read), DuckDB's SQLite reader
    copies the same kernels and calls: counts equal the CSVs', summaries equal the decoder's."""
    loaded = tables(name)
    assert loaded.events.count("kernels") == instance_sum(name, "cuda_gpu_kern_sum", "Instances")
    assert loaded.events.count("cuda_api") == instance_sum(name, "cuda_api_sum", "Num Calls")

    def refuse(*args, **kwargs):
        raise sqlite_pages.Unsupported("refused by the test")

    monkeypatch.setattr(sqlite_pages, "int_columns", refuse)
    strings = pd.DataFrame(query(name, "SELECT id, CAST(value AS TEXT) FROM StringIds"), columns=["id", "value"])
    present = {n for (n,) in query(name, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    fallback = store.from_nsys_sqlite(sqlite_path(name), present, strings, None)
    try:
        assert fallback.count("kernels") == loaded.events.count("kernels")
        assert fallback.count("cuda_api") == loaded.events.count("cuda_api")
        assert fallback.frame("kernels").equals(loaded.kernels)
        assert fallback.frame("cuda_api").equals(loaded.cuda_api)
    finally:
        fallback.close()


@pytest.mark.parametrize("name", CAPTURES)
def test_sync_and_memory_kinds_read_through_the_2025_enums(name):
    """SYNCHRONIZATION's syncType (not the new deprecatedSyncType) labelled from ENUM_CUPTI_SYNC_TYPE;
    memory operations' kinds from ENUM_CUDA_MEM_KIND; metadata from META_DATA_EXPORT (release 2025:
    the long memcpy names, checked against the CSV above)."""
    rows = dict(
        query(
            name,
            """SELECT t.label, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y
                               JOIN ENUM_CUPTI_SYNC_TYPE t ON t.id = y.syncType GROUP BY 1""",
        )
    )
    assert tables(name).sync["sync_type"].value_counts().to_dict() == rows and rows
    copies = dict(
        query(
            name,
            """SELECT s.label || '>' || d.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                                 JOIN ENUM_CUDA_MEM_KIND s ON s.id = m.srcKind
                                 JOIN ENUM_CUDA_MEM_KIND d ON d.id = m.dstKind GROUP BY 1""",
        )
    )
    memops = tables(name).memops
    ours = memops[memops["copy_kind"] != "memset"].groupby(["src_kind", "dst_kind"], observed=True).size()
    assert {f"{s}>{d}": n for (s, d), n in ours.items()} == copies
    assert set(memops["operation"]) <= {row["Operation"] for row in stats_csv(name, "cuda_gpu_mem_time_sum")}


# ---------------------------------------------------------------- findings and the CLI


def test_cudnn_that_nsys_could_not_trace_is_the_empty_trace_kind_finding():
    """2025.3.1 could not load its cuDNN 9.19 injection; the export keeps "No cuDNN events collected.
    Does the process use cuDNN?" among its strings, and the analysis names it once."""
    assert tables("h200_plant_gemm").empty_trace_kinds == {
        "cuDNN": 'nsys says "No cuDNN events collected. Does the process use cuDNN?"'
    }
    [finding] = [f for f in analysis("h200_plant_gemm").findings if f.rule == "empty_trace_kind"]
    assert finding.severity == "info" and finding.title.endswith("cuDNN")
    assert "No cuDNN events collected" in finding.evidence
    assert all(not tables(name).empty_trace_kinds for name in CAPTURES if name != "h200_plant_gemm")


def test_analyze_of_a_2025_report_with_an_older_nsys_says_what_to_do(tmp_path):
    """The installed nsys (2022.4 in CI) cannot read a 2025.3 .nsys-rep: one line that says a newer nsys
    wrote it and what to do, no traceback, and no export left beside it."""
    installed = nsys.nsys_version(shutil.which("nsys")) if shutil.which("nsys") else None
    if installed is None or installed[1] >= RELEASE:
        pytest.skip(f"needs an nsys older than {RELEASE} on PATH (found {installed})")
    report = tmp_path / "h200_sft_clean.nsys-rep"
    shutil.copy(FIXTURES / report.name, report)
    message = assert_refused(run_sftprof("analyze", report, cwd=tmp_path), contains="was written by a newer nsys")
    assert f"nsys {installed[0]}" in message and "Version not supported" in message
    assert f"nsys export --type=sqlite --output={report.with_suffix('.sqlite')} {report}" in message
    assert "give sftprof the .sqlite" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == [report.name]


def test_analyze_of_the_2025_export_itself_works(tmp_path):
    """What the refusal advises: the .sqlite that the capturing nsys exported analyses in full."""
    result = run_sftprof("analyze", sqlite_path("h200_plant_gemm"), "-o", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    kernels = pd.read_csv(tmp_path / "out" / "analysis" / "kernels_by_name.csv")
    assert kernels["instances"].sum() == instance_sum("h200_plant_gemm", "cuda_gpu_kern_sum", "Instances")
