from sftprof import logs, pipeline

logs.setup(snakemake.log[0])
logs.one_line_errors(pipeline.export_capture, snakemake.input.capture, snakemake.output.export,
                     snakemake.params.container)
