"""Hostile and damaged nsys exports (class "trace"): each ends as a one-line refusal, or as a report
whose numbers are sane and that names the rows it left out. Hand cases go through the installed
command; a seeded fuzzer corrupts the b-tree pages of a small real export and loads every case in a
child process, with a watchdog per case (a hang is a failure, not a stuck CI job).

Run the fuzzer alone, e.g. against another checkout: python tests/test_hostile_trace.py BASE DIR SEED COUNT
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sftprof.pipeline import analyze_trace
from sftprof.trace.nsys.store import MISSING_KERNEL_NAME

from conftest import (
    as_parquetdir,
    assert_refused,
    assert_sane_with_dropped_rows,
    ci_bounded,
    impossible_numbers,
    run_sftprof,
    tree_state,
)

FIXTURE = Path(__file__).parent / "fixtures" / "h200_plant_clean.sqlite"
FUZZ_SEED, FUZZ_CASES = 20261201, ci_bounded(60, 12)
CASE_TIMEOUT_S = 60  # one case loads and analyses in about a second
# Tables whose pages the fuzzer corrupts, with weights: the two the page decoder reads come first.
FUZZED_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": 4,
    "CUPTI_ACTIVITY_KIND_RUNTIME": 3,
    "NVTX_EVENTS": 1,
    "OSRT_API": 1,
    "CUPTI_ACTIVITY_KIND_MEMCPY": 1,
    "CUPTI_ACTIVITY_KIND_MEMSET": 1,
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": 1,
    "StringIds": 1,
    "ThreadNames": 1,
    "sqlite_schema": 1,
}
# A second file to corrupt: the real capture with GPU metrics and context switches, whose metric samples
# gpu_samples reads from the pages (names looked up by TARGET_INFO_GPU_METRICS), and fewer cases of it.
METRICS_FIXTURE = FIXTURE.parent / "nsys2025" / "h200_sft_clean_metrics.sqlite"
FUZZ_FILES = {
    "plant": (FIXTURE, FUZZED_TABLES, FUZZ_CASES),
    "metrics": (
        METRICS_FIXTURE,
        {"GPU_METRICS": 3, "TARGET_INFO_GPU_METRICS": 2, "SCHED_EVENTS": 1, "CUPTI_ACTIVITY_KIND_KERNEL": 1},
        FUZZ_CASES // 2,
    ),
}
INT64_MAX = 2**63 - 1


def export_copy(
    folder: Path, name: str, *statements: str, not_null_off: tuple[str, ...] = (), source: Path = FIXTURE
) -> Path:
    """`source` with `statements` applied; `not_null_off` tables take NULLs (their schema text edited,
    as a hostile file may have it)."""
    path = folder / name
    shutil.copy(source, path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA writable_schema = ON")
        for table in not_null_off:
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') WHERE name = ?", (table,))
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)
    return path


def count(path: Path, sql: str) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchone()[0]


def left_out(path: Path) -> dict[str, int]:
    """The rows of each table that no capture can hold, counted by SQLite: the loaders' rule, written again."""
    out_of_range = f'abs(start) > {2**53} OR abs("end") > {2**53} OR "end" < start'
    bad = f'(start IS NULL OR "end" IS NULL OR {out_of_range})'
    queries = {
        "kernels": f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE {bad}",
        # a call without its thread, or with a name StringIds does not hold, is damaged too
        "cuda_api": f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE {bad} "
        "OR nameId IS NULL OR nameId NOT IN (SELECT id FROM StringIds) OR globalTid IS NULL",
        "memops": f"SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE {bad}) "
        f"+ (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE {bad})",
        "sync": f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION WHERE {bad}",
        # a call with no event class, or a name StringIds does not hold, is damaged too
        "osrt": "SELECT count(*) FROM OSRT_API WHERE (eventClass = 27 OR eventClass IS NULL) AND "
        f"({bad} OR eventClass IS NULL OR nameId IS NULL OR nameId NOT IN (SELECT id FROM StringIds))",
        # an NVTX range without an end is open to the capture's end, not damaged; an event without a type is,
        # and so is a range without its thread
        "nvtx": "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IS NULL "
        f"OR (eventType IN (59, 60, 70, 71) AND (start IS NULL OR {out_of_range} OR globalTid IS NULL))",
        # a context switch without its thread or core pairs with nothing
        "sched": f"SELECT count(*) FROM SCHED_EVENTS WHERE start IS NULL OR abs(start) > {2**53} "
        "OR globalTid IS NULL OR cpu IS NULL",
        # a sample of no known metric is no sample (not counted), as before
        "gpu_metrics": f"SELECT count(*) FROM GPU_METRICS g WHERE (timestamp IS NULL OR abs(timestamp) > {2**53}) "
        "AND EXISTS (SELECT 1 FROM TARGET_INFO_GPU_METRICS i WHERE i.typeId = g.typeId AND i.metricId = g.metricId)",
    }
    with sqlite3.connect(path) as conn:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    return {
        table: rows
        for table, sql in queries.items()
        if set(re.findall(r"FROM (\w+)", sql)) <= present and (rows := count(path, sql))
    }


def small_pages_export(path: Path, source: Path = FIXTURE) -> Path:
    """`source` rewritten with 512-byte pages: b-trees of interior pages over hundreds of leaves."""
    shutil.copy(source, path)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA page_size = 512")
        conn.execute("VACUUM")
    return path


def btree_pages(path: Path) -> list[tuple[int, str, str]]:
    """(page number, table, "internal" or "leaf") for every b-tree page but page 1 (the file header's)."""
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT pageno, name, pagetype FROM dbstat WHERE pagetype IN ('internal', 'leaf') "
            "AND pageno > 1 ORDER BY pageno"
        ).fetchall()


# ---------------------------------------------------------------- hand cases, through the CLI


def interior_root(path: Path, table: str) -> tuple[bytearray, int]:
    """The file's bytes and the offset of `table`'s root page, an interior page in a small_pages_export."""
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    data = bytearray(path.read_bytes())
    assert data[(root - 1) * 512] == 0x05
    return data, (root - 1) * 512


def own_child(data: bytearray, at: int) -> None:
    """An interior page with no cells whose rightmost child is itself: a walk that trusts it never ends."""
    data[at + 3 : at + 5] = b"\0\0"
    data[at + 8 : at + 12] = (at // 512 + 1).to_bytes(4, "big")


def cell_pointer_out_of_page(data: bytearray, at: int) -> None:
    data[at + 12 : at + 14] = b"\xff\xff"


def child_page_zero(data: bytearray, at: int) -> None:
    data[at + 8 : at + 12] = b"\0\0\0\0"


@pytest.mark.parametrize("damage", [own_child, cell_pointer_out_of_page, child_page_zero], ids=lambda f: f.__name__)
def test_a_damaged_btree_is_refused_in_one_line(tmp_path, damage):
    """The page decoder gives the table up (no loop, no traceback), and SQLite, reading it instead, finds it malformed."""
    path = small_pages_export(tmp_path / "export.sqlite")
    data, root = interior_root(path, "CUPTI_ACTIVITY_KIND_KERNEL")
    damage(data, root)
    path.write_bytes(bytes(data))
    before = tree_state(tmp_path)
    result = run_sftprof("analyze", path, "-o", tmp_path / "out", timeout=60)
    assert_refused(result, contains=f"{path}: damaged or truncated export")
    assert tree_state(tmp_path) == before  # no output folder, no stray file


def test_a_directory_named_like_an_export_is_refused(tmp_path):
    folder = tmp_path / "x.sqlite"
    folder.mkdir()
    result = run_sftprof("analyze", folder, "-o", tmp_path / "out")
    assert_refused(result, contains=f"{folder}: not a regular file")
    assert not (tmp_path / "out").exists()


def test_damaged_values_are_left_out_and_named_and_odd_names_open_the_right_file(tmp_path):
    """One run of the command over every export that must load: bad times and strings inside, and a file
    name that an unescaped SQLite URI would cut short (at `?` or `#`) or decode (`%41`)."""
    steps = "text LIKE 'step %'"
    cases = {
        "times": export_copy(
            tmp_path,
            "times.sqlite",
            # end before start
            'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 100000000 WHERE rowid % 3 = 0',
            'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = start - 1 WHERE rowid % 3 = 0',
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET nameId = 987654321 WHERE rowid % 13 = 1",
            'UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET "end" = start - 100000000',
            'UPDATE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION SET "end" = start - 5',
            'UPDATE OSRT_API SET "end" = start - 100000000 WHERE rowid % 5 = 0',
            f'UPDATE NVTX_EVENTS SET start = "end" + 1000000000 WHERE {steps} AND rowid % 2 = 0',
            # NULL times
            "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid % 7 = 0",
            "UPDATE NVTX_EVENTS SET eventType = NULL WHERE rowid % 11 IN (0, 5)",
            # no thread: a step range among them once broke the step accounting
            "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid % 17 = 3",
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = NULL WHERE rowid % 17 = 2",
            "UPDATE OSRT_API SET start = NULL WHERE rowid % 5 = 1",
            'UPDATE OSRT_API SET "end" = NULL WHERE rowid % 5 = 2',
            "UPDATE OSRT_API SET eventClass = NULL WHERE rowid % 11 = 4",
            "UPDATE OSRT_API SET nameId = NULL WHERE rowid % 11 = 6",
            "UPDATE OSRT_API SET nameId = 987654321 WHERE rowid % 11 = 7",
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL WHERE rowid % 3 = 1",
            # times near 2^63
            f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = {INT64_MAX - 1000}, "end" = {INT64_MAX} WHERE rowid % 5 = 0',
            f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = {-INT64_MAX}, "end" = {INT64_MAX} WHERE rowid = 8',
            f'UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET "end" = {INT64_MAX} WHERE rowid % 4 = 0',
            f"UPDATE OSRT_API SET start = {-INT64_MAX} WHERE rowid % 5 = 3",
            f'UPDATE NVTX_EVENTS SET "end" = {INT64_MAX} WHERE {steps} AND rowid % 2 = 1',
            "UPDATE ANALYSIS_DETAILS SET duration = -5",
            not_null_off=("NVTX_EVENTS", "OSRT_API", "CUPTI_ACTIVITY_KIND_KERNEL"),
        ),
        "strings": export_copy(
            tmp_path,
            "strings.sqlite",
            "UPDATE StringIds SET value = x'00ff10' WHERE id % 7 = 0",
            "UPDATE StringIds SET value = CAST(x'41ff42' AS TEXT) WHERE id % 7 = 1",  # not UTF-8
            "UPDATE NVTX_EVENTS SET text = x'00ff10' WHERE text = 'forward'",
            "UPDATE NVTX_EVENTS SET text = 'step 99999999999999999999' WHERE text = 'step 4'",
            # read by sqlite3 (text not in UTF-8): events without a type counted there too
            "UPDATE NVTX_EVENTS SET eventType = NULL WHERE rowid % 13 = 2",
            "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid % 13 = 5",
            not_null_off=("NVTX_EVENTS",),
        ),
        "sched": export_copy(
            tmp_path,
            "sched.sqlite",
            f"UPDATE SCHED_EVENTS SET start = {INT64_MAX} WHERE rowid % 9 = 0",
            "UPDATE SCHED_EVENTS SET start = NULL WHERE rowid % 9 = 1",
            not_null_off=("SCHED_EVENTS",),
            source=FIXTURE.with_name("cpu_lock_sched.sqlite"),
        ),
        "metrics": export_copy(  # the real capture with GPU metrics and context switches
            tmp_path,
            "metrics.sqlite",
            "UPDATE GPU_METRICS SET timestamp = NULL WHERE rowid % 13 = 1",
            f"UPDATE GPU_METRICS SET timestamp = {INT64_MAX} WHERE rowid % 13 = 2",
            "UPDATE GPU_METRICS SET metricId = NULL WHERE rowid % 13 = 3",
            f"UPDATE GPU_METRICS SET typeId = {INT64_MAX} WHERE rowid % 13 = 4",
            "UPDATE GPU_METRICS SET value = NULL WHERE rowid % 13 = 5",
            f"UPDATE GPU_METRICS SET value = {INT64_MAX} WHERE rowid % 13 = 6",
            "UPDATE SCHED_EVENTS SET isSchedIn = NULL WHERE rowid % 5 = 0",
            f"UPDATE SCHED_EVENTS SET cpu = {2**62} WHERE rowid % 5 = 1",
            "UPDATE SCHED_EVENTS SET globalTid = NULL WHERE rowid % 5 = 2",
            f"UPDATE SCHED_EVENTS SET start = {-(2**62)} WHERE rowid % 5 = 3",
            "UPDATE SCHED_EVENTS SET cpu = NULL WHERE rowid = 5",
            not_null_off=("GPU_METRICS", "SCHED_EVENTS"),
            source=FIXTURE.parent / "nsys2025" / "h200_sft_clean_metrics.sqlite",
        ),
        # ranges pushed with no message: not damage (they once stopped the gap causes with a traceback)
        "nameless": export_copy(
            tmp_path,
            "nameless.sqlite",
            "UPDATE NVTX_EVENTS SET text = NULL, textId = NULL WHERE rowid % 7 = 3",
            not_null_off=("NVTX_EVENTS",),
            source=FIXTURE.with_name("h200_sft_clean.sqlite"),
        ),
        **{name: export_copy(tmp_path, f"{name}.sqlite") for name in ("plain", "a?b#c%41")},
    }
    expected = {name: left_out(path) for name, path in cases.items()}
    expected["times"]["capture span"] = 1
    before = tree_state(tmp_path)
    result = run_sftprof("analyze", *cases.values(), "-o", tmp_path / "out", timeout=240)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    new = set(tree_state(tmp_path)) - set(before)
    assert {path.split("/")[0] for path in new} == {"out"}, sorted(new)[:5]  # no stray file beside the exports
    results = {}
    for name in cases:
        summary, frames = assert_sane_with_dropped_rows(
            tmp_path / "out" / name.split(".")[0] / "analysis", expected[name]
        )
        results[name] = summary, frames
    named_steps = count(cases["strings"], f"SELECT count(*) FROM NVTX_EVENTS WHERE {steps}")
    assert len(results["strings"][1]["steps"]) == named_steps - 1 > 0  # the step past int64 is no step
    plain = results["plain"][0]
    assert (
        results["a?b#c%41"][0]["headline"] == plain["headline"]
        and results["a?b#c%41"][0]["findings"] == plain["findings"]
    )


# ---------------------------------------------------------------- the fuzzer


def corrupt(
    data: bytearray, pages: list[tuple[int, str, str]], rng: random.Random, weights: dict, page_size: int = 512
) -> str:
    """One random damage to one b-tree page of a table `weights` names (table: weight): a header field, a cell
    pointer, a child page number, a varint or random bytes; says what it did."""
    number, table, kind = rng.choices(pages, [weights.get(table, 0) for _, table, _ in pages])[0]
    base, header = (number - 1) * page_size, 12 if kind == "internal" else 8
    cells = int.from_bytes(data[base + 3 : base + 5], "big")

    def cell(i: int) -> int:
        pointer = int.from_bytes(data[base + header + 2 * i : base + header + 2 * i + 2], "big")
        return base + min(pointer, page_size - 4)

    what = rng.choice(["header", "cell pointer", "child page", "varint", "bytes"])
    if what == "header":
        data[base + rng.randrange(header)] = rng.randrange(256)
    elif what == "cell pointer" and cells:
        at = base + header + 2 * rng.randrange(min(cells, (page_size - header) // 2))
        data[at : at + 2] = rng.choice([0, 1, header, page_size - 1, 0xFFFF, rng.randrange(65536)]).to_bytes(2, "big")
    elif what == "child page" and kind == "internal":
        child = rng.choice([0, 1, number, len(data) // page_size + 1, 2**32 - 1, rng.randrange(len(data) // page_size)])
        at = base + 8 if not cells or rng.random() < 0.3 else cell(rng.randrange(min(cells, (page_size - 12) // 2)))
        data[at : at + 4] = child.to_bytes(4, "big")
    elif what == "varint" and cells:
        at = cell(rng.randrange(min(cells, (page_size - header) // 2))) + rng.randrange(4)
        data[at] = rng.choice([0x00, 0x07, 0x0C, 0x7F, 0x80, 0xFF, rng.randrange(256)])
    else:
        what = "bytes"
        for _ in range(rng.randint(1, 8)):
            data[base + rng.randrange(page_size)] = rng.randrange(256)
    return f"{table} page {number} ({kind}): {what}"


def fuzz(base: Path, folder: Path, seed: int, cases: int, weights: dict) -> None:
    """The child process: `cases` corruptions of `base` (pages of the tables `weights` names, as corrupt picks
    them), each loaded and analysed in turn; one JSON line per case on stdout. A case that runs past
    CASE_TIMEOUT_S ends the process with every thread's stack."""
    import faulthandler
    import traceback

    from sftprof.analysis import analyze
    from sftprof.errors import SftprofError
    from sftprof.trace import load_trace

    rng, pristine, pages = random.Random(seed), base.read_bytes(), btree_pages(base)
    for case in range(cases):
        data = bytearray(pristine)
        damage = [corrupt(data, pages, rng, weights) for _ in range(rng.randint(1, 3))]
        path = folder / f"case{case}.sqlite"
        path.write_bytes(bytes(data))
        print(json.dumps({"case": case, "damage": damage}), flush=True)
        faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
        outcome = {"case": case}
        try:
            tables = load_trace(path)
            try:
                frames = {name: getattr(tables, name) for name in ("nvtx", "osrt", "memops", "sync")}
                frames.update(kernels=tables.kernels, cuda_api=tables.cuda_api)
                analysis = analyze(tables)
            finally:
                tables.events.close()
            frames.update(analysis.tables)
            outcome["outcome"] = "loaded"
            outcome["problems"] = impossible_numbers(frames, analysis.headline)
        except SftprofError as error:
            outcome.update(outcome="refused", message=str(error))
        except Exception:
            outcome.update(outcome="crashed", message=traceback.format_exc(limit=-4))
        faulthandler.cancel_dump_traceback_later()
        path.unlink()
        print(json.dumps(outcome), flush=True)


@pytest.mark.ci_sample(1)
@pytest.mark.parametrize("fuzzed", FUZZ_FILES)
def test_fuzzed_btree_pages_are_refused_or_loaded_sanely(tmp_path, record_property, fuzzed):
    source, _, cases = FUZZ_FILES[fuzzed]
    base = small_pages_export(tmp_path / "base.sqlite", source)
    result = subprocess.run(
        [sys.executable, __file__, base, tmp_path, str(FUZZ_SEED), str(cases), fuzzed],
        capture_output=True,
        text=True,
        timeout=cases * CASE_TIMEOUT_S,
    )
    record_property("hostile_inputs", cases)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    damage = {line["case"]: line["damage"] for line in lines if "damage" in line}
    outcomes = [line for line in lines if "outcome" in line]
    assert len(outcomes) == cases, (
        f"case {max(damage)} ({damage[max(damage)]}) did not finish:\n{result.stderr[-4000:]}"
    )
    bad = [
        (o["case"], damage[o["case"]], o.get("message") or o["problems"])
        for o in outcomes
        if o["outcome"] == "crashed"
        or o.get("problems")
        or (o["outcome"] == "refused" and ("\n" in o["message"] or f"case{o['case']}.sqlite" not in o["message"]))
    ]
    assert not bad, "\n".join(map(str, bad))
    kinds = {o["outcome"] for o in outcomes}
    assert kinds == {"loaded", "refused"}, kinds  # the damage both reaches the loaders and gets past them


if __name__ == "__main__":
    fuzz(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), FUZZ_FILES[sys.argv[5]][1])


@pytest.mark.parametrize("form", ["sqlite", "parquetdir"])
@pytest.mark.parametrize(
    "deleted",
    [
        "DELETE FROM StringIds",
        "DELETE FROM StringIds WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)",
    ],
    ids=["StringIds emptied", "kernel names deleted"],
)
def test_kernels_whose_names_are_missing_keep_their_time_under_a_name_that_says_so(tmp_path, form, deleted):
    trace = export_copy(tmp_path, "nameless.sqlite", deleted)
    if form == "parquetdir":
        trace = as_parquetdir(trace, tmp_path / "nameless.parquetdir")
    with sqlite3.connect(FIXTURE) as db:
        kernel_ns = db.execute('SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0]
    analysis = analyze_trace(trace)
    assert analysis.headline["top_kernel"].startswith(MISSING_KERNEL_NAME)
    assert analysis.tables["kernels"]["total_ns"].sum() == kernel_ns
