import logging
import shutil
import subprocess

from sftprof import logs

from sftprof.capture import container
from sftprof.io import atomic_path

logs.setup(snakemake.log[0])
settings = snakemake.params.container
# Each runtime's command is named like the runtime (apptainer, singularity, docker).
if shutil.which(settings["runtime"]) is None:
    raise SystemExit(f"{settings['runtime']} is not installed here: pull where it is (the login node), or set "
                     "container.pull_on: slurm to pull on a compute node")
with atomic_path(snakemake.output.image) as partial, open(snakemake.log[0], "a") as log:
    partial.unlink()  # `apptainer pull` refuses to overwrite, even its own temporary name
    for argv in container.pull_commands(settings, partial):
        logging.info("running %s", " ".join(argv))
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        log.write(result.stdout)
        if result.returncode != 0:
            raise SystemExit(f"{argv[0]} {argv[1]} failed (exit {result.returncode}); see {snakemake.log[0]}")
    if settings["runtime"] == "docker":
        partial.write_text(result.stdout)  # the last command printed the pulled digest
logging.info("pulled %s into %s", settings["image"], snakemake.output.image)
