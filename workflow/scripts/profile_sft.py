import logging
import os
import shutil
import tempfile
from pathlib import Path

from sftprof import logs, nsys, sft

logs.setup()
params = snakemake.params.profile
report = Path(snakemake.output.report)
# nsys writes into a fresh folder (so it can never find its target already there), and the
# report is moved into place only once it is complete.
workdir = Path(tempfile.mkdtemp(prefix=".profile-", dir=report.parent))
try:
    app = sft.command(snakemake.input.model, snakemake.input.training, snakemake.output.metrics,
                      params["sft"], params["window"])
    with open(snakemake.log[0], "w") as log:
        captured = nsys.run_profile(params["nsys_options"], app, workdir / report.stem, log, params["nsys_env"])
    os.replace(captured, report)
    logging.info("report %s (%d bytes)", report, report.stat().st_size)
finally:
    shutil.rmtree(workdir, ignore_errors=True)
