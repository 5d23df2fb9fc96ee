from sftprof import logs, pipeline

logs.setup(snakemake.log[0])
logs.one_line_errors(pipeline.cross_rank_capture, snakemake.input.capture, snakemake.input.export,
                     snakemake.input.analysis, snakemake.params.output_name, snakemake.output.tables,
                     snakemake.output.html, snakemake.params.title)
