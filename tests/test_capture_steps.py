"""The workflow's capture steps that run outside programs (sftprof.capture.steps), run for real with
stand-in programs on PATH: what they leave behind, and the one line they fail with."""

import os
import stat
import sys

import pytest

from sftprof.capture import steps

DOCKER = {"runtime": "docker", "image": "docker://nvcr.io/nvidia/nemo:25.02.01", "image_dir": "img", "gpus": True}


def _on_path(tmp_path, monkeypatch, name: str, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / name
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_pull_keeps_the_digest_and_logs_every_command(tmp_path, monkeypatch):
    _on_path(tmp_path, monkeypatch, "docker", 'echo "ran $*" >&2; [ "$2" = inspect ] && echo sha256:abc; exit 0')
    image, log = tmp_path / "img" / "nemo.digest", tmp_path / "pull.log"
    steps.pull_image(DOCKER, image, log)
    assert image.read_text().strip() == "sha256:abc"
    logged = log.read_text()
    assert "[sftprof] docker pull nvcr.io/nvidia/nemo:25.02.01" in logged and "ran pull" in logged


def test_failed_pull_names_the_log_and_leaves_no_image(tmp_path, monkeypatch):
    _on_path(tmp_path, monkeypatch, "docker", 'echo "denied: $*" >&2; exit 3')
    image, log = tmp_path / "img" / "nemo.digest", tmp_path / "pull.log"
    with pytest.raises(steps.StepFailed, match=rf"docker pull failed \(exit 3\); see {log}"):
        steps.pull_image(DOCKER, image, log)
    assert not image.exists() and not [p for p in image.parent.iterdir() if p.name.startswith(".")]
    assert "denied: pull" in log.read_text()


def test_missing_runtime_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(steps.StepFailed, match="apptainer is not installed here"):
        steps.pull_image({**DOCKER, "runtime": "apptainer"}, tmp_path / "x.sif", tmp_path / "log")


def test_checkpoint_import_without_nemo_fails_in_one_line_and_leaves_no_folder(tmp_path):
    """Runtime `none` runs this interpreter, which has no NeMo: the import fails, its output is in the log."""
    out, log = tmp_path / "ckpt", tmp_path / "import.log"
    with pytest.raises(steps.StepFailed, match=rf"checkpoint import failed \(exit \d+\); see {log}"):
        steps.import_nemo_checkpoint({**DOCKER, "runtime": "none"}, tmp_path / "hf", out, log)
    assert not out.exists()
    assert f"[sftprof] {sys.executable} -m sftprof.capture.sft.nemo_backend import-checkpoint" in log.read_text()
