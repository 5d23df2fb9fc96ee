import logging

from sftprof import logs, pipeline

from sftprof.report import compare

logs.setup(snakemake.log[0])
comparison = pipeline.compare_paths(list(snakemake.input.analyses))
written = compare.write(comparison, snakemake.output.comparison, snakemake.params.title)
logging.info("%s", compare.summary_text(comparison))
logging.info("wrote %s", ", ".join(str(path) for path in written.values()))
