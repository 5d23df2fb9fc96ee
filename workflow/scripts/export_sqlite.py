import logging
from pathlib import Path

from sftprof import logs

from sftprof.capture import nsys, rank
from sftprof.io import atomic_dir

logs.setup(snakemake.log[0])
capture = Path(snakemake.input.capture)
with atomic_dir(snakemake.output.sqlite) as partial:
    for record in rank.profiled_records(capture):
        target = partial / rank.SQLITE_PATTERN.format(rank=record["rank"])
        nsys.export_sqlite(capture / record["report"], target)
        logging.info("rank %d: %s -> %s", record["rank"], record["report"], target.name)
