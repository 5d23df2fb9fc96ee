from sftprof import logs
from sftprof.capture import steps

logs.setup(snakemake.log[0])
logs.one_line_errors(steps.export_capture, snakemake.input.capture, snakemake.output.export,
                     snakemake.params.container)
