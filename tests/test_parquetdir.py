"""nsys's parquetdir export (`nsys export --type=parquetdir`, nsys 2024+: a folder NAME.parquetdir/
with one TABLE.parquet per SQLite table) read directly: on the real 2025.3.1 export of
tests/fixtures/nsys2025/h200_sft_clean (the .nsys-rep that its .sqlite was exported from), and of its
capture with GPU metrics and context switches (h200_sft_clean_metrics), every table sftprof loads and the
whole analysis equal the SQLite export's; a damaged or hostile folder is a
one-line refusal."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from sftprof import pipeline
from sftprof.capture import nsys
from sftprof.pipeline import ANALYSIS_DIR, analyze_into
from sftprof.trace import load_trace
from sftprof.trace.load import clock_origin
from sftprof.trace.nsys import nsys_sqlite
from sftprof.trace.nsys.nsys_sqlite import TraceFormatError

from conftest import as_parquetdir, assert_refused, run_sftprof, tree_state

FIXTURES = Path(__file__).parent / "fixtures" / "nsys2025"
NAME = "h200_sft_clean"
CAPTURES = (NAME, "h200_sft_clean_metrics")  # the second: --gpu-metrics-devices=all --cpuctxsw=process-tree
FRAMES = ("threads", "nvtx", "osrt", "memops", "sync", "sched", "gpu_metrics", "gpus", "kernels", "cuda_api")
VALUES = ("span_ns", "sources", "dropped_rows", "empty_trace_kinds")


def _extracted(folder: Path, name: str) -> Path:
    """A committed export, extracted (the folder itself is not committed)."""
    with tarfile.open(FIXTURES / f"{name}.parquetdir.tar.xz") as tar:
        tar.extractall(folder, filter="data")
    return folder / f"{name}.parquetdir"


@pytest.fixture(scope="module")
def parquetdir(tmp_path_factory) -> Path:
    return _extracted(tmp_path_factory.mktemp("parquetdir"), NAME)


@pytest.fixture(scope="module", params=CAPTURES)
def capture(request, tmp_path_factory) -> tuple[str, Path]:
    """Each capture's name and its parquetdir export."""
    return request.param, _extracted(tmp_path_factory.mktemp("parquetdir"), request.param)


@pytest.fixture(scope="module")
def both(capture):
    name, parquetdir = capture
    loaded = load_trace(FIXTURES / f"{name}.sqlite"), load_trace(parquetdir)
    yield name, loaded
    for tables in loaded:
        tables.events.close()


@pytest.mark.parametrize("table", FRAMES)
def test_each_table_equals_the_sqlite_exports(both, table):
    name, loaded = both
    from_sqlite, from_parquet = (getattr(tables, table) for tables in loaded)
    # the first capture has no context switches or metrics
    assert len(from_sqlite) or (name == NAME and table in ("sched", "gpu_metrics"))
    pd.testing.assert_frame_equal(from_parquet, from_sqlite, check_exact=True)


def test_tables_read_a_batch_at_a_time_equal_the_sqlite_exports(tmp_path, monkeypatch):
    """A parquetdir's OS-runtime calls, memory operations and synchronizations are read by DuckDB a batch at a
    time (nsys_sqlite._query_chunks; a vector, 2,048 rows, here), not whole: on NeMo's capture written as a
    parquetdir by DuckDB, its 7,695 OS-runtime calls come in four batches (its memory copies, sets and
    synchronizations in one each), and every table equals the SQLite's."""
    sqlite = tmp_path / "nemo.sqlite"
    with lzma.open(FIXTURES.parent / "nemo" / "h200_nemo_lora_llama2_7b.sqlite.xz") as packed:
        sqlite.write_bytes(packed.read())
    folder = as_parquetdir(sqlite, tmp_path / "nemo.parquetdir")
    monkeypatch.setattr(nsys_sqlite, "BATCH_VECTORS", 1)
    from_sqlite, batched = load_trace(sqlite), load_trace(folder)
    try:
        assert len(from_sqlite.osrt) > 3 * 2048
        for table in ("osrt", "memops", "sync", "nvtx"):
            pd.testing.assert_frame_equal(getattr(batched, table), getattr(from_sqlite, table), check_exact=True)
        assert batched.dropped_rows == from_sqlite.dropped_rows
    finally:
        from_sqlite.events.close()
        batched.events.close()


@pytest.mark.parametrize("value", VALUES)
def test_capture_facts_equal_the_sqlite_exports(both, value):
    _, (from_sqlite, from_parquet) = both
    assert getattr(from_parquet, value) == getattr(from_sqlite, value)


@pytest.fixture(scope="module")
def saved(capture, tmp_path_factory) -> tuple[str, dict[str, tuple[dict, dict]]]:
    """Each format's saved analysis (with the trainer's metrics): suffix -> (CSV bytes by name, analysis.json
    without source_path, which names the input)."""
    name, parquetdir = capture
    metrics = FIXTURES / f"{name}.metrics.jsonl"
    outputs = {}
    for trace in (FIXTURES / f"{name}.sqlite", parquetdir):
        out = tmp_path_factory.mktemp(trace.suffix.strip("."))
        analysis = analyze_into(trace, out, metrics, "same")
        assert analysis.findings and analysis.headline["kernels"] == 2852
        files = {p.name: p.read_bytes() for p in sorted((out / ANALYSIS_DIR).iterdir())}
        summary = json.loads(files.pop("analysis.json"))
        assert summary.pop("source_path") == str(trace)
        outputs[trace.suffix] = files, summary
    return name, outputs


def test_whole_analysis_equals_the_sqlite_exports(saved):
    """Saved tables byte for byte, headline and findings (no_cpu_scheduling, or the cores' finding where
    context switches were traced, included: both are nsys captures)."""
    name, outputs = saved
    (sqlite_files, sqlite_summary), (parquet_files, parquet_summary) = outputs[".sqlite"], outputs[".parquetdir"]
    assert parquet_files == sqlite_files and len(sqlite_files) > 20
    assert ("no_cpu_scheduling" if name == NAME else "cpu_cores") in {f["rule"] for f in sqlite_summary["findings"]}
    assert parquet_summary == sqlite_summary
    if name != NAME:  # the metrics while the GPU worked, and each core the trainer ran on
        assert b"GPU metrics while busy" in sqlite_files["bound_evidence.csv"]
        assert sqlite_files["cpu_cores.csv"].count(b"\n") > 2


def test_cli_analyzes_a_parquetdir_and_says_so_in_its_help(parquetdir, tmp_path):
    assert ".parquetdir" in run_sftprof("analyze", "--help").stdout
    result = run_sftprof("analyze", parquetdir, "-o", tmp_path / "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / ANALYSIS_DIR / "kernels.csv").is_file()


def test_export_argv_writes_a_parquetdir_as_the_fixtures_was():
    """The command tests/fixtures/nsys2025/README.md ran for the fixture."""
    assert nsys.export_argv("c/r.nsys-rep", "s/r.parquetdir", "N", kind="parquetdir") == [
        "N",
        "export",
        "--type=parquetdir",
        "--force-overwrite=true",
        "--output=s/r.parquetdir",
        "c/r.nsys-rep",
    ]
    with pytest.raises(ValueError, match="sftprof reads sqlite, parquetdir"):
        nsys.export_argv("r.nsys-rep", "r.csv", kind="csv")


# ---------------------------------------------------------------- the workflow's choice of format

HELP_2025 = FIXTURES / "export_help.txt"  # `nsys export --help` of 2025.3.1, saved on the H200


def test_each_release_lists_its_export_types():
    """2025.3.1 (saved) writes parquetdir; the real 2022.4 here does not, so the workflow exports SQLite."""
    assert {"sqlite", "arrowdir", "parquetdir"} <= nsys.export_types(HELP_2025.read_text())
    here = subprocess.run(["nsys", "export", "--help"], capture_output=True, text=True).stdout
    assert "sqlite" in nsys.export_types(here) and "parquetdir" not in nsys.export_types(here)
    assert nsys.export_kind("nsys") == "sqlite"
    assert nsys.export_kind(str(FIXTURES / "no-such-nsys")) == "sqlite"


def _nsys_2025(folder: Path, damage: bool = False) -> Path:
    """An nsys that answers `export --help` as 2025.3.1 does and "exports" the committed parquetdir of
    h200_sft_clean (its real 2025.3.1 export); with `damage`, with its kernel table cut short."""
    folder.mkdir()
    cut = 'truncate -s 100 "$out/CUPTI_ACTIVITY_KIND_KERNEL.parquet"\n' if damage else ""
    script = folder / "nsys"
    script.write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "export --help" ]; then cat "{HELP_2025}"; exit 0; fi\n'
        f'out=${{4#--output=}}\nmkdir -p "$out" && tar xJf "{FIXTURES / NAME}.parquetdir.tar.xz" -C "$out" '
        f"--strip-components=1\n{cut}"
    )
    script.chmod(0o755)
    return script


def _capture_folder(folder: Path) -> Path:
    """A capture folder as the profile step leaves it: rank 0's record, report and the trainer's metrics."""
    folder.mkdir()
    shutil.copy(FIXTURES / f"{NAME}.nsys-rep", folder / "profile.nsys-rep")
    shutil.copy(FIXTURES / f"{NAME}.metrics.jsonl", folder / "profile.rank0.metrics.jsonl")
    record = {"rank": 0, "world_size": 1, "host": "h", "node": 0, "slurm_job_id": None, "report": "profile.nsys-rep"}
    (folder / "rank0.json").write_text(json.dumps(record))
    return folder


def test_the_export_step_writes_a_parquetdir_where_nsys_can_and_analyze_reads_it(tmp_path, monkeypatch):
    """The workflow's export and analyze steps (pipeline.export_capture, pipeline.analyze_capture) with an nsys
    that writes parquetdir: rank0.parquetdir, analysed as its SQLite export is. The real 2025.3.1 did the
    same in the workflow on the H200 (tests/gpu_programs/workflow_export.sh, docs/NSYS.md)."""
    fake = _nsys_2025(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    capture = _capture_folder(tmp_path / "capture")
    pipeline.export_capture(capture, tmp_path / "export", None)
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["rank0.parquetdir"]
    pipeline.analyze_capture(capture, tmp_path / "export", "profile", tmp_path / "analysis")
    (sqlite_export := tmp_path / "sqlite").mkdir()
    shutil.copy(FIXTURES / f"{NAME}.sqlite", sqlite_export / "rank0.sqlite")
    pipeline.analyze_capture(capture, sqlite_export, "profile", tmp_path / "analysis_sqlite")
    saved = [
        {p.name: p.read_bytes() for p in (tmp_path / out / "rank0").iterdir()}
        for out in ("analysis", "analysis_sqlite")
    ]
    summaries = [json.loads(files.pop("analysis.json")) for files in saved]
    assert saved[0] == saved[1] and len(saved[0]) > 20
    assert [summary.pop("source_path") for summary in summaries] == [
        str(tmp_path / "export" / "rank0.parquetdir"),
        str(sqlite_export / "rank0.sqlite"),
    ]
    assert summaries[0] == summaries[1] and summaries[0]["headline"]["kernels"] == 2852


def test_a_parquetdir_export_cut_short_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    fake = _nsys_2025(tmp_path / "bin", damage=True)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    capture = _capture_folder(tmp_path / "capture")
    with pytest.raises(nsys.NsysError) as error:
        pipeline.export_capture(capture, tmp_path / "export", None)
    message = str(error.value)
    assert "\n" not in message and "is not a complete export" in message
    assert "CUPTI_ACTIVITY_KIND_KERNEL.parquet" in message and "Is the disk of" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "capture"]  # no export, no partial folder


# ---------------------------------------------------------------- hostile folders


def without_stringids(folder: Path) -> None:
    (folder / "StringIds.parquet").unlink()


def emptied(folder: Path) -> None:
    for file in folder.iterdir():
        file.unlink()


def truncated_table(folder: Path) -> None:
    table = folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])


def garbage_table(folder: Path) -> None:
    (folder / "NVTX_EVENTS.parquet").write_bytes(b"PAR1" + os.urandom(4096))


def linked_outside(folder: Path) -> None:
    """A table that is a link to a file outside the folder (here a real table: read, it would load)."""
    outside = folder.parent / "elsewhere.parquet"
    (folder / "StringIds.parquet").rename(outside)
    (folder / "StringIds.parquet").symlink_to(outside)


def text_times(folder: Path) -> None:
    """Kernels' start as text: every row's type is wrong, not one row's."""
    table = folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    rewritten = folder.parent / "rewritten.parquet"
    with duckdb.connect() as con:
        con.execute(
            f"COPY (SELECT * REPLACE (CAST(start AS VARCHAR) AS start) FROM read_parquet('{table}')) "
            f"TO '{rewritten}' (FORMAT parquet)"
        )
    rewritten.replace(table)


HOSTILE = {
    emptied: "no .parquet tables in the folder",
    without_stringids: "Parquet tables, but not an nsys export (no StringIds.parquet)",
    truncated_table: "CUPTI_ACTIVITY_KIND_KERNEL.parquet is not a readable Parquet table",
    garbage_table: "NVTX_EVENTS.parquet is not a readable Parquet table",
    linked_outside: "StringIds.parquet is not a regular file",
    text_times: "CUPTI_ACTIVITY_KIND_KERNEL.parquet: column 'start' is VARCHAR, not an integer type",
}


@pytest.mark.parametrize("damage", list(HOSTILE), ids=lambda f: f.__name__)
def test_a_hostile_parquetdir_is_refused_in_one_line(parquetdir, tmp_path, damage):
    folder = tmp_path / "input" / parquetdir.name
    shutil.copytree(parquetdir, folder)
    damage(folder)
    before = tree_state(tmp_path)
    result = run_sftprof("analyze", folder, "-o", tmp_path / "out", cwd=tmp_path)
    assert_refused(result, contains=f"{folder}: {HOSTILE[damage]}")
    assert tree_state(tmp_path) == before  # no output folder, nothing beside the input


def test_a_parquetdir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "x.parquetdir"
    path.write_bytes(b"PAR1")
    before = tree_state(tmp_path)
    result = run_sftprof("analyze", path, "-o", tmp_path / "out", cwd=tmp_path)
    assert_refused(result, contains=f"{path}: not a folder")
    assert tree_state(tmp_path) == before


def test_a_path_duckdb_would_read_as_a_pattern_is_refused(parquetdir, tmp_path):
    """read_parquet expands * ? [ ]: `a[12].parquetdir` could read a1.parquetdir's tables."""
    folder = tmp_path / "a[12].parquetdir"
    shutil.copytree(parquetdir, folder)
    with pytest.raises(TraceFormatError, match=r"must not hold any of \*\?\[\]\{\}"):
        load_trace(folder)


def test_clock_origin_is_read_from_either_export(parquetdir):
    """The cross-rank analysis lines ranks up by the capture's start on its host: both exports give it."""
    origin = clock_origin(FIXTURES / f"{NAME}.sqlite")
    assert origin is not None and origin > 10**18 and clock_origin(parquetdir) == origin
