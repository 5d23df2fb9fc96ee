import logging
from pathlib import Path

from sftprof import logs, results

from sftprof.capture import rank
from sftprof.analysis import analyze
from sftprof.io import atomic_dir
from sftprof.trace import load_trace
from sftprof.trace.metrics import read_metrics

logs.setup(snakemake.log[0])
metrics_name = rank.METRICS_PATTERN.format(output_name=snakemake.params.output_name)
with atomic_dir(snakemake.output.analysis) as partial:
    for record in rank.profiled_records(snakemake.input.capture):
        sqlite = Path(snakemake.input.sqlite) / rank.SQLITE_PATTERN.format(rank=record["rank"])
        metrics = Path(snakemake.input.capture) / metrics_name.format(rank=record["rank"])
        analysis = analyze(load_trace(sqlite), progress=lambda step: logging.info("rank %d: %s", record["rank"], step),
                           metrics=read_metrics(metrics if metrics.exists() else None))
        results.save(analysis, partial / rank.RANK_DIR_PATTERN.format(rank=record["rank"]))
        for finding in analysis.findings:
            logging.info("rank %d [%s] %s", record["rank"], finding.severity, finding.title)
