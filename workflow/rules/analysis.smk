rule analyze:
    """Normalized tables -> summaries and findings (CSV tables + analysis.json)."""
    input:
        sqlite=nsys_sqlite,
    output:
        analysis=directory("results/{experiment}/{window}/analysis"),
    log:
        "logs/{experiment}/{window}/analyze.log",
    script:
        "../scripts/analyze.py"


rule report:
    """One self-contained HTML report per window."""
    input:
        analysis=rules.analyze.output.analysis,
        metrics=lambda wc: nsys_report(wc).removesuffix(".nsys-rep") + ".metrics.jsonl",
    output:
        html="results/{experiment}/{window}/report.html",
    params:
        title=lambda wc: f"sftprof: {wc.experiment} / {wc.window}",
    log:
        "logs/{experiment}/{window}/report.log",
    script:
        "../scripts/report.py"
