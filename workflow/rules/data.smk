rule make_sample_dataset:
    """A dolly-15k-format sample written by sftprof's generator (no download)."""
    output:
        dolly="resources/{experiment}/dolly.jsonl",
    params:
        records=lambda wc: experiment(wc)["data"]["sample_records"],
        seed=lambda wc: experiment(wc)["data"]["sample_seed"],
    log:
        "logs/{experiment}/make_sample_dataset.log",
    script:
        "../scripts/make_sample_dataset.py"


rule prepare_sft_data:
    """Dolly records -> prompt/response jsonl, split 80/15/5 by seed (NeMo's Dolly layout)."""
    input:
        dolly=rules.make_sample_dataset.output.dolly,
    output:
        training="resources/{experiment}/sft/training.jsonl",
        validation="resources/{experiment}/sft/validation.jsonl",
        test="resources/{experiment}/sft/test.jsonl",
        stats="resources/{experiment}/sft/stats.json",
    params:
        split=lambda wc: experiment(wc)["data"]["split"],
        seed=lambda wc: experiment(wc)["data"]["split_seed"],
    log:
        "logs/{experiment}/prepare_sft_data.log",
    script:
        "../scripts/prepare_sft_data.py"
