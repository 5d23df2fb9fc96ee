"""Shared fixtures. The expensive one, `demo_run`, runs the real workflow once per session:
real data prep, model creation, SFT steps under the real nsys, export, analysis and report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# Small enough for CI (a 2-core machine), large enough that the window has steps to analyse.
SMALL_DEMO = {
    "run": ["demo"],
    "experiments": {
        "demo": {
            "data": {"sample_records": 60},
            "sft": {"steps": 6, "micro_batch_size": 2, "grad_accum_steps": 2, "seq_length": 128,
                    "device": "cpu"},
            "profile": {
                "trace": ["osrt", "nvtx"],
                "windows": {"steady": {"capture_range": "nvtx", "start_step": 2, "end_step": 4}},
            },
        }
    },
}


def write_config(workdir: Path, config: dict) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def private_copy(tmp_path_factory, source: Path) -> Path:
    """A copy of a committed fixture, so that nsys stats (which may write an export) never touches it."""
    path = tmp_path_factory.mktemp(source.stem) / source.name
    shutil.copy(source, path)
    return path


H200_CAPTURE = Path(__file__).parent / "fixtures" / "h200_tiny_llama_bf16.sqlite"


@pytest.fixture(scope="session")
def h200_capture(tmp_path_factory) -> Path:
    """A private copy of the committed H200 capture of the built-in SFT loop (tests/fixtures/README.md)."""
    return private_copy(tmp_path_factory, H200_CAPTURE)


@pytest.fixture(scope="session")
def h200_tables(h200_capture):
    from sftprof.trace import load_trace

    return load_trace(h200_capture)


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the repo's workflow with the local profile, in `workdir` (which holds config.yaml)."""
    argv = [SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
            "--workflow-profile", str(REPO / "profiles" / "local"), *args]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=workdir)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
    return result


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """A finished run of the small demo; returns its working directory."""
    workdir = tmp_path_factory.mktemp("demo")
    write_config(workdir, SMALL_DEMO)
    snakemake(workdir)
    return workdir


@pytest.fixture(scope="session")
def demo_sqlite(demo_run) -> Path:
    return demo_run / "results" / "demo" / "steady" / "sqlite" / "rank0.sqlite"


@pytest.fixture(scope="session", autouse=True)
def no_nsys_agents_left_behind():
    """nsys can leave `--start-agent` helpers that burn a core each; no test may leave one."""
    from sftprof.nsys import running_agent_pids

    before = running_agent_pids()
    yield
    leftover = running_agent_pids() - before
    assert not leftover, f"nsys agents left running after the tests: {sorted(leftover)}"
