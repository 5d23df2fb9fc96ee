rule make_sample_dataset:
    """A dolly-15k-format sample written by sftprof's generator (no download)."""
    output:
        dolly=layout.DOLLY_JSONL,
    params:
        records=lambda wc: experiment(wc)["data"]["sample_records"],
        seed=lambda wc: experiment(wc)["data"]["sample_seed"],
    log:
        f"{layout.LOG_DIR}/make_sample_dataset.log",
    script:
        "../scripts/make_sample_dataset.py"


rule prepare_sft_data:
    """Dolly records -> prompt/response jsonl, split 80/15/5 by seed (NeMo's Dolly layout)."""
    input:
        dolly=rules.make_sample_dataset.output.dolly,
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
