import re

from sftprof.capture import hub as sftprof_hub


def experiments_with(section, *sources):
    """A wildcard pattern that matches the experiments whose `section` (data or model) comes
    from one of `sources`: it picks, per experiment, the one rule that makes its data or model
    (also used by model.smk). Matches nothing when no experiment qualifies."""
    names = [name for name, exp in config["experiments"].items() if exp[section]["source"] in sources]
    return "|".join(re.escape(name) for name in names) or "(?!)"


def dolly_local_file(wildcards):
    """A local dolly file is an input, so that replacing it redoes the data; URLs and the Hub are not."""
    data = experiment(wildcards)["data"]
    if data["source"] == "path" and not re.match(r"https?://", data["path"]):
        return [data["path"]]
    return []


rule make_sample_dataset:
    """A dolly-15k-format sample written by sftprof's generator (no download)."""
    output:
        dolly=layout.DOLLY_JSONL,
    params:
        records=lambda wc: experiment(wc)["data"]["sample_records"],
        seed=lambda wc: experiment(wc)["data"]["sample_seed"],
    wildcard_constraints:
        experiment=experiments_with("data", "sample"),
    log:
        f"{layout.LOG_DIR}/make_sample_dataset.log",
    script:
        "../scripts/make_sample_dataset.py"


rule fetch_dolly:
    """databricks-dolly-15k from the Hub (through the HF cache), a mirror URL or a local copy,
    checked against the Hub's sha256 and data.sha256. On the machine that runs snakemake: compute
    nodes often have no internet."""
    input:
        dolly_local_file,
    output:
        dolly=layout.DOLLY_JSONL,
    params:
        # What the file is; how to get it (token, endpoint, offline) is read from the config by
        # the script, so changing that reruns nothing.
        source=lambda wc: sftprof_hub.dolly_identity(experiment(wc)["data"]),
    wildcard_constraints:
        experiment=experiments_with("data", "hub", "path"),
    log:
        f"{layout.LOG_DIR}/fetch_dolly.log",
    localrule: True
    script:
        "../scripts/fetch_dolly.py"


rule prepare_sft_data:
    """Dolly records -> prompt/response jsonl, split 80/15/5 by seed (NeMo's Dolly layout), and
    stats: skipped rows by reason, records per split, length percentiles."""
    input:
        dolly=layout.DOLLY_JSONL,
    output:
        training=layout.SFT_SPLIT.replace("{split}", "training"),
        validation=layout.SFT_SPLIT.replace("{split}", "validation"),
        test=layout.SFT_SPLIT.replace("{split}", "test"),
        stats=layout.SFT_STATS,
    params:
        split=lambda wc: experiment(wc)["data"]["split"],
        seed=lambda wc: experiment(wc)["data"]["split_seed"],
    log:
        f"{layout.LOG_DIR}/prepare_sft_data.log",
    script:
        "../scripts/prepare_sft_data.py"
