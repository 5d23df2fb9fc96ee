from sftprof import logs, pipeline

logs.setup(snakemake.log[0])
pipeline.render_capture(snakemake.input.capture, snakemake.input.analysis, snakemake.params.output_name,
                        snakemake.output.html, snakemake.params.title)
