from snakemake.utils import validate

from sftprof import config as sftprof_config
from sftprof import layout
from sftprof import nsys as sftprof_nsys

validate(config, "../schemas/config.schema.yaml")
try:
    sftprof_config.check_cross_field_rules(config)
except sftprof_config.ConfigError as error:
    raise WorkflowError(str(error))


wildcard_constraints:
    experiment=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    window=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    report=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


def experiment(wildcards):
    return sftprof_config.experiment(config, wildcards.experiment)


def window(wildcards):
    return sftprof_config.window(config, wildcards.experiment, wildcards.window)


def window_file(pattern):
    """Input function: a per-window file named after the experiment's profile.output_name."""

    def path(wildcards):
        output_name = experiment(wildcards)["profile"]["output_name"]
        return pattern.format(experiment=wildcards.experiment, window=wildcards.window, report=output_name)

    return path


def all_reports():
    return [
        layout.REPORT_HTML.format(experiment=name, window=window_name)
        for name in config["run"]
        for window_name in config["experiments"][name]["profile"]["windows"]
    ]


def profile_params(wildcards):
    """Everything that shapes one profiled run; a change to any of it reruns that window only."""
    exp, win = experiment(wildcards), window(wildcards)
    return {
        "nsys_options": sftprof_nsys.profile_options(exp["profile"], win),
        "nsys_env": sftprof_nsys.profile_environment(win),
        "sft": exp["sft"],
        "window": win,
    }
