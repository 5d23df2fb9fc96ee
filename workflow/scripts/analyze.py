from sftprof import logs, pipeline

logs.setup(snakemake.log[0])
pipeline.analyze_capture(snakemake.input.capture, snakemake.input.sqlite, snakemake.params.output_name,
                         snakemake.output.analysis)
