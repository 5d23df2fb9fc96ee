"""Steps on any capture: the step ranges common loops name, a user's pattern, and steps inferred from the GPU
timeline where a loop names none. Each is checked against the `step N` original of the same committed H200
capture, renamed or stripped of NVTX in a copy."""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from sftprof.analysis import analyze
from sftprof.cli import main
from sftprof.errors import SftprofError
from sftprof.step_names import STEP_RANGE, step_pattern
from sftprof.trace import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = ("h200_sft_clean", "h200_sft_foreach_adamw", "h200_sft_data_stall", "h200_tiny_llama_bf16")


@pytest.mark.parametrize(
    "name, number",
    [
        ("step 3", "3"),
        ("Step 3", "3"),
        ("iteration 12", "12"),
        ("ITERATION 12", "12"),
        ("iter 7", "7"),
        ("iter7", "7"),
        ("train_step 4", "4"),
        ("global_step 4", "4"),
        ("train step 4", "4"),
        ("step#9", "9"),
        ("my_domain:iteration 5", "5"),
    ],
)
def test_the_step_names_of_common_loops_are_recognised(name, number):
    match = STEP_RANGE.match(name)
    assert match and next(g for g in match.groups() if g) == number


@pytest.mark.parametrize("name", ["optimizer_step 3", "step", "steps 3", "iteration", "forward", "step 3 of 10"])
def test_other_names_are_not_steps(name):
    assert not STEP_RANGE.match(name)


@pytest.mark.parametrize("pattern", ["epoch \\d+ batch \\d+", "batch (", ""])
def test_a_users_pattern_needs_a_group_for_the_number(pattern):
    with pytest.raises(SftprofError, match="step range pattern"):
        step_pattern(pattern)


def _copy(capture: str, tmp_path: Path, label: str, sql: str) -> Path:
    path = tmp_path / f"{capture}.{label}.sqlite"
    shutil.copyfile(FIXTURES / f"{capture}.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    return path


def _renamed(capture: str, tmp_path: Path, prefix: str) -> Path:
    """A copy whose `step N` ranges are named `PREFIX N`."""
    return _copy(
        capture,
        tmp_path,
        prefix.strip(),
        f"UPDATE NVTX_EVENTS SET text = '{prefix}' || substr(text, 6) WHERE text LIKE 'step %'",
    )


def _accounting(path: Path, step_range: str | None = None):
    analysis = analyze(load_trace(path), step_range=step_range)
    return analysis.tables["step_accounting"], analysis.headline["steps_found_by"]


@pytest.fixture(scope="module")
def originals():
    return {capture: _accounting(FIXTURES / f"{capture}.sqlite")[0] for capture in CAPTURES}


def _agree(found, original) -> None:
    """The same steps, and per step the same accounting within 5% (of the step, for idle time)."""
    assert len(found) == len(original)
    assert (found["kernels"].to_numpy() == original["kernels"].to_numpy()).all()
    for column in ("duration", "kernel_ns", "sm_busy_ns"):
        assert found[column].to_numpy() == pytest.approx(original[column].to_numpy(), rel=0.05), column
    idle_gap = (found["idle_ns"] - original["idle_ns"]).abs().to_numpy()
    assert (idle_gap <= 0.05 * original["duration"].to_numpy()).all()


@pytest.mark.parametrize("capture", CAPTURES)
def test_renamed_step_ranges_give_the_same_accounting(capture, originals, tmp_path):
    renamed = _renamed(capture, tmp_path, "Iteration ")
    found, how = _accounting(renamed)
    assert "'Iteration " in how
    assert found.drop(columns="evidence").equals(originals[capture].drop(columns="evidence"))


@pytest.mark.parametrize("capture", CAPTURES)
def test_a_users_pattern_finds_ranges_no_default_knows(capture, originals, tmp_path):
    custom = _renamed(capture, tmp_path, "epoch 0 batch ")
    found, how = _accounting(custom, step_range=r"epoch \d+ batch (\d+)")
    assert "'epoch 0 batch " in how
    assert list(found["step"]) == list(originals[capture]["step"])


@pytest.mark.parametrize("capture", CAPTURES)
def test_without_nvtx_the_steps_come_from_the_gpu_timeline(capture, originals, tmp_path):
    stripped = _copy(capture, tmp_path, "no-nvtx", "DELETE FROM NVTX_EVENTS")
    found, how = _accounting(stripped)
    assert how.startswith("inferred from the GPU timeline")
    _agree(found, originals[capture])


def test_analyze_takes_a_step_pattern_and_refuses_a_bad_one(tmp_path, capsys):
    custom = _renamed("h200_sft_clean", tmp_path, "epoch 0 batch ")
    assert main(["analyze", str(custom), "-o", str(tmp_path / "bad"), "--step-range", "epoch (\\d+"]) == 1
    assert "not a regular expression" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["analyze", str(custom), "-o", str(tmp_path / "out"), "--step-range", r"batch (\d+)"]) == 0
    assert re.search(r"steps_found_by +2 NVTX step ranges", capsys.readouterr().out)


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(\w+)", r"epoch (\d+) batch \d+ x"])
def test_a_pattern_whose_group_holds_no_number_is_one_line_not_a_traceback(pattern, tmp_path, capsys):
    """Its group matched range names but held no step number in any (a pandas ValueError before): the pattern
    is named, cut to 80 characters, with what its group matched; nothing is written."""
    custom = _renamed("h200_sft_clean", tmp_path, "epoch 0 batch ")
    if pattern.endswith(" x"):  # matches nothing at all: no steps by name, so they are inferred
        assert main(["analyze", str(custom), "-o", str(tmp_path / "none"), "--step-range", pattern]) == 0
        assert "inferred from the GPU timeline" in capsys.readouterr().out
        return
    assert main(["analyze", str(custom), "-o", str(tmp_path / "bad"), "--step-range", pattern]) == 1
    err = capsys.readouterr().err
    assert "its group matched" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_a_long_pattern_is_cut_in_its_message():
    with pytest.raises(SftprofError) as refused:
        step_pattern("a" * 5000)
    assert len(str(refused.value)) < 200


OTHER_THREAD = 5 << 24  # another process's thread id in nsys's global_tid


@pytest.mark.ci_sample(4)
@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("how", ["another thread", "nested"])
def test_overlapping_step_ranges_count_once(capture, how, originals, tmp_path):
    """Step ranges marked twice, overlapping (a second process or thread naming the same steps, as ranks of one
    capture do; or `train_step N` inside `step N` on the same thread): one timeline's steps, the outermost, and
    the same accounting as the original, with the report saying what was left out (the gains' step windows
    must not overlap: each would take its share of the same GPU time)."""
    shift, thread, name = (1_000, OTHER_THREAD, "text") if how == "another thread" else (1_000, 0, "'train_' || text")
    copied = _copy(
        capture,
        tmp_path,
        how.replace(" ", "-"),
        f"""INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, textId, domainId)
            SELECT start + {shift}, "end" - {shift if thread == 0 else -shift}, eventType, {name},
                   globalTid + {thread}, NULL, domainId
            FROM NVTX_EVENTS WHERE text LIKE 'step %'""",
    )
    found, how_found = _accounting(copied)
    _agree(found, originals[capture])
    assert re.search(r"; \d+ matched on [12] thread\(s\), overlapping: the outermost on pid \d+", how_found)
