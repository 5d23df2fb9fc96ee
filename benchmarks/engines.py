"""Which engine computes `nsys stats -r gpukernsum` fastest, in the least memory, with our exact numbers?

    python benchmarks/engines.py FILE.sqlite [FILE...] [--engines sftprof,sqlite,...] [--python PY] [--out CSV]

The same summary (one row per kernel name + grid + block: total, instances, average, median,
min, max, sample standard deviation, share of kernel time; nsys's rounding and order) by:

  sftprof      the code as it is: sftprof.trace.load_trace (kernels and runtime calls copied into
               DuckDB, the other tables into pandas), then analysis.gpu.kernel_summary. (The pandas
               path it replaced, every kernel row with its names as strings, is measured in ENGINE.md.)
  pandas-ids   a pandas groupby on integer columns only (name ids, launch shape, duration; no join,
               no ORDER BY), names attached to the ~100 result rows
  sqlite       SQL pushdown into SQLite (Python's sqlite3): one window query over the kernels
               ordered by (group, duration) gives the median rows, the group mean for a two-pass
               standard deviation, and the GROUP BY aggregates; names joined on the result
  duckdb       DuckDB reading the file through its sqlite extension (duckdb-ext-sqlite wheel):
               GROUP BY with median() and stddev_samp(), on both cores
  polars-cx    polars group_by on the integer columns read by connectorx
  polars-adbc  polars group_by on the integer columns read by the ADBC SQLite driver (Arrow)

Every engine runs in its own child process (fresh interpreter: its peak RSS is its own), timed
from interpreter start to result. Each result must equal sftprof's exactly (same rows, order,
integers and rounded floats), or the engine is marked WRONG. Engines whose package is missing
are skipped with the reason; polars, connectorx and ADBC are not sftprof dependencies: install
them in a scratch venv and pass it with --python, e.g.

    python3.11 -m venv /tmp/bench-venv
    /tmp/bench-venv/bin/pip install pandas==3.1.1 duckdb==1.4.4 duckdb-ext-sqlite==1.4.4.20260205 \\
        polars connectorx adbc-driver-sqlite pyarrow
    .venv/bin/python benchmarks/engines.py /tmp/sftprof-bench/k1M.sqlite --python /tmp/bench-venv/bin/python
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINES = ("sftprof", "pandas-ids", "sqlite", "duckdb", "polars-cx", "polars-adbc")
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
KEY_COLUMNS = ("nid", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
# Raw aggregates every engine returns, one row per group; `finish` turns them into the summary.
RAW_COLUMNS = [*KEY_COLUMNS, "total_ns", "instances", "mean_ns", "med_ns", "min_ns", "max_ns", "stddev_ns"]
INT_QUERY = (
    f'SELECT demangledName AS nid, gridX, gridY, gridZ, blockX, blockY, blockZ, "end" - start AS d FROM {KERNEL}'
)


def _uri(path: Path) -> str:
    return f"{Path(path).resolve().as_uri()}?mode=ro"


def _names(path: Path, ids) -> dict[int, str]:
    import sqlite3

    conn = sqlite3.connect(_uri(path), uri=True)
    try:
        ids = sorted({int(i) for i in ids})
        marks = ",".join("?" * len(ids))
        return dict(conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", ids).fetchall())
    finally:
        conn.close()


def finish(raw, path: Path):
    """Raw per-group aggregates -> the summary exactly as analysis.gpu.kernel_summary prints it:
    names and nsys's grid/block text, share of the total, SQLite round() to 0.1, nsys's order."""
    import pandas as pd

    from sftprof.analysis.stats import SUMMARY_COLUMNS, sqlite_round

    raw = pd.DataFrame(raw, columns=RAW_COLUMNS) if not isinstance(raw, pd.DataFrame) else raw[RAW_COLUMNS]
    names = _names(path, raw["nid"])
    fmt = lambda a, b, c: f"{int(a):4d} {int(b):4d} {int(c):4d}"  # noqa: E731  printf('%4d %4d %4d')
    out = pd.DataFrame(
        {
            "total_ns": raw["total_ns"].astype("int64"),
            "instances": raw["instances"].astype("int64"),
            "avg_ns": raw["total_ns"].astype("int64") / raw["instances"].astype("int64"),
            "med_ns": raw["med_ns"].astype("float64"),
            "min_ns": raw["min_ns"].astype("int64"),
            "max_ns": raw["max_ns"].astype("int64"),
            "stddev_ns": raw["stddev_ns"].astype("float64").fillna(0.0),
            "grid": [fmt(*r) for r in raw[["gridX", "gridY", "gridZ"]].itertuples(index=False)],
            "block": [fmt(*r) for r in raw[["blockX", "blockY", "blockZ"]].itertuples(index=False)],
            "kernel": raw["nid"].map(lambda i: names[int(i)]).astype(object),
        }
    )
    grand = out["total_ns"].sum()
    out["time_pct"] = out["total_ns"] * 100.0 / grand if grand else 0.0
    for column in ("time_pct", "avg_ns", "med_ns", "stddev_ns"):
        out[column] = sqlite_round(out[column])
    keys = ["grid", "block", "kernel"]
    out = out.sort_values(["total_ns", *keys], ascending=[False, True, True, True], kind="stable")
    return out[SUMMARY_COLUMNS + keys].reset_index(drop=True)


# --- the engines (each runs in a child process) -----------------------------------------------


def run_sftprof(path: Path):
    """The code as it is: load the trace, then kernel_summary over its event store."""
    from sftprof.analysis.gpu import kernel_summary
    from sftprof.trace import load_trace

    tables = load_trace(path)
    return kernel_summary(tables.events), {"rows_loaded": tables.events.count("kernels")}


def run_pandas_ids(path: Path):
    import sqlite3

    import pandas as pd

    conn = sqlite3.connect(_uri(path), uri=True)
    try:
        frame = pd.read_sql_query(INT_QUERY, conn)
    finally:
        conn.close()
    g = frame.groupby(list(KEY_COLUMNS), sort=False)["d"]
    raw = g.agg(
        total_ns="sum", instances="count", mean_ns="mean", med_ns="median", min_ns="min", max_ns="max", stddev_ns="std"
    ).reset_index()
    return finish(raw, path), {"rows_loaded": len(frame)}


SQLITE_PUSHDOWN = f"""
WITH k AS ({INT_QUERY}),
w AS (
  SELECT nid, gridX, gridY, gridZ, blockX, blockY, blockZ, d,
         row_number() OVER g AS rn, count(*) OVER g AS n, avg(d) OVER g AS mean
  FROM k
  WINDOW g AS (PARTITION BY nid, gridX, gridY, gridZ, blockX, blockY, blockZ ORDER BY d
               ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING))
SELECT nid, gridX, gridY, gridZ, blockX, blockY, blockZ,
       sum(d) AS total_ns, count(*) AS instances, avg(d) AS mean_ns,
       avg(CASE WHEN rn = (n + 1) / 2 OR rn = (n + 2) / 2 THEN d END) AS med_ns,
       min(d) AS min_ns, max(d) AS max_ns,
       CASE WHEN count(*) > 1 THEN sqrt(sum((d - mean) * (d - mean)) / (count(*) - 1)) ELSE 0.0 END AS stddev_ns
FROM w GROUP BY nid, gridX, gridY, gridZ, blockX, blockY, blockZ
"""


def run_sqlite(path: Path):
    import sqlite3

    conn = sqlite3.connect(_uri(path), uri=True)
    try:
        conn.execute("PRAGMA temp_store = FILE")  # the sort spills to disk instead of growing the heap
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB page cache
        plan = [r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + SQLITE_PUSHDOWN)]
        rows = conn.execute(SQLITE_PUSHDOWN).fetchall()
    finally:
        conn.close()
    return finish(rows, path), {"plan": " | ".join(plan)}


def _duckdb_connect():
    import duckdb

    con = duckdb.connect()
    try:
        con.execute("LOAD sqlite")
    except Exception:  # no network: load the extension shipped by the duckdb-ext-sqlite wheel
        import importlib.util

        spec = importlib.util.find_spec("duckdb_ext")
        roots = list(spec.submodule_search_locations) if spec else []
        found = [p for root in roots for p in Path(root).rglob("sqlite_scanner.duckdb_extension")]
        if not found:
            raise ImportError(
                "no DuckDB sqlite extension: pip install duckdb-ext-sqlite (matching duckdb's version)"
            ) from None
        con.execute(f"LOAD '{found[0]}'")
    return con


def run_duckdb(path: Path):
    con = _duckdb_connect()
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute(f"ATTACH '{Path(path).resolve()}' AS t (TYPE sqlite, READ_ONLY)")
    rows = con.execute(f"""
        SELECT demangledName AS nid, gridX, gridY, gridZ, blockX, blockY, blockZ,
               sum(d)::BIGINT, count(*), avg(d), median(d), min(d), max(d), stddev_samp(d)
        FROM (SELECT demangledName, gridX, gridY, gridZ, blockX, blockY, blockZ, "end" - start AS d
              FROM t.{KERNEL})
        GROUP BY ALL""").fetchall()
    return finish(rows, path), {"threads": threads}


def _polars_summary(frame):
    import polars as pl

    raw = frame.group_by(list(KEY_COLUMNS)).agg(
        pl.col("d").sum().alias("total_ns"),
        pl.col("d").count().alias("instances"),
        pl.col("d").mean().alias("mean_ns"),
        pl.col("d").median().alias("med_ns"),
        pl.col("d").min().alias("min_ns"),
        pl.col("d").max().alias("max_ns"),
        pl.col("d").std(ddof=1).alias("stddev_ns"),
    )
    return raw.to_pandas()


def run_polars_cx(path: Path):
    import connectorx as cx

    frame = cx.read_sql(f"sqlite://{Path(path).resolve()}", INT_QUERY, return_type="polars")
    return finish(_polars_summary(frame), path), {"rows_loaded": frame.height}


def run_polars_adbc(path: Path):
    import adbc_driver_sqlite.dbapi as adbc
    import polars as pl

    with adbc.connect(str(Path(path).resolve())) as conn, conn.cursor() as cursor:
        cursor.execute(INT_QUERY)
        frame = pl.from_arrow(cursor.fetch_arrow_table())
    return finish(_polars_summary(frame), path), {"rows_loaded": frame.height}


RUNNERS = {
    "sftprof": run_sftprof,
    "pandas-ids": run_pandas_ids,
    "sqlite": run_sqlite,
    "duckdb": run_duckdb,
    "polars-cx": run_polars_cx,
    "polars-adbc": run_polars_adbc,
}


def child(engine: str, path: Path, out: Path) -> int:
    started = time.perf_counter()
    try:
        summary, info = RUNNERS[engine](path)
    except ImportError as exc:
        out.write_bytes(pickle.dumps({"skipped": f"{type(exc).__name__}: {exc}"}))
        return 0
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # plain lists, not a DataFrame: the parent's pandas may lack the child's pyarrow string dtype
    columns = {c: summary[c].tolist() for c in summary.columns}
    out.write_bytes(pickle.dumps({"summary": columns, "info": info, "compute_s": seconds, "peak_rss": peak}))
    return 0


# --- the parent: one child per (file, engine), then compare ---------------------------------


def measure(python: str, engine: str, path: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.pickle"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(
            [python, __file__, "--child", engine, str(path), str(result_file)], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0 or not result_file.exists():
            return {"engine": engine, "status": "FAILED", "error": (proc.stderr or proc.stdout).strip()[-2000:]}
        result = pickle.loads(result_file.read_bytes())
    if "summary" in result:
        import pandas as pd

        result["summary"] = pd.DataFrame(result["summary"])
    if "skipped" in result:
        return {"engine": engine, "status": "skipped", "error": result["skipped"]}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "engine": engine,
        "status": "ok",
        "wall_s": wall,
        "cpu_s": cpu,
        "compute_s": result["compute_s"],
        "peak_rss_gb": result["peak_rss"] / 2**30,
        "summary": result["summary"],
        "info": result["info"],
    }


def same(a, b) -> str:
    """'' when the two summaries are identical, else what differs first."""
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(
            a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False, check_exact=True
        )
        return ""
    except AssertionError as exc:
        return str(exc).splitlines()[0][:300]


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter for the engines other than sftprof (a venv with polars, connectorx, ADBC...)",
    )
    parser.add_argument("--out", type=Path, help="also write the measurements as CSV")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"unknown engines: {', '.join(sorted(unknown))}")
    if "sftprof" in engines:  # the reference goes first
        engines = ["sftprof"] + [e for e in engines if e != "sftprof"]
    rows = []
    print("| file | kernels | engine | wall s | CPU s | peak RSS GB | result | note |")
    print("|---|---:|---|---:|---:|---:|---|---|")
    for path in args.files:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from generate_export import row_counts

        kernels = row_counts(path)["kernels"]
        reference = None
        for engine in engines:
            python = sys.executable if engine == "sftprof" else args.python
            m = measure(python, engine, path)
            if m["status"] == "ok":
                if reference is None:
                    reference = m["summary"]
                    verdict = "reference" if engine == "sftprof" else "no reference"
                else:
                    diff = same(reference, m["summary"])
                    verdict = "identical" if not diff else f"WRONG: {diff}"
                note = json.dumps(m["info"]) if m["info"] else ""
                print(
                    f"| {path.name} | {kernels:,} | {engine} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | "
                    f"{m['peak_rss_gb']:.2f} | {verdict} | {note[:120]} |",
                    flush=True,
                )
            else:
                verdict, note = m["status"], m["error"].splitlines()[-1] if m["error"] else ""
                print(f"| {path.name} | {kernels:,} | {engine} | | | | {verdict} | {note[:200]} |", flush=True)
            rows.append(
                {
                    "file": path.name,
                    "kernels": kernels,
                    "engine": engine,
                    "status": m["status"],
                    "wall_s": round(m.get("wall_s", float("nan")), 2),
                    "cpu_s": round(m.get("cpu_s", float("nan")), 2),
                    "peak_rss_gb": round(m.get("peak_rss_gb", float("nan")), 3),
                    "result": verdict,
                    "note": note,
                }
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
