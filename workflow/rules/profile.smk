rule profile_sft:
    """The SFT run under `nsys profile`, for one profiling window."""
    input:
        model=rules.create_tiny_model.output.model,
        training=rules.prepare_sft_data.output.training,
    output:
        report="results/{experiment}/{window}/{report}.nsys-rep",
        metrics="results/{experiment}/{window}/{report}.metrics.jsonl",
    params:
        profile=profile_params,
    log:
        "logs/{experiment}/{window}/{report}.profile.log",
    threads: workflow.cores
    script:
        "../scripts/profile_sft.py"


rule export_sqlite:
    """`nsys export --type=sqlite`: the input of every analysis."""
    input:
        report="results/{experiment}/{window}/{report}.nsys-rep",
    output:
        sqlite="results/{experiment}/{window}/{report}.sqlite",
    log:
        "logs/{experiment}/{window}/{report}.export.log",
    script:
        "../scripts/export_sqlite.py"
