rule make_sample_dataset:
    """A dolly-15k-format sample written by sftprof's generator (no download)."""
    output:
        dolly=layout.DOLLY_JSONL,
    log:
        f"{layout.LOG_DIR}/make_sample_dataset.log",
    wildcard_constraints:
        experiment=experiments_with("data", "sample"),
    conda:
        "../envs/sftprof.yaml"
    params:
        records=lambda wc: experiment(wc)["data"]["sample_records"],
        seed=lambda wc: experiment(wc)["data"]["sample_seed"],
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
    log:
        f"{layout.LOG_DIR}/fetch_dolly.log",
    wildcard_constraints:
        experiment=experiments_with("data", "hub", "path"),
    localrule: True
    conda:
        "../envs/sftprof.yaml"
    params:
        # What the file is; how to get it (token, endpoint, offline) is read from the config by
        # the script, so changing that reruns nothing.
        source=lambda wc: sftprof_hub.dolly_identity(experiment(wc)["data"]),
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
    log:
        f"{layout.LOG_DIR}/prepare_sft_data.log",
    conda:
        "../envs/sftprof.yaml"
    params:
        split=lambda wc: experiment(wc)["data"]["split"],
        seed=lambda wc: experiment(wc)["data"]["split_seed"],
    script:
        "../scripts/prepare_sft_data.py"
