from sftprof import logs
from sftprof.capture import steps

logs.setup()
logs.one_line_errors(steps.profile, snakemake.wildcards.experiment, snakemake.params.run, snakemake.wildcards.window,
                     snakemake.output.capture, snakemake.log[0])
