from sftprof import logs, pipeline

logs.setup(snakemake.log[0])
inputs, variants = snakemake.input, snakemake.params.variants
runs = [(name, entry.get("motivated_by"), inputs[f"capture_{i}"], inputs[f"analysis_{i}"])
        for i, (name, entry) in enumerate(variants.items(), start=1)]
logs.one_line_errors(pipeline.compare_variants, (snakemake.wildcards.experiment, inputs.capture_0, inputs.analysis_0),
                     runs, snakemake.params.output_name, snakemake.output.variants, snakemake.params.title)
