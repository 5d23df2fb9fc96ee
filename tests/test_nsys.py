"""nsys command lines, and what the runner does when real nsys misbehaves."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sftprof import pipeline
from sftprof.capture import nsys

from conftest import ENDPOINT_THROW, SEM_OPEN_THROW, TEST_SESSION

PROFILE = {
    "trace": ["cuda", "cudnn", "cublas", "osrt", "nvtx"],
    "sample": "none",
    "cpuctxsw": "none",
    "event_sample": "system-wide",
    "show_output": True,
    "force_overwrite": False,
}
CPU_PROFILE = {
    "trace": ["osrt"],
    "sample": "none",
    "cpuctxsw": "none",
    "event_sample": "none",
    "show_output": True,
    "force_overwrite": False,
}
SHORT_PROGRAM = [sys.executable, "-c", "import time; print('profiled'); time.sleep(0.2)"]


def test_time_window_renders_long_options_with_delay_and_duration_the_right_way_round():
    window = {"capture_range": "none", "capture_range_end": "stop", "delay_s": 30, "duration_s": 60, "kill": "none"}
    assert nsys.profile_options(PROFILE, window) == [
        "--trace=cuda,cudnn,cublas,osrt,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--show-output=true",
        "--event-sample=system-wide",
        "--delay=30",
        "--duration=60",
        "--kill=none",
    ]
    assert nsys.profile_environment(window) == {}


def test_cuda_profiler_api_window():
    window = {
        "capture_range": "cudaProfilerApi",
        "capture_range_end": "stop-shutdown",
        "start_step": 5,
        "end_step": 10,
        "kill": "none",
    }
    options = nsys.profile_options({**PROFILE, "event_sample": "none", "show_output": False}, window)
    assert options == [
        "--trace=cuda,cudnn,cublas,osrt,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--show-output=false",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop-shutdown",
    ]


def test_nvtx_window_names_the_trainers_range_and_allows_unregistered_strings():
    window = {"capture_range": "nvtx", "capture_range_end": "stop", "start_step": 1, "end_step": 2, "kill": "none"}
    options = nsys.profile_options(CPU_PROFILE, window)
    assert options[-3:] == ["--capture-range=nvtx", "--capture-range-end=stop", "--nvtx-capture=sftprof_capture"]
    assert nsys.profile_environment(window) == {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}


def test_missing_nsys_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(nsys.NsysError, match="install-nsys.sh"):
        nsys.run_profile([], SHORT_PROGRAM, tmp_path / "r", io.StringIO())


def test_real_profile_writes_report_and_leaves_no_agents(tmp_path):
    before = nsys.running_agent_pids(TEST_SESSION)
    log = io.StringIO()
    report = nsys.run_profile(
        ["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM, tmp_path / "plain", log
    )
    assert report == tmp_path / "plain.nsys-rep" and report.stat().st_size > 0
    assert not (tmp_path / "plain.qdstrm").exists()
    assert "profiled" in log.getvalue()
    assert nsys.running_agent_pids(TEST_SESSION) <= before


def _fake_install(root: Path, target: str, host: str) -> tuple[Path, Path]:
    """An Nsight Systems install laid out as NVIDIA packages it, with executable stand-ins: (nsys, importer)."""
    for path in (root / target / "nsys", root / host / "QdstrmImporter"):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    (root / "bin").mkdir()
    (root / "bin" / "nsys").symlink_to(Path("..") / target / "nsys")
    return root / "bin" / "nsys", root / host / "QdstrmImporter"


@pytest.mark.parametrize(
    "machine, target, host",
    [
        ("aarch64", "target-linux-sbsa-armv8", "host-linux-armv8"),
        ("aarch64", "target-linux-sbsa-armv8", "host-linux-aarch64"),
        ("arm64", "target-linux-sbsa-armv8", "host-linux-armv8"),
        ("x86_64", "target-linux-x64", "host-linux-x64"),
    ],
)
def test_the_importer_of_an_install_is_found_on_x86_and_arm(tmp_path, monkeypatch, machine, target, host):
    """GH200 nodes are aarch64: their nsys puts QdstrmImporter in an Arm host folder, which was never looked in."""
    monkeypatch.delenv("SFTPROF_QDSTRM_IMPORTER", raising=False)
    monkeypatch.setattr(nsys.platform, "machine", lambda: machine)
    nsys_path, importer = _fake_install(tmp_path / "2025.3.1", target, host)
    assert nsys.find_qdstrm_importer(str(nsys_path)) == importer


def test_an_importer_for_the_other_cpu_is_not_taken(tmp_path, monkeypatch):
    monkeypatch.delenv("SFTPROF_QDSTRM_IMPORTER", raising=False)
    monkeypatch.setattr(nsys.platform, "machine", lambda: "aarch64")
    nsys_path, importer = _fake_install(tmp_path / "2025.3.1", "target-linux-x64", "host-linux-x64")
    assert nsys.find_qdstrm_importer(str(nsys_path)) != importer
    assert nsys.host_dirs("riscv64") == ("host-linux-x64", "host-linux-armv8", "host-linux-aarch64")


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
    report = nsys.run_profile(
        ["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM, tmp_path / "salvaged", log
    )
    assert "importer binary and its dependencies were not found" in log.getvalue()
    assert "running" in log.getvalue() and "QdstrmImporter" in log.getvalue()
    assert report.exists() and not (tmp_path / "salvaged.qdstrm").exists()
    # The salvaged report is a real one: nsys can export it.
    assert pipeline.export_report(report, tmp_path / "salvaged.sqlite").stat().st_size > 0


def _diverted_path(error: nsys.NsysError) -> Path:
    return Path(str(error).split(" instead")[0].split()[-1])


def test_output_diverted_to_tmp_is_an_error_not_the_stale_report(tmp_path):
    """nsys finds the .nsys-rep taken, writes /tmp/nsys-report-XXXX.nsys-rep and exits 0."""
    stale = tmp_path / "taken.nsys-rep"
    stale.write_bytes(b"an old report")
    with pytest.raises(nsys.NsysError, match=r"/tmp/nsys-report-\w+\.nsys-rep instead of .*taken\.nsys-rep") as e:
        nsys.run_profile(
            ["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM, tmp_path / "taken", io.StringIO()
        )
    assert stale.read_bytes() == b"an old report"
    assert _diverted_path(e.value).exists()  # the capture is not lost: the message says where it is
    _diverted_path(e.value).unlink()


def test_diverted_raw_capture_is_not_confused_with_an_old_qdstrm(nsys_without_importer, tmp_path):
    """Without the importer nsys checks the .qdstrm name; an old one there must not be imported."""
    stale = tmp_path / "taken.qdstrm"
    stale.write_bytes(b"an old capture that must not be imported")
    with pytest.raises(nsys.NsysError, match=r"/tmp/nsys-report-\w+\.qdstrm instead of .*taken\.nsys-rep") as e:
        nsys.run_profile(
            ["--trace=osrt", "--sample=none", "--cpuctxsw=none"], SHORT_PROGRAM, tmp_path / "taken", io.StringIO()
        )
    assert stale.read_bytes().startswith(b"an old capture")
    assert not (tmp_path / "taken.nsys-rep").exists()
    _diverted_path(e.value).unlink()


def test_capture_range_that_never_opens_is_named(tmp_path):
    options = [
        "--trace=osrt,nvtx",
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=nvtx",
        "--nvtx-capture=sftprof_capture",
        "--capture-range-end=stop",
    ]
    with pytest.raises(nsys.NsysError, match="capture range never opened"):
        nsys.run_profile(options, SHORT_PROGRAM, tmp_path / "never", io.StringIO(), nsys.NVTX_CAPTURE_ENV)


def test_failing_program_is_reported_with_its_output(tmp_path):
    program = [sys.executable, "-c", "import sys; print('boom happened'); sys.exit(3)"]
    with pytest.raises(nsys.NsysError, match="(?s)exited with 3.*kept at .*fail.nsys-rep.*boom happened"):
        nsys.run_profile(
            ["--trace=osrt", "--sample=none", "--cpuctxsw=none"], program, tmp_path / "fail", io.StringIO()
        )


def test_export_of_a_damaged_report_fails_cleanly(tmp_path):
    bad = tmp_path / "bad.nsys-rep"
    bad.write_bytes(b"\0" * 100)
    with pytest.raises(nsys.NsysError, match="nsys export failed"):
        pipeline.export_report(bad, tmp_path / "bad.sqlite")
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


# ---------------------------------------------------------------- what nsys 2022.4 and 2025.3 print

# Real output, progress bars shortened. 2025.3.1: `nsys profile` of tests/gpu_programs/plants.py gemm
# on the H200 (tests/fixtures/nsys2025/README.md); 2022.4.2.1: `nsys profile` of a one-line program here.
PROFILE_2025 = (
    "gemm step 4: 187.5 ms on the host\nCapture range started in the application.\n"
    "Capture range ended in the application.\nGenerating '/tmp/nsys-report-11f2.qdstrm'\n"
    "\r[1/1] [0%                          ] h200_plant_gemm.nsys-repProcessing events...\n"
    "\r[1/1] [0%                          ] h200_plant_gemm.nsys-rep"
    "\r[1/1] [========================100%] h200_plant_gemm.nsys-rep\n"
    "gemm step 5: 200.8 ms on the host\nGenerated:\n\t/tmp/nsys2025/caps/h200_plant_gemm.nsys-rep\n"
)
PROFILE_2022 = (
    "hi\nGenerating '/tmp/nsys-report-af76.qdstrm'\n\r[1/1] [0%                          ] plain.nsys-rep"
    "\r[1/1] [========================100%] plain.nsys-rep\nGenerated:\n    /tmp/p22/plain.nsys-rep\n"
)


# `nsys export --type=sqlite`: 2025.3.1 draws "Processing N events", 2022.4 "Exporting N events"; both say
# nothing else when they succeed. 2022.4 on a 2025.3 report: the refusal, exit 1.
def _export_bar(label: str) -> str:
    return "".join(f"\r{label}: [{'=' * (p // 2)}{p}%{' ' * (52 - p // 2)}]" for p in (1, 50, 100)) + "\n"


EXPORT_2025, EXPORT_2022 = _export_bar("Processing 9535 events"), _export_bar("Exporting 142 events")
REFUSED_BY_2022 = "Exportation error: Version not supported: 36398880\n"


def test_versions_of_both_releases_are_read():
    assert nsys.parse_version("NVIDIA Nsight Systems version 2025.3.1.0\n") == ("2025.3.1.0", 2025)
    assert nsys.parse_version("NVIDIA Nsight Systems version 2022.4.2.1-df9881f\n") == ("2022.4.2.1-df9881f", 2022)
    assert nsys.parse_version("nsys: command not found") is None


def test_profile_output_of_both_releases_names_the_report_and_the_raw_capture():
    assert nsys.generated_paths(PROFILE_2025) == ["/tmp/nsys2025/caps/h200_plant_gemm.nsys-rep"]
    assert nsys.generated_paths(PROFILE_2022) == ["/tmp/p22/plain.nsys-rep"]
    assert nsys.raw_capture_paths(PROFILE_2025) == ["/tmp/nsys-report-11f2.qdstrm"]
    assert nsys.raw_capture_paths(PROFILE_2022) == ["/tmp/nsys-report-af76.qdstrm"]
    assert nsys.nsys_messages(PROFILE_2025)[-4:] == [
        "Generating '/tmp/nsys-report-11f2.qdstrm'",
        "gemm step 5: 200.8 ms on the host",
        "Generated:",
        "/tmp/nsys2025/caps/h200_plant_gemm.nsys-rep",
    ]


def test_export_progress_bars_of_both_releases_are_not_messages():
    assert nsys.nsys_messages(EXPORT_2025) == [] and nsys.nsys_messages(EXPORT_2022) == []
    assert nsys.nsys_messages(EXPORT_2022 + REFUSED_BY_2022) == [REFUSED_BY_2022.strip()]


def test_a_2025_capture_whose_report_was_written_is_collected(tmp_path):
    """The raw capture 2025.3 (like 2022.4) generates in /tmp is its own, not a diverted report."""
    report = tmp_path / "h200_plant_gemm.nsys-rep"
    report.write_bytes(b"report")
    output = PROFILE_2025.replace("/tmp/nsys2025/caps", str(tmp_path))
    assert nsys._collect_report(tmp_path / "h200_plant_gemm", output, "nsys", io.StringIO(), True) == report


def test_raw_capture_left_where_nsys_generated_it_is_imported(tmp_path, monkeypatch):
    """No report and no NAME.qdstrm, but the run's own raw capture (named in its "Generating" line) is
    there: it is imported, as NAME.qdstrm would be."""
    raw = tmp_path / "nsys-report-11f2.qdstrm"
    raw.write_bytes(b"raw capture")
    importer = tmp_path / "QdstrmImporter"
    importer.write_text('#!/bin/sh\ncp "$2" "$4"\necho "[1/1] [100%] imported"\n')
    importer.chmod(0o755)
    monkeypatch.setenv("SFTPROF_QDSTRM_IMPORTER", str(importer))
    output = PROFILE_2025.replace("/tmp/nsys-report-11f2.qdstrm", str(raw)).split("Generated:")[0]
    log = io.StringIO()
    report = nsys._collect_report(tmp_path / "h200_plant_gemm", output, "nsys", log, True)
    assert report.read_bytes() == b"raw capture" and not raw.exists()
    assert f"running {importer}" in log.getvalue()


def _fake_nsys(folder: Path, version: str, export_stdout: str, export_stderr: str, code: int) -> Path:
    """An `nsys` that prints `version` for --version and the given output for export."""
    folder.mkdir()
    (folder / "out").write_text(export_stdout)
    (folder / "err").write_text(export_stderr)
    script = folder / "nsys"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = --version ]; then\n  echo "NVIDIA Nsight Systems version {version}"; exit 0\n'
        f'fi\ncat "{folder}/out"; cat "{folder}/err" >&2; exit {code}\n'
    )
    script.chmod(0o755)
    return script


def test_a_report_too_new_for_the_nsys_is_refused_with_what_to_do(tmp_path, monkeypatch):
    fake = _fake_nsys(tmp_path / "bin", "2022.4.2.1-df9881f", "", REFUSED_BY_2022, 1)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    report = tmp_path / "new.nsys-rep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report 36398880.\n")
    with pytest.raises(nsys.NsysError) as error:
        pipeline.export_report(report, tmp_path / "new.sqlite")
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{report} was written by a newer nsys than nsys 2022.4.2.1")
    assert "(it says: Exportation error: Version not supported: 36398880)" in message
    assert f"nsys export --type=sqlite --output={tmp_path / 'new.sqlite'} {report}" in message
    assert not (tmp_path / "new.sqlite").exists() and not list(tmp_path.glob(".*partial*"))


def test_a_failed_export_quotes_what_nsys_said_without_its_progress_bar(tmp_path, monkeypatch):
    fake = _fake_nsys(tmp_path / "bin", "2025.3.1.0", "", EXPORT_2025 + "Export failed: disk quota exceeded\n", 2)
    said = r"nsys export failed on .* \(exit 2\): Export failed: disk quota exceeded$"
    with pytest.raises(nsys.NsysError, match=said):
        pipeline.export_report(tmp_path / "r.nsys-rep", tmp_path / "r.sqlite", nsys=str(fake))


def test_export_runs_the_nsys_that_captured_inside_its_container():
    prefix = ["apptainer", "exec", "--nv", "nemo.sif"]
    assert nsys.export_argv("c/rank0.nsys-rep", "s/.rank0.sqlite.partial.sqlite", prefix=prefix) == [
        *prefix,
        "nsys",
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        "--output=s/.rank0.sqlite.partial.sqlite",
        "c/rank0.nsys-rep",
    ]


def test_stats_report_names_of_both_releases():
    assert {t: nsys.stats_report(t, 2022) for t in nsys.STATS_REPORTS} == {
        "kernels": "gpukernsum",
        "kernels_by_name": None,
        "memops": "gpumemtimesum",
        "memops_by_size": "gpumemsizesum",
        "cuda_api": "cudaapisum",
        "osrt": "osrtsum",
        "nvtx": "nvtxsum",
    }
    # the names 2025.3.1 ran: tests/fixtures/nsys2025/NAME.REPORT.csv
    assert {t: nsys.stats_report(t, 2025) for t in nsys.STATS_REPORTS} == {
        "kernels": None,
        "kernels_by_name": "cuda_gpu_kern_sum",
        "memops": "cuda_gpu_mem_time_sum",
        "memops_by_size": "cuda_gpu_mem_size_sum",
        "cuda_api": "cuda_api_sum",
        "osrt": "osrt_sum",
        "nvtx": "nvtx_sum",
    }
    fixtures = Path(__file__).parent / "fixtures" / "nsys2025"
    assert all((fixtures / f"h200_sft_clean.{name}.csv").exists() for _, name in nsys.STATS_REPORTS.values() if name)


def test_installed_nsys_knows_its_releases_report_names():
    version = nsys.nsys_version(nsys.find_nsys())
    assert version is not None
    listed = subprocess.run([nsys.find_nsys(), "stats", "--help-reports"], capture_output=True, text=True).stdout
    names = {line.split()[0].split("[")[0] for line in listed.splitlines() if line.startswith("  ") and line.split()}
    wanted = {nsys.stats_report(table, version[1]) for table in nsys.STATS_REPORTS} - {None}
    assert wanted <= names, wanted - names


@pytest.mark.parametrize(
    "output, could_not",
    [
        (SEM_OPEN_THROW, True),
        (ENDPOINT_THROW, True),
        ("End of file\n", True),
        ("Connection to the Agent lost.\nConnection to the Agent lost.\n", True),
        ("", False),  # silence: the program may have run and said nothing
        (SEM_OPEN_THROW + "the program said this\n", False),  # the program ran
        ("Connection to the Agent lost.\nstep 0 loss 5.5\n", False),
        (SEM_OPEN_THROW.replace("ProcessWaiterImpl::ProcessWaiterImpl", "Importer::Import"), False),  # elsewhere
        ("\n".join(SEM_OPEN_THROW.splitlines()[1:]), False),  # a dump's lines without nsys's throw
    ],
)
def test_could_not_start_only_where_nsys_says_nothing_but_its_start_failure(output, could_not):
    assert nsys.could_not_start(nsys.nsys_messages(output)) is could_not


def test_agents_are_told_by_the_mark_in_their_environment():
    """Another session's agent on the machine is not this session's: the session's end check counted one
    alive as this session's own leftover (an error of its last test)."""
    stand_in = [sys.executable, "-c", "import time; time.sleep(60)", "--start-agent"]
    mine = subprocess.Popen(["nsys", *stand_in[1:]], executable=sys.executable)
    other_env = {k: v for k, v in os.environ.items() if k != TEST_SESSION.split("=")[0]}
    other = subprocess.Popen(["nsys", *stand_in[1:]], executable=sys.executable, env=other_env)
    try:
        deadline = time.monotonic() + 30  # until both have exec'd
        while {mine.pid, other.pid} - nsys.running_agent_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {mine.pid, other.pid} <= nsys.running_agent_pids()
        marked = nsys.running_agent_pids(TEST_SESSION)
        assert mine.pid in marked and other.pid not in marked
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()
