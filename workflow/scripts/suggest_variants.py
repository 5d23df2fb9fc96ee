from sftprof import logs
from sftprof.report import suggest

logs.setup(snakemake.log[0])
logs.one_line_errors(suggest.write_suggestions, snakemake.input.analysis, snakemake.params.backend,
                     snakemake.params.top, snakemake.output.variants)
