import logging

from sftprof import logs, nsys

logs.setup(snakemake.log[0])
nsys.export_sqlite(snakemake.input.report, snakemake.output.sqlite)
logging.info("exported %s", snakemake.output.sqlite)
