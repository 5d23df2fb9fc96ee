"""Write a large, valid `nsys export --type=sqlite` file by replicating a real one.

    python benchmarks/generate_export.py 1M -o /tmp/bench/k1M.sqlite [--seed SEED.sqlite] [--check]

The output has the seed's exact schema (every `sqlite_master` statement, comments included) and
its metadata tables (StringIds, ENUM_*, TARGET_INFO_*, ThreadNames, PROCESSES, EXPORT_META_DATA...)
copied as they are. The activity tables are the seed's captured window repeated back to back:

- replica r of a row is the row with `r * period` added to its times, and `r * stride` added to its
  correlationId (and gridId, NVTX rangeId), so every kernel, memcpy, memset and sync row keeps a
  unique correlationId that links it to its own CUDA API row, on the same launching thread;
- `period` is the seed's step cycle (its `step N` NVTX ranges: steps x mean step spacing), or the
  span of its GPU/API activity when that is longer; NVTX `step N` ranges are renumbered so the
  steps continue (step 4, 5, 6, 7, 8, 9, ...), and emit_nvtx's `op_id = N` too (each call has its own);
- the last replica is partial: it stops at the seed kernel that makes the kernel count exactly N,
  and keeps only the other rows that started before that kernel (launches precede their kernels,
  so every kernel still has its API row);
- OS-runtime calls that outlast one period are cut at the period's end (except in the last
  replica), so a thread's calls do not overlap themselves; rows that belong to the capture's edges
  (NVTX domain/category definitions, OSRT "profiling started/finished" markers, the profiler's
  flush overheads after the last GPU activity, anything at a negative time) are written once,
  the late ones moved to the end of the scaled capture; ANALYSIS_DETAILS gets the scaled span.

Names, launch shapes, streams, threads and the mix of API calls are therefore distributed exactly
as in the seed, and every table grows in proportion to the kernel count. All the copying happens
inside SQLite (INSERT ... SELECT over a replica-number table CROSS JOIN the attached seed), on one
core: 16M kernels (52M rows in all, 2.7 GiB) took 53 s here, in 0.3 GB of memory.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SEED = REPO / "tests" / "fixtures" / "h200_tiny_llama_bf16.sqlite"

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
# GPU/API activity: defines the replicated window and its period.
CORE_TABLES = (
    KERNEL,
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    RUNTIME,
)
# Every table that is repeated (when the seed has it); any other table is copied once.
GPU_WORK_TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
REPLICATED_TABLES = (*CORE_TABLES, "OSRT_API", "NVTX_EVENTS", "SCHED_EVENTS", "GPU_METRICS")
# Point events repeated only within the replicated window (earlier ones are written once where they are,
# later ones once at the end).
WINDOWED_POINTS = ("SCHED_EVENTS", "GPU_METRICS")
# Each table's time columns: GPU metric samples have their own (and the raw counter time beside it).
TIME_COLUMNS = {"GPU_METRICS": ("timestamp", "rawTimestamp")}
CORRELATED_TABLES = CORE_TABLES + ("CUDA_GPU_MEMORY_USAGE_EVENTS",)
NVTX_REPEATED_TYPES = (34, 59, 60, 70, 71)  # mark, push/pop, start/end (native and NVTXT)
NVTX_RANGE_TYPES = (59, 60, 70, 71)
# emit_nvtx numbers every op call ("aten::mm, op_id = 345"): each replica's calls get numbers of their own,
# as a longer capture's would, so no two ranges share a name (replica r adds r * OP_ID_STRIDE).
OP_ID = ", op_id = "
OP_ID_STRIDE = 10**9
OSRT_CALL_CLASS = 27
STEP_TEXT = re.compile(r"^step (\d+)$")
# The profiler's flush overheads after the last GPU activity: written once, at the end.
EDGE_TABLES = ("PROFILER_OVERHEAD",)


def parse_count(text: str) -> int:
    """'20k' -> 20000, '1M' -> 1000000, '1.5M', '16000000'."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (use e.g. 20k, 1M, 16M)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[match.group(2).lower()]
    value = float(match.group(1)) * scale
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a positive whole count: {text!r}")
    return int(value)


def format_count(n: int) -> str:
    """1000000 -> '1M', 20000 -> '20k', 1234 -> '1234'."""
    for suffix, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


@dataclass
class Plan:
    kernels: int  # kernels wanted
    seed_kernels: int
    full: int  # complete replicas
    total: int  # replicas written, the partial one included
    cut_ns: int | None  # in the partial replica, rows with seed start < cut_ns
    origin_ns: int  # start of the replicated window (seed time)
    period_ns: int
    correlation_stride: int
    grid_stride: int
    range_stride: int
    steps_per_period: int
    tail_ns: int  # rows written once that start after the seed's last GPU work move to the end

    @property
    def window_end_ns(self) -> int:
        return self.origin_ns + self.period_ns

    @property
    def shift_to_end_ns(self) -> int:
        return (self.total - 1) * self.period_ns


def _q(conn, sql, *args):
    return conn.execute(sql, args).fetchall()


def _tables(conn, schema="main") -> set[str]:
    return {r[0] for r in _q(conn, f"SELECT name FROM {schema}.sqlite_master WHERE type='table'")}


def _columns(conn, table, schema="main") -> list[str]:
    return [r[1] for r in _q(conn, f'PRAGMA {schema}.table_info("{table}")')]


def make_plan(conn, kernels: int) -> Plan:
    """Work out period and strides from the seed (attached as `seed`)."""
    tables = _tables(conn, "seed")
    if KERNEL not in tables or RUNTIME not in tables:
        raise SystemExit("the seed export has no kernels or no CUDA API rows: nothing to replicate")
    seed_kernels, distinct_starts = _q(conn, f"SELECT count(*), count(DISTINCT start) FROM seed.{KERNEL}")[0]
    if seed_kernels == 0:
        raise SystemExit("the seed export has no kernels")
    if distinct_starts != seed_kernels:
        raise SystemExit("the seed's kernels do not have distinct start times; cannot cut a partial replica")
    core = [t for t in CORE_TABLES if t in tables]
    lo, hi, gpu_end = math.inf, -math.inf, -math.inf
    for table in core:
        first, last = _q(conn, f'SELECT min(start), max("end") FROM seed.{table} WHERE start >= 0')[0]
        if first is not None:
            lo, hi = min(lo, first), max(hi, last)
            if table in GPU_WORK_TABLES:
                gpu_end = max(gpu_end, last)
    steps = []
    if "NVTX_EVENTS" in tables:
        types = ",".join(map(str, NVTX_RANGE_TYPES))
        rows = _q(
            conn,
            f'SELECT start, "end", text FROM seed.NVTX_EVENTS WHERE eventType IN ({types}) '
            "AND start >= 0 AND text GLOB 'step [0-9]*'",
        )
        steps = sorted((start, end) for start, end, text in rows if STEP_TEXT.match(text or ""))
        ranges = _q(
            conn, f'SELECT min(start), max("end") FROM seed.NVTX_EVENTS WHERE start >= 0 AND eventType IN ({types})'
        )[0]
        if ranges[0] is not None:
            lo, hi = min(lo, ranges[0]), max(hi, ranges[1] if ranges[1] is not None else ranges[0])
    period = int(hi - lo) + 1000  # 1 µs between the last activity and the next replica
    if len(steps) > 1:
        spacing = (steps[-1][0] - steps[0][0]) / (len(steps) - 1)
        period = max(period, int(round(spacing * len(steps))))
    strides = []
    for table in CORRELATED_TABLES:
        if table in tables and "correlationId" in _columns(conn, table, "seed"):
            strides.append(_q(conn, f"SELECT max(correlationId) FROM seed.{table}")[0][0] or 0)
    full, rem = divmod(kernels, seed_kernels)
    cut = None
    if rem:
        cut = _q(conn, f"SELECT start FROM seed.{KERNEL} ORDER BY start LIMIT 1 OFFSET ?", rem)[0][0]
    grid = _q(conn, f"SELECT max(gridId) FROM seed.{KERNEL}")[0][0] or 0
    range_max = _q(conn, "SELECT max(rangeId) FROM seed.NVTX_EVENTS")[0][0] if "NVTX_EVENTS" in tables else 0
    return Plan(
        kernels=kernels,
        seed_kernels=seed_kernels,
        full=full,
        total=full + (1 if rem else 0),
        cut_ns=cut,
        origin_ns=int(lo),
        period_ns=period,
        correlation_stride=max(strides) + 1,
        grid_stride=grid + 1,
        range_stride=(range_max or 0) + 1,
        steps_per_period=len(steps),
        tail_ns=int(gpu_end),
    )


def _time(table: str) -> str:
    """The column that places a row of `table` in time."""
    return f's."{TIME_COLUMNS.get(table, ("start",))[0]}"'


def _repeated(plan: Plan, table: str) -> list[str]:
    """The conditions under which a seed row of `table` is repeated in every replica."""
    if table in WINDOWED_POINTS:  # sampled at a steady rate: repeating more than the window would sample twice
        return [f"{_time(table)} >= {plan.origin_ns}", f"{_time(table)} < {plan.window_end_ns}"]
    repeated = ["s.start >= 0"]
    if table == "OSRT_API":
        repeated += [f"s.eventClass = {OSRT_CALL_CLASS}", f"s.start < {plan.window_end_ns}"]
    if table == "NVTX_EVENTS":
        repeated.append(f"s.eventType IN ({','.join(map(str, NVTX_REPEATED_TYPES))})")
    return repeated


def _replica_filter(plan: Plan, table: str) -> str:
    """Which seed rows are repeated, and (partial replica) which rows its last replica keeps."""
    keep = _repeated(plan, table)
    if plan.cut_ns is not None:
        keep.append(f"(r.r < {plan.full} OR {_time(table)} < {plan.cut_ns})")
    return " AND ".join(keep)


def _once_filter(plan: Plan, table: str) -> str:
    """The rows of a replicated table that are written once (the complement of the repeated rows)."""
    return "NOT (" + " AND ".join(_repeated(plan, table)) + ")"


def _replica_expressions(plan: Plan, table: str, columns: list[str]) -> list[str]:
    offset = f"r.r * {plan.period_ns}"
    last = plan.total - 1
    out = []
    for column in columns:
        ref = f's."{column}"'
        if column in ("start", *TIME_COLUMNS.get(table, ())):
            out.append(f"{ref} + {offset}")
        elif column == "end" and table == "OSRT_API":
            # a call that outlasts the window is cut at the window's end, except in the last replica
            out.append(f"CASE WHEN r.r < {last} THEN min({ref}, {plan.window_end_ns}) ELSE {ref} END + {offset}")
        elif column == "end":
            out.append(f"{ref} + {offset}")  # NULL (open NVTX range) stays NULL
        elif column == "correlationId":
            out.append(f"{ref} + r.r * {plan.correlation_stride}")
        elif column == "gridId" and table == KERNEL:
            out.append(f"{ref} + r.r * {plan.grid_stride}")
        elif column == "rangeId" and table == "NVTX_EVENTS":
            out.append(f"{ref} + r.r * {plan.range_stride}")
        elif column == "text" and table == "NVTX_EVENTS":
            step = (
                f"WHEN {ref} GLOB 'step [0-9]*' AND CAST(substr({ref}, 6) AS INTEGER) || '' = substr({ref}, 6) "
                f"THEN 'step ' || (CAST(substr({ref}, 6) AS INTEGER) + r.r * {plan.steps_per_period})"
            )
            at = f"instr({ref}, '{OP_ID}') + {len(OP_ID)}"  # where the op id's digits start
            op_id = f"CAST(substr({ref}, {at}) AS INTEGER)"
            renumbered = (
                f"WHEN instr({ref}, '{OP_ID}') > 0 AND substr({ref}, {at}, 1) BETWEEN '0' AND '9' "
                f"THEN substr({ref}, 1, {at} - 1) || ({op_id} + r.r * {OP_ID_STRIDE}) "
                f"|| substr({ref}, {at} + length({op_id} || ''))"
            )
            out.append(f"CASE {step if plan.steps_per_period else ''} {renumbered} ELSE {ref} END")
        else:
            out.append(ref)
    return out


def _edge_expressions(plan: Plan, table: str, columns: list[str], condition: str) -> list[str]:
    """Edge rows (written once): those starting after the replicated window move to the capture's end."""
    shift = f"CASE WHEN {condition} THEN {plan.shift_to_end_ns} ELSE 0 END"
    times = ("start", "end", *TIME_COLUMNS.get(table, ()))
    return [f's."{c}" + {shift}' if c in times else f's."{c}"' for c in columns]


def generate(seed: Path, out: Path, kernels: int, quiet: bool = False) -> dict:
    """Write `out` with exactly `kernels` kernels; returns row counts, the plan and the time taken."""
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    conn = sqlite3.connect(str(partial), uri=True, isolation_level=None)
    # page_size 4096 as nsys writes them (set before the first table); no journal: a failed run
    # leaves only the .partial file, which the next run deletes
    for pragma in (
        "page_size = 4096",
        "journal_mode = OFF",
        "synchronous = OFF",
        "locking_mode = EXCLUSIVE",
        "cache_size = -262144",
        "temp_store = MEMORY",
    ):
        conn.execute(f"PRAGMA {pragma}")
    conn.execute("ATTACH DATABASE ? AS seed", (f"{seed.resolve().as_uri()}?mode=ro",))
    plan = make_plan(conn, kernels)
    schema = _q(conn, "SELECT type, name, sql FROM seed.sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
    seed_tables = [name for kind, name, _ in schema if kind == "table"]
    conn.execute("BEGIN")
    for kind, _, sql in schema:
        if kind == "table":
            conn.execute(sql)
    conn.execute("CREATE TEMP TABLE replica (r INTEGER PRIMARY KEY)")
    conn.execute(
        f"WITH RECURSIVE n(r) AS (SELECT 0 UNION ALL SELECT r + 1 FROM n WHERE r + 1 < {plan.total}) "
        "INSERT INTO temp.replica SELECT r FROM n"
    )
    counts = {}
    for table in seed_tables:
        columns = _columns(conn, table, "seed")
        names = ", ".join(f'"{c}"' for c in columns)
        t = time.perf_counter()
        if table in REPLICATED_TABLES:
            # edge rows once, then the replicas in time order (replica outer, seed rows in rowid order)
            edges = f"{_time(table)} >= {plan.tail_ns}"
            conn.execute(
                f'INSERT INTO main."{table}" ({names}) '
                f"SELECT {', '.join(_edge_expressions(plan, table, columns, edges))} "
                f'FROM seed."{table}" s WHERE {_once_filter(plan, table)} AND {_time(table)} < {plan.origin_ns}'
            )
            conn.execute(
                f'INSERT INTO main."{table}" ({names}) '
                f"SELECT {', '.join(_replica_expressions(plan, table, columns))} "
                f'FROM temp.replica r CROSS JOIN seed."{table}" s WHERE {_replica_filter(plan, table)}'
            )
            conn.execute(
                f'INSERT INTO main."{table}" ({names}) '
                f"SELECT {', '.join(_edge_expressions(plan, table, columns, edges))} "
                f'FROM seed."{table}" s WHERE {_once_filter(plan, table)} AND {_time(table)} >= {plan.origin_ns}'
            )
        elif table in EDGE_TABLES and "start" in columns:
            conn.execute(
                f'INSERT INTO main."{table}" ({names}) '
                f"SELECT {', '.join(_edge_expressions(plan, table, columns, f's.start >= {plan.tail_ns}'))} "
                f'FROM seed."{table}" s'
            )
        elif table == "ANALYSIS_DETAILS":
            exprs = [f"{c} + {plan.shift_to_end_ns}" if c in ("duration", "stopTime") else c for c in columns]
            conn.execute(f'INSERT INTO main."{table}" ({names}) SELECT {", ".join(exprs)} FROM seed."{table}"')
        else:
            conn.execute(f'INSERT INTO main."{table}" ({names}) SELECT {names} FROM seed."{table}"')
        counts[table] = _q(conn, f'SELECT count(*) FROM main."{table}"')[0][0]
        if not quiet and table in REPLICATED_TABLES:
            print(f"  {table}: {counts[table]:,} rows in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    for kind, _, sql in schema:
        if kind != "table":
            conn.execute(sql)
    conn.execute("COMMIT")
    conn.execute("DETACH DATABASE seed")
    conn.close()
    os.replace(partial, out)
    seconds = time.perf_counter() - t0
    if counts.get(KERNEL) != kernels:
        raise AssertionError(f"wrote {counts.get(KERNEL)} kernels, wanted {kernels}")
    return {"path": str(out), "seconds": seconds, "bytes": out.stat().st_size, "counts": counts, "plan": plan}


def row_counts(path: Path) -> dict[str, int]:
    """Rows per activity table, and OSRT calls / NVTX ranges as the analyses see them."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        tables = _tables(conn)
        count = lambda sql: _q(conn, sql)[0][0]  # noqa: E731
        return {
            "kernels": count(f"SELECT count(*) FROM {KERNEL}") if KERNEL in tables else 0,
            "runtime": count(f"SELECT count(*) FROM {RUNTIME}") if RUNTIME in tables else 0,
            "memops": sum(
                count(f"SELECT count(*) FROM {t}")
                for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
                if t in tables
            ),
            "osrt": count("SELECT count(*) FROM OSRT_API") if "OSRT_API" in tables else 0,
            "nvtx": count("SELECT count(*) FROM NVTX_EVENTS") if "NVTX_EVENTS" in tables else 0,
            "metrics": count("SELECT count(*) FROM GPU_METRICS") if "GPU_METRICS" in tables else 0,
            "sched": count("SELECT count(*) FROM SCHED_EVENTS") if "SCHED_EVENTS" in tables else 0,
        }
    finally:
        conn.close()


def check_links(path: Path) -> dict:
    """Every kernel has one CUDA API row with its correlationId in its process; correlationIds unique."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        kernels, distinct = _q(conn, f"SELECT count(*), count(DISTINCT correlationId) FROM {KERNEL}")[0]
        api_rows, api_distinct = _q(conn, f"SELECT count(*), count(DISTINCT correlationId) FROM {RUNTIME}")[0]
        # both sides sorted by correlationId (a temp b-tree each), then merged: linear, unlike a nested loop
        linked = _q(
            conn,
            f"""
            SELECT count(*) FROM (SELECT correlationId c, globalPid p FROM {KERNEL}) k
            JOIN (SELECT correlationId c, globalTid t FROM {RUNTIME}) r
              ON r.c = k.c AND (r.t & 0xFFFFFFFFFF000000) = k.p""",
        )[0][0]
        return {
            "kernels": kernels,
            "unique_kernel_correlation_ids": distinct == kernels,
            "unique_api_correlation_ids": api_distinct == api_rows,
            "kernels_linked": linked,
        }
    finally:
        conn.close()


def nsys_kernel_instances(path: Path) -> int:
    """Sum of the Instances column of `nsys stats -r gpukernsum` on the file."""
    import csv
    import io
    import subprocess

    proc = subprocess.run(
        ["nsys", "stats", "-r", "gpukernsum", "-f", "csv", "--force-export", "false", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Time (%)"))
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[header:]))))
    return sum(int(row["Instances"]) for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kernels", type=parse_count, help="kernel rows to write: 20k, 1M, 16M...")
    parser.add_argument("-o", "--output", type=Path, help="output .sqlite (default: k<N>.sqlite here)")
    parser.add_argument("--seed", type=Path, default=DEFAULT_SEED, help=f"seed export (default: {DEFAULT_SEED.name})")
    parser.add_argument(
        "--check",
        action="store_true",
        help="then verify: nsys stats -r gpukernsum counts N instances, every kernel links to "
        "its CUDA API row, correlationIds are unique",
    )
    args = parser.parse_args(argv)
    out = args.output or Path(f"k{format_count(args.kernels)}.sqlite")
    result = generate(args.seed, out, args.kernels)
    plan = result["plan"]
    print(
        f"{out}: {args.kernels:,} kernels from {plan.seed_kernels:,}-kernel seed x {plan.total} replicas "
        f"(period {plan.period_ns / 1e6:.3f} ms), {result['bytes'] / 2**30:.2f} GiB in {result['seconds']:.1f} s"
    )
    print("  " + ", ".join(f"{k} {v:,}" for k, v in row_counts(out).items()))
    if args.check:
        links = check_links(out)
        instances = nsys_kernel_instances(out)
        ok = (
            instances == args.kernels
            and links["kernels_linked"] == args.kernels
            and links["unique_kernel_correlation_ids"]
            and links["unique_api_correlation_ids"]
        )
        print(
            f"  check: nsys gpukernsum instances {instances:,}; kernels linked to their API call "
            f"{links['kernels_linked']:,}; unique correlationIds: kernels {links['unique_kernel_correlation_ids']}, "
            f"API {links['unique_api_correlation_ids']} -> {'OK' if ok else 'FAILED'}"
        )
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
