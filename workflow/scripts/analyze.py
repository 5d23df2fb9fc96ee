import logging

from sftprof import logs, results
from sftprof.analysis import analyze
from sftprof.trace import load_trace

logs.setup(snakemake.log[0])
analysis = analyze(load_trace(snakemake.input.sqlite))
results.save(analysis, snakemake.output.analysis)
for finding in analysis.findings:
    logging.info("[%s] %s", finding.severity, finding.title)
