import logging

from sftprof import logs

from sftprof.capture import model

logs.setup(snakemake.log[0])
summary = model.create_tiny_llama(snakemake.params.model, snakemake.output.model)
logging.info("created %s with %d parameters", summary["architecture"], summary["parameters"])
