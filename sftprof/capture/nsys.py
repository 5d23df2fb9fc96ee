"""Nsight Systems: build `nsys profile` command lines, run them safely, export to SQLite or Parquet.

This module is the one place that knows nsys's option names. It also handles what nsys does
wrong in practice, each seen on real installs:
- a capture left as NAME.qdstrm because QdstrmImporter was not found (exit code still 0);
- output diverted to /tmp/nsys-report-XXXX.qdstrm because the target existed (exit code 0);
- `nsys --start-agent` processes left behind that burn a core each and stall later captures;
- an agent that does not start when another nsys starts or ends on the node (two ranks, two jobs, another
  user's run): nsys says only "Agent launcher failed." or "End of file", or dumps an exception thrown
  before the program ran (START_EXCEPTIONS), or says only "Connection to the Agent lost.": started again.

Two releases are checked on real captures, 2022.4 (Debian's) and 2025.3 (tests/fixtures/nsys2025):
their messages (the progress bars, "Generating '...qdstrm'", "Generated:"), the stats report names
(STATS_REPORTS) and the refusal of a report written by a newer release (NEWER_REPORT).
"""

from __future__ import annotations

import glob
import os
import platform
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from sftprof.capture.sft.annotate import CAPTURE_RANGE_NAME
from sftprof.errors import SftprofError

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
# All that nsys 2022.4 says when its agent does not start, the program never run: "End of file"
# was seen with two ranks starting nsys on one node, 3 runs in 40 on 2 cores under load; "Connection
# to the Agent lost." (exit 0, no report, after about 10 s) with another nsys starting beside it.
START_FAILURES = {"End of file", "Agent launcher failed.", "Connection to the Agent lost."}
# Where nsys 2022.4 throws when it cannot start, the program never run (exit 1), with another nsys
# starting or ending on the host under load: its launcher's semaphore not there yet (`sem_open`, No such
# file or directory, 0.3 s), and its agent's endpoint not up ("Local Endpoint is not available.", 2 s).
# Each was seen 1 to 2 times in 60 runs beside a second nsys on 2 loaded cores; each failed a workflow's
# profiled run (exit 1) where it was not started again.
START_EXCEPTIONS = (
    "QuadDCommon::ProcessWaiter::ProcessWaiterImpl::ProcessWaiterImpl(",
    "QuadDProtobufComm::Client::ClientProxy::GetLocalEndpoint(",
)
# The lines of nsys's dump of an exception (boost's diagnostic information):
# ".../ProcessWaiterImpl.cpp(166): Throw in function ...", "Dynamic exception type: ...",
# "std::exception::what: ...", "[boost::errinfo_errno_*] = 2, ...".
_THROW_LINE = re.compile(r"^\S+\(\d+\): Throw in function (.+)$")
_EXCEPTION_LINE = re.compile(r"^(?:Dynamic exception type: |std::exception::what: |\[[^\]]+\] = )")
START_ATTEMPTS = 3
START_RETRY_S = 2.0  # times the attempt: 2 s, then 4 s
# Set to a fresh random value for each profiled run: what carries it in its environment is that
# run's, and only that is reaped after nsys exits.
RUN_TOKEN = "SFTPROF_RUN_TOKEN"
# A line of the progress bar nsys draws while importing a capture: "[1/1] [==42%   ] NAME".
_PROGRESS_LINE = re.compile(r"^\[\d+/\d+\] \[")
# Unregistered NVTX strings (what the trainer pushes) only open an nvtx capture range with this.
NVTX_CAPTURE_ENV = {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}
# A progress bar of `nsys export` (drawn with carriage returns): 2022.4 prints
# "Exporting 142 events: [====100%]", 2025.3 "Processing 9535 events: [====100%]".
_EXPORT_PROGRESS = re.compile(r"^(?:Exporting|Processing) \d+ events: \[")
# Where nsys writes the raw capture before importing it into the report (2022.4 and 2025.3 alike):
# "Generating '/tmp/nsys-report-af76.qdstrm'".
_RAW_CAPTURE_LINE = re.compile(r"^Generating '(.+\.qdstrm)'$")
# What an nsys says of a report written by a newer release, which it cannot read (2022.4 on a
# 2025.3 report: "Exportation error: Version not supported: 36398880").
NEWER_REPORT = re.compile(r"Version not supported")
# `nsys --version`: "NVIDIA Nsight Systems version 2022.4.2.1-df9881f", "... version 2025.3.1.0".
_VERSION = re.compile(r"Nsight Systems version (\d{4})\.(\d+)[\w.-]*")
# The first release whose `nsys stats` reports have the new names (cuda_gpu_kern_sum, ...);
# checked: 2022.4 has the old names, 2025.3 the new ones.
STATS_RENAMED_SINCE = 2023
# sftprof's summary table -> the `nsys stats` report it equals row for row: (2022.4's name,
# the name since STATS_RENAMED_SINCE); None where that release has no such report. Kernels differ
# in their rows, not only their name: 2022.4's gpukernsum has a row per name, grid and block
# (`kernels`), the newer cuda_gpu_kern_sum a row per name (`kernels_by_name`).
STATS_REPORTS = {
    "kernels": ("gpukernsum", None),
    "kernels_by_name": (None, "cuda_gpu_kern_sum"),
    "memops": ("gpumemtimesum", "cuda_gpu_mem_time_sum"),
    "memops_by_size": ("gpumemsizesum", "cuda_gpu_mem_size_sum"),
    "cuda_api": ("cudaapisum", "cuda_api_sum"),
    "osrt": ("osrtsum", "osrt_sum"),
    "nvtx": ("nvtxsum", "nvtx_sum"),
}


class NsysError(SftprofError, RuntimeError):
    """nsys is missing, failed, or produced no usable report; the message says which."""


def find_nsys() -> str:
    path = shutil.which("nsys")
    if path is None:
        raise NsysError(f"`nsys` is not on PATH. {INSTALL_HINT}")
    return path


def nsys_after(prefix: Sequence[str]) -> str:
    """The nsys to run after `prefix`: a container's exec prefix runs the image's ("nsys" on its PATH);
    no prefix, the one on this PATH."""
    return "nsys" if prefix else find_nsys()


def parse_version(text: str) -> tuple[str, int] | None:
    """(version, release year) from `nsys --version`'s output ("2025.3.1.0", 2025); None if it says none."""
    match = _VERSION.search(text)
    return (match.group(0).rsplit(" ", 1)[-1], int(match.group(1))) if match else None


def nsys_version(nsys: str, prefix: Sequence[str] = ()) -> tuple[str, int] | None:
    """parse_version of `nsys --version` (run after `prefix`, e.g. a container's exec prefix)."""
    try:
        result = subprocess.run([*prefix, nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(result.stdout + result.stderr)


def stats_report(table: str, release: int) -> str | None:
    """The `nsys stats` report of nsys release `release` (a year: 2022, 2025) that sftprof's `table`
    equals (STATS_REPORTS); None where that release has none."""
    old, new = STATS_REPORTS[table]
    return new if release >= STATS_RENAMED_SINCE else old


def nsys_messages(output: str) -> list[str]:
    """What nsys said, without its progress bars (import, export, of either release) or blank lines."""
    lines = output.replace("\r", "\n").splitlines()
    return [
        line.strip()
        for line in lines
        if line.strip() and not _PROGRESS_LINE.match(line) and not _EXPORT_PROGRESS.match(line)
    ]


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
    variables: Mapping[str, str] = os.environ if environ is None else environ

    def substitute(match: re.Match) -> str:
        token = match.group(0)
        if token == "%%":
            return "%"
        if token == "%h":
            return socket.gethostname()
        name = match.group(1)
        if name not in variables:
            raise NsysError(f"--output={pattern} needs ${name}, which is not set (run it under Slurm)")
        return variables[name]

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
            return list(argv[2:index]), arg.removeprefix("--output="), list(argv[index + 1 :])
    raise NsysError("the nsys profile command has no --output=... before the program")


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process whose command line can be read."""
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            yield int(cmdline_path.split("/")[2]), Path(cmdline_path).read_bytes().split(b"\0")[:-1]
        except OSError:
            continue


def running_agent_pids(marked: str | None = None) -> set[int]:
    """Process ids of running `nsys --start-agent` helpers; with `marked` (NAME=VALUE), only those whose
    environment holds it (nsys hands its environment to the agent): another's agents on the host are left out."""
    agents = {pid for pid, argv in _processes() if b"--start-agent" in argv and argv[:1] and argv[0].endswith(b"nsys")}
    return agents if marked is None else agents & _marked_processes(marked)


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# The folder of an Nsight Systems install that holds QdstrmImporter, by CPU: beside target-linux-x64 on x86-64;
# on 64-bit Arm servers (Grace, GH200) beside target-linux-sbsa-armv8, named host-linux-armv8 by NVIDIA's
# packages and host-linux-aarch64 by some. An importer of the other CPU's would not run.
HOST_DIRS = {"x86_64": ("host-linux-x64",), "aarch64": ("host-linux-armv8", "host-linux-aarch64")}
_MACHINE_NAMES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_dirs(machine: str | None = None) -> tuple[str, ...]:
    """The host folder names to look for QdstrmImporter in on `machine` (this one's by default); every
    known one on a CPU not in HOST_DIRS."""
    machine = (machine or platform.machine()).lower()
    known = HOST_DIRS.get(_MACHINE_NAMES.get(machine, machine))
    return known or tuple(name for names in HOST_DIRS.values() for name in names)


def find_qdstrm_importer(nsys_path: str) -> Path | None:
    """QdstrmImporter of the same installation as `nsys_path`, wherever the packager put it, for this CPU."""
    nsys_dir = Path(os.path.realpath(nsys_path)).parent
    candidates = [os.environ.get("SFTPROF_QDSTRM_IMPORTER", "")]
    for host in host_dirs():
        candidates += [
            str(nsys_dir.parent / host / "QdstrmImporter"),
            f"/usr/lib/nsight-systems/{host}/QdstrmImporter",
            *sorted(glob.glob(f"/opt/nvidia/nsight-systems/*/{host}/QdstrmImporter"), reverse=True),
        ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def import_qdstrm(qdstrm: Path, report: Path, nsys_path: str, log: IO[str]) -> None:
    """Turn a raw capture into a .nsys-rep, as nsys would have done had it found its importer."""
    importer = find_qdstrm_importer(nsys_path)
    if importer is None:
        raise NsysError(
            f"nsys left the raw capture {qdstrm} and QdstrmImporter cannot be found "
            "(set SFTPROF_QDSTRM_IMPORTER to its path)"
        )
    log.write(f"[sftprof] nsys did not import its capture; running {importer}\n")
    log.flush()
    result = subprocess.run(
        [str(importer), "-i", str(qdstrm), "-o", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # The importer draws a progress bar with carriage returns; keep only its final state.
    progress = [line for line in result.stdout.replace("\r", "\n").splitlines() if line.strip()]
    log.write("".join(progress[-1:]) + "\n")
    if result.returncode != 0 or not report.exists():
        raise NsysError(f"QdstrmImporter failed on {qdstrm} (exit {result.returncode})")
    qdstrm.unlink()


def raw_capture_paths(output: str) -> list[str]:
    """The raw captures nsys says it is writing ("Generating '/tmp/nsys-report-XXXX.qdstrm'")."""
    return [match.group(1) for match in map(_RAW_CAPTURE_LINE.match, nsys_messages(output)) if match]


def generated_paths(output: str) -> list[str]:
    """The files nsys says it wrote: the indented lines after each "Generated:" line (2022.4 indents
    them with spaces, 2025.3 with a tab)."""
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
        raise NsysError(
            f"nsys wrote its capture to {diverted[0]} instead of {report}: a file of that name "
            "already existed and overwriting was not allowed. Nothing was imported; remove the "
            "old file or pass --force-overwrite=true."
        )
    if report.exists():
        raw.unlink(missing_ok=True)
        return report
    if raw.exists():
        import_qdstrm(raw, report, nsys_path, log)
        return report
    # Its own raw capture, named in this run's output, where a failed import left it.
    left = [Path(p) for p in raw_capture_paths(output) if Path(p).is_file()]
    if left:
        import_qdstrm(left[-1], report, nsys_path, log)
        return report
    if capture_range:
        raise NsysError(
            f"nsys produced no report at {report}: the capture range never opened (check the "
            "window's steps, and that the program emits the NVTX range or cudaProfilerStart)"
        )
    raise NsysError(f"nsys produced no report at {report}; see the log for its messages")


def run_profile(
    options: Sequence[str],
    app_argv: Sequence[str],
    output: str | Path,
    log: IO[str],
    extra_env: dict[str, str] | None = None,
) -> Path:
    """Profile `app_argv` into `output`.nsys-rep; return the report path or raise NsysError.

    `output` may hold nsys's %q{VAR} and %h expansions (see output_pattern). nsys's own output
    is copied to `log` and echoed to stdout. What this run started and left behind (nsys's
    process group, the program, the `--start-agent` helper) is killed before returning; it is
    found by a token in its environment, so other runs on the node are never touched. An nsys
    that could not start (could_not_start) is started again, up to START_ATTEMPTS times.
    """
    nsys = find_nsys()
    token = secrets.token_hex(16)
    env = {**os.environ, **(extra_env or {}), RUN_TOKEN: token}
    base = expand_output(str(output), env)
    base.parent.mkdir(parents=True, exist_ok=True)
    argv = profile_argv(options, output, app_argv, nsys)
    for attempt in range(1, START_ATTEMPTS + 1):
        log.write("[sftprof] " + shlex.join(argv) + "\n")
        log.flush()
        returncode, captured = _run_nsys(argv, env, log, token)
        said = nsys_messages("".join(captured))
        started = not could_not_start(said) or report_path(base).exists()
        if started or attempt == START_ATTEMPTS:
            break
        log.write(f"[sftprof] nsys could not start ({'; '.join(said)[-500:]}); starting it again\n")
        time.sleep(START_RETRY_S * attempt)
    output = "".join(captured)
    if not started:
        raise NsysError(
            f"nsys could not start its agent ({START_ATTEMPTS} attempts; it said: {'; '.join(said)[-500:]}). "
            "Look for `nsys --start-agent` processes left on this node and end them; if none, move "
            f"{Path(tempfile.gettempdir()) / 'nvidia'} aside (nsys's session state, seen damaged after "
            "agents were killed) and run again."
        )
    if returncode != 0:
        # nsys's import progress bar can print dozens of lines after the program's last words.
        program_lines = [line for line in captured if not _PROGRESS_LINE.match(line)]
        tail = "".join(program_lines[-15:])
        partial = report_path(base)
        kept = f" A report of the failed run is kept at {partial} for inspection." if partial.exists() else ""
        raise NsysError(
            f"nsys profile exited with {returncode}: the profiled program or nsys failed.{kept} Last output:\n{tail}"
        )
    capture_range = any(o.startswith("--capture-range=") and o != "--capture-range=none" for o in options)
    return _collect_report(base, output, nsys, log, capture_range)


def could_not_start(said: Sequence[str]) -> bool:
    """Whether nsys's messages (nsys_messages) say only that it could not start, the program never run:
    nothing but START_FAILURES and the dumps of exceptions thrown at START_EXCEPTIONS sites. Any other line
    (the program's own output, or nsys's after it ran) means it started; so does silence."""
    throws = [match.group(1) for match in map(_THROW_LINE.match, said) if match]
    dumps = [line for line in said if line not in START_FAILURES]
    return (
        bool(said)
        and all(_THROW_LINE.match(line) or _EXCEPTION_LINE.match(line) for line in dumps)
        and bool(throws) == bool(dumps)
        and all(any(site in throw for site in START_EXCEPTIONS) for throw in throws)
    )


def _run_nsys(argv: list[str], env: dict[str, str], log: IO[str], token: str) -> tuple[int, list[str]]:
    """Run `nsys profile` to its end, copying its output to `log` and stdout; kill what it left
    (the run that `token` marks); return its exit status and its lines."""
    captured: list[str] = []
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )

    def copy_output() -> None:
        for line in proc.stdout or ():  # a PIPE: never None
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
    return returncode, captured


def _run_processes(token: str) -> set[int]:
    """Processes started by the run that `token` marks: the environment they began with holds it.
    nsys hands its environment to everything it starts (its launcher, the program, the
    `--start-agent` helper), even where they leave its session or process group."""
    return _marked_processes(f"{RUN_TOKEN}={token}")


def _marked_processes(marked: str) -> set[int]:
    """Processes (not this one) whose environment holds `marked` (NAME=VALUE)."""
    marker = marked.encode()
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


# What sftprof reads, by the suffix nsys is given: one SQLite file, or (nsys 2024 and later) a folder
# of one TABLE.parquet per table.
EXPORT_SUFFIXES = {"sqlite": ".sqlite", "parquetdir": ".parquetdir"}
# `nsys export --help`'s --type option, from its own line up to the next option (other options' text
# names --type too): 2022.4 lists "Possible values are: sqlite, hdf, text, arrow, json, info.", 2025.3.1
# "sqlite, hdf, text, json, info, arrow, arrowdir, and parquetdir." over two lines.
_EXPORT_TYPE_HELP = re.compile(r"^\s*(?:-t,\s*)?--type=(.*?)(?=^\s*-{1,2}\w|\Z)", re.S | re.M)


def export_types(help_text: str) -> set[str]:
    """The export types `nsys export --help` lists (its --type option's "Possible values are: ...")."""
    option = _EXPORT_TYPE_HELP.search(help_text)
    values = re.search(r"Possible values are:?\s*([^.]*)", option.group(1)) if option else None
    return set(re.findall(r"[a-z]+", values.group(1))) - {"and", "or"} if values else set()


def export_kind(nsys: str, prefix: Sequence[str] = ()) -> str:
    """parquetdir where this nsys (run after `prefix`) writes it, else sqlite. A parquetdir is a third of
    the SQLite file's size and is analysed faster, with identical results (docs/NSYS.md)."""
    try:
        result = subprocess.run([*prefix, nsys, "export", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "sqlite"  # the export itself then says what is wrong with this nsys
    return "parquetdir" if "parquetdir" in export_types(result.stdout + result.stderr) else "sqlite"


def export_argv(
    report: str | Path, output: str | Path, nsys: str = "nsys", prefix: Sequence[str] = (), kind: str = "sqlite"
) -> list[str]:
    """`nsys export --type=KIND` of `report` into `output`, run after `prefix` (a container's exec
    prefix, or nothing). 2022.4 and 2025.3 both write `output` as named when it ends in .sqlite;
    2025.3 writes the folder `output` when it ends in .parquetdir (one TABLE.parquet per table)."""
    if kind not in EXPORT_SUFFIXES:
        raise ValueError(f"export type {kind!r}: sftprof reads {', '.join(EXPORT_SUFFIXES)}")
    report = str(report)
    report = f"./{report}" if report.startswith("-") else report  # `-x.nsys-rep` is a file, not an option
    return [*prefix, nsys, "export", f"--type={kind}", "--force-overwrite=true", f"--output={output}", report]


def newer_report_message(report: str | Path, nsys: str, prefix: Sequence[str], said: str) -> str:
    """One line for a report that `nsys` cannot read because a newer release wrote it (NEWER_REPORT)."""
    version = nsys_version(nsys, prefix)
    which = f"nsys {version[0]}" if version else "nsys"
    return (
        f"{report} was written by a newer nsys than {which} ({shlex.join([*prefix, nsys])}), which cannot read it "
        f"(it says: {said}). Export it with the nsys that captured it (`nsys export --type=sqlite "
        f"--output={shlex.quote(str(Path(report).with_suffix('.sqlite')))} {shlex.quote(str(report))}`) and give "
        "sftprof the .sqlite, or put that nsys first on PATH."
    )


def run_export(report: str | Path, output: Path, kind: str, nsys: str, prefix: Sequence[str] = ()) -> list[str]:
    """Run `nsys export --type=KIND` of `report` into `output` (export_argv) with `nsys`, after `prefix`;
    returns what nsys said. NsysError where it failed or wrote nothing; an older release refuses a newer
    one's report, and the error says so and what to do. Whether what it wrote is a whole export is the
    format's to say: pipeline.export_report checks it."""
    result = subprocess.run(export_argv(report, output, nsys, prefix, kind), capture_output=True, text=True)
    said = nsys_messages(f"{result.stdout}\n{result.stderr}")
    if result.returncode != 0 or not output.exists():
        refusal = next((line for line in said if NEWER_REPORT.search(line)), None)
        if refusal:
            raise NsysError(newer_report_message(report, nsys, prefix, refusal[-300:]))
        raise NsysError(
            f"nsys export failed on {report} (exit {result.returncode}): {'; '.join(said)[-2000:] or 'no message'}"
        )
    return said
