"""The memory budget: parsed from a size, handed to every DuckDB database, checked against the peak, and a
too-small share reported as what it is (not as a damaged export)."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest
import yaml

from sftprof import memory_budget
from sftprof.capture import config
from sftprof.pipeline import analyze_trace
from sftprof.trace.events import EventStore

from conftest import REPO, run_sftprof

FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture
def budget():
    """Restores the process's budget after a test that sets it."""
    before = memory_budget.current()
    yield memory_budget
    memory_budget.use(before)


@pytest.mark.parametrize(
    "text, size",
    [("1GB", 2**30), ("1.5G", 3 * 2**29), ("512MiB", 2**29), ("800m", 800 * 2**20), (" 2 gb ", 2**31), ("1T", 2**40)],
)
def test_sizes_in_binary_units(text, size):
    assert memory_budget.parse(text) == size


@pytest.mark.parametrize(
    "text", ["", "GB", "1 GB extra", "-1GB", "1e9", "1PB", "1,5G", "511MB", "12", "9" * 400 + "GB", "1025T", "1GB\n"]
)
def test_what_is_not_a_size_or_too_small_is_refused(text):
    with pytest.raises(memory_budget.MemoryBudgetError, match="memory budget"):
        memory_budget.parse(text)


def _limit(con) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_each_database_is_held_to_its_share(budget):
    budget.use(budget.parse("2GB"))
    store, reference = EventStore(on_disk=False), duckdb.connect()
    reference.execute(f"SET memory_limit = '{2**31 // budget.DUCKDB_SHARE // 2**20}MiB'")
    assert _limit(store.con) == _limit(reference)
    budget.use(budget.parse("512MB"))  # the smallest budget: its share is DuckDB's floor
    reference.execute(f"SET memory_limit = '{budget.MIN_DUCKDB_BYTES // 2**20}MiB'")
    assert _limit(EventStore(on_disk=False).con) == _limit(reference) != _limit(store.con)


@pytest.mark.parametrize(
    "usable, size, threads", [(2, "1GB", 2), (16, "1GB", 4), (16, "4GB", 8), (72, "64GB", 8), (3, "512MB", 2)]
)
def test_each_database_runs_on_the_cores_the_process_may_use(budget, monkeypatch, usable, size, threads):
    """Not the machine's: `srun -c 2` or taskset on a node of many cores gives the process two. At most
    MAX_THREADS, and as many as the database's share of the budget holds (DUCKDB_THREAD_BYTES each): 8 threads
    in the default budget's 128 MiB ran out on NeMo's 60M NVTX ranges."""
    budget.use(budget.parse(size))
    monkeypatch.setattr(os, "cpu_count", lambda: 72)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(usable)), raising=False)
    store = EventStore(on_disk=False)
    assert store.con.execute("SELECT current_setting('threads')").fetchone()[0] == threads


def test_overrun_is_said_only_past_the_budget(budget, monkeypatch):
    budget.use(budget.parse("1GB"))
    monkeypatch.setattr(budget, "peak", lambda: 2**30)
    assert budget.overrun() is None
    monkeypatch.setattr(budget, "peak", lambda: 3 * 2**30)
    assert budget.overrun().startswith("peak memory 3.00 GB went over the memory budget of 1.00 GB")


def test_peak_is_this_process_resident_memory():
    with open("/proc/self/status") as status:
        high_water = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
    assert 0.5 * high_water <= memory_budget.peak() <= 2 * high_water


def test_a_share_too_small_for_a_query_is_named_as_such(budget, monkeypatch):
    """Below DuckDB's floor a real export's copy runs out of memory: the error says to raise the budget,
    where it used to call the export damaged."""
    monkeypatch.setattr(budget, "MIN_DUCKDB_BYTES", 2**20)
    budget.use(2**20 * budget.DUCKDB_SHARE)
    with pytest.raises(
        budget.MemoryBudgetError, match=r"DuckDB needed more than its 1MiB share .* raise --memory-budget"
    ):
        analyze_trace(FIXTURES / "nsys2025" / "h200_sft_clean_metrics.sqlite")


@pytest.mark.parametrize("command", ["analyze", "compare", "ranks"])
def test_each_command_that_analyses_traces_refuses_a_bad_budget_before_any_work(tmp_path, command):
    trace = FIXTURES / "h200_tiny_llama_bf16.sqlite"
    inputs = {"analyze": [trace], "compare": [trace, trace], "ranks": [tmp_path]}[command]
    result = run_sftprof(command, *inputs, "-o", tmp_path / "out", "--memory-budget", "lots")
    assert result.returncode == 1
    assert result.stderr.strip() == "sftprof: error: memory budget 'lots' is not a size such as 1GB, 1.5G or 512MB"
    assert not (tmp_path / "out").exists()
    assert "--memory-budget SIZE" in run_sftprof(command, "--help").stdout


def test_the_cli_says_when_the_peak_went_over(budget, monkeypatch, tmp_path, capsys):
    from sftprof import cli

    report = FIXTURES / "h200_tiny_llama_bf16.sqlite"
    assert cli.main(["analyze", str(report), "-o", str(tmp_path / "within"), "--memory-budget", "64GB"]) == 0
    assert "memory budget" not in capsys.readouterr().err
    monkeypatch.setattr(budget, "peak", lambda: 5 * 2**30)
    assert cli.main(["analyze", str(report), "-o", str(tmp_path / "over"), "--memory-budget", "4GB"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("sftprof: note: peak memory 5.00 GB went over the memory budget of 4.00 GB")
    assert (tmp_path / "over" / "report.html").exists()  # a note, not a failure: nothing is lost


def test_the_config_defaults_the_budget_and_refuses_a_bad_one(tmp_path):
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    assert config.validate(dict(base))["memory_budget"] == memory_budget.DEFAULT
    with pytest.raises(config.ConfigError, match="^config key memory_budget: memory budget '100MB' is below 512MB$"):
        config.validate({**base, "memory_budget": "100MB"})


_COUNT_HEAPS = """
import ctypes, sys, tempfile, threading
import numpy as np
from sftprof import memory_budget
if sys.argv[1] == "budget":
    memory_budget.use(memory_budget.parse("1GB"))
held = threading.Barrier(8)  # every thread holds its heap until all have one: an ended thread's is reused
def allocate():
    data = np.ones(1000)  # numpy's data: malloc
    held.wait()
    del data
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    print(open(report.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="glibc's malloc (Linux)")
def test_a_budget_holds_threads_to_two_malloc_heaps():
    """Eight threads that allocate get a malloc heap each (glibc allows 8 a core), and two in all once a budget
    is set: each heap keeps what its thread freed, which had taken a 16-core run 0.1-0.2 GiB over the budget."""
    heaps = {
        setting: int(
            subprocess.run(
                [sys.executable, "-c", _COUNT_HEAPS, setting], capture_output=True, text=True, check=True, cwd=REPO
            ).stdout
        )
        for setting in ("default", "budget")
    }
    assert heaps["budget"] <= memory_budget.MALLOC_ARENAS < heaps["default"]
