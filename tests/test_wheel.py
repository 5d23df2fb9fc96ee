"""sftprof installed from its wheel into a fresh virtual environment, run outside the checkout: what a
user who analyses fetched reports on a laptop, without the workflow, gets."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "h200_plant_pageable.sqlite"
# Nothing of the checkout may leak in: not its source on PYTHONPATH, nor its editable install.
CLEAN_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
# Building the wheel and installing it with its dependencies takes about a minute: the full test run has it, CI not.
pytestmark = pytest.mark.ci_sample(0)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The `sftprof` command of a venv that holds only the wheel and its dependencies."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(root / "dist"),
            str(REPO),
        ],
        check=True,
        env=CLEAN_ENV,
    )
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, env=CLEAN_ENV)
    wheel = next((root / "dist").glob("sftprof-*.whl"))
    subprocess.run([str(root / "venv" / "bin" / "pip"), "install", "-q", str(wheel)], check=True, env=CLEAN_ENV)
    return root / "venv" / "bin" / "sftprof"


def _run(sftprof, *args, cwd):
    return subprocess.run([str(sftprof), *args], cwd=cwd, capture_output=True, text=True, env=CLEAN_ENV, timeout=600)


def test_wheel_analyzes_compares_and_validates_outside_the_checkout(installed, tmp_path):
    (tmp_path / "a.sqlite").write_bytes(FIXTURE.read_bytes())
    analyzed = _run(installed, "analyze", "a.sqlite", "-o", "out", cwd=tmp_path)
    assert analyzed.returncode == 0, analyzed.stderr
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000
    assert (tmp_path / "out" / "analysis" / "analysis.json").exists()
    compared = _run(installed, "compare", "out/analysis", "out/analysis", "-o", "cmp", cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert (tmp_path / "cmp" / "compare.html").exists()
    (tmp_path / "config.yaml").write_text((REPO / "config.yaml").read_text())
    validated = _run(installed, "validate", "config.yaml", cwd=tmp_path)  # the schema is package data
    assert validated.returncode == 0, validated.stderr
    bad = _run(installed, "validate", "missing.yaml", cwd=tmp_path)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


def test_wheel_fetch_explains_itself(installed, tmp_path):
    helped = _run(installed, "fetch", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "experiment" in helped.stdout
