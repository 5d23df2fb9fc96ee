import os
import re

from sftprof.capture import config as sftprof_config
from sftprof import layout
from sftprof.capture import container as sftprof_container
from sftprof.capture import hub as sftprof_hub
from sftprof.capture import jobs as sftprof_jobs
from sftprof.capture import sft as sftprof_sft
from sftprof.report import suggest as sftprof_suggest

# The same checks as `sftprof validate`: each config file read strictly (duplicate keys, aliases,
# depth), then what Snakemake merged from the files and --config validated as a whole.
try:
    for path in workflow.configfiles:
        sftprof_config.read(path)
    sftprof_config.validate(config)
except sftprof_config.ConfigError as error:
    raise WorkflowError(str(error))


wildcard_constraints:
    # EXPERIMENT or EXPERIMENT/VARIANT: a variant's results sit under its experiment's folder.
    experiment=r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?",
    window=r"[A-Za-z0-9][A-Za-z0-9_.-]*",


def experiment(wildcards):
    return sftprof_config.experiment(
        known_config(wildcards.experiment), wildcards.experiment
    )


def window(wildcards):
    return sftprof_config.window(
        known_config(wildcards.experiment), wildcards.experiment, wildcards.window
    )


def known_config(name):
    """The config, with the suggested variants of `name`'s experiment added where it is one of them: a job of
    a suggested variant (here or in a Slurm job's own snakemake) finds its settings in the suggestion file.
    """
    base, _, variant = name.partition("/")
    suggestion = layout.SUGGESTED_VARIANTS.format(experiment=base)
    if (
        variant
        and name not in config["experiments"]
        and base in config["experiments"]
        and sftprof_config.suggested_variant_count(config, base)
        and os.path.exists(suggestion)
    ):
        sftprof_config.add_suggested_variants(
            config, base, sftprof_suggest.read_suggestions(suggestion)
        )
    return config


def first_window(name):
    return next(iter(config["experiments"][name]["profile"]["windows"]))


def variants_with_suggested(name):
    """The experiment's variants, the suggested ones included once its baseline is analysed (the
    checkpoint suggest_variants; before that, Snakemake plans that step and asks again after it).
    """
    if sftprof_config.suggested_variant_count(config, name):
        suggestion = checkpoints.suggest_variants.get(experiment=name).output.variants
        sftprof_config.add_suggested_variants(
            config, name, sftprof_suggest.read_suggestions(suggestion)
        )
    return sftprof_config.variants_of(config, name)


def all_reports():
    """Every window's report, and a comparison where an experiment has several windows or
    profiled ranks (not when only reports are fetched: the analyses stay on the cluster).
    """
    reports = [
        layout.REPORT_HTML.format(experiment=name, window=window_name)
        for name in sftprof_config.built_experiments(config)
        for window_name in config["experiments"][name]["profile"]["windows"]
    ]
    if (
        config["results_from"] == "remote"
        and config["remote"]["analysis_on"] == "cluster"
    ):
        return reports
    for name in config["run"]:
        profile = config["experiments"][name]["profile"]
        if len(profile["windows"]) * len(profile["ranks"]) > 1:
            reports.append(layout.COMPARISON_DIR.format(experiment=name))
        # the cross-rank report of each window (rule cross_rank)
        if len(profile["ranks"]) > 1:
            ranks_html = f"{layout.WINDOW_DIR}/ranks.html"
            reports += [
                ranks_html.format(experiment=name, window=window_name)
                for window_name in profile["windows"]
            ]
        if sftprof_config.variants_of(
            config, name
        ) or sftprof_config.suggested_variant_count(config, name):
            reports.append(layout.VARIANTS_DIR.format(experiment=name))
    return reports


def suggested_reports(wildcards):
    """Every window's report of the suggested variants (known only after each baseline's analysis)."""
    if (
        config["results_from"] == "remote"
        and config["remote"]["analysis_on"] == "cluster"
    ):
        return []
    return [
        layout.REPORT_HTML.format(experiment=f"{name}/{variant}", window=window_name)
        for name in config["run"]
        if sftprof_config.suggested_variant_count(config, name)
        for variant in variants_with_suggested(name)
        for window_name in config["experiments"][f"{name}/{variant}"]["profile"][
            "windows"
        ]
    ]


def variant_windows(wildcards):
    """The first window of the experiment and of each of its variants: capture and analysis folders."""
    window_name = first_window(wildcards.experiment)
    names = [wildcards.experiment] + [
        f"{wildcards.experiment}/{v}"
        for v in variants_with_suggested(wildcards.experiment)
    ]
    return {
        f"{kind}_{i}": pattern.format(experiment=name, window=window_name)
        for i, name in enumerate(names)
        for kind, pattern in (
            ("capture", layout.CAPTURE_DIR),
            ("analysis", layout.ANALYSIS_DIR),
        )
    }


def image_file(wildcards):
    """The pulled container image of the experiment, or nothing when it runs without one."""
    image = sftprof_container.image_file(experiment(wildcards)["container"])
    return [] if image is None else [str(image)]


def export_image(wildcards):
    """The image whose nsys exports the capture: only where the capture ran here."""
    return image_file(wildcards) if config["results_from"] == "here" else []


def profile_inputs(wildcards):
    exp = experiment(wildcards)
    names = {"experiment": wildcards.experiment, "split": "training"}
    inputs = {
        "training": layout.SFT_SPLIT.format(**names),
        "image": image_file(wildcards),
    }
    inputs["model"] = sftprof_jobs.model_dir(wildcards.experiment, exp)
    if sftprof_jobs.needs_nemo_checkpoint(exp):
        inputs["nemo_checkpoint"] = sftprof_jobs.nemo_checkpoint(
            wildcards.experiment, exp
        )
    return inputs


def profile_params(wildcards):
    """What shapes one profiled run, and nothing else: a change here reruns that window only.

    Other windows, time limits and accounts are left out, so editing them reruns nothing.
    """
    exp = experiment(wildcards)
    slurm = exp["slurm"]
    return {
        # Only where the checkpoint is: the model's contents reach this step as its input.
        "model": {
            key: exp["model"][key] for key in ("source", "path") if key in exp["model"]
        },
        "sft": sftprof_sft.backend_settings(exp["sft"]),
        "profile": {
            key: value for key, value in exp["profile"].items() if key != "windows"
        },
        "container": exp["container"],
        "slurm": {
            key: slurm[key] for key in ("nodes", "ntasks_per_node", "cpus_per_task")
        },
        "window": window(wildcards),
    }


def profile_threads(wildcards):
    """CPUs of the profiled run on one node; locally this keeps other jobs off those cores."""
    slurm = experiment(wildcards)["slurm"]
    return slurm["cpus_per_task"] * slurm["ntasks_per_node"]


def slurm_resources():
    """Resources of the profiled run for the Slurm executor, from the experiment's `slurm`
    section (the same one `sftprof render sbatch` reads). The job starts its own srun (mpi),
    one task per rank; the local executor ignores all of these."""

    def resource(key):
        return lambda wildcards: sftprof_jobs.executor_resources(
            experiment(wildcards)["slurm"]
        )[key]

    return {key: resource(key) for key in sftprof_jobs.EXECUTOR_RESOURCES} | {
        "mpi": "srun"
    }


def image_container(wildcards):
    """The container settings (runtime, image) of whichever experiment pulls this image file."""
    path = f"{wildcards.image_dir}/{wildcards.image}.{wildcards.kind}"
    for exp in config["experiments"].values():
        if str(sftprof_container.image_file(exp["container"])) == path:
            return {key: exp["container"][key] for key in ("runtime", "image")}
    raise WorkflowError(f"no experiment's container pulls into {path}")


# Pulls run where snakemake runs unless some experiment asks for them to run as Slurm jobs.
if all(
    exp["container"]["pull_on"] == "login" for exp in config["experiments"].values()
):

    localrules:
        pull_image,


def nemo_import_experiment(wildcards):
    """The (first) experiment whose NeMo checkpoint this is: it names the HF folder and container."""
    path = layout.NEMO_CHECKPOINT.format(model=wildcards.model)
    for name, exp in config["experiments"].items():
        if (
            sftprof_jobs.needs_nemo_checkpoint(exp)
            and sftprof_jobs.nemo_checkpoint(name, exp) == path
        ):
            return {"name": name, **exp}
    raise WorkflowError(f"no nemo experiment converts into {path}")


def nemo_import_inputs(wildcards):
    exp = nemo_import_experiment(wildcards)
    image = sftprof_container.image_file(exp["container"])
    return {
        "hf": sftprof_jobs.model_dir(exp["name"], exp),
        "image": [] if image is None else [str(image)],
    }


def experiments_with(section, *sources):
    """A wildcard pattern that matches the experiments whose `section` (data or model) comes
    from one of `sources`: it picks, per experiment, the one rule that makes its data or model
    (also used by model.smk). Matches nothing when no experiment qualifies."""
    names = [
        re.escape(name)
        for name, exp in config["experiments"].items()
        if exp[section]["source"] in sources
    ]
    # the variants suggested later inherit the experiment's data and model
    variant_name = "[A-Za-z0-9][A-Za-z0-9_.-]*"
    names += [
        f"{re.escape(name)}/{variant_name}"
        for name, exp in config["experiments"].items()
        if exp[section]["source"] in sources
        and sftprof_config.suggested_variant_count(config, name)
    ]
    return "|".join(names) or "(?!)"


def dolly_local_file(wildcards):
    """A local dolly file is an input, so that replacing it redoes the data; URLs and the Hub are not."""
    data = experiment(wildcards)["data"]
    if data["source"] == "path" and not re.match(r"https?://", data["path"]):
        return [data["path"]]
    return []


def hub_checkpoint_manifest(wildcards):
    """The manifest of the experiment's shared checkpoint: it exists only once every file is verified."""
    model = experiment(wildcards)["model"]
    return f"{sftprof_hub.checkpoint_dir(model)}/{layout.MODEL_MANIFEST}"


if config["local_analysis"]:

    localrules:
        export_capture,
        analyze,
        render_report,
        cross_rank,
