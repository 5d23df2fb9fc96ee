rule profile_sft:
    """The SFT run under `nsys profile`, for one profiling window."""
    input:
        model=rules.create_tiny_model.output.model,
        training=rules.prepare_sft_data.output.training,
    output:
        report=layout.NSYS_REPORT,
        metrics=layout.METRICS,
    params:
        profile=profile_params,
    log:
        f"{layout.LOG_DIR}/{{window}}/{{report}}.profile.log",
    threads: workflow.cores
    script:
        "../scripts/profile_sft.py"


rule export_sqlite:
    """`nsys export --type=sqlite`: the input of every analysis."""
    input:
        report=layout.NSYS_REPORT,
    output:
        sqlite=layout.NSYS_SQLITE,
    log:
        f"{layout.LOG_DIR}/{{window}}/{{report}}.export.log",
    script:
        "../scripts/export_sqlite.py"
