import logging

from sftprof import logs, results
from sftprof.report import write_html

logs.setup(snakemake.log[0])
write_html(results.load(snakemake.input.analysis), snakemake.input.metrics, snakemake.output.html,
           snakemake.params.title)
logging.info("report %s", snakemake.output.html)
