rule create_tiny_model:
    """A seeded random LlamaForCausalLM in HF layout, standing in for Llama 2 7B."""
    output:
        model=directory("resources/{experiment}/model"),
    params:
        model=lambda wc: experiment(wc)["model"],
    log:
        "logs/{experiment}/create_tiny_model.log",
    script:
        "../scripts/create_tiny_model.py"
