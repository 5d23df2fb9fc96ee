from sftprof import logs, memory_budget, pipeline

logs.setup(snakemake.log[0])
memory_budget.use(memory_budget.parse(snakemake.config["memory_budget"]))  # not a param: it changes no result
pipeline.analyze_capture(snakemake.input.capture, snakemake.input.export, snakemake.params.output_name,
                         snakemake.output.analysis, snakemake.params.step_range)
