if config["remote"]["analysis_on"] == "workstation":

    rule fetch_capture:
        """A window's capture from the cluster: every rank's record, report and metrics, each
        verified by size and SHA-256 (resumed after a dropped connection)."""
        output:
            capture=directory(layout.CAPTURE_DIR),
        log:
            f"{layout.LOG_DIR}/{{window}}/fetch.log",
        localrule: True
        conda:
            "../envs/sftprof.yaml"
        resources:
            ssh=1,  # login nodes limit concurrent logins: one fetch at a time
        params:
            remote=config["remote"],
            experiment=experiment,
        script:
            "../scripts/fetch_capture.py"

else:

    rule fetch_report:
        """The report that the cluster's own run of the workflow rendered."""
        output:
            html=layout.REPORT_HTML,
        log:
            f"{layout.LOG_DIR}/{{window}}/fetch.log",
        localrule: True
        conda:
            "../envs/sftprof.yaml"
        resources:
            ssh=1,
        params:
            remote=config["remote"],
        script:
            "../scripts/fetch_report.py"
