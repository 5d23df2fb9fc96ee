import logging
from pathlib import Path

from sftprof import logs, results

from sftprof.capture import rank
from sftprof.report import RankReport, write_html

logs.setup(snakemake.log[0])
capture, analysis = Path(snakemake.input.capture), Path(snakemake.input.analysis)
metrics_name = rank.METRICS_PATTERN.format(output_name=snakemake.params.output_name)
ranks = [RankReport(f"Rank {record['rank']} on {record['host']}", results.load(analysis / rank.RANK_DIR_PATTERN.format(rank=record["rank"])),
                    capture / metrics_name.format(rank=record["rank"]))
         for record in rank.profiled_records(capture)]
write_html(ranks, snakemake.output.html, snakemake.params.title)
logging.info("report %s (%d rank(s))", snakemake.output.html, len(ranks))
