"""One rank of a profiled run, started once per Slurm task:
`python -m sftprof.capture.rank --profiled-ranks=0 --capture-dir=DIR -- nsys profile ... PROGRAM`.

Listed ranks run the SFT program under `nsys profile`; the others run it plain.
Either way the rank leaves a small record (RECORD_PATTERN) in the capture folder naming its
report and metrics files, which is how the analysis finds every rank's report without knowing
job ids or host names in advance. Outside Slurm this is rank 0 of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sftprof.capture import nsys
from sftprof.errors import SftprofError
from sftprof.io import atomic_write_text, read_limited
from sftprof.untrusted import plain_file_name

RECORD_PATTERN = "rank{rank}.json"
RECORD_GLOB = "rank*.json"
# The trainer's metrics file, per rank, beside the reports.
METRICS_PATTERN = "{output_name}.rank{{rank}}.metrics.jsonl"
# Per-rank names in the export and analysis folders of a window: rankN.sqlite or rankN.parquetdir
# (export_path), and rankN/.
RANK_DIR_PATTERN = "rank{rank}"
# Each job gets its own rendezvous port, so two jobs sharing a node do not collide.
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 20000


def export_path(folder: str | Path, rank_number: int, kind: str = "sqlite") -> Path:
    """Where rank `rank_number`'s export of type `kind` (nsys.EXPORT_SUFFIXES) goes in `folder`."""
    return Path(folder) / (RANK_DIR_PATTERN.format(rank=rank_number) + nsys.EXPORT_SUFFIXES[kind])


def find_export(folder: str | Path, rank_number: int) -> Path:
    """Rank `rank_number`'s export in `folder`, of whichever type is there (the SQLite path, which
    errors then name, where none is)."""
    paths = [export_path(folder, rank_number, kind) for kind in nsys.EXPORT_SUFFIXES]
    return next((path for path in paths if path.exists()), paths[0])


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `gh[003-004,9],login1` -> `gh003`.

    Parsed here rather than with `scontrol show hostnames`, which containers do not have.
    """
    match = re.match(r"([^,\[]+)(?:\[([^\],-]+))?", nodelist)
    if not match:
        raise ValueError(f"cannot read the Slurm node list {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def distributed_environment(environ: dict[str, str]) -> dict[str, str]:
    """torch.distributed's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*) from Slurm's,
    keeping any that are already set; rank 0 of 1 on localhost outside Slurm."""
    slurm = "SLURM_PROCID" in environ
    derived = {
        "RANK": environ.get("SLURM_PROCID", "0"),
        "WORLD_SIZE": environ.get("SLURM_NTASKS", "1"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID", "0"),
        "MASTER_ADDR": first_host(environ["SLURM_JOB_NODELIST"]) if slurm else "127.0.0.1",
        "MASTER_PORT": str(MASTER_PORT_BASE + int(environ.get("SLURM_JOB_ID", "0")) % MASTER_PORT_SPAN),
    }
    return {name: environ.get(name, value) for name, value in derived.items()}


def rank_argv(python: str, profiled_ranks: list[int], capture_dir: str, nsys_env: dict[str, str]) -> list[str]:
    """`python -m sftprof.capture.rank ... --`, to be followed by `nsys profile ... PROGRAM`."""
    argv = [
        python,
        "-m",
        "sftprof.capture.rank",
        f"--profiled-ranks={','.join(map(str, profiled_ranks))}",
        f"--capture-dir={capture_dir}",
    ]
    argv += [f"--env={name}={value}" for name, value in nsys_env.items()]
    return [*argv, "--"]


def run_rank(
    profiled_ranks: list[int],
    capture_dir: str | Path,
    nsys_env: dict[str, str],
    profile_argv: list[str],
    environ: dict[str, str],
) -> dict:
    """Run this rank's program (under nsys when listed) and write its record; return the record."""
    options, output, app = nsys.split_profile_argv(profile_argv)
    env = {**environ, **distributed_environment(environ)}
    rank = int(env["RANK"])
    capture_dir = Path(capture_dir)
    capture_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "world_size": int(env["WORLD_SIZE"]),
        "host": socket.gethostname(),
        "node": int(environ.get("SLURM_NODEID", "0")),
        "slurm_job_id": environ.get("SLURM_JOB_ID"),
        "report": None,
    }
    if rank in profiled_ranks:
        os.environ.update(env)
        record["report"] = nsys.run_profile(options, app, output, sys.stdout, nsys_env).name
    else:
        result = subprocess.run(app, env=env)
        if result.returncode != 0:
            raise nsys.NsysError(f"rank {rank}: the SFT program exited with {result.returncode}")
    atomic_write_text(capture_dir / RECORD_PATTERN.format(rank=rank), json.dumps(record, indent=1))
    return record


class RecordError(SftprofError):
    """A rank's record that is damaged, or was not written by sftprof.capture.rank."""


# A record is a few hundred bytes; ranks and nodes stay far below these.
MAX_RECORD_BYTES = 1 << 20
MAX_RANK = 1 << 20
_SLURM_JOB_ID = re.compile(r"[0-9]{1,20}([_+][0-9]{1,20})?\Z")  # 123, array task 123_4, het job 123+0
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


def read_record(path: str | Path) -> dict:
    """One rank's record, every field checked: records may come from a cluster (fetched), and
    their names become local file names."""
    path = Path(path)
    try:
        record = json.loads(read_limited(path, MAX_RECORD_BYTES).decode("utf-8"))
    except OSError as error:
        raise RecordError(f"{path}: cannot read it ({error.strerror or error})") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise RecordError(f"{path} is not a rank record ({str(error)[:200]})") from None
    if not isinstance(record, dict):
        raise RecordError(f"{path} is not a rank record (not a JSON object)")
    for key in ("rank", "world_size", "node"):
        if type(record.get(key)) is not int or not 0 <= record[key] <= MAX_RANK:
            raise RecordError(f"{path}: {key} {ascii(record.get(key))[:50]} is not a number from 0 to {MAX_RANK}")
    if not record["rank"] < record["world_size"]:
        raise RecordError(f"{path}: rank {record['rank']} cannot be in a world of {record['world_size']} rank(s)")
    if path.name != RECORD_PATTERN.format(rank=record["rank"]):
        raise RecordError(
            f"{path}: records rank {record['rank']}, whose record is named {RECORD_PATTERN.format(**record)}"
        )
    if not isinstance(record.get("host"), str) or not _HOST.match(record["host"]):
        raise RecordError(f"{path}: host {ascii(record.get('host'))[:80]} is not a host name")
    job_id = record.get("slurm_job_id")
    if job_id is not None and not (isinstance(job_id, str) and _SLURM_JOB_ID.match(job_id)):
        raise RecordError(f"{path}: slurm_job_id {ascii(job_id)[:50]} is not a Slurm job id")
    if record.get("report") is not None:
        plain_file_name(record["report"], f"{path}: report")
    return record


def read_records(capture_dir: str | Path) -> list[dict]:
    """Every rank's record in a capture folder, by rank."""
    records = [read_record(path) for path in Path(capture_dir).glob(RECORD_GLOB)]
    return sorted(records, key=lambda record: record["rank"])


def profiled_records(capture_dir: str | Path) -> list[dict]:
    """The records of the ranks that wrote a report."""
    return [record for record in read_records(capture_dir) if record["report"]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sftprof.capture.rank", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profiled-ranks",
        required=True,
        type=lambda text: [int(r) for r in text.split(",")],
        help="comma-separated global ranks that run under nsys",
    )
    parser.add_argument("--capture-dir", required=True, help="folder of the reports and rank records")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for nsys and the program, on profiled ranks only",
    )
    parser.add_argument(
        "profile_argv", nargs=argparse.REMAINDER, help="-- nsys profile OPTIONS --output=PATTERN PROGRAM [ARGS...]"
    )
    return parser


def _exit_on_sigterm(signum: int, frame) -> None:
    """Slurm ends a task (time limit, scancel, another task failing) with SIGTERM: unwind, so that
    what the rank started is killed (run_profile's cleanup), not left behind on the node."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = build_parser().parse_args(argv)
    profile_argv = args.profile_argv[1:] if args.profile_argv[:1] == ["--"] else args.profile_argv
    nsys_env = dict(item.split("=", 1) for item in args.env)
    try:
        run_rank(args.profiled_ranks, args.capture_dir, nsys_env, profile_argv, dict(os.environ))
    except nsys.NsysError as error:
        print(f"sftprof.capture.rank: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
