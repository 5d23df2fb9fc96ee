"""Faults of the machine, with the real nsys: two profiled runs on one host, a full disk (the
hostile-input tally's class "faults")."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sftprof import pipeline
from sftprof.capture import nsys

from conftest import ENDPOINT_THROW, SEM_OPEN_THROW, SFTPROF, TEST_SESSION, assert_refused, run_sftprof, tree_state

OPTIONS = ["--trace=osrt", "--sample=none", "--cpuctxsw=none"]
# One command line for both runs, as two ranks or a rerun have: only the environment differs.
PROGRAM = [sys.executable, "-c", "import os, time; time.sleep(float(os.environ['SLEEP_S'])); print('finished')"]


def profile_in_child(output: Path, sleep_s: float) -> subprocess.Popen:
    """nsys.run_profile in a process of its own, as each rank or workflow job runs it."""
    code = textwrap.dedent(f"""
        import io
        from sftprof.capture import nsys
        report = nsys.run_profile({OPTIONS!r}, {PROGRAM!r}, {str(output)!r}, io.StringIO(),
                                  {{"SLEEP_S": "{sleep_s}", "RANK": "0"}})
        print("REPORT", report)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_profiled_runs_on_one_host_leave_each_other_alone(tmp_path):
    """The run that ends first reaps only what it started: not the other's agent, nor its
    program, though both have the same command line and RANK."""
    first = profile_in_child(tmp_path / "short", 2)
    second = profile_in_child(tmp_path / "long", 8)  # starts later, ends later
    for run, name in ((first, "short"), (second, "long")):
        stdout, stderr = run.communicate(timeout=180)
        assert run.returncode == 0, stderr[-3000:]
        assert f"REPORT {tmp_path / name}.nsys-rep" in stdout
        assert (tmp_path / f"{name}.nsys-rep").stat().st_size > 0


def test_a_run_leaves_an_unrelated_process_of_the_same_command_line_running(tmp_path):
    """A rerun after a kill -9 meets the old run's program still running (or the reverse): the
    cleanup of one must not kill the other."""
    stranger = subprocess.Popen(PROGRAM, env={**os.environ, "SLEEP_S": "60", "RANK": "0"}, start_new_session=True)
    try:
        report = nsys.run_profile(OPTIONS, PROGRAM, tmp_path / "run", io.StringIO(), {"SLEEP_S": "0.5", "RANK": "0"})
        assert report.stat().st_size > 0
        assert stranger.poll() is None, "the run killed a process it did not start"
    finally:
        stranger.kill()
        stranger.wait()


def fake_nsys(folder: Path, says: str, failures: int, exit_code: int = 1) -> Path:
    """An `nsys` ahead of the real one on PATH that prints `says` and exits `exit_code` its first `failures`
    times, as nsys 2022.4 does when its agent cannot start, then runs the real one. Each call
    appends a line to the returned file."""
    calls, said, script = folder / "calls", folder / "says", folder / "nsys"
    said.write_text(says + "\n")
    script.write_text(
        textwrap.dedent(f"""\
            #!/bin/bash
            echo call >> {calls}
            if [ "$(wc -l < {calls})" -le {failures} ]; then cat {said}; exit {exit_code}; fi
            exec {nsys.find_nsys()} "$@"
        """)
    )
    script.chmod(0o755)
    return calls


@pytest.mark.parametrize(
    "says, failures, runs, exit_code",
    [
        ("Agent launcher failed.", 1, 2, 1),  # started again, and the second works
        ("End of file", 2, 3, 1),
        ("End of file\nthe program said this", 1, 1, 1),  # the program ran: its failure is its own
        # nsys 2022.4 beside another nsys starting or ending on 2 loaded cores (tests/test_nsys.py):
        (SEM_OPEN_THROW, 1, 2, 1),
        (ENDPOINT_THROW, 2, 3, 1),
        ("Connection to the Agent lost.\nConnection to the Agent lost.", 1, 2, 0),  # exit 0, and no report
        (SEM_OPEN_THROW + "the program said this", 1, 1, 1),
    ],
)
def test_an_nsys_that_could_not_start_is_started_again(tmp_path, monkeypatch, says, failures, runs, exit_code):
    monkeypatch.setattr(nsys, "START_RETRY_S", 0.0)
    calls = fake_nsys(tmp_path, says, failures, exit_code)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    log = io.StringIO()
    if runs > failures:
        report = nsys.run_profile(OPTIONS, PROGRAM, tmp_path / "run", log, {"SLEEP_S": "0.1"})
        assert report.stat().st_size > 0 and "finished" in log.getvalue()
        assert log.getvalue().count("starting it again") == failures
    else:
        with pytest.raises(nsys.NsysError, match="the program said this"):
            nsys.run_profile(OPTIONS, PROGRAM, tmp_path / "run", log, {"SLEEP_S": "0.1"})
        assert "starting it again" not in log.getvalue()
    assert len(calls.read_text().splitlines()) == runs


def test_an_nsys_that_never_starts_is_an_error_after_the_last_attempt(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "START_RETRY_S", 0.0)
    calls = fake_nsys(tmp_path, "Agent launcher failed.", 99)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(nsys.NsysError, match="could not start its agent .3 attempts; it said: Agent launcher failed"):
        nsys.run_profile(OPTIONS, PROGRAM, tmp_path / "run", io.StringIO(), {"SLEEP_S": "0.1"})
    assert len(calls.read_text().splitlines()) == nsys.START_ATTEMPTS


def test_a_rank_ended_by_slurm_leaves_nothing_running(tmp_path):
    """Slurm ends a task with SIGTERM (time limit, scancel, another task failing): the rank's nsys,
    agent and program go with it, or they burn the node's cores and stall later captures."""
    marker = f"sftprof-sigterm-{os.getpid()}"
    program = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)", marker]
    before = nsys.running_agent_pids(TEST_SESSION)
    rank = subprocess.Popen(
        [sys.executable, "-m", "sftprof.capture.rank", "--profiled-ranks=0", f"--capture-dir={tmp_path}", "--"]
        + nsys.profile_argv(OPTIONS, tmp_path / "ended", program),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in rank.stdout:
        if line.strip() == "started":
            break
    rank.terminate()
    assert rank.wait(timeout=60) == 143
    running = [argv for _, argv in nsys._processes() if marker.encode() in argv]
    assert running == [] and nsys.running_agent_pids(TEST_SESSION) <= before
    assert not (tmp_path / "rank0.json").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: too small for any export."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_an_export_onto_a_full_disk_fails_and_leaves_no_file(tmp_path, small_disk):
    """nsys export exits 0 with an empty file when the disk fills: the export must be checked,
    or the step passes for done and every rerun fails on it."""
    report = nsys.run_profile(OPTIONS, PROGRAM, tmp_path / "run", io.StringIO(), {"SLEEP_S": "0.5"})
    target = small_disk / "rank0.sqlite"
    with pytest.raises(nsys.NsysError, match="not a complete export"):
        pipeline.export_report(report, target)
    assert list(small_disk.iterdir()) == []
    done = pipeline.export_report(report, tmp_path / "rank0.sqlite")  # with room, the same report exports
    assert done.stat().st_size > 0


@pytest.mark.e2e
@pytest.mark.ci_sample(0)  # 18 s; CI keeps two runs writing one folder (test_hostile_output)
def test_two_workflows_profiling_at_once_on_one_host_both_finish(demo_run, tmp_path):
    """Two users (or two experiments) running the workflow on one login node at once: each
    profiles, exports and analyses its own window, and neither run breaks the other's capture."""
    import copy

    from conftest import SMALL_DEMO, snakemake_argv, write_config

    runs = []
    for name, end_step in (("first", 3), ("second", 5)):
        workdir = tmp_path / name
        shutil.copytree(demo_run, workdir, symlinks=True)
        config = copy.deepcopy(SMALL_DEMO)
        config["experiments"]["demo"]["profile"]["windows"]["steady"]["end_step"] = end_step
        write_config(workdir, config)
        runs.append(
            (
                workdir,
                end_step,
                subprocess.Popen(
                    snakemake_argv(workdir), cwd=workdir, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                ),
            )
        )
    for workdir, end_step, run in runs:
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, stderr[-4000:]
        steps = (workdir / "results/demo/steady/analysis/rank0/steps.csv").read_text().splitlines()
        assert [int(line.split(",")[0]) for line in steps[1:]] == list(range(2, end_step + 1))


@pytest.mark.parametrize("kept", [0.0, 0.5, 0.99])
def test_a_cut_short_export_is_not_complete(tmp_path, kept):
    """What a full disk or a killed export leaves: refused however much of the file is there."""
    from sftprof.trace.nsys.nsys_sqlite import TraceFormatError, check_export

    export = tmp_path / "rank0.sqlite"
    shutil.copy(Path(__file__).parent / "fixtures" / "h200_plant_clean.sqlite", export)
    check_export(export)
    os.truncate(export, int(export.stat().st_size * kept))
    with pytest.raises(TraceFormatError):
        check_export(export)


def test_an_analysis_whose_temporary_disk_fills_says_so_and_writes_nothing(tmp_path, small_disk):
    """The analysis keeps the capture's large tables in a database under TMPDIR (NeMo's emit_nvtx at 10M kernels:
    1.1 GB): a full disk there is the machine's fault, said in one line, not "damaged export"; no output
    appears, and the database's folder is gone."""
    out = tmp_path / "out"
    result = subprocess.run(
        [SFTPROF, "analyze", str(Path(__file__).parent / "fixtures" / "h200_plant_clean.sqlite"), "-o", str(out)],
        env={**os.environ, "TMPDIR": str(small_disk)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    message = assert_refused(result, contains="no space left on the disk of the temporary folder")
    assert str(small_disk) in message and "damaged" not in message
    assert not out.exists() and list(small_disk.iterdir()) == []


def test_busy_time_files_on_a_full_disk_say_so(small_disk, monkeypatch):
    """A device's busy time is written to files under TMPDIR (analysis.spilled); when that disk fills, the
    analysis gives the same one line as for the database, naming the folder."""
    import tempfile

    from sftprof.analysis.spilled import SpilledUnion
    from sftprof.trace.events import out_of_disk

    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))
    union = SpilledUnion()
    starts = np.arange(0, 10**6, 10, dtype="int64")  # 1.6 MB of intervals: more than 256 KiB
    with pytest.raises(OSError) as raised:
        union.add(starts, starts + 5)
        union.finish()
    message = str(out_of_disk(raised.value))
    assert message.startswith("no space left on the disk of the temporary folder") and str(small_disk) in message
    assert out_of_disk(OSError(errno.EACCES, "denied")) is None


# ---------------------------------------------------------------- reports, their exports and the machine

FIXTURES = Path(__file__).parent / "fixtures"
CLEAN, GEMM = FIXTURES / "h200_plant_clean.sqlite", FIXTURES / "h200_plant_gemm.sqlite"
FAKE_NSYS = """#!/bin/sh
# nsys export, as far as sftprof runs it: the "report" is an SQLite export already, copied to --output
echo "$@" >> "$(dirname "$0")/calls"
for arg; do case "$arg" in --output=*) out="${arg#--output=}";; esac; done
eval "report=\\${$#}"
case "$report" in -*) echo "unrecognised option $report" >&2; exit 1;; esac
cp "$report" "$out"
"""


@pytest.fixture
def copying_nsys(tmp_path, monkeypatch) -> Path:
    """An nsys on PATH whose export copies the report (an SQLite file here); returns its log of calls."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nsys").write_text(FAKE_NSYS)
    (folder / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder / "calls"


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _kernels(out: Path) -> int:
    return json.loads((out / "analysis" / "analysis.json").read_text())["headline"]["kernels"]


def test_an_export_beside_a_report_is_reused_only_when_it_is_that_reports(tmp_path, copying_nsys):
    """A report copied with its time kept (cp -p) beside an older capture's export is exported anew, not
    analysed as that other capture; so is an export sftprof did not make; a rerun reuses its own export."""

    def analyze() -> int:
        assert run_sftprof("analyze", report, "-o", tmp_path / "out").returncode == 0
        return _kernels(tmp_path / "out")

    report, export = tmp_path / "profile.nsys-rep", tmp_path / "profile.sqlite"
    shutil.copy2(CLEAN, report)
    shutil.copy(GEMM, export)  # the user's own export of another capture, newer than the report
    clean = analyze()
    assert _calls(copying_nsys) == 1 and analyze() == clean and _calls(copying_nsys) == 1
    shutil.copy2(GEMM, report)  # cp -p: another capture, its time older than the export's
    os.utime(report, ns=(export.stat().st_mtime_ns - 10**9,) * 2)
    gemm = analyze()
    assert _calls(copying_nsys) == 2 and gemm != clean


def test_a_report_whose_name_starts_with_a_dash_reaches_nsys_as_a_file(tmp_path, copying_nsys):
    shutil.copy(CLEAN, tmp_path / "-x.nsys-rep")
    for given in ("-x.nsys-rep", "./-x.nsys-rep"):
        result = run_sftprof("analyze", "-o", tmp_path / "out", "--", given, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
    assert all(call.split()[-1] == "./-x.nsys-rep" for call in copying_nsys.read_text().splitlines())


def _read_only(folder: Path) -> None:
    """Make `folder` unwritable, also for root (chattr +i), or skip."""
    folder.chmod(0o555)
    if os.access(folder, os.W_OK) and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("cannot make a folder read-only here")


def test_a_report_in_a_read_only_folder_is_exported_to_a_temporary_folder(tmp_path, copying_nsys):
    """A report on a read-only share: its export goes under TMPDIR, and is gone when the analysis ends."""
    shared, scratch = tmp_path / "shared", tmp_path / "tmp"
    shared.mkdir(), scratch.mkdir()
    shutil.copy(CLEAN, shared / "profile.nsys-rep")
    _read_only(shared)
    try:
        before = tree_state(shared)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sftprof.cli",
                "analyze",
                str(shared / "profile.nsys-rep"),
                "-o",
                str(tmp_path / "o"),
            ],
            env={**os.environ, "TMPDIR": str(scratch)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert tree_state(shared) == before and list(scratch.iterdir()) == []
    finally:
        subprocess.run(["chattr", "-i", str(shared)], capture_output=True)
        shared.chmod(0o755)


def _stores(scratch: Path) -> list[str]:
    return sorted(p.name for p in scratch.iterdir())


def _started(scratch: Path, out: Path) -> subprocess.Popen:
    """`sftprof analyze` of a 2 MB capture, once its event store is under `scratch`."""
    run = subprocess.Popen(
        [SFTPROF, "analyze", str(FIXTURES / "h200_sft_clean.sqlite"), "-o", str(out)],
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(name.startswith(f"sftprof-events-{socket.gethostname()}-") for name in _stores(scratch)):
        assert run.poll() is None and time.monotonic() < deadline, "the analysis made no event store"
        time.sleep(0.02)
    return run


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_ends_an_analysis_in_one_line_and_removes_its_temporary_files(tmp_path, signum):
    """Slurm's SIGTERM at a time limit, Ctrl-C, a closed terminal: exit 128+N, one line, no traceback, nothing left
    under TMPDIR and no output folder."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    run = _started(scratch, tmp_path / "out")
    run.send_signal(signum)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, stderr[-2000:]
    assert (
        stderr.strip().splitlines()[-1:]
        == [f"sftprof: stopped by {signal.Signals(signum).name}: temporary files removed, earlier output kept"]
        and "Traceback" not in stderr
    ), stderr[-2000:]
    assert _stores(scratch) == [] and not (tmp_path / "out").exists()


def test_what_a_killed_analysis_left_is_removed_by_the_next(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    (scratch / "sftprof-events-otherhost-1-abcdefgh").mkdir()  # another host's, on a shared TMPDIR
    run = _started(scratch, tmp_path / "out")
    run.kill()
    run.communicate(timeout=60)
    left = [name for name in _stores(scratch) if name.startswith(f"sftprof-events-{socket.gethostname()}-")]
    assert left, _stores(scratch)
    result = subprocess.run(
        [sys.executable, "-m", "sftprof.cli", "analyze", str(CLEAN), "-o", str(tmp_path / "next")],
        env={**os.environ, "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert _stores(scratch) == ["sftprof-events-otherhost-1-abcdefgh"]


def test_a_full_output_disk_is_one_line_and_keeps_the_previous_output(tmp_path, small_disk):
    (small_disk / "out").mkdir()
    (small_disk / "out" / "report.html").write_text("the previous report")
    before = tree_state(small_disk)
    message = assert_refused(run_sftprof("analyze", CLEAN, "-o", small_disk / "out"), contains="no space left")
    assert str(small_disk) in message
    assert tree_state(small_disk) == before


def _limited(address_space: int):
    """A child's address space held to `address_space` bytes (ulimit -v)."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))


@pytest.mark.parametrize("limit_gib, ends", [(0.95, "refused"), (1.3, "analysed")])
def test_an_address_space_limit_is_met_or_refused_up_front(tmp_path, limit_gib, ends):
    """Under ulimit -v (as clusters set it) a 512MB budget either fits, its threads' stacks made small, or is
    refused in one line naming the limit it needs; DuckDB's threads used to abort (exit 134) below about 1.4 GB."""
    result = subprocess.run(
        [SFTPROF, "analyze", str(FIXTURES / "h200_sft_clean.sqlite"), "-o", str(tmp_path / "out"), "--memory-budget"]
        + ["512MB"],
        preexec_fn=_limited(int(limit_gib * 2**30)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ends == "refused":
        assert_refused(result, contains="the address-space limit (ulimit -v) of 0.95 GB is below the 1.25 GB")
    else:
        assert result.returncode == 0, result.stderr[-2000:]
