"""The floor under `sftprof analyze`: how long an export takes to read at all, to load, and to analyse, against
`nsys stats` on the same file.

    .venv/bin/python benchmarks/floor.py FILE.sqlite [FILE.sqlite ...] [--runs 2] [--out CSV]

For each file, read once untimed (into the page cache), then in fresh child processes, one after the other and
timed as benchmarks/run.py times them (wall, CPU and peak RSS from wait4), each repeated --runs times in turn:

  decode    every table the loader reads from the file's pages (nsys_sqlite.PAGE_READS: the same columns and
            chunks, NVTX's text as codes), decoded and dropped: what any analysis built on this reader pays
  load      sftprof.trace.load_trace: the same decoded and copied into the event store (DuckDB)
  analyze   `sftprof analyze FILE -o DIR`: the load, every analysis, the tables and the report
  nsys      `nsys stats` with run.py's reports

Each row gives its wall time over `nsys stats`' (the issue's target for analyze: 0.2) and its CPU time over the
cores times nsys's wall: what it would take were every core busy all the time. benchmarks/ENGINE.md has the
figures and what they say.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (benchmarks/run.py: measure, sftprof_command, the nsys reports)

from sftprof.capture import nsys as nsys_tool  # noqa: E402
from sftprof.trace.events import usable_cores  # noqa: E402
from sftprof.trace.nsys.nsys_export import read_only_uri  # noqa: E402

STEPS = ("decode", "load", "analyze", "nsys")


def decode(path: Path) -> None:
    """Decode every table the loader reads from `path`'s pages, keeping nothing; the rows per table to stdout."""
    from sftprof.trace.nsys import nsys_sqlite, sqlite_pages

    with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as con:
        present = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table, columns, chunk_bytes in nsys_sqlite.PAGE_READS:
        if table not in present:
            continue
        text = nsys_sqlite.nvtx_text_codes() if table == "NVTX_EVENTS" else None
        started, rows = time.perf_counter(), 0
        for values, *_ in sqlite_pages.raw_columns(
            path, table, columns, chunk_bytes or sqlite_pages.CHUNK_BYTES, text=text
        ):
            rows += values.shape[1]
        print(f"{table}: {rows:,} rows in {time.perf_counter() - started:.1f} s", flush=True)


def load(path: Path) -> None:
    from sftprof.trace import load_trace

    load_trace(path)


def commands(path: Path, out_dir: Path, nsys: str, reports: str) -> dict[str, list[str]]:
    child = [sys.executable, __file__, "--child"]
    return {
        "decode": [*child, "decode", str(path)],
        "load": [*child, "load", str(path)],
        "analyze": [*run.sftprof_command(), "analyze", str(path), "-o", str(out_dir / "analysis")],
        "nsys": [nsys, "stats", "-r", reports, "-f", "csv", "--force-export", "false", str(path)],
    }


def read_through(path: Path) -> None:
    """Read the file once, untimed, so that every step finds it in the page cache: the first step of a file read
    from disk took 2.7x (the trainer's 10M export) and 2.6x (NeMo's) its time on this VM."""
    with path.open("rb") as f:
        while f.read(64 << 20):
            pass


def measure_file(path: Path, runs: int, nsys: str, reports: str, timeout: float) -> list[dict]:
    read_through(path)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sftprof-floor-") as folder:
        out_dir = Path(folder)
        for attempt in range(1, runs + 1):
            for step, command in commands(path, out_dir, nsys, reports).items():
                shutil.rmtree(out_dir / "analysis", ignore_errors=True)
                progress = f"[{path.name} {step} {attempt}/{runs}]"
                m = run.measure(command, out_dir / f"{step}.out", out_dir / f"{step}.err", timeout, progress)
                if m["rc"] != 0:
                    raise SystemExit(f"{progress} exited {m['rc']}: {run._failure(m, out_dir / f'{step}.err')}")
                rows.append({"file": path.name, "run": attempt, "step": step, **m})
    return rows


def ratios(rows: list[dict], cores: int) -> list[dict]:
    """Each row's wall and CPU over the same run's `nsys stats` wall time (CPU spread over `cores`)."""
    nsys_wall = {(r["file"], r["run"]): r["wall_s"] for r in rows if r["step"] == "nsys"}
    table = []
    for r in rows:
        anchor = nsys_wall[(r["file"], r["run"])]
        table.append(
            {
                "file": r["file"],
                "run": r["run"],
                "step": r["step"],
                "wall_s": round(r["wall_s"], 1),
                "cpu_s": round(r["cpu_s"], 1),
                "peak_rss_gb": round(r["peak_rss_gb"], 2),
                "wall / nsys": round(r["wall_s"] / anchor, 3),
                f"cpu / ({cores} cores x nsys)": round(r["cpu_s"] / cores / anchor, 3),
            }
        )
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="nsys SQLite exports (benchmarks/generate_export.py)")
    parser.add_argument("--runs", type=int, default=2, help="times each step is run, in turn (default 2)")
    parser.add_argument("--out", type=Path, help="write the table as CSV too")
    parser.add_argument("--nsys", default="nsys", help="the nsys to compare with (default: nsys on PATH)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per measured command (default 3600)")
    parser.add_argument("--child", choices=("decode", "load"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        {"decode": decode, "load": load}[args.child](args.files[0])
        return 0
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        raise SystemExit(f"no such file: {', '.join(missing)}")
    nsys = shutil.which(args.nsys)
    version = nsys_tool.nsys_version(nsys) if nsys else None
    if version is None:
        raise SystemExit(f"{args.nsys}: no nsys that says which release it is (scripts/install-nsys.sh installs one)")
    reports = ",".join(report for report, *_ in run.comparisons(version[1]))
    cores = usable_cores()
    print(f"{cores} cores; nsys {version[0]}", file=sys.stderr)
    rows = [row for path in args.files for row in measure_file(path, args.runs, nsys, reports, args.timeout)]
    table = ratios(rows, cores)
    run.print_table(table, args.out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
