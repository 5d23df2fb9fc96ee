import logging

from sftprof import logs

from sftprof.capture import model

logs.setup(snakemake.log[0])
summary = model.create_random_model(snakemake.params.model, snakemake.output.model)
logging.info("created %s (%s, %d parameters, random weights)", summary["preset"], summary["nemo_config"],
             summary["parameters"])
