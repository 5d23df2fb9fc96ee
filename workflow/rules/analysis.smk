rule analyze:
    """Normalized tables -> summaries and findings (CSV tables + analysis.json)."""
    input:
        sqlite=window_file(layout.NSYS_SQLITE),
    output:
        analysis=directory(layout.ANALYSIS_DIR),
    log:
        f"{layout.LOG_DIR}/{{window}}/analyze.log",
    script:
        "../scripts/analyze.py"


rule render_report:
    """One self-contained HTML report per window."""
    input:
        analysis=rules.analyze.output.analysis,
        metrics=window_file(layout.METRICS),
    output:
        html=layout.REPORT_HTML,
    params:
        title=lambda wc: f"sftprof: {wc.experiment} / {wc.window}",
    log:
        f"{layout.LOG_DIR}/{{window}}/report.log",
    script:
        "../scripts/report.py"
