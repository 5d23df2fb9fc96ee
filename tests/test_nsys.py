"""nsys command lines, and what the runner does when real nsys misbehaves."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sftprof.capture import nsys

PROFILE = {"trace": ["cuda", "cudnn", "cublas", "osrt", "nvtx"], "sample": "none", "cpuctxsw": "none",
           "event_sample": "system-wide", "show_output": True, "force_overwrite": False}
CPU_PROFILE = {"trace": ["osrt"], "sample": "none", "cpuctxsw": "none", "event_sample": "none",
               "show_output": True, "force_overwrite": False}
SHORT_PROGRAM = [sys.executable, "-c", "import time; print('profiled'); time.sleep(0.2)"]


def test_time_window_renders_long_options_with_delay_and_duration_the_right_way_round():
    window = {"capture_range": "none", "capture_range_end": "stop", "delay_s": 30, "duration_s": 60,
              "kill": "none"}
    assert nsys.profile_options(PROFILE, window) == [
        "--trace=cuda,cudnn,cublas,osrt,nvtx", "--sample=none", "--cpuctxsw=none", "--show-output=true",
        "--event-sample=system-wide", "--delay=30", "--duration=60", "--kill=none"]
    assert nsys.profile_environment(window) == {}


def test_cuda_profiler_api_window():
    window = {"capture_range": "cudaProfilerApi", "capture_range_end": "stop-shutdown", "start_step": 5,
              "end_step": 10, "kill": "none"}
    options = nsys.profile_options({**PROFILE, "event_sample": "none", "show_output": False}, window)
    assert options == ["--trace=cuda,cudnn,cublas,osrt,nvtx", "--sample=none", "--cpuctxsw=none",
                       "--show-output=false", "--capture-range=cudaProfilerApi",
                       "--capture-range-end=stop-shutdown"]


def test_nvtx_window_names_the_trainers_range_and_allows_unregistered_strings():
    window = {"capture_range": "nvtx", "capture_range_end": "stop", "start_step": 1, "end_step": 2,
              "kill": "none"}
    options = nsys.profile_options(CPU_PROFILE, window)
    assert options[-3:] == ["--capture-range=nvtx", "--capture-range-end=stop", "--nvtx-capture=sftprof_capture"]
    assert nsys.profile_environment(window) == {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}


def test_missing_nsys_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(nsys.NsysError, match="install-nsys.sh"):
        nsys.run_profile([], SHORT_PROGRAM, tmp_path / "r", io.StringIO())


def test_real_profile_writes_report_and_leaves_no_agents(tmp_path):
    before = nsys.running_agent_pids()
    log = io.StringIO()
    report = nsys.run_profile(["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM,
                              tmp_path / "plain", log)
    assert report == tmp_path / "plain.nsys-rep" and report.stat().st_size > 0
    assert not (tmp_path / "plain.qdstrm").exists()
    assert "profiled" in log.getvalue()
    assert nsys.running_agent_pids() <= before


@pytest.fixture
def nsys_without_importer(tmp_path, monkeypatch) -> Path:
    """A private nsys install laid out like Debian's but without the importer beside it, so
    `nsys profile` leaves a bare .qdstrm exactly as on a fresh Debian install."""
    target = Path(os.path.realpath(shutil.which("nsys"))).parent
    install = tmp_path / "nsys-install"
    (install / "bin").mkdir(parents=True)
    if subprocess.run(["cp", "-al", str(target), str(install / target.name)]).returncode != 0:
        shutil.copytree(target, install / target.name, symlinks=True)
    (install / "bin" / "nsys").symlink_to(Path("..") / target.name / "nsys")
    monkeypatch.setenv("PATH", f"{install / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return install


def test_bare_qdstrm_is_imported(nsys_without_importer, tmp_path):
    log = io.StringIO()
    report = nsys.run_profile(["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM,
                              tmp_path / "salvaged", log)
    assert "importer binary and its dependencies were not found" in log.getvalue()
    assert "running" in log.getvalue() and "QdstrmImporter" in log.getvalue()
    assert report.exists() and not (tmp_path / "salvaged.qdstrm").exists()
    # The salvaged report is a real one: nsys can export it.
    assert nsys.export_sqlite(report, tmp_path / "salvaged.sqlite").stat().st_size > 0


def _diverted_path(error: nsys.NsysError) -> Path:
    return Path(str(error).split(" instead")[0].split()[-1])


def test_output_diverted_to_tmp_is_an_error_not_the_stale_report(tmp_path):
    """nsys finds the .nsys-rep taken, writes /tmp/nsys-report-XXXX.nsys-rep and exits 0."""
    stale = tmp_path / "taken.nsys-rep"
    stale.write_bytes(b"an old report")
    with pytest.raises(nsys.NsysError, match=r"/tmp/nsys-report-\w+\.nsys-rep instead of .*taken\.nsys-rep") as e:
        nsys.run_profile(["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM,
                         tmp_path / "taken", io.StringIO())
    assert stale.read_bytes() == b"an old report"
    assert _diverted_path(e.value).exists()  # the capture is not lost: the message says where it is
    _diverted_path(e.value).unlink()


def test_diverted_raw_capture_is_not_confused_with_an_old_qdstrm(nsys_without_importer, tmp_path):
    """Without the importer nsys checks the .qdstrm name; an old one there must not be imported."""
    stale = tmp_path / "taken.qdstrm"
    stale.write_bytes(b"an old capture that must not be imported")
    with pytest.raises(nsys.NsysError, match=r"/tmp/nsys-report-\w+\.qdstrm instead of .*taken\.nsys-rep") as e:
        nsys.run_profile(["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM,
                         tmp_path / "taken", io.StringIO())
    assert stale.read_bytes().startswith(b"an old capture")
    assert not (tmp_path / "taken.nsys-rep").exists()
    _diverted_path(e.value).unlink()


def test_capture_range_that_never_opens_is_named(tmp_path):
    options = ["--trace=osrt,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range=nvtx",
               "--nvtx-capture=sftprof_capture", "--capture-range-end=stop"]
    with pytest.raises(nsys.NsysError, match="capture range never opened"):
        nsys.run_profile(options, SHORT_PROGRAM, tmp_path / "never", io.StringIO(), nsys.NVTX_CAPTURE_ENV)


def test_failing_program_is_reported_with_its_output(tmp_path):
    program = [sys.executable, "-c", "import sys; print('boom happened'); sys.exit(3)"]
    with pytest.raises(nsys.NsysError, match="(?s)exited with 3.*kept at .*fail.nsys-rep.*boom happened"):
        nsys.run_profile(["--trace=osrt", "--sample=none", "--cpuctxsw=none"], program, tmp_path / "fail",
                         io.StringIO())


def test_export_of_a_damaged_report_fails_cleanly(tmp_path):
    bad = tmp_path / "bad.nsys-rep"
    bad.write_bytes(b"\0" * 100)
    with pytest.raises(nsys.NsysError, match="nsys export failed"):
        nsys.export_sqlite(bad, tmp_path / "bad.sqlite")
    assert not (tmp_path / "bad.sqlite").exists()
    assert not list(tmp_path.glob(".*partial*"))


def test_time_window_with_real_nsys_lets_the_program_finish(tmp_path):
    window = {"capture_range": "none", "capture_range_end": "stop", "delay_s": 1, "duration_s": 1, "kill": "none"}
    program = [sys.executable, "-c", "import time; time.sleep(3); print('finished after the window')"]
    log = io.StringIO()
    report = nsys.run_profile(nsys.profile_options(CPU_PROFILE, window), program, tmp_path / "timed", log)
    assert report.exists()
    assert "finished after the window" in log.getvalue()
    assert "--delay=1" in log.getvalue() and "--duration=1" in log.getvalue()
