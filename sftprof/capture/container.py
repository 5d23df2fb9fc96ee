"""Container runtimes: the pull command that caches an image, and the prefix that runs a
command inside it. Argv lists only; the job renderer quotes them for shell.

Apptainer and Singularity share one command-line interface (`pull`, `exec --nv --bind`), and
pass the host environment into the container unless told otherwise. Docker needs each variable
named with `-e NAME`, which passes its value from the host without writing it anywhere.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import sftprof

SIF_RUNTIMES = ("apptainer", "singularity")
# The sftprof checkout is mounted here and put on PYTHONPATH, so the stock NeMo image runs the
# very sftprof version that rendered the job (an image built from containers/ works the same).
PACKAGE_MOUNT = "/opt/sftprof-src"
PACKAGE_ROOT = Path(sftprof.__file__).resolve().parent.parent
# What a rank needs to know who it is and where its peers are, inside any container.
DISTRIBUTED_ENV = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def python_for(container: dict) -> str:
    """The interpreter that runs sftprof: this one without a container, the image's own inside."""
    return sys.executable if container["runtime"] == "none" else "python"


def docker_reference(image: str) -> str:
    """`docker://nvcr.io/nvidia/nemo:25.02.01` -> `nvcr.io/nvidia/nemo:25.02.01`."""
    scheme, _, reference = image.partition("://")
    if scheme != "docker":
        raise ValueError(f"the docker runtime needs a docker:// image, got {image!r}")
    return reference


def image_file(container: dict) -> Path | None:
    """The local file a pull produces: the .sif itself, or for Docker a record of the digest.

    Named after the image's last path component, so `.../nemo:25.02.01` becomes
    `nemo_25.02.01.sif`; a .sif given by path is itself; None when no container is used.
    """
    runtime = container["runtime"]
    if runtime == "none":
        return None
    if container["image"].startswith("/"):
        if runtime not in SIF_RUNTIMES:
            raise ValueError(f"a .sif file is an image for apptainer or singularity, not {runtime}")
        return Path(container["image"])
    last = container["image"].partition("://")[2].rsplit("/", 1)[-1]
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", last)
    suffix = ".sif" if runtime in SIF_RUNTIMES else ".digest"
    return Path(container["image_dir"]) / (stem + suffix)


def pull_commands(container: dict, destination: str | Path) -> list[list[str]]:
    """The commands that fetch the image into `destination` (a temporary name: the caller
    renames it into place only when the pull succeeded)."""
    runtime, image = container["runtime"], container["image"]
    if runtime in SIF_RUNTIMES:
        return [[runtime, "pull", str(destination), image]]
    if runtime == "docker":
        reference = docker_reference(image)
        return [
            ["docker", "pull", reference],
            ["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", reference],
        ]
    raise ValueError("container runtime none has nothing to pull")


def _split_bind(bind: str) -> tuple[str, str, str]:
    host, _, rest = bind.partition(":")
    target, _, mode = rest.partition(":")
    return host, target or host, mode


def exec_prefix(container: dict, image_path: str | Path | None, workdir: str | Path) -> list[str]:
    """The argv prefix that runs a command in the container, with `workdir` mounted at its own
    path and used as the working directory (the workflow's relative paths then hold inside)."""
    runtime, workdir = container["runtime"], str(workdir)
    if runtime == "none":
        return []
    if runtime in SIF_RUNTIMES:
        argv = [runtime, "exec"]
        if container["gpus"]:
            argv.append("--nv")
        argv += ["--bind", workdir, "--bind", f"{PACKAGE_ROOT}:{PACKAGE_MOUNT}:ro"]
        for bind in container["binds"]:
            argv += ["--bind", bind]
        return argv + ["--env", f"PYTHONPATH={PACKAGE_MOUNT}", "--pwd", workdir, str(image_path)]
    argv = ["docker", "run", "--rm", "--network=host", "--ipc=host"]
    if container["gpus"]:
        argv += ["--gpus", "all"]
    argv += [
        "--volume",
        f"{workdir}:{workdir}",
        "--workdir",
        workdir,
        "--volume",
        f"{PACKAGE_ROOT}:{PACKAGE_MOUNT}:ro",
        "--env",
        f"PYTHONPATH={PACKAGE_MOUNT}",
    ]
    for bind in container["binds"]:
        host, target, mode = _split_bind(bind)
        argv += ["--volume", f"{host}:{target}" + (f":{mode}" if mode else "")]
    for name in (*DISTRIBUTED_ENV, *container["env"]):
        argv += ["--env", name]
    return argv + [docker_reference(container["image"])]
