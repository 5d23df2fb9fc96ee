rule export_capture:
    """`nsys export` of every rank's report, the input of every analysis: as a parquetdir where the
    nsys that captured writes one (2024 and later), else as SQLite."""
    input:
        capture=layout.CAPTURE_DIR,
        image=export_image,
    output:
        export=directory(layout.EXPORT_DIR),
    log:
        f"{layout.LOG_DIR}/{{window}}/export.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        # The nsys that captured: the container's where the capture ran in one here; a fetched
        # capture is exported by this machine's nsys.
        container=lambda wc: (
            experiment(wc)["container"] if config["results_from"] == "here" else None
        ),
    script:
        "../scripts/export.py"


rule analyze:
    """Normalized tables -> summaries and findings, per profiled rank (CSV tables + analysis.json)."""
    input:
        capture=layout.CAPTURE_DIR,
        export=rules.export_capture.output.export,
    output:
        analysis=directory(layout.ANALYSIS_DIR),
    log:
        f"{layout.LOG_DIR}/{{window}}/analyze.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        output_name=lambda wc: experiment(wc)["profile"]["output_name"],
        step_range=config["step_range"],
    script:
        "../scripts/analyze.py"


rule render_report:
    """One self-contained HTML report per window, a section per profiled rank."""
    input:
        capture=layout.CAPTURE_DIR,
        analysis=rules.analyze.output.analysis,
    output:
        html=layout.REPORT_HTML,
    log:
        f"{layout.LOG_DIR}/{{window}}/report.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        title=lambda wc: f"sftprof: {wc.experiment} / {wc.window}",
        output_name=lambda wc: experiment(wc)["profile"]["output_name"],
    script:
        "../scripts/report.py"


rule compare_experiment:
    """Every window and profiled rank of an experiment side by side (sftprof compare), against
    the first window's first rank."""
    input:
        analyses=lambda wc: [
            layout.ANALYSIS_DIR.format(experiment=wc.experiment, window=name)
            for name in experiment(wc)["profile"]["windows"]
        ],
    output:
        comparison=directory(layout.COMPARISON_DIR),
    log:
        f"{layout.LOG_DIR}/compare.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        title=lambda wc: f"sftprof: {wc.experiment}, windows and ranks compared",
    script:
        "../scripts/compare.py"


checkpoint suggest_variants:
    """What `sftprof suggest` prints for the experiment's first window, for its backend: the variants
    the workflow adds when the experiment sets suggested_variants (known only after this analysis).
    """
    input:
        analysis=lambda wc: layout.ANALYSIS_DIR.format(
            experiment=wc.experiment, window=first_window(wc.experiment)
        ),
    output:
        variants=layout.SUGGESTED_VARIANTS,
    log:
        f"{layout.LOG_DIR}/suggest_variants.log",
    localrule: True  # reads one analysis.json
    conda:
        "../envs/sftprof.yaml"
    params:
        backend=lambda wc: experiment(wc)["sft"]["backend"],
        top=lambda wc: sftprof_config.suggested_variant_count(config, wc.experiment),
    script:
        "../scripts/suggest_variants.py"


rule compare_variants:
    """Each variant of an experiment against it, in its first window: predicted gain beside the
    measured one, real tokens/s, whether the motivating finding is gone, and the loss curve.
    """
    input:
        unpack(variant_windows),
    output:
        variants=directory(layout.VARIANTS_DIR),
    log:
        f"{layout.LOG_DIR}/variants.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        variants=lambda wc: variants_with_suggested(wc.experiment),
        output_name=lambda wc: experiment(wc)["profile"]["output_name"],
        title=lambda wc: f"sftprof: {wc.experiment}, variants against it",
    script:
        "../scripts/compare_variants.py"


rule cross_rank:
    """Every profiled rank of a window compared (as `sftprof ranks`): stragglers, skew per
    step, waiting and collectives; it links each rank to its section of the window's report.
    """
    input:
        capture=layout.CAPTURE_DIR,
        export=rules.export_capture.output.export,
        analysis=rules.analyze.output.analysis,
    output:
        tables=directory(f"{layout.WINDOW_DIR}/ranks"),
        html=f"{layout.WINDOW_DIR}/ranks.html",
    log:
        f"{layout.LOG_DIR}/{{window}}/ranks.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        title=lambda wc: f"sftprof: {wc.experiment} / {wc.window}, across ranks",
        output_name=lambda wc: experiment(wc)["profile"]["output_name"],
    script:
        "../scripts/ranks.py"
