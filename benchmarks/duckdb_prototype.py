"""Prototype of the recommended engine (see ENGINE.md): the three `nsys stats` reports, plus the
two heaviest row-level analyses, computed by DuckDB straight from the SQLite export.

    /tmp/bench-venv/bin/python benchmarks/duckdb_prototype.py FILE.sqlite [--check NSYS_STATS.csv]

Needs duckdb and its sqlite extension (duckdb==1.4.4 duckdb-ext-sqlite==1.4.4.20260205: not
sftprof dependencies; see engines.py for the scratch venv). It computes:

  gpukernsum     kernels by name, grid, block (2022.4)        } sftprof's kernels, memops and cuda_api
  gpumemtimesum  memcpy by copy kind, memset                   } tables, with nsys's statistics,
  cudaapisum     CUDA API calls by name, `_vNNNN` stripped     } rounding and order
  gpu_busy       per device: the union of kernel and memory-operation intervals (islands by
                 a running max of `end` over rows ordered by start), busy time and span
  launches       kernels joined to their launching API call on (pid, correlationId): kernel
                 time per launching thread (what nvtx.gpu_time_by_range and the rules need)

Only integer columns are read; names are looked up for the result rows. With --check it compares
the three summaries with what `nsys stats -r gpukernsum,gpumemtimesum,cudaapisum -f csv` printed
for the same file (run.py keeps it as out-SIZE/nsys.csv with --keep). Prints the time of each step
and the peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from engines import _duckdb_connect  # noqa: E402

# nsys 2022.4's gpumemtimesum names (an inline list in its SQL), by copyKind.
MEMCPY_NAMES = {0: "[CUDA memcpy Unknown]", 1: "[CUDA memcpy HtoD]", 2: "[CUDA memcpy DtoH]", 3: "[CUDA memcpy HtoA]",
                4: "[CUDA memcpy AtoH]", 5: "[CUDA memcpy AtoA]", 6: "[CUDA memcpy AtoD]", 7: "[CUDA memcpy DtoA]",
                8: "[CUDA memcpy DtoD]", 9: "[CUDA memcpy HtoH]", 10: "[CUDA memcpy PtoP]",
                11: "[CUDA Unified Memory memcpy HtoD]", 12: "[CUDA Unified Memory memcpy DtoH]",
                13: "[CUDA Unified Memory memcpy DtoD]"}
STATS = ('sum(d)::BIGINT AS total_ns, count(*) AS instances, median(d) AS med_ns, min(d) AS min_ns, '
         'max(d) AS max_ns, stddev_samp(d) AS stddev_ns')


def summary(rows, keys: list[str]):
    """Raw aggregates -> nsys's table: share, SQLite round() to 0.1, order by total then keys."""
    import pandas as pd

    from sftprof.analysis.stats import SUMMARY_COLUMNS, sqlite_round

    frame = pd.DataFrame(rows, columns=[*keys, "total_ns", "instances", "med_ns", "min_ns", "max_ns", "stddev_ns"])
    frame["avg_ns"] = frame["total_ns"] / frame["instances"]
    frame["stddev_ns"] = frame["stddev_ns"].astype("float64").fillna(0.0)
    frame["time_pct"] = frame["total_ns"] * 100.0 / frame["total_ns"].sum()
    for column in ("time_pct", "avg_ns", "med_ns", "stddev_ns"):
        frame[column] = sqlite_round(frame[column].astype("float64"))
    frame = frame.sort_values(["total_ns", *keys], ascending=[False] + [True] * len(keys), kind="stable")
    return frame[SUMMARY_COLUMNS + keys].reset_index(drop=True)


def read_adbc(path: Path, table: str, columns: str, readers: int = 2):
    """`SELECT columns FROM table` as one Arrow table, read by `readers` threads on rowid ranges
    (the ADBC driver releases the GIL while SQLite decodes rows)."""
    from concurrent.futures import ThreadPoolExecutor

    import adbc_driver_sqlite.dbapi as adbc
    import pyarrow as pa

    uri = str(Path(path).resolve())
    with adbc.connect(uri) as conn, conn.cursor() as cursor:
        cursor.execute(f"SELECT min(rowid), max(rowid) FROM {table}")
        low, high = cursor.fetchone()
    if low is None:
        low = high = 0
    edges = [low - 1 + (high - low + 1) * i // readers for i in range(readers + 1)]

    def part(bounds):
        with adbc.connect(uri) as conn, conn.cursor() as cursor:
            cursor.execute(f"SELECT {columns} FROM {table} WHERE rowid > {bounds[0]} AND rowid <= {bounds[1]}")
            return cursor.fetch_arrow_table()

    with ThreadPoolExecutor(readers) as pool:
        parts = list(pool.map(part, zip(edges[:-1], edges[1:])))
    return pa.concat_tables(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--check", type=Path, help="nsys stats CSV output for the same file")
    parser.add_argument("--memory-limit", default="1GB", help="DuckDB memory_limit (default 1GB)")
    parser.add_argument("--materialize", choices=("none", "duckdb", "adbc"), default="none",
                        help="none: every query scans SQLite through DuckDB's sqlite extension; duckdb: read "
                             "each table once (the columns used) into DuckDB tables through that extension; "
                             "adbc: read each table once with the ADBC SQLite driver into Arrow, two readers on "
                             "halves of the rowid range in parallel, and query the Arrow tables from DuckDB")
    args = parser.parse_args(argv)
    steps = []
    t0 = time.perf_counter()

    def step(name, started):
        steps.append((name, time.perf_counter() - started))

    con = _duckdb_connect()
    con.execute(f"SET memory_limit = '{args.memory_limit}'")
    con.execute(f"ATTACH '{args.file.resolve()}' AS t (TYPE sqlite, READ_ONLY)")
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = 't'").fetchall()}
    # the few strings the results need, in DuckDB: names by id
    t = time.perf_counter()
    con.execute("CREATE TEMP TABLE names AS SELECT id, value FROM t.StringIds")
    step("strings", t)
    src = "t"
    if args.materialize != "none":
        t = time.perf_counter()
        con.execute("CREATE SCHEMA m")
        wanted = {"CUPTI_ACTIVITY_KIND_KERNEL": 'start, "end", deviceId, globalPid, correlationId, demangledName, '
                                                'gridX, gridY, gridZ, blockX, blockY, blockZ',
                  "CUPTI_ACTIVITY_KIND_RUNTIME": 'start, "end", globalTid, correlationId, nameId',
                  "CUPTI_ACTIVITY_KIND_MEMCPY": 'start, "end", deviceId, copyKind',
                  "CUPTI_ACTIVITY_KIND_MEMSET": 'start, "end", deviceId'}
        for table, columns in wanted.items():
            if table not in tables:
                continue
            if args.materialize == "duckdb":
                con.execute(f"CREATE TABLE m.{table} AS SELECT {columns} FROM t.{table}")
            else:
                arrow = read_adbc(args.file, table, columns)
                con.register(f"arrow_{table}", arrow)
                con.execute(f"CREATE VIEW m.{table} AS SELECT * FROM arrow_{table}")
        src = "m"
        step("materialize", t)

    t = time.perf_counter()
    kern = con.execute(f"""
        SELECT n.value AS kernel, printf('%4d %4d %4d', gridX, gridY, gridZ) AS grid,
               printf('%4d %4d %4d', blockX, blockY, blockZ) AS block, s.* EXCLUDE (nid, gridX, gridY, gridZ, blockX, blockY, blockZ)
        FROM (SELECT demangledName AS nid, gridX, gridY, gridZ, blockX, blockY, blockZ, {STATS}
              FROM (SELECT demangledName, gridX, gridY, gridZ, blockX, blockY, blockZ, "end" - start AS d
                    FROM {src}.CUPTI_ACTIVITY_KIND_KERNEL) GROUP BY ALL) s
        JOIN names n ON n.id = s.nid""").fetchall()
    kernels = summary([(r[1], r[2], r[0], *r[3:]) for r in kern], ["grid", "block", "kernel"])
    step("gpukernsum", t)

    t = time.perf_counter()
    parts = []
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        parts.append(f'SELECT copyKind AS k, "end" - start AS d FROM {src}.CUPTI_ACTIVITY_KIND_MEMCPY')
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        parts.append(f'SELECT -1 AS k, "end" - start AS d FROM {src}.CUPTI_ACTIVITY_KIND_MEMSET')
    mem = con.execute(f"SELECT k, {STATS} FROM ({' UNION ALL '.join(parts)}) GROUP BY k").fetchall() if parts else []
    memops = summary([("[CUDA memset]" if r[0] == -1 else MEMCPY_NAMES.get(r[0], MEMCPY_NAMES[0]), *r[1:])
                      for r in mem], ["operation"])
    step("gpumemtimesum", t)

    t = time.perf_counter()
    api = con.execute(f"""
        WITH api_names AS (
            SELECT id, CASE WHEN substr(value, -6, 2) = '_v' THEN substr(value, 1, length(value) - 6) ELSE value END AS name
            FROM names WHERE id IN (SELECT DISTINCT nameId FROM {src}.CUPTI_ACTIVITY_KIND_RUNTIME))
        SELECT a.name, {STATS}
        FROM (SELECT nameId, "end" - start AS d FROM {src}.CUPTI_ACTIVITY_KIND_RUNTIME) r JOIN api_names a ON a.id = r.nameId
        GROUP BY a.name""").fetchall()
    cuda_api = summary(api, ["name"])
    step("cudaapisum", t)

    t = time.perf_counter()
    busy = con.execute(f"""
        WITH ops AS (
            SELECT deviceId AS dev, start, "end" FROM {src}.CUPTI_ACTIVITY_KIND_KERNEL WHERE start > 0
            UNION ALL SELECT deviceId, start, "end" FROM {src}.CUPTI_ACTIVITY_KIND_MEMCPY WHERE start > 0
            UNION ALL SELECT deviceId, start, "end" FROM {src}.CUPTI_ACTIVITY_KIND_MEMSET WHERE start > 0),
        marked AS (
            SELECT dev, start, "end", max("end") OVER (PARTITION BY dev ORDER BY start, "end"
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM ops),
        islands AS (
            SELECT dev, start, "end", sum(CASE WHEN before IS NULL OR start > before THEN 1 ELSE 0 END)
                   OVER (PARTITION BY dev ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS island FROM marked),
        merged AS (SELECT dev, island, min(start) AS s, max("end") AS e FROM islands GROUP BY ALL)
        SELECT dev, max(e) - min(s) AS span_ns, sum(e - s)::BIGINT AS busy_ns, count(*) AS intervals
        FROM merged GROUP BY dev ORDER BY dev""").fetchall()
    step("gpu_busy", t)

    t = time.perf_counter()
    launches = con.execute(f"""
        SELECT r.globalTid, count(*) AS kernels, sum(k."end" - k.start)::BIGINT AS gpu_ns
        FROM (SELECT correlationId, globalPid, start, "end" FROM {src}.CUPTI_ACTIVITY_KIND_KERNEL) k
        JOIN (SELECT correlationId, globalTid FROM {src}.CUPTI_ACTIVITY_KIND_RUNTIME) r
          ON r.correlationId = k.correlationId AND (r.globalTid & ~16777215::BIGINT) = k.globalPid
        GROUP BY r.globalTid ORDER BY gpu_ns DESC""").fetchall()
    step("launches", t)

    total = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    for name, seconds in steps:
        print(f"{name:14s} {seconds:7.2f} s")
    print(f"{'total':14s} {total:7.2f} s   peak RSS {peak:.2f} GB (memory_limit {args.memory_limit})")
    print(f"gpu_busy: {busy}")
    print(f"launches (thread, kernels, gpu_ns): {launches[:4]}")
    if args.check:
        from run import nsys_sections

        sections = nsys_sections(args.check.read_text())
        mapping = (("gpukernsum", kernels, ("Name", "GridXYZ", "BlockXYZ"), ("kernel", "grid", "block")),
                   ("gpumemtimesum", memops, ("Operation",), ("operation",)),
                   ("cudaapisum", cuda_api, ("Name",), ("name",)))
        ok = True
        for report, ours, nkeys, okeys in mapping:
            rows = sections[report]
            nvals = list(rows[0])[:8]
            theirs = [(tuple(r[k] for k in nkeys), [float(r[v]) for v in nvals]) for r in rows]
            mine = [(tuple(r[k] for k in okeys), [float(r[v]) for v in ours.columns[:8]])
                    for r in ours.to_dict("records")]
            same = theirs == mine  # same rows, same values, same order
            ok &= same
            print(f"check {report}: {'identical to nsys stats' if same else 'DIFFERS from nsys stats'} ({len(rows)} rows)")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
