"""The cluster path on a real Slurm: munge, slurmctld and slurmd on loopback, partition gh.

The session fixture starts them with scripts/slurm-up.sh (as CI does on a fresh machine) and
stops them afterwards if it started them. Jobs run the real SFT under the real nsys.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SMALL_DEMO, snakemake, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]
SFTPROF = str(Path(sys.executable).with_name("sftprof"))


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0:
        pytest.skip("starting Slurm daemons needs root (scripts/slurm-up.sh)")
    # On a fresh machine Slurm is not installed yet: slurm-up.sh installs it.
    running = (
        bool(shutil.which("sinfo")) and subprocess.run(["sinfo", "-h", "-p", "gh"], capture_output=True).returncode == 0
    )
    subprocess.run([str(REPO / "scripts" / "slurm-up.sh")], check=True)
    yield
    if not running:
        subprocess.run([str(REPO / "scripts" / "slurm-down.sh")], check=True)


def slurm_config(ranks: int = 1, profiled: list[int] | None = None) -> dict:
    config = copy.deepcopy(SMALL_DEMO)
    experiment = config["experiments"]["demo"]
    experiment["sft"].update({"steps": 4, "num_threads": 1})
    experiment["profile"]["windows"]["steady"] = {"capture_range": "nvtx", "start_step": 1, "end_step": 2}
    experiment["profile"]["ranks"] = profiled or list(range(ranks))
    # A job takes about a minute on CI's 2 cores; the limit bounds what a hung rank costs CI (one took 10 min).
    experiment["slurm"] = {"ntasks_per_node": ranks, "cpus_per_task": 1, "time": "0:05:00"}
    return config


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, slurm_cluster):
    """A working directory with the demo's data and model built (locally), ready for jobs."""
    workdir = tmp_path_factory.mktemp("slurm")
    write_config(workdir, slurm_config())
    snakemake(workdir, "resources/demo/model", "resources/demo/sft/training.jsonl")
    return workdir


def sftprof(*args, cwd):
    return subprocess.run([SFTPROF, *args], capture_output=True, text=True, cwd=cwd)


def test_rendered_sbatch_script_submits_and_completes(prepared):
    result = sftprof("submit", "demo", "steady", "--wait", cwd=prepared)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split("Slurm job ")[1].split(",")[0]
    capture = prepared / "results" / "demo" / "steady" / "capture"
    record = json.loads((capture / "rank0.json").read_text())
    # nsys named the report after the job, node, rank and host (%q{SLURM_*}, %h).
    assert record["slurm_job_id"] == job_id
    assert record["report"] == f"profile.{job_id}.0.0.{record['host']}.nsys-rep"
    assert (capture / record["report"]).stat().st_size > 0
    log = (prepared / "jobs" / "demo" / "steady" / f"slurm-{job_id}.out").read_text()
    assert "Generated:" in log


def test_salloc_form_runs_non_interactively(prepared, tmp_path):
    script = tmp_path / "salloc.sh"
    assert sftprof("render", "salloc", "demo", "steady", "-o", str(script), cwd=prepared).returncode == 0
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "salloc: Granted job allocation" in result.stderr
    job_id = result.stderr.split("Granted job allocation ")[1].split()[0]
    record = json.loads((prepared / "results/demo/steady/capture/rank0.json").read_text())
    assert record["slurm_job_id"] == job_id


def test_values_from_config_are_never_executed(prepared, tmp_path):
    """A model path full of shell syntax reaches the trainer as one literal argument."""
    config = slurm_config()
    config["experiments"]["demo"]["model"] = {
        "source": "path",
        "path": f"{tmp_path}/m $(touch PWNED1);touch PWNED2 `touch PWNED3`",
    }
    write_config(tmp_path, config)
    script = tmp_path / "salloc.sh"
    rendered = sftprof(
        "render",
        "salloc",
        "demo",
        "steady",
        "--config",
        str(tmp_path / "config.yaml"),
        "--workdir",
        str(prepared),
        "-o",
        str(script),
        cwd=tmp_path,
    )
    assert rendered.returncode == 0, rendered.stderr
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0  # no model there: the trainer fails, loudly
    assert "m $(touch PWNED1);touch PWNED2 `touch PWNED3`" in result.stdout + result.stderr
    for directory in (tmp_path, prepared, Path.cwd()):
        assert not list(directory.glob("PWNED*"))


def test_unknown_partition_is_a_clear_error(prepared, tmp_path):
    config = slurm_config()
    config["experiments"]["demo"]["slurm"]["partition"] = "nope"
    write_config(tmp_path, config)
    result = sftprof(
        "submit", "demo", "steady", "--config", str(tmp_path / "config.yaml"), "--workdir", str(prepared), cwd=tmp_path
    )
    assert result.returncode == 1
    assert "sbatch rejected" in result.stderr and "invalid partition" in result.stderr.lower()
    assert "Traceback" not in result.stderr


def test_snakemake_profile_slurm_runs_two_ranks_through_the_executor(slurm_cluster, tmp_path):
    """`snakemake --profile slurm` as a user types it, from a folder laid out like the repo."""
    workdir = tmp_path / "repo"
    workdir.mkdir()
    (workdir / "workflow").symlink_to(REPO / "workflow")
    write_config(workdir, slurm_config(ranks=2))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    subprocess.run([str(REPO / "scripts" / "install-slurm-profile.sh")], env=env, check=True)
    # This Slurm keeps no accounting, so job states come from squeue; check them early.
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("snakemake")),
            "--profile",
            "slurm",
            "--slurm-status-command",
            "squeue",
            "--slurm-init-seconds-before-status-checks",
            "1",
            "--slurm-keep-successful-logs",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    profile_log = workdir / "logs" / "demo" / "steady" / "profile.log"
    # On failure, show what the ranks printed: the error names only this log.
    ranks_said = profile_log.read_text()[-6000:] if profile_log.exists() else "(no profile.log)"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:] + "\nprofile.log:\n" + ranks_said
    assert "Job " in result.stderr and "has been submitted with SLURM jobid" in result.stderr

    capture = workdir / "results" / "demo" / "steady" / "capture"
    records = [json.loads((capture / f"rank{r}.json").read_text()) for r in (0, 1)]
    job_ids = {record["slurm_job_id"] for record in records}
    assert len(job_ids) == 1 and None not in job_ids  # both ranks: tasks of one Slurm job
    job_id = job_ids.pop()
    assert [record["report"] for record in records] == [
        f"profile.{job_id}.0.{r}.{records[r]['host']}.nsys-rep" for r in (0, 1)
    ]
    assert all(record["world_size"] == 2 for record in records)
    assert f"slurm job {job_id}, 2 rank(s)" in profile_log.read_text()
    # The job's own Slurm log, kept by the executor plugin, names the same job.
    slurm_logs = workdir / ".snakemake" / "slurm_logs"
    assert list((slurm_logs / "rule_profile_sft").rglob(f"{job_id}.log")), "no Slurm log for the profile job"
    # The analysis ran as light Slurm jobs of its own, fanning out over the cluster.
    assert list((slurm_logs / "rule_analyze").rglob("*.log"))

    analysis = workdir / "results" / "demo" / "steady" / "analysis"
    summaries = [json.loads((analysis / f"rank{r}" / "analysis.json").read_text()) for r in (0, 1)]
    assert [s["headline"]["steps_captured"] for s in summaries] == [2, 2]
    html = (workdir / "results" / "demo" / "steady" / "report.html").read_text()
    assert "Rank 0 on" in html and "Rank 1 on" in html
    comparison = (workdir / "results" / "demo" / "comparison" / "compare.html").read_text()
    assert "rank0" in comparison and "rank1" in comparison


def test_a_failed_job_is_reported_with_its_id(prepared, tmp_path):
    config = slurm_config()
    config["experiments"]["demo"]["model"] = {"source": "path", "path": str(tmp_path / "no-such-model")}
    write_config(tmp_path, config)
    result = sftprof(
        "submit",
        "demo",
        "steady",
        "--wait",
        "--config",
        str(tmp_path / "config.yaml"),
        "--workdir",
        str(prepared),
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "sftprof: error: Slurm job" in result.stderr and "failed" in result.stderr
