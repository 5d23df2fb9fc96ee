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
