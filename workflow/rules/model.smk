rule create_tiny_model:
    """A seeded random LlamaForCausalLM in HF layout, standing in for Llama 2 7B."""
    output:
        model=directory(layout.MODEL_DIR),
    log:
        f"{layout.LOG_DIR}/create_tiny_model.log",
    wildcard_constraints:
        experiment=experiments_with("model", "tiny"),
    conda:
        "../envs/sftprof.yaml"
    params:
        model=lambda wc: experiment(wc)["model"],
    script:
        "../scripts/create_tiny_model.py"


rule create_random_model:
    """A published architecture (model.architecture) with no weights: its config, the
    byte tokenizer and a note that each backend initialises it randomly; no download."""
    output:
        model=directory(layout.MODEL_DIR),
    log:
        f"{layout.LOG_DIR}/create_random_model.log",
    wildcard_constraints:
        experiment=experiments_with("model", "random"),
    localrule: True
    conda:
        "../envs/sftprof.yaml"
    params:
        model=lambda wc: experiment(wc)["model"],
    script:
        "../scripts/create_random_model.py"


rule download_model:
    """A Hub checkpoint (Llama 2 7B) into the shared model folder model.dir/model.repo, every
    file verified; the manifest is written last, so only a complete checkpoint has one. On the
    machine that runs snakemake: compute nodes often have no internet."""
    output:
        manifest=f"{{checkpoint}}/{layout.MODEL_MANIFEST}",
    log:
        f"{{checkpoint}}/{layout.MODEL_DOWNLOAD_LOG}",
    localrule: True
    conda:
        "../envs/sftprof.yaml"
    params:
        # What the checkpoint is; how to get it (token, endpoint, offline) is read from the
        # config by the script, so changing that reruns nothing.
        source=lambda wc: sftprof_hub.model_identity(
            sftprof_hub.hub_model_settings(config, wc.checkpoint)
        ),
    script:
        "../scripts/download_model.py"


rule link_hub_model:
    """The experiment's model folder, a link to the verified shared checkpoint."""
    input:
        manifest=hub_checkpoint_manifest,
    output:
        model=directory(layout.MODEL_DIR),
    log:
        f"{layout.LOG_DIR}/link_hub_model.log",
    wildcard_constraints:
        experiment=experiments_with("model", "hub"),
    localrule: True
    conda:
        "../envs/sftprof.yaml"
    script:
        "../scripts/link_hub_model.py"


rule import_nemo_checkpoint:
    """HF Llama checkpoint -> NeMo 2 format (llm.import_ckpt), once per model, in the container."""
    input:
        unpack(nemo_import_inputs),
    output:
        checkpoint=directory(layout.NEMO_CHECKPOINT),
    log:
        "logs/import_nemo_checkpoint/{model}.log",
    # The NeMo image is not declared as `container:`: the step runs on the host in this env and puts
    # its command in the image itself (sftprof.capture.container.exec_prefix), with the binds, GPU and
    # Slurm settings a `container:` directive cannot express; declaring it would nest one in the other.
    conda:
        "../envs/sftprof.yaml"
    params:
        container=lambda wc: nemo_import_experiment(wc)["container"],
    script:
        "../scripts/import_nemo_checkpoint.py"
