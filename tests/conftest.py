"""Shared fixtures. The expensive one, `demo_run`, runs the real workflow once per session:
real data prep, model creation, SFT steps under the real nsys, export, analysis and report."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import lzma
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sftprof import layout

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# Small enough for CI (a 2-core machine), large enough that the window has steps to analyse.
SMALL_DEMO = {
    "run": ["demo"],
    "experiments": {
        "demo": {
            "data": {"sample_records": 60},
            "sft": {"steps": 6, "micro_batch_size": 2, "grad_accum_steps": 2, "seq_length": 128, "device": "cpu"},
            "profile": {
                "trace": ["osrt", "nvtx"],
                "windows": {"steady": {"capture_range": "nvtx", "start_step": 2, "end_step": 4}},
            },
        }
    },
}


def write_config(workdir: Path, config: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def private_copy(tmp_path_factory, source: Path) -> Path:
    """A copy of a committed fixture, so that nsys stats (which may write an export) never touches it."""
    path = tmp_path_factory.mktemp(source.stem) / source.name
    shutil.copy(source, path)
    return path


H200_CAPTURE = Path(__file__).parent / "fixtures" / "h200_tiny_llama_bf16.sqlite"


@pytest.fixture(scope="session")
def h200_capture(tmp_path_factory) -> Path:
    """A private copy of the committed H200 capture of the built-in SFT loop (tests/fixtures/README.md)."""
    return private_copy(tmp_path_factory, H200_CAPTURE)


@pytest.fixture(scope="session")
def h200_tables(h200_capture):
    from sftprof.trace import load_trace

    return load_trace(h200_capture)


def edited_export(tmp_path: Path, table: str, edits: list[str]) -> Path:
    """A copy of the memset-heavy H200 export with `edits` (SQL) applied, NOT NULL taken off `table` first,
    as a hostile file may have it: for comparing a loader's routes on damaged rows."""
    path = tmp_path / "edited.sqlite"
    shutil.copy(REPO / "tests" / "fixtures" / "h200_sft_clean.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA writable_schema = ON")
        con.execute(f"UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') WHERE name = '{table}'")
    with sqlite3.connect(path) as con:
        for edit in edits:
            con.execute(edit)
    return path


def as_parquetdir(sqlite: Path, folder: Path) -> Path:
    """An SQLite export written as a parquetdir at `folder`, every table, by benchmarks/to_parquetdir.py (DuckDB's
    stand-in for `nsys export --type=parquetdir`)."""
    spec = importlib.util.spec_from_file_location("to_parquetdir", REPO / "benchmarks" / "to_parquetdir.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(sqlite, folder)
    return folder


def snakemake_argv(workdir: Path, *args: str) -> list[str]:
    """The repo's workflow with the local profile, in `workdir` (which holds config.yaml)."""
    return [
        SNAKEMAKE,
        "--snakefile",
        str(REPO / "workflow" / "Snakefile"),
        "--directory",
        str(workdir),
        "--workflow-profile",
        str(REPO / "profiles" / "local"),
        *args,
    ]


JOB_TABLE = re.compile(r"^(\w+)\s+(\d+)$", re.M)


def planned_jobs(result) -> dict[str, int]:
    """The job-count table a dry run prints."""
    table = result.stdout.split("Job stats:")[1].split("Reasons:")[0] if "Job stats:" in result.stdout else ""
    return {name: int(n) for name, n in JOB_TABLE.findall(table) if name != "total"}


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the repo's workflow with the local profile, in `workdir` (which holds config.yaml)."""
    result = subprocess.run(snakemake_argv(workdir, *args), capture_output=True, text=True, cwd=workdir)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
    return result


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """A finished run of the small demo; returns its working directory."""
    workdir = tmp_path_factory.mktemp("demo")
    write_config(workdir, SMALL_DEMO)
    snakemake(workdir)
    return workdir


@pytest.fixture(scope="session")
def demo_sqlite(demo_run) -> Path:
    """The demo's export: SQLite, which the nsys here (2022.4) writes."""
    return demo_run / layout.EXPORT_DIR.format(experiment="demo", window="steady") / "rank0.sqlite"


# In the environment of this test session and so of every process it starts (nsys hands it on to its agent):
# the agents this session started are told from those of another session or user on the same machine.
TEST_SESSION = f"SFTPROF_TEST_SESSION={os.getpid()}-{os.urandom(8).hex()}"
os.environ.update([TEST_SESSION.split("=", 1)])


# What nsys 2022.4 said, and all it said, when it could not start beside another nsys on 2 loaded cores (exit 1,
# the program never run): before these were started again, each failed a workflow's profiled run.
SEM_OPEN_THROW = """\
/build/agent/work/323cb361ab84164c/QuadD/Common/ProcessWaiter/Src/POSIX/ProcessWaiterImpl.cpp(166): Throw in function QuadDCommon::ProcessWaiter::ProcessWaiterImpl::ProcessWaiterImpl(QuadDCommon::ProcessId, bool)
Dynamic exception type: boost::wrapexcept<QuadDCommon::SystemException>
std::exception::what: SystemException
[QuadDCommon::tag_errno_text*] = No such file or directory
[boost::errinfo_errno_*] = 2, "No such file or directory"
[boost::errinfo_api_function_*] = sem_open
"""
ENDPOINT_THROW = """\
/build/agent/work/323cb361ab84164c/QuadD/Common/ProtobufComm/Client/ClientProxy.cpp(381): Throw in function QuadDProtobufComm::Endpoint QuadDProtobufComm::Client::ClientProxy::GetLocalEndpoint() const
Dynamic exception type: boost::wrapexcept<QuadDCommon::RuntimeException>
std::exception::what: RuntimeException
[QuadDCommon::tag_message*] = Local Endpoint is not available.
"""


@pytest.fixture(scope="session", autouse=True)
def no_nsys_agents_left_behind():
    """nsys can leave `--start-agent` helpers that burn a core each; no test may leave one. Only this
    session's count: another session's agent, alive when this one ends, was an error of this one's last test."""
    from sftprof.capture.nsys import running_agent_pids

    before = running_agent_pids(TEST_SESSION)
    yield
    leftover = running_agent_pids(TEST_SESSION) - before
    assert not leftover, f"nsys agents left running after the tests: {sorted(leftover)}"


# --- hostile inputs and faults (tests/test_hostile_*.py) ---------------------------------------

SFTPROF = str(Path(sys.executable).with_name("sftprof"))
CONTROL_CHARACTERS = (
    {chr(c) for c in range(32) if chr(c) not in "\n\t"} | {"\x7f"} | {chr(c) for c in range(0x80, 0xA0)}
)


def run_sftprof(*args, cwd=REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """The installed `sftprof` command as a user runs it (a hang fails the test instead of CI)."""
    return subprocess.run(
        [SFTPROF, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout, errors="surrogateescape"
    )


def assert_refused(result: subprocess.CompletedProcess, *, contains: str = "") -> str:
    """A hostile input's outcome as a user must see it: exit 1, one line `sftprof: error: ...`, last
    on stderr (progress logged before it is allowed), no traceback, no raw control character.
    Returns the message."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, f"exit {result.returncode}; stderr: {result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in lines if line.startswith("sftprof: error: ")]
    assert errors == lines[-1:], result.stderr[-2000:]
    assert not CONTROL_CHARACTERS & set(result.stderr + result.stdout), repr(result.stderr[-500:])
    assert contains in errors[0], errors[0]
    return errors[0]


def impossible_numbers(frames: dict, headline: dict) -> list[str]:
    """What no capture can give, found in an analysis' tables (name -> DataFrame) and headline: a
    negative time, count or share, a share over 100%, or a time beyond 2^62 ns (146 years: the
    scale of a wrapped or misread integer)."""
    problems = []
    for name, frame in frames.items():
        for column in frame.columns:
            values = frame[column].dropna()
            if not pd.api.types.is_numeric_dtype(values):
                continue
            if (
                re.search(r"(_ns|_pct|_ms|duration|instances)$", column)
                and (values < 0).any()
                or column.endswith("_pct")
                and (values > 100.001).any()
                or re.search(r"(_ns|duration|start|end)$", column)
                and (values.abs() > 2**62).any()
            ):
                problems.append(f"{name}.{column} from {values.min()} to {values.max()}")
    for key, limit in (("gpu_busy_pct", 100.001), ("median_step_ms", 2**62 / 1e6), ("capture_s", 2**62 / 1e9)):
        value = headline.get(key)
        if value is not None and not 0 <= value <= limit:
            problems.append(f"headline {key} = {value}")
    return problems


def assert_sane_with_dropped_rows(folder: Path, dropped: dict[str, int]) -> tuple[dict, dict]:
    """An analysis folder of a damaged trace: no impossible number anywhere, and the rows left out
    (table -> count, none expected when empty) named in one `dropped_rows` note. Returns
    (analysis.json, tables)."""
    summary = json.loads((folder / "analysis.json").read_text())
    frames = {csv.stem: pd.read_csv(csv) for csv in folder.glob("*.csv") if csv.stat().st_size > 1}
    assert not impossible_numbers(frames, summary["headline"]), (
        folder,
        impossible_numbers(frames, summary["headline"]),
    )
    notes = [f for f in summary["findings"] if f["rule"] == "dropped_rows"]
    if dropped:
        [note] = notes
        assert f"{sum(dropped.values()):,} trace rows" in note["title"], (folder, note, dropped)
        for table, rows in dropped.items():
            assert f"{table} {rows:,}" in note["evidence"], (folder, table, rows, note["evidence"])
    else:
        assert not notes, notes
    return summary, frames


def tree_state(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and link under `root` (relative path -> (mode, content or link target)): compare
    two states to prove that nothing outside an output folder was written, and that a previous
    good output is intact."""
    import os

    state = {}
    for path in sorted(Path(root).rglob("*")):
        key = str(path.relative_to(root))
        info = path.lstat()
        if path.is_symlink():
            state[key] = (info.st_mode, os.readlink(path).encode())
        elif path.is_file():
            state[key] = (info.st_mode, path.read_bytes())
        else:
            state[key] = (info.st_mode, b"")
    return state


_HOSTILE_TALLY: dict[str, list[int]] = {}


# sft.nemo as the config schema fills it for a LoRA run of Llama 2 7B, every knob off: what the NeMo backend's
# tests plan from.
NEMO_LORA = {
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
    "precision": "bf16-mixed",
    "peft": "lora",
    "recipe": "llama2_7b",
    "packed_sequence": False,
    "cuda_graphs": False,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
}
NEMO_CAPTURE = REPO / "tests" / "fixtures" / "nemo" / "h200_nemo_lora_llama2_7b"  # .sqlite.xz, .metrics.jsonl


def unpack_xz(packed: Path, out: Path) -> Path:
    """An xz-compressed fixture written out whole to `out` (the committed captures are stored compressed)."""
    with lzma.open(packed) as source, open(out, "wb") as target:
        shutil.copyfileobj(source, target)
    return out


@pytest.fixture(scope="module")
def nemo_sqlite(tmp_path_factory) -> Path:
    """The committed NeMo LoRA capture, decompressed once per module."""
    return unpack_xz(NEMO_CAPTURE.with_suffix(".sqlite.xz"), tmp_path_factory.mktemp("nemo") / "nemo_lora.sqlite")


NEMO_DEFAULT_WINDOW = NEMO_CAPTURE.parent / "h100_nemo_lora_no_op_ranges"  # .sqlite.xz, .metrics.jsonl, nsys's CSVs


@pytest.fixture(scope="session")
def nemo_default_window(tmp_path_factory):
    """The NeMo capture taken with the backend's default window (no op ranges, H100), decompressed and analysed
    with its metrics once for every module that reads it: (sqlite path, analysis)."""
    from sftprof.pipeline import analyze_trace

    sqlite_path = unpack_xz(NEMO_DEFAULT_WINDOW.with_suffix(".sqlite.xz"), tmp_path_factory.mktemp("nemo") / "n.sqlite")
    return sqlite_path, analyze_trace(sqlite_path, NEMO_DEFAULT_WINDOW.with_suffix(".metrics.jsonl"))


@pytest.fixture(scope="module")
def nemo(nemo_sqlite):
    """The NeMo capture analysed with NeMo's own step metrics."""
    from sftprof.pipeline import analyze_trace

    return analyze_trace(nemo_sqlite, NEMO_CAPTURE.with_suffix(".metrics.jsonl"))


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def ci_bounded(full: int, in_ci: int) -> int:
    """How many cases a seeded fuzzer runs: all of them, or under CI its first `in_ci` (the same ones every
    time, so CI stays within its time limit and is never flaky)."""
    return min(full, in_ci) if IN_CI else full


def pytest_collection_modifyitems(config, items):
    """Under CI (CI=true, a 2-core machine with a time limit), a test marked `ci_sample(n)` runs n of its
    parametrized cases, spread evenly over them, the same n every time (n=0: none, for a test the full run keeps
    that CI's time limit cannot); elsewhere every case runs."""
    if not IN_CI:
        return
    cases: dict = {}
    for item in items:
        marker = item.get_closest_marker("ci_sample")
        if marker is not None:
            cases.setdefault((item.path, item.originalname), (marker.args[0], []))[1].append(item)
    skipped = set()
    for wanted, group in cases.values():
        kept = {round(i * (len(group) - 1) / max(wanted - 1, 1)) for i in range(min(wanted, len(group)))}
        skipped.update(item for i, item in enumerate(group) if i not in kept)
    if skipped:
        config.hook.pytest_deselected(items=[item for item in items if item in skipped])
        items[:] = [item for item in items if item not in skipped]


def pytest_runtest_logreport(report):
    """Count the hostile-input cases per class (the module's name after test_hostile_)."""
    module = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if not module.startswith("test_hostile_") or report.skipped or (report.when != "call" and report.passed):
        return
    # A test that tries many inputs (a fuzzer) says how many: record_property("hostile_inputs", n).
    inputs = dict(report.user_properties).get("hostile_inputs", 1)
    counts = _HOSTILE_TALLY.setdefault(module.removeprefix("test_hostile_").removesuffix(".py"), [0, 0])
    counts[0 if report.passed else 1] += inputs


def pytest_terminal_summary(terminalreporter):
    """The table docs/HOSTILE.md quotes: hostile inputs tried, held and broke, per class."""
    if not _HOSTILE_TALLY:
        return
    terminalreporter.section("hostile inputs and faults")
    terminalreporter.write_line(f"{'class':<12} {'tried':>6} {'held':>6} {'broke':>6}")
    for name, (held, broke) in sorted(_HOSTILE_TALLY.items()):
        terminalreporter.write_line(f"{name:<12} {held + broke:>6} {held:>6} {broke:>6}")


# nsys stats beside sftprof's own summaries: the fidelity tests compare them row for row.
def nsys_stats(report: str, sqlite_path) -> list[dict]:
    """One `nsys stats` report of an export, as CSV rows (the installed nsys)."""
    result = subprocess.run(
        ["nsys", "stats", "--report", report, "--format", "csv", "--force-export", "false", str(sqlite_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    text = result.stdout[result.stdout.index("Time (%)") :]
    return list(csv.DictReader(io.StringIO(text)))


def as_nsys_rows(summary, name_columns) -> set[tuple]:
    return {
        (
            f"{r.time_pct:.1f}",
            str(r.total_ns),
            str(r.instances),
            f"{r.avg_ns:.1f}",
            f"{r.med_ns:.1f}",
            str(r.min_ns),
            str(r.max_ns),
            f"{r.stddev_ns:.1f}",
            *(str(getattr(r, c)) for c in name_columns),
        )
        for r in summary.itertuples()
    }


# The training thread of the hand-built traces (global_tid of pid 7, tid 7): its NVTX ranges, as the loader gives them.
TRAINING_TID = (7 << 24) | 7


def merged(rows) -> list[list[int]]:
    """The union of (start, end) rows, plainly: tests' own count, apart from sftprof's interval code."""
    out = []
    for start, end in sorted(rows):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def nvtx_range(name: str, start: int, end: int, tid: int = TRAINING_TID) -> dict:
    return {
        "start": start,
        "end": end,
        "duration": end - start,
        "name": name,
        "style": "PushPop",
        "global_tid": tid,
        "pid": tid >> 24,
        "tid": tid & 0xFFFFFF,
    }


def kernel_row(
    name: str, start: int, duration: int, short: str | None = None, correlation: int = 0, device: int = 0, pid: int = 7
) -> dict:
    """A kernel as the loader gives it, for traces built by hand."""
    return {
        "start": start,
        "end": start + duration,
        "duration": duration,
        "name": name,
        "short_name": short or name,
        "device_id": device,
        "stream_id": 7,
        "pid": pid,
        "correlation_id": correlation,
    }
