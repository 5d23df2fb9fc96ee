import logging
import os
import subprocess

from sftprof import logs

from sftprof.capture import container
from sftprof.io import atomic_dir

logs.setup()
settings = snakemake.params.container
image = container.image_file(settings)
with atomic_dir(snakemake.output.checkpoint) as partial, open(snakemake.log[0], "w") as log:
    argv = [*container.exec_prefix(settings, image, os.getcwd()), container.python_for(settings), "-m", "sftprof.capture.sft.nemo_backend", "import-checkpoint", snakemake.input.hf, str(partial)]
    log.write("[sftprof] " + " ".join(argv) + "\n")
    log.flush()
    result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"checkpoint import failed (exit {result.returncode}); see {snakemake.log[0]}")
logging.info("NeMo checkpoint %s", snakemake.output.checkpoint)
