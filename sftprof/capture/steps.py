"""The workflow's capture steps that run an outside program: profile the ranks, pull the image, import
a NeMo checkpoint. Each rule script is one call here, so the CLI and tests reach the same code.

`run_logged` is the one way a step runs a command: its output goes to the rule's log, and a failure
is one line that names the log.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from sftprof.capture import config, container, jobs, rank
from sftprof.errors import SftprofError
from sftprof.io import atomic_dir, atomic_path

log = logging.getLogger(__name__)


class StepFailed(SftprofError, RuntimeError):
    """A step's command failed, or left less than it must; the message names the rule's log."""


def run_logged(
    argv: Sequence[str], log_file, log_path: str | Path, what: str, *, stdout=None
) -> subprocess.CompletedProcess:
    """Run `argv` with its output appended to the open rule log `log_file` (stdout captured instead where
    `stdout` is subprocess.PIPE: then it is copied to the log too); raise StepFailed naming `what`."""
    log_file.write("[sftprof] " + " ".join(map(str, argv)) + "\n")
    log_file.flush()
    result = subprocess.run(
        list(map(str, argv)), stdout=stdout or log_file, stderr=log_file if stdout else subprocess.STDOUT, text=True
    )
    if stdout is not None:
        log_file.write(result.stdout)
    if result.returncode != 0:
        raise StepFailed(f"{what} failed (exit {result.returncode}); see {log_path}")
    return result


def profile(
    experiment_name: str, run: dict, window_name: str, capture_dir: str | Path, log_path: str | Path
) -> list[dict]:
    """Run one window of an experiment under nsys, every rank, into CAPTURE_DIR. Ranks write into a fresh
    folder (nsys can never find its target there already), which becomes the output only once every rank
    has finished and left its record; the records are returned."""
    experiment = {**run, "profile": {**run["profile"], "windows": {}}}
    under_slurm = "SLURM_JOB_ID" in os.environ
    ranks = config.world_size(experiment)
    if ranks > 1 and not under_slurm:
        raise StepFailed(
            f"{ranks} ranks (slurm.nodes x slurm.ntasks_per_node) need Slurm: run with "
            "`snakemake --profile slurm`, or inside an salloc allocation"
        )
    with atomic_dir(capture_dir) as partial, open(log_path, "w") as log_file:
        plan = jobs.launch_plan(
            experiment_name,
            experiment,
            window_name,
            run["window"],
            workdir=os.getcwd(),
            under_slurm=under_slurm,
            capture_dir=str(partial),
        )
        log_file.write(f"[sftprof] slurm job {os.environ.get('SLURM_JOB_ID', '-')}, {ranks} rank(s)\n")
        run_logged(plan.argv, log_file, log_path, "the profiled run")
        records = rank.read_records(partial)
        missing = sorted(set(range(ranks)) - {record["rank"] for record in records})
        unreported = [r["rank"] for r in records if r["rank"] in run["profile"]["ranks"] and not r["report"]]
        if missing or unreported:
            raise StepFailed(f"rank(s) {missing} left no record, rank(s) {unreported} no report; see {log_path}")
    for record in records:
        log.info("rank %d on %s: %s", record["rank"], record["host"], record["report"] or "not profiled")
    return records


def pull_image(settings: dict, image: str | Path, log_path: str | Path) -> None:
    """Pull the container image into IMAGE (a .sif, or for Docker a file holding the pulled digest)."""
    # Each runtime's command is named like the runtime (apptainer, singularity, docker).
    if shutil.which(settings["runtime"]) is None:
        raise StepFailed(
            f"{settings['runtime']} is not installed here: pull where it is (the login node), or set "
            "container.pull_on: slurm to pull on a compute node"
        )
    with atomic_path(image) as partial, open(log_path, "a") as log_file:
        partial.unlink()  # `apptainer pull` refuses to overwrite, even its own temporary name
        for argv in container.pull_commands(settings, partial):
            result = run_logged(argv, log_file, log_path, f"{argv[0]} {argv[1]}", stdout=subprocess.PIPE)
        if settings["runtime"] == "docker":
            partial.write_text(result.stdout)  # the last command printed the pulled digest
    log.info("pulled %s into %s", settings["image"], image)


def import_nemo_checkpoint(settings: dict, hf_dir: str | Path, checkpoint: str | Path, log_path: str | Path) -> None:
    """Convert a Hugging Face checkpoint to NeMo 2 format inside the container (llm.import_ckpt)."""
    image = container.image_file(settings)
    with atomic_dir(checkpoint) as partial, open(log_path, "w") as log_file:
        argv = [
            *container.exec_prefix(settings, image, os.getcwd()),
            container.python_for(settings),
            "-m",
            "sftprof.capture.sft.nemo_backend",
            "import-checkpoint",
            str(hf_dir),
            str(partial),
        ]
        run_logged(argv, log_file, log_path, "checkpoint import")
    log.info("NeMo checkpoint %s", checkpoint)
