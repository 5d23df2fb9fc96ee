"""The field's own checks, held in CI: ruff (lint and format, the rule set in pyproject.toml), snakefmt, and
Snakemake's linter on the workflow."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        ["ruff", "check", "--no-cache", "."],
        ["ruff", "format", "--check", "--no-cache", "."],
        ["snakefmt", "--check", "workflow"],
    ],
    ids=["ruff-check", "ruff-format", "snakefmt"],
)
def test_tool_passes(argv):
    result = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_snakemake_lint_is_clean():
    result = subprocess.run(
        [str(BIN / "snakemake"), "--lint", "-s", "workflow/Snakefile"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0 and "Congratulations" in result.stdout + result.stderr, result.stdout[-3000:]
