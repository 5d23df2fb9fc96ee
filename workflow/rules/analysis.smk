rule export_sqlite:
    """`nsys export --type=sqlite` of every rank's report: the input of every analysis."""
    input:
        capture=layout.CAPTURE_DIR,
    output:
        sqlite=directory(layout.SQLITE_DIR),
    log:
        f"{layout.LOG_DIR}/{{window}}/export.log",
    conda:
        "../envs/sftprof.yaml"
    script:
        "../scripts/export_sqlite.py"


rule analyze:
    """Normalized tables -> summaries and findings, per profiled rank (CSV tables + analysis.json)."""
    input:
        capture=layout.CAPTURE_DIR,
        sqlite=rules.export_sqlite.output.sqlite,
    output:
        analysis=directory(layout.ANALYSIS_DIR),
    log:
        f"{layout.LOG_DIR}/{{window}}/analyze.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        output_name=lambda wc: experiment(wc)["profile"]["output_name"],
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
