"""The CLI as a user runs it: exit codes, messages, files."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SFTPROF = str(Path(sys.executable).with_name("sftprof"))


def sftprof(*args, cwd=REPO):
    return subprocess.run([SFTPROF, *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.e2e
def test_analyze_writes_tables_findings_and_html(demo_sqlite, demo_run, tmp_path):
    metrics = demo_run / "results" / "demo" / "steady" / "capture" / "profile.rank0.metrics.jsonl"
    result = sftprof("analyze", str(demo_sqlite), "-o", str(tmp_path / "out"), "--metrics", str(metrics))
    assert result.returncode == 0, result.stderr
    assert "No GPU activity in this capture" in result.stdout
    summary = json.loads((tmp_path / "out" / "analysis" / "analysis.json").read_text())
    assert summary["headline"]["steps_captured"] == 3
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("<svg") >= 3 and "Step time over the whole run" in html


def test_analyze_of_a_missing_file_is_a_clear_error(tmp_path):
    result = sftprof("analyze", str(tmp_path / "nope.nsys-rep"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"sftprof: error: {tmp_path / 'nope.nsys-rep'}: no such file"


def test_analyze_without_duckdbs_sqlite_extension_says_what_to_install(h200_capture, tmp_path, monkeypatch, capsys):
    from sftprof import cli
    from sftprof.trace.nsys import nsys_export

    real_find_spec = nsys_export.importlib.util.find_spec
    monkeypatch.setattr(
        nsys_export.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "duckdb_ext" else real_find_spec(name, *a),
    )
    assert cli.main(["analyze", str(h200_capture), "-o", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("sftprof: error: no DuckDB sqlite extension") and "pip install duckdb-ext-sqlite" in error
    assert not (tmp_path / "out").exists()


def test_render_prints_the_command_the_workflow_runs():
    result = sftprof("render", "local", "demo", "steady")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.replace("\\\n", " "))
    assert argv[1:3] == ["-m", "sftprof.capture.rank"] and "--env=NSYS_NVTX_PROFILER_REGISTER_ONLY=0" in argv
    nsys_at = argv.index("--") + 1
    assert argv[nsys_at : nsys_at + 2] == ["nsys", "profile"]
    assert "--capture-range=nvtx" in argv and "--output=results/demo/steady/capture/profile" in argv
    settings = json.loads(argv[-1])
    assert settings["window"]["start_step"] == 4 and settings["model_dir"] == "resources/demo/model"


def test_render_sbatch_writes_a_script(tmp_path):
    result = sftprof("render", "sbatch", "demo", "steady", "-o", str(tmp_path / "job.sbatch"))
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --partition=gh" in script and "srun --nodes=1 --ntasks=1" in script


def test_submit_without_slurm_or_with_a_bad_config_is_a_clear_error(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "experiments:\n  demo:\n    slurm: {partition: 'a;b'}\n    profile:\n      windows:\n"
        "        w: {duration_s: 1}\n"
    )
    result = sftprof("submit", "demo", "w", "--config", str(config))
    assert result.returncode == 1
    assert "experiments.demo.slurm.partition" in result.stderr and "Traceback" not in result.stderr


def test_validate_reports_the_bad_key(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("experiments:\n  demo:\n    profile:\n      windows:\n        w: {delay_s: -1}\n")
    result = sftprof("validate", str(config))
    assert result.returncode == 1
    assert "experiments.demo.profile.windows.w.delay_s" in result.stderr


def test_help_explains_each_command():
    result = sftprof("--help")
    assert result.returncode == 0
    for command in ("analyze", "render", "submit", "validate"):
        assert command in result.stdout
