"""Hostile and damaged PyTorch profiler (Kineto) traces (class "kineto"): each ends as a one-line
refusal, or as a report whose numbers are sane and that names the events it left out. Hand cases go
through the installed command; a seeded fuzzer breaks the events of a small real trace and loads
every case in this process, under an alarm (a hang is a failure)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (
    SFTPROF,
    assert_refused,
    assert_sane_with_dropped_rows,
    ci_bounded,
    impossible_numbers,
    run_sftprof,
)

FIXTURE = Path(__file__).parent / "fixtures" / "h200_plant_clean.pt.trace.json.gz"
FUZZ_SEED, FUZZ_CASES = 20261201, ci_bounded(100, 20)
CASE_TIMEOUT_S = 30  # one case loads and analyses in about 0.3 s
TABLE_OF = {
    "cpu_op": "nvtx",
    "user_annotation": "nvtx",
    "cuda_runtime": "cuda_api",
    "cuda_driver": "cuda_api",
    "kernel": "kernels",
    "gpu_memcpy": "memops",
    "gpu_memset": "memops",
}
# JSON numbers that json.dumps cannot write from Python values: written as these strings, then unquoted.
RAW_NUMBERS = {"1e999": "1e999", "-1e999": "-1e999", "big": "1" + "0" * 400}
HOSTILE_VALUES = [
    None,
    True,
    False,
    -1,
    0,
    2**24,
    2**31,
    2**63,
    2**64,
    -(2**63),
    10**30,
    1e308,
    -1e308,
    5e-324,
    float("inf"),
    float("-inf"),
    float("nan"),
    *RAW_NUMBERS,
    "",
    "abc",
    "12",
    "\u202e\x00",
    [],
    {},
    [1, 2, 3],
    ["a", 1, 2],
    {"a": 1},
    [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]],
]
FIELDS = [
    "ts",
    "dur",
    "pid",
    "tid",
    "name",
    "cat",
    "ph",
    "args",
    "args.correlation",
    "args.device",
    "args.stream",
    "args.bytes",
    "args.grid",
    "args.block",
    "args.name",
    "args.inDevice",
]


def small_trace() -> dict:
    """The fixture's first 10 ms (part of a step, kernels, API calls, memsets) and its memcpys and metadata."""
    with gzip.open(FIXTURE, "rt") as stream:
        document = json.load(stream)
    events = document["traceEvents"]
    first = min(e["ts"] for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int))
    document["traceEvents"] = [
        e
        for e in events
        if e.get("ph") == "M"
        or e.get("cat") == "gpu_memcpy"
        or (isinstance(e.get("ts"), (int, float)) and e["ts"] - first < 10_000)
    ]
    return document


def write(path: Path, document) -> Path:
    text = json.dumps(document, allow_nan=True)  # Infinity and NaN, as some writers emit them
    for name, number in RAW_NUMBERS.items():
        text = text.replace(json.dumps(name), number)
    path.write_text(text)
    return path


def spoil(document: dict, category: str, field: str, value, every: int, spoiled: dict[str, set]) -> None:
    """Set `field` of every `every`-th event of `category` to `value`; note the events in `spoiled[table]`."""
    for n, event in enumerate(e for e in document["traceEvents"] if e.get("cat") == category):
        if n % every == 0:
            event[field] = value
            spoiled.setdefault(TABLE_OF[category], set()).add(id(event))


# ---------------------------------------------------------------- hand cases, through the CLI


def test_events_of_wrong_types_or_impossible_times_are_left_out_and_named(tmp_path):
    base, cases, expected = small_trace(), {}, {}
    for name, spoils in {
        "ids": [("cpu_op", "pid", 10**30, 3), ("kernel", "pid", 2**70, 4), ("cuda_runtime", "tid", -5, 5)],
        "times": [
            ("user_annotation", "ts", float("nan"), 4),
            ("kernel", "dur", float("inf"), 3),
            ("cpu_op", "ts", "1e999", 4),
            ("cuda_runtime", "dur", 1e30, 6),
            ("gpu_memset", "ts", -1e20, 2),
            ("gpu_memcpy", "dur", -5, 2),
            ("cuda_driver", "ts", "big", 1),
        ],
        "types": [
            ("kernel", "name", [1, 2], 5),
            ("cuda_runtime", "name", 123, 7),
            ("gpu_memcpy", "args", "oops", 3),
            ("cpu_op", "ts", "12", 9),
            ("cuda_driver", "dur", True, 2),
        ],
    }.items():
        document, spoiled = copy.deepcopy(base), {}
        for category, field, value, every in spoils:
            spoil(document, category, field, value, every, spoiled)
        cases[name] = write(tmp_path / f"{name}.pt.trace.json", document)
        expected[name] = {table: len(events) for table, events in spoiled.items()}
    # Fields in args of the wrong type are read as unknown; a category that is not a string is no category.
    document = copy.deepcopy(base)
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel":
            event["args"] = {"correlation": [1], "grid": ["a", 1, 2], "block": 7, "device": 1e300, "stream": {"x": 1}}
        elif event.get("ph") == "M":
            event["args"] = {"name": ["a"]}
        elif event.get("cat") == "gpu_memset":
            event["cat"] = ["gpu_memset"]
    document["traceEvents"] += [5, "x", None, [1]]
    cases["args"], expected["args"] = write(tmp_path / "args.pt.trace.json", document), {}
    cases["plain"], expected["plain"] = write(tmp_path / "plain.pt.trace.json", base), {}

    result = run_sftprof("analyze", *cases.values(), "-o", tmp_path / "out", timeout=240)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for name in cases:
        summary, _ = assert_sane_with_dropped_rows(tmp_path / "out" / name / "analysis", expected[name])
        assert summary["headline"]["capture_s"] < 1, summary["headline"]  # no far-off time stretched the capture


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "deep",
            '{"schemaVersion": 1, "traceEvents": [' + "[" * 200_000 + "]" * 200_000 + "]}",
            "JSON nested too deeply",
        ),
        (
            "huge integer",
            '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": ' + "9" * 5000 + "}]}",
            "not valid JSON",
        ),
    ],
)
def test_json_no_parser_should_take_is_refused(tmp_path, name, text, message):
    path = tmp_path / "t.pt.trace.json"
    path.write_text(text)
    assert_refused(run_sftprof("analyze", path, "-o", tmp_path / "out"), contains=f"{path}: {message}")
    assert not (tmp_path / "out").exists()


def test_a_gzip_bomb_is_refused_with_bounded_memory(tmp_path):
    """2 MB that inflate to 2 GiB of JSON: refused once the cap (1 GiB) is read, never held whole."""
    from sftprof.trace.kineto import MAX_JSON_BYTES

    member = gzip.compress(b" " * (64 << 20), compresslevel=9)
    path = tmp_path / "bomb.pt.trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [') + member * 32)
    assert path.stat().st_size < 3 << 20
    result, peak_rss = run_measured("analyze", path, "-o", tmp_path / "out", folder=tmp_path)
    assert_refused(result, contains=f"{path}: more than 1 GiB of JSON")
    assert peak_rss < 1.5 * MAX_JSON_BYTES, peak_rss
    assert not (tmp_path / "out").exists()


def run_measured(*args, folder: Path) -> tuple[subprocess.CompletedProcess, int]:
    """run_sftprof, with the command's own peak RSS in bytes (from wait4, which reaps it)."""
    with open(folder / "stdout", "w+") as stdout, open(folder / "stderr", "w+") as stderr:
        process = subprocess.Popen([SFTPROF, *map(str, args)], stdout=stdout, stderr=stderr, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0), stderr.seek(0)
        return subprocess.CompletedProcess(
            args, process.returncode, stdout.read(), stderr.read()
        ), usage.ru_maxrss * 1024


def test_a_directory_named_like_a_trace_is_refused(tmp_path):
    folder = tmp_path / "x.pt.trace.json"
    folder.mkdir()
    assert_refused(run_sftprof("analyze", folder, "-o", tmp_path / "out"), contains=f"{folder}: not a regular file")


# ---------------------------------------------------------------- the fuzzer


def break_event(events: list, rng: random.Random) -> str:
    """One random damage to one event: a field set to a hostile value or removed, or the event replaced."""
    mapped = [
        i for i, e in enumerate(events) if isinstance(e, dict) and (str(e.get("cat")) in TABLE_OF or e.get("ph") == "M")
    ]
    i = rng.choice(mapped) if rng.random() < 0.9 else rng.randrange(len(events))
    if rng.random() < 0.03:
        events[i] = rng.choice([None, 5, "x", [1], [[[[1]]]]])
        return f"event {i} replaced"
    field = rng.choice(FIELDS)
    target = events[i]
    if not isinstance(target, dict):
        return f"event {i} left as it is"
    if field.startswith("args."):
        if not isinstance(target.get("args"), dict):
            target["args"] = {}
        target, field = target["args"], field.removeprefix("args.")
    if rng.random() < 0.1:
        target.pop(field, None)
        return f"event {i}: {field} removed"
    value = rng.choice(HOSTILE_VALUES)
    target[field] = value
    return f"event {i}: {field} = {value!r}"[:120]


class CaseTimeout(Exception):
    pass


def test_fuzzed_events_are_refused_or_loaded_sanely(tmp_path, record_property):
    from sftprof.analysis import analyze
    from sftprof.errors import SftprofError
    from sftprof.trace import load_trace

    def alarm(signum, frame):
        raise CaseTimeout()

    rng, base, outcomes, bad = random.Random(FUZZ_SEED), small_trace(), {"loaded": 0, "refused": 0}, []
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for case in range(FUZZ_CASES):
            document = copy.deepcopy(base)
            damage = [break_event(document["traceEvents"], rng) for _ in range(rng.randint(1, 12))]
            path = write(tmp_path / f"case{case}.pt.trace.json", document)
            signal.alarm(CASE_TIMEOUT_S)
            try:
                tables = load_trace(path)
                try:
                    frames = {name: getattr(tables, name) for name in ("nvtx", "memops")}
                    frames.update(kernels=tables.kernels, cuda_api=tables.cuda_api)
                    analysis = analyze(tables)
                finally:
                    tables.events.close()
                frames.update(analysis.tables)
                outcomes["loaded"] += 1
                if problems := impossible_numbers(frames, analysis.headline):
                    bad.append((case, damage, problems))
            except SftprofError as error:
                outcomes["refused"] += 1
                if "\n" in str(error) or str(path) not in str(error):
                    bad.append((case, damage, str(error)))
            except CaseTimeout:
                bad.append((case, damage, f"no result in {CASE_TIMEOUT_S} s"))
            except Exception as error:  # any other exception is what this test looks for
                bad.append((case, damage, repr(error)))
            finally:
                signal.alarm(0)
            path.unlink()
    finally:
        signal.signal(signal.SIGALRM, previous)
    record_property("hostile_inputs", FUZZ_CASES)
    assert not bad, "\n".join(map(str, bad))
    assert outcomes["loaded"] > FUZZ_CASES // 2, outcomes  # the damage gets past the reader into the analyses
