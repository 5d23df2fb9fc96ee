"""The whole demo workflow for real, then what reruns when config changes."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from conftest import REPO, SMALL_DEMO, planned_jobs, snakemake, write_config

pytestmark = pytest.mark.e2e


def test_demo_produces_report_from_real_capture(demo_run):
    window = demo_run / "results" / "demo" / "steady"
    html = (window / "report.html").read_text()
    assert "<svg" in html and "Step time by phase" in html
    summary = json.loads((window / "analysis" / "rank0" / "analysis.json").read_text())
    # Steps 2..4 were inside the capture window: exactly those three steps were recorded.
    assert summary["headline"]["steps_captured"] == 3
    steps = (window / "analysis" / "rank0" / "steps.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in steps[1:]] == ["2", "3", "4"]
    record = json.loads((window / "capture" / "rank0.json").read_text())
    assert record["report"] == "profile.nsys-rep" and record["world_size"] == 1
    metrics = [
        json.loads(line) for line in (window / "capture" / "profile.rank0.metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == list(range(6))
    assert [m["in_window"] for m in metrics] == [False, False, True, True, True, False]
    assert all(m["tokens_per_s"] > 0 for m in metrics)


def test_second_run_has_nothing_to_do(demo_run):
    result = snakemake(demo_run)
    assert "Nothing to be done" in result.stdout + result.stderr


def test_changed_window_reruns_profile_and_downstream_only(demo_run, tmp_path):
    workdir = tmp_path / "rerun"
    shutil.copytree(demo_run, workdir, symlinks=True)
    config = copy.deepcopy(SMALL_DEMO)
    config["experiments"]["demo"]["profile"]["windows"]["steady"]["end_step"] = 3
    write_config(workdir, config)

    # (`--list-changes params` is not used: Snakemake 9.27 lists unchanged outputs there too.)
    dry_run = snakemake(workdir, "-n")
    assert planned_jobs(dry_run) == {"profile_sft": 1, "export_capture": 1, "analyze": 1, "render_report": 1, "all": 1}
    assert "params changed" in dry_run.stdout.lower() or "params have changed" in dry_run.stdout.lower()


def test_changed_training_steps_do_not_rebuild_data_or_model(demo_run, tmp_path):
    workdir = tmp_path / "sft-change"
    shutil.copytree(demo_run, workdir, symlinks=True)
    config = copy.deepcopy(SMALL_DEMO)
    config["experiments"]["demo"]["sft"]["learning_rate"] = 0.001
    write_config(workdir, config)
    planned = planned_jobs(snakemake(workdir, "-n"))
    assert "create_tiny_model" not in planned and "prepare_sft_data" not in planned
    assert planned["profile_sft"] == 1


def test_changed_allocation_limits_rerun_nothing(demo_run, tmp_path):
    """A longer time limit or another account does not change what is measured."""
    workdir = tmp_path / "limits"
    shutil.copytree(demo_run, workdir, symlinks=True)
    config = copy.deepcopy(SMALL_DEMO)
    config["experiments"]["demo"]["slurm"] = {"time": "9:00:00", "account": "other", "mem": "4G"}
    write_config(workdir, config)
    result = snakemake(workdir, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr


def test_invalid_config_is_rejected_naming_the_key(tmp_path):
    config = copy.deepcopy(SMALL_DEMO)
    config["experiments"]["demo"]["profile"]["windows"]["steady"] = {"duration_s": 0}
    write_config(tmp_path, config)
    result = snakemake(tmp_path, "-n", check=False)
    assert result.returncode != 0
    assert "duration_s" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


def test_failed_profile_leaves_no_complete_looking_output(tmp_path):
    """A trainer that crashes under nsys: the step fails and no report or metrics remain."""
    config = copy.deepcopy(SMALL_DEMO)
    config["experiments"]["demo"]["sft"]["seq_length"] = 16
    config["experiments"]["demo"]["model"] = {"max_position_embeddings": 16}
    write_config(tmp_path, config)
    # Break the model after it is built: the trainer then fails inside nsys.
    snakemake(tmp_path, "resources/demo/model")
    (tmp_path / "resources" / "demo" / "model" / "model.safetensors").write_bytes(b"not a checkpoint")
    result = snakemake(tmp_path, check=False)
    assert result.returncode != 0
    window = tmp_path / "results" / "demo" / "steady"
    assert not (window / "capture").exists()
    assert not list(window.glob("*partial*"))


def cluster_config(model_path) -> dict:
    """A NeMo experiment in an Apptainer image with two windows (dry runs only: no GPU here)."""
    config = yaml.safe_load((REPO / "tests" / "fixtures" / "cluster-config.yaml").read_text())
    experiment = config["experiments"]["llama"]
    experiment["model"]["path"] = str(model_path)
    experiment["container"]["image_dir"] = "images"
    experiment["profile"]["windows"]["early"] = {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 3}
    return config


def test_cluster_experiment_pulls_and_converts_once_for_all_windows(tmp_path):
    (tmp_path / "Llama-2-7b-hf").mkdir()
    write_config(tmp_path, cluster_config(tmp_path / "Llama-2-7b-hf"))
    planned = planned_jobs(snakemake(tmp_path, "-n"))
    assert planned["pull_image"] == 1 and planned["import_nemo_checkpoint"] == 1
    assert planned["profile_sft"] == 2 and planned["render_report"] == 2
    assert planned["compare_experiment"] == 1  # the two windows (2 ranks each) side by side


def test_pull_without_the_runtime_is_a_clear_error_and_leaves_no_image(tmp_path):
    (tmp_path / "Llama-2-7b-hf").mkdir()
    write_config(tmp_path, cluster_config(tmp_path / "Llama-2-7b-hf"))
    result = snakemake(tmp_path, "images/nemo_25.02.01.sif", check=False)
    assert result.returncode != 0
    assert "apptainer is not installed here" in result.stdout + result.stderr
    images = tmp_path / "images"
    assert not images.exists() or not any(images.iterdir())
