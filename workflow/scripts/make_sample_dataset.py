import logging

from sftprof import logs

from sftprof.capture import data

logs.setup(snakemake.log[0])
records = data.generate_sample(snakemake.params.records, snakemake.params.seed)
data.write_jsonl(snakemake.output.dolly, records)
logging.info("wrote %d dolly-format records to %s", len(records), snakemake.output.dolly)
