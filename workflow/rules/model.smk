rule create_tiny_model:
    """A seeded random LlamaForCausalLM in HF layout, standing in for Llama 2 7B."""
    output:
        model=directory(layout.MODEL_DIR),
    params:
        model=lambda wc: experiment(wc)["model"],
    log:
        f"{layout.LOG_DIR}/create_tiny_model.log",
    script:
        "../scripts/create_tiny_model.py"


rule import_nemo_checkpoint:
    """HF Llama checkpoint -> NeMo 2 format (llm.import_ckpt), once per model, in the container."""
    input:
        unpack(nemo_import_inputs),
    output:
        checkpoint=directory(layout.NEMO_CHECKPOINT),
    params:
        container=lambda wc: nemo_import_experiment(wc)["container"],
    log:
        "logs/import_nemo_checkpoint/{model}.log",
    script:
        "../scripts/import_nemo_checkpoint.py"
