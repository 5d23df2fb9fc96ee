from sftprof import logs
from sftprof.capture import steps

logs.setup(snakemake.log[0])
logs.one_line_errors(steps.pull_image, snakemake.params.container, snakemake.output.image, snakemake.log[0])
