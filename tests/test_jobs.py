"""Job rendering for the cluster: the exact sbatch/salloc text, container lines, quoting.

Apptainer, Singularity and Docker cannot run here, so their command lines are checked
character for character against what their documentation says they take.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from sftprof.capture import config, container, jobs, nsys, rank
from sftprof.capture.sft import nemo_backend

from conftest import REPO

CLUSTER_CONFIG = REPO / "tests" / "fixtures" / "cluster-config.yaml"
SFT_JSON = (
    '{"model_dir": "resources/nemo-checkpoints/Llama-2-7b-hf", "train_jsonl": '
    '"resources/llama/sft/training.jsonl", "metrics_path": '
    '"results/llama/steady/capture/profile.rank{rank}.metrics.jsonl", "sft": {"backend": "nemo", '
    '"device": "cuda", "steps": 20, "micro_batch_size": 1, "grad_accum_steps": 4, "seq_length": 2048, '
    '"learning_rate": 0.0001, "nemo": {"tensor_parallel": 2, "peft": "lora", "recipe": "llama2_7b", '
    '"pipeline_parallel": 1, "precision": "bf16-mixed", "packed_sequence": false, "cuda_graphs": false, '
    '"overlap_grad_reduce": false, "overlap_param_gather": false}, "precision": "fp32", '
    '"weight_decay": 0.01, '
    '"seed": 0, "num_threads": 0}, "window": {"capture_range": "cudaProfilerApi", "start_step": 10, '
    '"end_step": 12, "capture_range_end": "stop", "op_ranges": false, "kill": "none"}}'
)
LAUNCH = f"""\
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=72 --kill-on-bad-exit=1 \\
  apptainer exec --nv --bind /work/exp --bind {REPO}:/opt/sftprof-src:ro --bind /shared/models \
--bind /scratch/hf:/root/.cache/huggingface --env PYTHONPATH=/opt/sftprof-src --pwd /work/exp \
/shared/images/nemo_25.02.01.sif \\
  python -m sftprof.capture.rank --profiled-ranks=0,1 --capture-dir=results/llama/steady/capture -- \\
  nsys profile --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --show-output=true \
--event-sample=system-wide --capture-range=cudaProfilerApi --capture-range-end=stop \
'--output=results/llama/steady/capture/profile.%q{{SLURM_JOB_ID}}.%q{{SLURM_NODEID}}.%q{{SLURM_PROCID}}.%h' \\
  python -m sftprof.capture.sft '{SFT_JSON}'
"""


@pytest.fixture
def cluster():
    cfg = config.load(CLUSTER_CONFIG)
    return cfg["experiments"]["llama"]


def test_sbatch_script_is_exactly_the_documented_form(cluster):
    text = jobs.render_sbatch("llama", cluster, "steady", cluster["profile"]["windows"]["steady"], "/work/exp")
    header = text.split("set -euo pipefail\n")[0]
    assert header.splitlines()[5:] == [
        "#SBATCH --job-name=sftprof-llama-steady",
        "#SBATCH --partition=gh",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=72",
        "#SBATCH --time=2:00:00",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem=400G",
        "#SBATCH --account=ml-perf",
        "#SBATCH --exclusive",
        "#SBATCH --chdir=/work/exp",
        "#SBATCH --output=/work/exp/jobs/llama/steady/slurm-%j.out",
    ]
    assert text.startswith("#!/bin/bash\n") and "ranks 0, 1 run under nsys" in text
    assert text.split("set -euo pipefail\n")[1] == LAUNCH


def test_salloc_form_holds_the_same_allocation_and_launch(cluster):
    text = jobs.render_salloc("llama", cluster, "steady", cluster["profile"]["windows"]["steady"], "/work/exp")
    salloc = text.split("cd /work/exp\n")[1]
    assert salloc.startswith(
        "salloc --job-name=sftprof-llama-steady --partition=gh --nodes=2 --ntasks-per-node=1 --cpus-per-task=72 "
        "--time=2:00:00 --gres=gpu:1 --mem=400G --account=ml-perf --exclusive \\\n"
    )
    # The same launch lines as the batch script, indented under salloc.
    launch = salloc.split("\n", 1)[1]
    assert [line.strip() for line in launch.splitlines()] == [line.strip() for line in LAUNCH.splitlines()]


def test_gpus_can_be_requested_with_gpus_per_node(cluster):
    cluster["slurm"]["gpu_request"] = "gpus"
    assert "--gpus-per-node=1" in jobs.allocation_options(cluster["slurm"], "j")
    assert not any(o.startswith("--gres") for o in jobs.allocation_options(cluster["slurm"], "j"))


def test_mission_salloc_line_for_one_gh_node():
    cfg = config.load(REPO / "config.yaml")
    options = jobs.allocation_options(cfg["experiments"]["demo"]["slurm"], "x")
    # salloc -n 1 -N 1 -p gh -t 2:00:00, in long form.
    assert {"--partition=gh", "--nodes=1", "--ntasks-per-node=1", "--time=2:00:00"} <= set(options)


def test_container_pull_commands():
    apptainer = {"runtime": "apptainer", "image": "docker://nvcr.io/nvidia/nemo:25.02.01", "image_dir": "img"}
    assert container.image_file(apptainer) == Path("img/nemo_25.02.01.sif")
    assert container.pull_commands(apptainer, "img/x.sif") == [
        ["apptainer", "pull", "img/x.sif", "docker://nvcr.io/nvidia/nemo:25.02.01"]
    ]
    singularity = {**apptainer, "runtime": "singularity"}
    assert container.pull_commands(singularity, "nemo_25.02.sif") == [
        ["singularity", "pull", "nemo_25.02.sif", "docker://nvcr.io/nvidia/nemo:25.02.01"]
    ]
    docker = {**apptainer, "runtime": "docker"}
    assert container.image_file(docker) == Path("img/nemo_25.02.01.digest")
    assert container.pull_commands(docker, "d") == [
        ["docker", "pull", "nvcr.io/nvidia/nemo:25.02.01"],
        ["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", "nvcr.io/nvidia/nemo:25.02.01"],
    ]
    assert container.image_file({**apptainer, "runtime": "none"}) is None
    built = {**apptainer, "image": "/shared/images/sftprof-nemo.sif"}
    assert container.image_file(built) == Path("/shared/images/sftprof-nemo.sif")
    with pytest.raises(ValueError, match="not docker"):
        container.image_file({**built, "runtime": "docker"})


def test_docker_run_line_passes_variables_by_name_only(cluster):
    settings = {**cluster["container"], "runtime": "docker"}
    argv = container.exec_prefix(settings, None, "/work/exp")
    assert shlex.join(argv) == (
        "docker run --rm --network=host --ipc=host --gpus all --volume /work/exp:/work/exp --workdir /work/exp "
        f"--volume {REPO}:/opt/sftprof-src:ro --env PYTHONPATH=/opt/sftprof-src --volume /shared/models:/shared/models --volume /scratch/hf:/root/.cache/huggingface "
        "--env SLURM_JOB_ID --env SLURM_JOB_NODELIST --env SLURM_NNODES --env SLURM_NODEID --env SLURM_NTASKS "
        "--env SLURM_PROCID --env SLURM_LOCALID --env MASTER_ADDR --env MASTER_PORT --env NCCL_DEBUG "
        "nvcr.io/nvidia/nemo:25.02.01"
    )


def test_local_plan_has_one_rank_and_a_plain_report_name():
    cfg = config.load(REPO / "config.yaml")
    demo = cfg["experiments"]["demo"]
    plan = jobs.launch_plan(
        "demo", demo, "steady", demo["profile"]["windows"]["steady"], workdir="/w", under_slurm=False
    )
    assert plan.srun == [] and plan.container == []
    options, output, app = nsys.split_profile_argv(plan.nsys + plan.app)
    assert output == "results/demo/steady/capture/profile"
    assert app[1:3] == ["-m", "sftprof.capture.sft"] and "--capture-range=nvtx" in options


@pytest.mark.parametrize(
    "key, value",
    [
        ("partition", "$(rm -rf ~)"),
        ("partition", "a;b"),
        ("account", "x y"),
        ("qos", "`id`"),
        ("extra", ["--comment=$(id)"]),
        ("extra", ["-x"]),
        ("time", "2h"),
    ],
)
def test_shell_meta_characters_in_slurm_values_are_rejected(key, value):
    cfg = config.load(CLUSTER_CONFIG)
    cfg["experiments"]["llama"]["slurm"][key] = value
    with pytest.raises(config.ConfigError, match=f"experiments.llama.slurm.{key}"):
        config.validate(cfg)


@pytest.mark.parametrize(
    "key, value",
    [("binds", ["/a,/b"]), ("binds", ["relative/path"]), ("env", ["HF_TOKEN=secret"]), ("image", "nvcr.io/nemo $(id)")],
)
def test_unsafe_container_values_are_rejected(key, value):
    cfg = config.load(CLUSTER_CONFIG)
    cfg["experiments"]["llama"]["container"][key] = value
    with pytest.raises(config.ConfigError, match=f"experiments.llama.container.{key}"):
        config.validate(cfg)


def test_free_text_values_reach_the_script_literally(cluster):
    """A path may hold anything; in the script it is one quoted word that parses back to itself."""
    nasty = "/models/$(touch PWNED);echo INJECTED `id` 'q'"
    cluster["model"]["path"] = nasty
    cluster["sft"]["backend"] = "torch"
    cluster["container"]["binds"] = ["/data/$(touch${IFS}PWNED)"]
    text = jobs.render_sbatch("llama", cluster, "steady", cluster["profile"]["windows"]["steady"], "/work/exp")
    argv = shlex.split(text.split("set -euo pipefail\n")[1].replace("\\\n", " "))
    assert "/data/$(touch${IFS}PWNED)" in argv
    assert json.loads(argv[-1])["model_dir"] == nasty


def test_working_directory_unfit_for_sbatch_lines_is_a_clear_error(cluster, tmp_path):
    with pytest.raises(jobs.SlurmError, match="cannot carry"):
        jobs.render_sbatch("llama", cluster, "steady", cluster["profile"]["windows"]["steady"], "/work/my exp")


def test_ranks_beyond_the_allocation_are_rejected():
    cfg = config.load(CLUSTER_CONFIG)
    cfg["experiments"]["llama"]["profile"]["ranks"] = [0, 2]
    with pytest.raises(config.ConfigError, match=r"profile.ranks: rank\(s\) \[2\] do not exist"):
        config.validate(cfg)


def test_executor_resources_ask_for_the_same_allocation(cluster):
    assert jobs.minutes("2:00:00") == 120 and jobs.minutes("1-00:30:01") == 1471
    assert jobs.megabytes("400G") == 409600 and jobs.megabytes("") == 0 and jobs.megabytes("512") == 512
    cluster["slurm"]["reservation"] = "hackathon"
    assert jobs.executor_resources(cluster["slurm"]) == {
        "slurm_partition": "gh",
        "nodes": 2,
        "tasks_per_node": 1,
        "cpus_per_task": 72,
        "runtime": 120,
        "mem_mb": 409600,
        "gres": "gpu:1",
        "gpu": 0,
        "slurm_account": "ml-perf",
        "qos": None,
        "constraint": None,
        "slurm_extra": "--reservation=hackathon --exclusive",
    }
    cluster["slurm"]["gpu_request"] = "gpus"
    resources = jobs.executor_resources(cluster["slurm"])
    assert resources["gres"] is None and resources["gpu"] == 2
    assert set(resources) == set(jobs.EXECUTOR_RESOURCES)


@pytest.mark.parametrize(
    "nodelist, first", [("gh001", "gh001"), ("gh[003-004,9],login1", "gh003"), ("a,b", "a"), ("n[7]", "n7")]
)
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert rank.first_host(nodelist) == first


def test_distributed_environment_from_slurm_and_outside_it():
    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gh[01-02]",
        "SLURM_JOB_ID": "4242",
    }
    assert rank.distributed_environment(slurm) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gh01",
        "MASTER_PORT": "24242",
    }
    assert rank.distributed_environment({"MASTER_PORT": "1234"})["MASTER_PORT"] == "1234"
    assert rank.distributed_environment({})["WORLD_SIZE"] == "1"


def test_nsys_output_pattern_expands_as_nsys_does(monkeypatch):
    pattern = nsys.output_pattern("out", "profile", per_rank=True)
    env = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_PROCID": "1"}
    monkeypatch.setattr(nsys.socket, "gethostname", lambda: "gh001")
    assert nsys.expand_output(pattern, env) == Path("out/profile.7.0.1.gh001")
    with pytest.raises(nsys.NsysError, match=r"needs \$SLURM_PROCID"):
        nsys.expand_output(pattern, {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0"})


def test_nemo_plan_derives_batch_and_window_from_config(cluster):
    env = {"WORLD_SIZE": "8", "SLURM_NNODES": "2"}
    settings = nemo_backend.plan(cluster["sft"], cluster["profile"]["windows"]["steady"], env)
    assert settings["devices_per_node"] == 4 and settings["data_parallel"] == 4
    assert settings["global_batch_size"] == 1 * 4 * 4
    # The window's inclusive steps 10..12: NsysCallback stops at the end of completed step 13.
    assert settings["nsys_steps"] == (10, 13)
    assert settings["peft_scheme"] == "lora" and settings["tensor_parallel"] == 2
    with pytest.raises(ValueError, match="tensor x pipeline"):
        nemo_backend.plan(cluster["sft"], cluster["profile"]["windows"]["steady"], {"WORLD_SIZE": "3"})


def test_nemo_backend_needs_cuda_and_a_cuda_window():
    cfg = config.load(CLUSTER_CONFIG)
    broken = copy.deepcopy(cfg)
    broken["experiments"]["llama"]["sft"]["device"] = "cpu"
    with pytest.raises(config.ConfigError, match="nemo backend trains on CUDA"):
        config.check_cross_field_rules(broken)
    broken = copy.deepcopy(cfg)
    broken["experiments"]["llama"]["slurm"]["nodes"] = 3
    with pytest.raises(config.ConfigError, match="groups of tensor_parallel x pipeline_parallel = 2"):
        config.check_cross_field_rules(broken)


def test_cluster_only_code_compiles():
    """What runs only inside the NeMo container or as a workflow step must at least compile."""
    import py_compile

    for path in [
        REPO / "sftprof" / "capture" / "sft" / "nemo_backend.py",
        *sorted((REPO / "workflow" / "scripts").glob("*.py")),
    ]:
        py_compile.compile(str(path), doraise=True)


def test_unlisted_rank_runs_its_program_without_nsys(tmp_path):
    """Rank 1 of 2 with only rank 0 profiled: the program runs plain and the record says so."""
    program = [
        sys.executable,
        "-c",
        "import os, sys; open(sys.argv[1], 'w').write(os.environ['RANK'])",
        str(tmp_path / "ran"),
    ]
    argv = nsys.profile_argv(["--trace=osrt"], str(tmp_path / "never.%q{SLURM_PROCID}"), program)
    environ = {
        **os.environ,
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_ID": "77",
        "SLURM_NODEID": "0",
    }
    record = rank.run_rank([0], tmp_path / "capture", {}, argv, environ)
    assert record == {
        "rank": 1,
        "world_size": 2,
        "host": record["host"],
        "node": 0,
        "slurm_job_id": "77",
        "report": None,
    }
    assert rank.read_records(tmp_path / "capture") == [record] and rank.profiled_records(tmp_path / "capture") == []
    assert (tmp_path / "ran").read_text() == "1" and not list(tmp_path.glob("never*"))


def test_a_failing_unprofiled_rank_is_an_error(tmp_path):
    argv = nsys.profile_argv([], "out", [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(nsys.NsysError, match="rank 0: the SFT program exited with 3"):
        rank.run_rank([5], tmp_path, {}, argv, {})
    assert not list(tmp_path.glob("rank*.json"))
