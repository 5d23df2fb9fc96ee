from sftprof import logs
from sftprof.capture import steps

logs.setup()
logs.one_line_errors(steps.import_nemo_checkpoint, snakemake.params.container, snakemake.input.hf,
                     snakemake.output.checkpoint, snakemake.log[0])
