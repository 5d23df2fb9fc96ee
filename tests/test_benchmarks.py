"""Smoke test of the scale benchmark (benchmarks/): the generator writes an export nsys accepts with
exactly the kernels asked for, and `benchmarks/run.py` completes at a tiny size and prints its
table. No timing is asserted: CI machines are too noisy for that."""

from __future__ import annotations

import csv
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import generate_export  # noqa: E402
import run as bench  # noqa: E402

SMALL = 20_000  # 4 replicas of the 4,227-kernel seed and a partial fifth
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None, reason="needs nsys (scripts/install-nsys.sh)")


@pytest.fixture(scope="module")
def small_export(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "k20k.sqlite"
    result = generate_export.generate(generate_export.DEFAULT_SEED, path, SMALL, quiet=True)
    assert result["counts"]["CUPTI_ACTIVITY_KIND_KERNEL"] == SMALL
    return path


def test_sizes_parse():
    assert [generate_export.parse_count(s) for s in ("20k", "1M", "16M", "1.5M", "4227")] == [
        20_000,
        1_000_000,
        16_000_000,
        1_500_000,
        4227,
    ]
    assert generate_export.format_count(16_000_000) == "16M"


def test_export_keeps_the_seed_schema_and_scales_every_table(small_export):
    import sqlite3

    seed = sqlite3.connect(generate_export.DEFAULT_SEED)
    out = sqlite3.connect(small_export)
    schema = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
    assert out.execute(schema).fetchall() == seed.execute(schema).fetchall()
    for table in ("StringIds", "ThreadNames", "TARGET_INFO_GPU", "ENUM_CUDA_MEMCPY_OPER", "EXPORT_META_DATA"):
        assert out.execute(f"SELECT * FROM {table}").fetchall() == seed.execute(f"SELECT * FROM {table}").fetchall()
    ratio = SMALL / seed.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY", "OSRT_API", "NVTX_EVENTS"):
        seeded = seed.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        scaled = out.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert 0.7 * ratio * seeded <= scaled <= 1.3 * ratio * seeded, table
    # the steps go on: step 4, 5, 6 in the seed, then 7, 8, ...
    steps = [r[0] for r in out.execute("SELECT text FROM NVTX_EVENTS WHERE text GLOB 'step *' ORDER BY start")]
    assert steps[:5] == ["step 4", "step 5", "step 6", "step 7", "step 8"]
    assert len(set(steps)) == len(steps)


def test_every_kernel_links_to_its_launch(small_export):
    links = generate_export.check_links(small_export)
    assert links == {
        "kernels": SMALL,
        "unique_kernel_correlation_ids": True,
        "unique_api_correlation_ids": True,
        "kernels_linked": SMALL,
    }


def test_sftprof_loads_it(small_export):
    from sftprof.trace import load_trace

    tables = load_trace(small_export)
    assert len(tables.kernels) == SMALL
    assert tables.kernels["correlation_id"].is_unique
    assert tables.kernels["correlation_id"].isin(tables.cuda_api["correlation_id"]).all()


@needs_nsys
def test_nsys_stats_counts_every_kernel(small_export):
    assert generate_export.nsys_kernel_instances(small_export) == SMALL


@needs_nsys
@pytest.mark.ci_sample(0)  # the benchmark itself, 31 s: the full test run has it
def test_benchmark_runs_and_prints_its_table(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "run.py"),
            "--sizes",
            "20k",
            "--seed",
            str(generate_export.DEFAULT_SEED),
            "--seed",  # a second shape: GPU metrics and context switches
            str(REPO / "tests" / "fixtures" / "nsys2025" / "h200_sft_clean_metrics.sqlite"),
            "--workdir",
            str(tmp_path),
            "--out",
            str(tmp_path / "results.csv"),
            "--parquetdir",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| shape | size | kernels | runtime | osrt | nvtx | GPU metrics | switches | sftprof wall s |" in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| shape |")).split("|")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| h200_tiny_llama_bf16 | 20k |")).split(
        "|"
    )
    cell = dict(zip((h.strip() for h in header), (c.strip() for c in row), strict=True))
    assert cell["agree"] == "yes", row  # sftprof's summaries equal nsys stats' on the same file
    # the same export as a parquetdir: analysed, and every saved file as the SQLite's
    assert cell["parquetdir files as SQLite's"] == "yes" and float(cell["parquetdir wall s"]) > 0, row
    other = next(line for line in proc.stdout.splitlines() if line.startswith("| h200_sft_clean_metrics | 20k |"))
    metrics, switches = (int(cell.replace(",", "")) for cell in other.split("|")[7:9])
    assert metrics > 100_000 and switches > 100, other
    assert (tmp_path / "results.csv").exists()
    assert not list(tmp_path.glob("*.sqlite")) and not list(tmp_path.glob("*.parquetdir"))  # without --keep: cleaned


@needs_nsys
@pytest.mark.ci_sample(0)  # 18 s: the full test run has it
def test_floor_measures_each_step_against_nsys_stats(small_export, tmp_path):
    """benchmarks/floor.py: decode, load, analyze and nsys stats on one file, each row's wall time over the same
    run's nsys stats; the decoder reads every row of the tables it lists (its children print them)."""
    out = tmp_path / "floor.csv"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "floor.py"), "--runs", "1", "--out", str(out), str(small_export)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with out.open() as f:
        rows = {row["step"]: row for row in csv.DictReader(f)}
    assert list(rows) == ["decode", "load", "analyze", "nsys"]
    assert float(rows["nsys"]["wall / nsys"]) == 1.0
    for row in rows.values():
        assert float(row["wall_s"]) > 0 and float(row["peak_rss_gb"]) > 0
        assert float(row["wall / nsys"]) > 0
    decoded = subprocess.run(
        [sys.executable, str(BENCHMARKS / "floor.py"), "--child", "decode", str(small_export)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    with sqlite3.connect(small_export) as con:
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert f"CUPTI_ACTIVITY_KIND_KERNEL: {kernels:,} rows" in decoded


def test_emit_nvtx_calls_keep_numbers_of_their_own_in_every_replica(tmp_path):
    """A longer NeMo capture numbers every op call anew (`aten::mm, op_id = N`): so does each replica."""
    import lzma
    import sqlite3

    seed = tmp_path / "nemo.sqlite"
    with lzma.open(REPO / "tests" / "fixtures" / "nemo" / "h200_nemo_lora_llama2_7b.sqlite.xz") as packed:
        seed.write_bytes(packed.read())
    out = tmp_path / "nemo40k.sqlite"
    generate_export.generate(seed, out, 40_000, quiet=True)  # two replicas and part of a third
    with sqlite3.connect(seed) as con:
        (seed_calls,) = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE '%, op_id = %'").fetchone()
    with sqlite3.connect(out) as con:
        calls, names = con.execute(
            "SELECT count(*), count(DISTINCT text) FROM NVTX_EVENTS WHERE text LIKE '%, op_id = %'"
        ).fetchone()
    assert calls > 2 * seed_calls and names == calls


def test_op_ids_are_renumbered_with_what_follows_them_kept():
    import sqlite3

    plan = generate_export.Plan(1, 1, 1, 3, None, 0, 10, 1, 1, 1, 0, 0)
    (text,) = generate_export._replica_expressions(plan, "NVTX_EVENTS", ["text"])
    names = ["aten::mm, seq = 4, op_id = 17, sizes = [[2, 3]]", "aten::add_, op_id = 9", "op_id = 3", "step 2", None]
    with sqlite3.connect(":memory:") as con:
        con.execute('CREATE TABLE s ("text" TEXT)')
        con.executemany("INSERT INTO s VALUES (?)", [(name,) for name in names])
        renamed = [row[0] for row in con.execute(f"SELECT {text} FROM s, (SELECT 2 AS r) r")]
    stride = 2 * generate_export.OP_ID_STRIDE
    assert renamed == [
        f"aten::mm, seq = 4, op_id = {17 + stride}, sizes = [[2, 3]]",
        f"aten::add_, op_id = {9 + stride}",
        "op_id = 3",
        "step 2",
        None,
    ]


def test_metric_samples_and_context_switches_are_replicated_with_the_kernels(tmp_path):
    """From the real capture with GPU metrics and context switches: both tables grow with the kernels,
    every replica's samples are the seed's window moved by whole periods (the same count per period, times
    in order, inside the export's span), and sftprof reads them all."""
    import sqlite3

    from sftprof.trace import load_trace

    seed_path = REPO / "tests" / "fixtures" / "nsys2025" / "h200_sft_clean_metrics.sqlite"
    path = tmp_path / "m.sqlite"
    result = generate_export.generate(seed_path, path, SMALL, quiet=True)
    plan, counts = result["plan"], result["counts"]
    seed = sqlite3.connect(seed_path)
    per_period = seed.execute(
        f"SELECT count(*) FROM GPU_METRICS WHERE timestamp >= {plan.origin_ns} AND timestamp < {plan.window_end_ns}"
    ).fetchone()[0]
    assert per_period > 1000 and counts["GPU_METRICS"] >= plan.full * per_period
    out = sqlite3.connect(path)
    first, last = out.execute('SELECT min(start), max("end") FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()
    in_periods = out.execute(
        f"""SELECT (timestamp - {plan.origin_ns}) / {plan.period_ns} AS r, count(*), min(timestamp) FROM GPU_METRICS
            WHERE timestamp >= {plan.origin_ns} AND timestamp < {plan.origin_ns + plan.full * plan.period_ns}
            GROUP BY r ORDER BY r"""
    ).fetchall()
    assert [n for _, n, _ in in_periods] == [per_period] * plan.full
    assert all(b[2] - a[2] == plan.period_ns for a, b in zip(in_periods, in_periods[1:]))
    assert out.execute("SELECT count(*) FROM GPU_METRICS WHERE rawTimestamp != timestamp").fetchone()[0] == 0
    assert first <= in_periods[-1][2] <= last
    assert counts["SCHED_EVENTS"] > 4 * seed.execute("SELECT count(*) FROM SCHED_EVENTS").fetchone()[0]
    tables = load_trace(path)
    assert tables.events.count("gpu_metrics") == counts["GPU_METRICS"]
    assert tables.events.count("sched") == counts["SCHED_EVENTS"]


def test_every_real_shape_is_there_and_a_packed_one_is_unpacked_once(tmp_path):
    import run

    assert all(seed.is_file() for seed in run.REAL_SHAPES)
    packed = next(seed for seed in run.REAL_SHAPES if seed.suffix == ".xz")
    seed = run.unpacked(packed, tmp_path)
    assert seed.parent == tmp_path and seed.read_bytes()[:16] == b"SQLite format 3\x00"
    made = seed.stat().st_mtime_ns
    assert run.unpacked(packed, tmp_path) == seed and seed.stat().st_mtime_ns == made


def test_edited_shapes_are_written_once_and_say_when_an_edit_misses(tmp_path, monkeypatch):
    import run

    syncs = run.edited("sync_per_launch", tmp_path)
    made = syncs.stat().st_mtime_ns
    assert run.edited("sync_per_launch", tmp_path) == syncs and syncs.stat().st_mtime_ns == made
    with sqlite3.connect(syncs) as con:
        [(calls,)] = con.execute(
            """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
               WHERE s.value = 'cudaDeviceSynchronize_v3020'"""
        )
        [(launches,)] = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert calls > launches / 2  # about one per launch
    copies = run.edited("host_copies", tmp_path)
    with sqlite3.connect(copies) as con:
        assert {kind for (kind,) in con.execute("SELECT DISTINCT memKind FROM CUPTI_ACTIVITY_KIND_MEMSET")} == {1}
    monkeypatch.setitem(run.EDITED_SHAPES, "nothing", (run.DEFAULT_SEED, ("UPDATE StringIds SET value = 'x' WHERE 0",)))
    with pytest.raises(SystemExit, match="changed no row"):
        run.edited("nothing", tmp_path)
    assert not list(tmp_path.glob("*nothing*"))  # nor its partial copy


@pytest.mark.parametrize("peak, shown", [(1.004, 1.01), (1.0, 1.0), (0.996, 1.0), (0.95000000001, 0.95), (6.551, 6.56)])
def test_peaks_are_rounded_up_so_an_overrun_never_reads_as_met(peak, shown):
    import run

    assert run._rounded_up(peak) == shown
    assert (run._rounded_up(peak) <= run.TARGET_RSS_GB) == (peak <= run.TARGET_RSS_GB)


def test_the_profile_gives_each_section_its_own_peak_in_turn(small_export):
    """benchmarks/profile_analyze.py --in-turn: every section of the registry is listed with what the process
    held when it started and its peak above that, the high-water mark read back after each reset."""
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "profile_analyze.py"), "--in-turn", str(small_export)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    table = run.stdout.split("sections in turn: load_trace peaked at ")[1]
    load_peak = float(table.split(" GB")[0])
    rows = [line.split() for line in table.splitlines()[2:17]]
    assert len(rows) == 15 and load_peak > 0.1
    for name, start, above, _left in rows:
        assert float(start) > 0.1 and float(above) > -0.05 and float(start) + float(above) <= load_peak + 1, name


def test_copy_kinds_that_a_new_export_spells_out_agree_with_nsys_2022s_short_names(tmp_path):
    values = {"Time (%)": "92.4", "Total Time (ns)": "10", "Count": "2", "Avg (ns)": "5.0", "Med (ns)": "5.0"}
    values |= {"Min (ns)": "4", "Max (ns)": "6", "StdDev (ns)": "1.4"}
    (tmp_path / "memops.csv").write_text(
        "time_pct,total_ns,instances,avg_ns,med_ns,min_ns,max_ns,stddev_ns,operation\n"
        "92.4,10,2,5.0,5.0,4,6,1.4,[CUDA memcpy Device-to-Device]\n"
    )
    reports = {"gpumemtimesum": [values | {"Operation": "[CUDA memcpy DtoD]"}]}
    said = bench.agreement(reports, tmp_path, 2022)
    assert "memops" not in said
    renamed = {"cuda_gpu_mem_time_sum": reports["gpumemtimesum"]}  # 2025's report keeps the names it is given
    assert "memops: 2/1 rows differ" in bench.agreement(renamed, tmp_path, 2025)
