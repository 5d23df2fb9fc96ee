"""Nsight Systems: build `nsys profile` command lines, run them safely, export to SQLite.

This module is the one place that knows nsys's option names. It also handles what nsys does
wrong in practice, each seen on real installs:
- a capture left as NAME.qdstrm because QdstrmImporter was not found (exit code still 0);
- output diverted to /tmp/nsys-report-XXXX.qdstrm because the target existed (exit code 0);
- `nsys --start-agent` processes left behind that burn a core each and stall later captures.
"""

from __future__ import annotations

import glob
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator, Sequence

from sftprof.errors import SftprofError
from sftprof.io import atomic_path
from sftprof.capture.sft.annotate import CAPTURE_RANGE_NAME

REPORT_SUFFIX = ".nsys-rep"
RAW_SUFFIX = ".qdstrm"
INSTALL_HINT = (
    "Install the Nsight Systems CLI: on Debian 12 run `sudo scripts/install-nsys.sh` "
    "(non-free package nsight-systems); elsewhere get it from NVIDIA's Nsight Systems page, "
    "then make sure `nsys` is on PATH."
)
# nsys expands these in --output: one report per rank, named by job, node, rank and host.
PER_RANK_OUTPUT = ".%q{SLURM_JOB_ID}.%q{SLURM_NODEID}.%q{SLURM_PROCID}.%h"
# How long output may keep coming after nsys has exited before what is left is killed.
OUTPUT_GRACE_S = 10.0
# Set to a fresh random value for each profiled run: what carries it in its environment is that
# run's, and only that is reaped after nsys exits.
RUN_TOKEN = "SFTPROF_RUN_TOKEN"
# A line of the progress bar nsys draws while importing a capture: "[1/1] [==42%   ] NAME".
_PROGRESS_LINE = re.compile(r"^\[\d+/\d+\] \[")
# Unregistered NVTX strings (what the trainer pushes) only open an nvtx capture range with this.
NVTX_CAPTURE_ENV = {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}


class NsysError(SftprofError, RuntimeError):
    """nsys is missing, failed, or produced no usable report; the message says which."""


def find_nsys() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise NsysError(f"`nsys` is not on PATH. {INSTALL_HINT}")
    return path


def profile_options(profile: dict, window: dict) -> list[str]:
    """Long-form `nsys profile` options for an experiment's profile settings and one window.

    Long options only: the short ones are easy to swap (`-d` is --duration, `-y` is --delay,
    the reverse of what NVIDIA's Grace Hopper SFT write-up says).
    """
    options = [
        f"--trace={','.join(profile['trace'])}",
        f"--sample={profile['sample']}",
        f"--cpuctxsw={profile['cpuctxsw']}",
        f"--show-output={'true' if profile['show_output'] else 'false'}",
    ]
    if profile["force_overwrite"]:
        options.append("--force-overwrite=true")
    if profile["event_sample"] != "none":
        options.append(f"--event-sample={profile['event_sample']}")
    if window["capture_range"] != "none":
        options.append(f"--capture-range={window['capture_range']}")
        options.append(f"--capture-range-end={window['capture_range_end']}")
        if window["capture_range"] == "nvtx":
            options.append(f"--nvtx-capture={CAPTURE_RANGE_NAME}")
    if "delay_s" in window:
        options.append(f"--delay={window['delay_s']}")
    if "duration_s" in window:
        options.append(f"--duration={window['duration_s']}")
        options.append(f"--kill={window['kill']}")
    return options


def profile_environment(window: dict) -> dict[str, str]:
    return dict(NVTX_CAPTURE_ENV) if window["capture_range"] == "nvtx" else {}


def output_pattern(directory: str | Path, output_name: str, per_rank: bool) -> str:
    """The --output value: under Slurm, nsys itself makes each rank's name unique."""
    return str(Path(directory) / output_name) + (PER_RANK_OUTPUT if per_rank else "")


def expand_output(pattern: str, environ: dict[str, str] | None = None) -> Path:
    """The path nsys makes of an --output pattern: %q{VAR} is $VAR, %h the host name, %% a %."""
    environ = os.environ if environ is None else environ

    def substitute(match: re.Match) -> str:
        token = match.group(0)
        if token == "%%":
            return "%"
        if token == "%h":
            return socket.gethostname()
        name = match.group(1)
        if name not in environ:
            raise NsysError(f"--output={pattern} needs ${name}, which is not set (run it under Slurm)")
        return environ[name]

    return Path(re.sub(r"%q\{([A-Za-z_][A-Za-z0-9_]*)\}|%h|%%", substitute, pattern))


def profile_argv(options: Sequence[str], output: str | Path, app_argv: Sequence[str], nsys: str = "nsys") -> list[str]:
    """`nsys profile OPTIONS --output=OUTPUT PROGRAM...`: --output always comes last, right before
    the program (sftprof.capture.rank relies on that to split the two). No "--" before the program:
    nsys 2022.4 rejects it as an ambiguous option."""
    return [nsys, "profile", *options, f"--output={output}", *app_argv]


def split_profile_argv(argv: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """The inverse of profile_argv: (options, output, program argv)."""
    if len(argv) < 2 or Path(argv[0]).name != "nsys" or argv[1] != "profile":
        raise NsysError(f"expected an `nsys profile ...` command, got: {shlex.join(argv[:3])} ...")
    for index, arg in enumerate(argv):
        if arg.startswith("--output="):
            return list(argv[2:index]), arg.removeprefix("--output="), list(argv[index + 1:])
    raise NsysError("the nsys profile command has no --output=... before the program")


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process whose command line can be read."""
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            yield int(cmdline_path.split("/")[2]), Path(cmdline_path).read_bytes().split(b"\0")[:-1]
        except OSError:
            continue


def running_agent_pids() -> set[int]:
    """Process ids of running `nsys --start-agent` helpers."""
    return {pid for pid, argv in _processes() if b"--start-agent" in argv and argv[:1] and argv[0].endswith(b"nsys")}


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def find_qdstrm_importer(nsys_path: str) -> Path | None:
    """QdstrmImporter of the same installation as `nsys_path`, wherever the packager put it."""
    nsys_dir = Path(os.path.realpath(nsys_path)).parent
    candidates = [os.environ.get("SFTPROF_QDSTRM_IMPORTER", ""),
                  str(nsys_dir.parent / "host-linux-x64" / "QdstrmImporter"),
                  "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter",
                  *sorted(glob.glob("/opt/nvidia/nsight-systems/*/host-linux-x64/QdstrmImporter"), reverse=True)]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def import_qdstrm(qdstrm: Path, report: Path, nsys_path: str, log: IO[str]) -> None:
    """Turn a raw capture into a .nsys-rep, as nsys would have done had it found its importer."""
    importer = find_qdstrm_importer(nsys_path)
    if importer is None:
        raise NsysError(f"nsys left the raw capture {qdstrm} and QdstrmImporter cannot be found "
                        "(set SFTPROF_QDSTRM_IMPORTER to its path)")
    log.write(f"[sftprof] nsys did not import its capture; running {importer}\n")
    log.flush()
    result = subprocess.run([str(importer), "-i", str(qdstrm), "-o", str(report)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The importer draws a progress bar with carriage returns; keep only its final state.
    progress = [line for line in result.stdout.replace("\r", "\n").splitlines() if line.strip()]
    log.write("".join(progress[-1:]) + "\n")
    if result.returncode != 0 or not report.exists():
        raise NsysError(f"QdstrmImporter failed on {qdstrm} (exit {result.returncode})")
    qdstrm.unlink()


def generated_paths(output: str) -> list[str]:
    """The files nsys says it wrote: the indented lines after each "Generated:" line."""
    paths, in_block = [], False
    for line in output.splitlines():
        if line.strip() == "Generated:":
            in_block = True
        elif in_block and line.startswith((" ", "\t")) and line.strip():
            paths.append(line.strip())
        else:
            in_block = False
    return paths


def report_path(base: Path) -> Path:
    """Where nsys puts the report for `--output=base` (it appends the suffix itself)."""
    return base.with_name(base.name + REPORT_SUFFIX)


def _collect_report(base: Path, output: str, nsys_path: str, log: IO[str], capture_range: bool) -> Path:
    report, raw = report_path(base), base.with_name(base.name + RAW_SUFFIX)
    expected = {str(report.resolve()), str(raw.resolve())}
    diverted = [p for p in generated_paths(output) if str(Path(p).resolve()) not in expected]
    if diverted:
        raise NsysError(f"nsys wrote its capture to {diverted[0]} instead of {report}: a file of that name "
                        "already existed and overwriting was not allowed. Nothing was imported; remove the "
                        "old file or pass --force-overwrite=true.")
    if report.exists():
        raw.unlink(missing_ok=True)
        return report
    if raw.exists():
        import_qdstrm(raw, report, nsys_path, log)
        return report
    if capture_range:
        raise NsysError(f"nsys produced no report at {report}: the capture range never opened (check the "
                        "window's steps, and that the program emits the NVTX range or cudaProfilerStart)")
    raise NsysError(f"nsys produced no report at {report}; see the log for its messages")


def run_profile(options: Sequence[str], app_argv: Sequence[str], output: str | Path, log: IO[str],
                extra_env: dict[str, str] | None = None) -> Path:
    """Profile `app_argv` into `output`.nsys-rep; return the report path or raise NsysError.

    `output` may hold nsys's %q{VAR} and %h expansions (see output_pattern). nsys's own output
    is copied to `log` and echoed to stdout. What this run started and left behind (nsys's
    process group, the program, the `--start-agent` helper) is killed before returning; it is
    found by a token in its environment, so other runs on the node are never touched.
    """
    nsys = find_nsys()
    token = secrets.token_hex(16)
    env = {**os.environ, **(extra_env or {}), RUN_TOKEN: token}
    base = expand_output(str(output), env)
    base.parent.mkdir(parents=True, exist_ok=True)
    argv = profile_argv(options, output, app_argv, nsys)
    log.write("[sftprof] " + shlex.join(argv) + "\n")
    log.flush()
    captured: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    def copy_output() -> None:
        for line in proc.stdout:
            captured.append(line)
            log.write(line)
            sys.stdout.write(line)

    # Read in a thread and wait for nsys itself: a program that nsys has given up on ("Connection
    # to the Agent lost", seen with two ranks profiled on one node) can hold the pipe open forever.
    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    try:
        returncode = proc.wait()
        reader.join(timeout=OUTPUT_GRACE_S)
    finally:
        # Whatever is still in nsys's process group now (the program, if nsys died) is left over.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        _reap_run(token)
        reader.join(timeout=OUTPUT_GRACE_S)
    log.flush()
    output = "".join(captured)
    if returncode != 0:
        # nsys's import progress bar can print dozens of lines after the program's last words.
        program_lines = [line for line in captured if not _PROGRESS_LINE.match(line)]
        tail = "".join(program_lines[-15:])
        partial = report_path(base)
        kept = f" A report of the failed run is kept at {partial} for inspection." if partial.exists() else ""
        raise NsysError(f"nsys profile exited with {returncode}: the profiled program or nsys failed.{kept} "
                        f"Last output:\n{tail}")
    capture_range = any(o.startswith("--capture-range=") and o != "--capture-range=none" for o in options)
    return _collect_report(base, output, nsys, log, capture_range)


def _run_processes(token: str) -> set[int]:
    """Processes started by the run that `token` marks: the environment they began with holds it.
    nsys hands its environment to everything it starts (its launcher, the program, the
    `--start-agent` helper), even where they leave its session or process group."""
    marker = f"{RUN_TOKEN}={token}".encode()
    found = set()
    for environ_path in glob.glob("/proc/[0-9]*/environ"):
        try:
            if marker in Path(environ_path).read_bytes().split(b"\0"):
                found.add(int(environ_path.split("/")[2]))
        except (OSError, ValueError):  # ended while we looked, or another user's
            continue
    found.discard(os.getpid())
    return found


def _reap_run(token: str, grace_s: float = 2.0) -> None:
    """Kill what this run started and left behind (the program if it outlived nsys, the agent),
    after `grace_s` to end on its own. Only this run's: another run on the same node, or a rerun
    of the same command line and rank, is left alone."""
    deadline = time.monotonic() + grace_s
    while _run_processes(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    _kill(_run_processes(token))


def export_sqlite(report: str | Path, sqlite_path: str | Path) -> Path:
    """`nsys export --type=sqlite`, written atomically to `sqlite_path`, and only once it opens
    as a whole export: on a full disk nsys exits 0 and leaves an empty or truncated file."""
    from sftprof.trace.nsys_sqlite import TraceFormatError, check_export

    nsys = find_nsys()
    sqlite_path = Path(sqlite_path)
    with atomic_path(sqlite_path) as tmp:
        tmp.unlink()
        result = subprocess.run([nsys, "export", "--type=sqlite", "--force-overwrite=true",
                                 f"--output={tmp}", str(report)], capture_output=True, text=True)
        messages = (result.stderr or result.stdout).strip()
        if result.returncode != 0 or not tmp.exists():
            raise NsysError(f"nsys export failed on {report} (exit {result.returncode}): {messages[-2000:]}")
        try:
            check_export(tmp)
        except TraceFormatError as error:
            last = messages.splitlines()[-1:] or ["no message"]
            raise NsysError(f"nsys export of {report} is not a complete export ({error}); nsys said: {last[0][-300:]}. "
                            f"Is the disk of {sqlite_path.parent} full?") from None
    return sqlite_path
