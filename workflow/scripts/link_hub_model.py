import logging
import os

from sftprof import logs

from sftprof.capture import hub

logs.setup(snakemake.log[0])
checkpoint = os.path.dirname(snakemake.input.manifest)
hub.link_checkpoint(checkpoint, snakemake.output.model)
logging.info("%s -> %s", snakemake.output.model, checkpoint)
