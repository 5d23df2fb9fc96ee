"""Hostile names and outputs (the hostile-input tally's class "output"): two runs writing one
folder, runs killed midway, names from the trace that are terminal escapes, spreadsheet formulas
or mathtext, and metrics or analysis folders that are not what sftprof writes."""

from __future__ import annotations

import csv
import json
import os
import pty
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sftprof import results
from sftprof.cli import main
from sftprof.io import atomic_dir
from sftprof.text import read_csv, write_csv

from conftest import CONTROL_CHARACTERS, SFTPROF, assert_refused, run_sftprof, tree_state

FIXTURES = Path(__file__).parent / "fixtures"
CLEAN, GEMM = FIXTURES / "h200_plant_clean.sqlite", FIXTURES / "h200_plant_gemm.sqlite"
# Clear screen, set the window title (OSC), bell, carriage return, backspace, a C1 CSI; a formula a
# spreadsheet would run; mathtext that matplotlib cannot parse.
PAYLOAD = "$\\frac$ \x1b[2J\x1b]0;pwned\x07 =cmd|' /C calc'!A0 \r\x08\x9b31m"
RAW_SEQUENCES = ("\x1b[2J", "\x1b]0;", "\x07", "\x08", "\x9b")
# The names planted in h200_plant_clean, each with a character that starts a spreadsheet formula.
PLANTED = {
    "top kernel": "=" + PAYLOAD,
    "python3": "+" + PAYLOAD,
    "pthread_cond_wait": "@" + PAYLOAD,
    "pt_autograd_0": "-" + PAYLOAD,
    "cub::DeviceRadixSort": PAYLOAD,
}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def plant(folder: Path) -> Path:
    """A copy of h200_plant_clean whose top kernel, two threads, an OS call and an NVTX range
    have hostile names."""
    path = folder / "hostile.sqlite"
    shutil.copy(CLEAN, path)
    with sqlite3.connect(path) as db:
        top_kernel = db.execute(
            "SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY demangledName "
            "ORDER BY sum(end - start) DESC LIMIT 1"
        ).fetchone()[0]
        for old, new in PLANTED.items():
            where = ("id = ?", top_kernel) if old == "top kernel" else ("value = ?", old)
            assert db.execute(f"UPDATE StringIds SET value = ? WHERE {where[0]}", (new, where[1])).rowcount == 1
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[Path, Path]:
    """The output folder of `sftprof analyze` of each clean input."""
    outputs = {source: tmp_path_factory.mktemp("good") / source.stem for source in (CLEAN, GEMM)}
    for source, out in outputs.items():
        assert run_sftprof("analyze", source, "-o", out).returncode == 0
    return outputs


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The hostile capture analysed, output piped."""
    root = tmp_path_factory.mktemp("planted")
    result = run_sftprof("analyze", plant(root), "-o", root / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


def refused_in_process(capsys, *args, contains: str) -> str:
    """`sftprof ARGS` run in this process, for the many cases refused before any work (no start-up
    time); anything but the one-line refusal, a traceback included, fails the test."""
    code = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return assert_refused(subprocess.CompletedProcess(args, code, out, err), contains=contains)


def test_hostile_names_reach_a_pipe_as_visible_escapes(planted):
    """Piped output (a log, `less -R`, a CI console) gets the names, not their control sequences."""
    _, result = planted
    assert not CONTROL_CHARACTERS & set(result.stdout + result.stderr), repr(result.stderr[-500:])
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in result.stdout


def test_hostile_names_reach_a_terminal_as_visible_escapes(planted, tmp_path):
    """On a terminal rich adds its colours and progress bar, but no sequence from the trace."""
    root, _ = planted
    terminal, child = pty.openpty()
    run = subprocess.Popen(
        [SFTPROF, "analyze", root / "hostile.sqlite", "-o", tmp_path / "out"], stdin=child, stdout=child, stderr=child
    )
    os.close(child)
    output = b""
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # EIO: every holder of the terminal's other side has closed it
            break
        if not chunk:
            break
        output += chunk
    os.close(terminal)
    assert run.wait(timeout=120) == 0, output[-3000:]
    text = output.decode("utf-8", "replace")
    assert "\\x1b[2J" in text and not [s for s in RAW_SEQUENCES if s in text], repr(text[-800:])


def test_compare_prints_hostile_names_as_visible_escapes(planted, good, tmp_path):
    root, _ = planted
    result = run_sftprof("compare", good[CLEAN], root / "out", "-o", tmp_path / "cmp")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not CONTROL_CHARACTERS & set(result.stdout + result.stderr), repr(result.stdout[-800:])
    assert "\\x1b[2J" in result.stdout


def test_logs_write_hostile_names_as_visible_escapes(tmp_path):
    """The workflow's rule scripts log finding titles; a log followed with `tail -f` is a terminal too."""
    code = "import logging, sys; from sftprof import logs; logs.setup(sys.argv[1]); logging.info('%s', sys.argv[2])"
    run = subprocess.run([sys.executable, "-c", code, tmp_path / "rule.log", PAYLOAD], capture_output=True, text=True)
    log = (tmp_path / "rule.log").read_text(encoding="utf-8")
    assert "\\x1b[2J" in log and not CONTROL_CHARACTERS & set(log + run.stderr), repr(log)


def _formula_cells(folder: Path) -> list[str]:
    """Cells of every CSV in `folder` that a spreadsheet would take for a formula (numbers aside)."""
    cells = []
    for path in folder.glob("*.csv"):
        with open(path, newline="", encoding="utf-8") as file:
            for row in csv.reader(file):
                cells += [cell for cell in row if cell.startswith(FORMULA_STARTS) and not _is_number(cell)]
    return cells


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def test_csv_cells_a_spreadsheet_would_run_are_quoted_and_read_back_whole(planted, good, tmp_path):
    """analyze's tables and compare's CSVs: every planted name is written behind a quote, and
    reading the analysis back (as compare does) gives the names as the trace had them."""
    root, _ = planted
    assert main(["compare", str(good[CLEAN]), str(root / "out"), "-o", str(tmp_path / "cmp")]) == 0
    for folder in (root / "out" / "analysis", tmp_path / "cmp"):
        assert not _formula_cells(folder), folder
    with open(root / "out" / "analysis" / "threads.csv", newline="", encoding="utf-8") as file:
        assert "'+" + PAYLOAD in {row["thread_name"] for row in csv.DictReader(file)}
    threads = results.load(root / "out" / "analysis").tables["threads"]
    assert {PLANTED["python3"], PLANTED["pt_autograd_0"]} <= set(threads["thread_name"])
    assert (threads["tid"] > 0).all()  # numbers stay numbers


def test_csv_quotes_only_text_and_round_trips(tmp_path):
    """Negative numbers are numbers, not formulas; a quote the text had survives the round trip."""
    frame = pd.DataFrame({"name": ["-1.5", "\tx", "\rx", "'q", "=1+1", "ok"], "value": [-1.5, -2, 0, 1, 2, 3]})
    write_csv(frame, tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    assert [row[0] for row in rows[1:]] == ["'-1.5", "'\tx", "'\rx", "''q", "'=1+1", "ok"]
    assert [row[1] for row in rows[1:3]] == ["-1.5", "-2.0"]
    pd.testing.assert_frame_equal(read_csv(tmp_path / "t.csv"), frame)


def test_mathtext_in_names_still_gives_the_report(planted):
    """`$...$` is drawn as it is: no mathtext parse error that would leave analysis/ without report.html."""
    root, _ = planted
    html = (root / "out" / "report.html").read_text(encoding="utf-8")
    assert html.count("<svg") >= 8 and "@$\\frac$" in html


# Shown reversed by a browser (U+202E), cut at the NUL, coloured by the ESC: a kernel and an NVTX domain.
PAGE_PLANTS = {"cub::DeviceSelect::UniqueByKey": "\u202eyeKyBeuqinU\x00hidden\x1b[31m", "CCCL": "\u202eLCCC\x00nul"}
PAGE_CONTROLS = CONTROL_CHARACTERS | {"\u202e", "\u2066", "\u2028"}


def test_report_and_compare_pages_show_control_characters_as_escapes(tmp_path):
    """report.html and compare.html get a bidi override, NUL or ESC from a name as a visible escape: raw, the
    browser reorders, cuts or hides what the page says."""
    source = tmp_path / "bidi.sqlite"
    shutil.copy(CLEAN, source)
    with sqlite3.connect(source) as db:
        kernel, domain = PAGE_PLANTS
        assert db.execute("UPDATE StringIds SET value = ? WHERE value = ?", (PAGE_PLANTS[kernel], kernel)).rowcount
        assert db.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text = ?", (PAGE_PLANTS[domain], domain)).rowcount
    assert run_sftprof("analyze", source, "-o", tmp_path / "out").returncode == 0
    analysis = tmp_path / "out" / "analysis"
    assert run_sftprof("compare", analysis, analysis, "-o", tmp_path / "cmp").returncode == 0
    for page in (tmp_path / "out" / "report.html", tmp_path / "cmp" / "compare.html"):
        html = page.read_text(encoding="utf-8")
        assert not PAGE_CONTROLS & set(html), (page.name, sorted(PAGE_CONTROLS & set(html)))
        assert "\\u202eLCCC\\x00nul" in html, page.name


def _analysis_written_since(root: Path, since_ns: int) -> bool:
    """Whether a run has written an analysis.json anywhere under `root` (its report comes next)."""
    for path in root.rglob("analysis.json"):
        try:
            if path.stat().st_mtime_ns >= since_ns:
                return True
        except FileNotFoundError:  # renamed meanwhile
            pass
    return False


def test_killed_between_tables_and_report_leaves_the_previous_output(good, tmp_path):
    """kill -9 after the new analysis/ is written but before report.html: the folder that was
    there stays whole; the next run clears what the killed one left."""
    out = tmp_path / "out"
    shutil.copytree(good[GEMM], out)
    before, started = tree_state(out), time.time_ns()
    run = subprocess.Popen([SFTPROF, "analyze", CLEAN, "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not _analysis_written_since(tmp_path, started) and run.poll() is None:
        time.sleep(0.005)
    run.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL, "the run ended before it could be killed midway"
    assert tree_state(out) == before
    assert run_sftprof("analyze", CLEAN, "-o", out).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_run_killed_between_its_two_renames_leaves_the_previous_output_to_the_next(tmp_path):
    """Killed after moving the old folder aside, before moving the new one in: the next writer puts
    the old one back before anything else, and clears the rest."""
    old = tmp_path / ".out.sftprof-4242-k1ll3d_0.old"
    old.mkdir()
    (old / "report.html").write_text("previous")
    (tmp_path / ".out.sftprof-4242-k1ll3d_0.partial").mkdir()
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "out", owned=("report.html",)):
        raise RuntimeError("this run fails too")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / "report.html").read_text() == "previous"


@pytest.mark.parametrize("previous", [False, True])
def test_a_users_own_folders_named_like_temporaries_are_left_alone(tmp_path, previous):
    """`.out.x.old` and `.out.x.partial` beside `-o out` are the user's: only what sftprof made (tagged
    `.out.sftprof-PID-...`) is removed, and a `.old` is put back as the output only if sftprof made it."""
    if previous:
        (tmp_path / "out").mkdir()
    for name in (".out.x.old", ".out.x.partial", ".out.sftprof.old", ".out.1.2.partial"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text("keep me")
    before = tree_state(tmp_path)
    with atomic_dir(tmp_path / "out", owned=("report.html",)) as tmp:
        (tmp / "report.html").write_text("new")
    after = tree_state(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("out")} == {
        k: v for k, v in before.items() if not k.startswith("out")
    }
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html"]


def _finished(run: subprocess.Popen) -> subprocess.CompletedProcess:
    """A run started with Popen, as run_sftprof would have returned it."""
    stdout, stderr = run.communicate(timeout=300)
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


def _analysis_of(out: Path) -> dict[str, bytes]:
    """Every file of an output's analysis/, byte for byte."""
    return {p.name: p.read_bytes() for p in (out / "analysis").iterdir()}


def test_two_runs_writing_one_folder_never_mix(good, tmp_path):
    """Started at once on two inputs, each result is wholly one input's (tables, findings and
    report), or a run is refused in one line; nothing is left beside the folder."""
    expected = {str(source): _analysis_of(out) for source, out in good.items()}
    out = tmp_path / "out"
    for _ in range(4):
        runs = [
            subprocess.Popen(
                [SFTPROF, "analyze", source, "-o", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for source in good
        ]
        finished = [_finished(run) for run in runs]
        assert any(result.returncode == 0 for result in finished), [r.stderr[-2000:] for r in finished]
        for result in finished:
            if result.returncode != 0:
                assert_refused(result, contains="another sftprof is writing")
        source = json.loads((out / "analysis" / "analysis.json").read_text())["source_path"]
        assert _analysis_of(out) == expected[source]
        assert f"sftprof: {Path(source).name}" in (out / "report.html").read_text(encoding="utf-8")
        assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_a_folder_with_other_files_is_not_replaced(tmp_path):
    """-o at a folder of one's own (a typo, the home folder) is refused, not wiped."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    before = tree_state(tmp_path)
    assert_refused(run_sftprof("analyze", CLEAN, "-o", tmp_path / "mine"), contains="not an output folder of sftprof")
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize(
    "command, output, message",
    [
        ("analyze", "notes.txt/out", "notes.txt is a file, not a folder"),
        ("analyze", "notes.txt/a/b", "notes.txt is a file, not a folder"),
        ("analyze", "notes.txt", "notes.txt: it is a file, not a folder"),
        ("compare", "notes.txt/out", "notes.txt is a file, not a folder"),
        ("ranks", "notes.txt/out", "notes.txt is a file, not a folder"),
        ("analyze", "mine", "not an output folder of sftprof"),
        ("compare", "mine", "not an output folder of sftprof"),
    ],
)
def test_an_output_at_or_below_a_file_is_refused_naming_it_before_any_work(
    good, capsys, monkeypatch, tmp_path, command, output, message
):
    """`-o notes.txt/out` said "File exists" (or "Not a directory"), and only after the whole analysis."""
    from sftprof import pipeline

    def work(*args, **kwargs):
        raise AssertionError("the output is checked only after the work")

    monkeypatch.setattr(pipeline, "analyze_trace", work)
    monkeypatch.setattr(pipeline, "compare_paths", work)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    before = tree_state(tmp_path)
    inputs = {"analyze": [CLEAN], "compare": [good[CLEAN], good[GEMM]], "ranks": [tmp_path]}[command]
    refused_in_process(capsys, command, *inputs, "-o", tmp_path / output, contains=message)
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "No such file"),
        ('{"step": 0, "step_time_s": 0.1, "tokens_per_s": 1.0, "in_window": true}\nnot json\n', "line 2: not JSON"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        ('{"step": "0", "step_time_s": 0.1, "tokens_per_s": 1.0, "in_window": true}\n', "step must be an integer"),
        (
            '{"step": 0, "step_time_s": 1e999, "tokens_per_s": 1.0, "in_window": true}\n',
            "step_time_s must be a number of seconds",
        ),
        ('{"step": 1' + "0" * 40 + ', "step_time_s": 0.1, "tokens_per_s": 1.0, "in_window": true}\n', "step must be"),
        ('{"step": 0, "step_time_s": 0.1, "tokens_per_s": 1.0, "in_window": "yes"}\n', "in_window must be true or"),
        ('{"step": 0, "tokens_per_s": 1.0, "in_window": true}\n', "no step_time_s"),
        (b"\xff\xfe\n", "cannot read the metrics"),
    ],
)
def test_bad_metrics_are_refused_before_any_work(capsys, tmp_path, content, message):
    """Refused by line and field before the analysis, so no output folder appears."""
    metrics = tmp_path / "metrics.jsonl"
    if isinstance(content, bytes):
        metrics.write_bytes(content)
    elif content is not None:
        metrics.write_text(content)
    before = tree_state(tmp_path)
    refused_in_process(capsys, "analyze", CLEAN, "-o", tmp_path / "out", "--metrics", metrics, contains=message)
    assert tree_state(tmp_path) == before


def _edit_summary(**changes):
    """An edit of analysis.json: `key` or `parent.key` set to a value."""

    def edit(folder: Path) -> None:
        path = folder / "analysis.json"
        summary = json.loads(path.read_text())
        for key, value in changes.items():
            parent, _, leaf = key.rpartition(".")
            (summary[parent] if parent else summary)[leaf] = value
        path.write_text(json.dumps(summary))

    return edit


def _edit_csv(name: str, column: str, value=None):
    """An edit of NAME.csv: `column` set to `value` everywhere, or dropped."""

    def edit(folder: Path) -> None:
        frame = read_csv(folder / f"{name}.csv")
        frame = frame.drop(columns=[column]) if value is None else frame.assign(**{column: value})
        write_csv(frame, folder / f"{name}.csv")

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (_edit_summary(span_ns="abc"), "analysis.json: span_ns must be a number"),
        (
            lambda f: (f / "analysis.json").write_text(
                (f / "analysis.json").read_text().replace('"span_ns": ', '"span_ns": 1e999, "x": ')
            ),
            "analysis.json: span_ns must be a number",
        ),
        (_edit_summary(**{"headline.kernels": 10**400}), "analysis.json: headline must be"),
        (_edit_summary(span_ns=1e308), "analysis.json: span_ns must be a number from 0 to 2^62"),
        (_edit_summary(span_ns=-1), "analysis.json: span_ns must be a number from 0 to 2^62"),
        (_edit_summary(**{"headline.kernels": 1e300}), "analysis.json: headline must be"),
        (_edit_summary(**{"headline.gpu_busy_pct": -1e300}), "analysis.json: headline must be"),
        (_edit_summary(sources="cuda"), "analysis.json: sources must be a list of strings"),
        (_edit_summary(findings=[{"rule": 1}]), "analysis.json: findings must be a list of findings"),
        (_edit_summary(tables=["../../../etc/passwd"]), "analysis.json: tables must be a list of table names"),
        (lambda f: (f / "analysis.json").write_text("{not json"), "analysis.json: cannot read it"),
        (lambda f: (f / "kernels.csv").unlink(), "kernels.csv: cannot read it"),
        (_edit_csv("kernels", "total_ns", "x"), "kernels.csv: column total_ns holds values that are not numbers"),
        (_edit_csv("steps", "duration", "x"), "steps.csv: column duration holds values that are not numbers"),
        *(
            (_edit_csv(table, column, value), f"{table}.csv: column {column} holds a value no capture gives")
            for table, column in (("steps", "duration"), ("kernels", "total_ns"))
            for value in (float("inf"), -5.0, 10.0**300)
        ),
        (
            lambda f: (_edit_csv("steps", "duration")(f), _edit_summary(**{"headline.steps_captured": "3"})(f)),
            "analysis.json: headline.steps_captured must be a number",
        ),
    ],
)
def test_compare_refuses_a_damaged_analysis_naming_file_and_key(good, capsys, tmp_path, edit, message):
    damaged = tmp_path / "damaged"
    shutil.copytree(good[CLEAN] / "analysis", damaged)
    edit(damaged)
    before = tree_state(tmp_path)
    refusal = refused_in_process(capsys, "compare", good[CLEAN], damaged, "-o", tmp_path / "cmp", contains=message)
    assert str(damaged) in refusal
    assert tree_state(tmp_path) == before


def test_error_messages_are_one_line_whatever_they_quote(tmp_path):
    """A file name with a newline and escape sequences, in sftprof's own errors and argparse's."""
    name = tmp_path / "a\nb\x1b[2J\x9b.sqlite"
    assert "\\n" in assert_refused(run_sftprof("analyze", name), contains="no such file")
    usage = run_sftprof("render", "\x1b]0;pwned\x07", "demo", "steady")
    assert usage.returncode == 2 and "\\x1b]0;pwned\\x07" in usage.stderr
    assert not CONTROL_CHARACTERS & set(usage.stderr)


def test_reports_whose_names_agree_up_to_a_dot_get_folders_of_their_own(tmp_path, capsys):
    """The workflow's rank reports are named profile.JOB.N.R.HOST: analysed together (beside them, or with -o),
    each keeps its own output folder and its own `report:` path."""
    ranks = [tmp_path / "profile.4101.0.0.vm.sqlite", tmp_path / "profile.4101.0.1.vm.sqlite"]
    for source, copy in zip((CLEAN, GEMM), ranks):
        shutil.copy(source, copy)
    for output in (None, tmp_path / "out"):
        assert main(["analyze", *map(str, ranks), *(["-o", str(output)] if output else [])]) == 0
        stdout = capsys.readouterr().out
        reports = [line.split("report: ")[1] for line in stdout.splitlines() if "report: " in line]
        assert len(set(reports)) == 2, reports
        for trace, report in zip(ranks, reports):
            summary = json.loads((Path(report).parent / "analysis" / "analysis.json").read_text())
            assert summary["source_path"] == str(trace), (report, summary["source_path"])


def test_a_trace_given_twice_is_refused_and_an_nsys_rep_beside_its_export_keeps_its_own_folder(tmp_path):
    from sftprof.pipeline import output_dirs

    traces = [tmp_path / "a.nsys-rep", tmp_path / "a.sqlite", tmp_path / "b.json.gz"]
    assert output_dirs(traces, None) == [
        tmp_path / "a.nsys-rep-sftprof",
        tmp_path / "a.sqlite-sftprof",
        tmp_path / "b-sftprof",
    ]
    one_name = [tmp_path / folder / "x.sqlite" for folder in ("n0", "n1")] + [tmp_path / "x-2.sqlite"]
    assert output_dirs(one_name, "OUT") == [Path("OUT/x"), Path("OUT/x-3"), Path("OUT/x-2")]
    assert_refused(run_sftprof("analyze", CLEAN, FIXTURES / ".." / "fixtures" / CLEAN.name), contains="given twice")


def _special(path: Path, kind: str) -> None:
    """Put a folder, a link to /dev/zero or a FIFO where a file is read."""
    if path.exists():
        path.unlink()
    if kind == "folder":
        path.mkdir()
    elif kind == "/dev/zero":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)


SPECIAL = ("folder", "/dev/zero", "fifo")


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["rank0.json", "rank1.json"])
def test_a_rank_record_that_is_no_regular_file_is_refused_at_once(tmp_path, kind, name):
    folder = tmp_path / "capture"
    shutil.copytree(FIXTURES / "ranks" / "clean", folder)
    _special(folder / name, kind)
    result = run_sftprof("ranks", folder, "-o", tmp_path / "out", timeout=60)
    assert_refused(result, contains=f"{folder / name}: cannot read it: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name", ["analysis.json", "kernels.csv"])
def test_an_analysis_file_that_is_no_regular_file_is_refused_at_once(good, capsys, tmp_path, kind, name):
    folder = tmp_path / "edited"
    shutil.copytree(good[CLEAN] / "analysis", folder)
    _special(folder / name, kind)
    refused_in_process(capsys, "compare", good[GEMM], folder, "-o", tmp_path / "cmp", contains=name)
    assert not (tmp_path / "cmp").exists()
