rule profile_sft:
    """Every rank of the SFT run, the listed ones under `nsys profile`, for one window.

    Under Slurm (the slurm profile, or snakemake inside an salloc) the ranks are srun tasks and
    each profiled rank writes NAME.JOBID.NODEID.RANK.HOST.nsys-rep; locally there is one rank.
    """
    input:
        unpack(profile_inputs),
    output:
        capture=directory(layout.CAPTURE_DIR),
    log:
        layout.PROFILE_LOG,
    # The NeMo image is not declared as `container:`: the step runs on the host in this env and puts
    # its command in the image itself (sftprof.capture.container.exec_prefix), with the binds, GPU and
    # Slurm settings a `container:` directive cannot express; declaring it would nest one in the other.
    conda:
        "../envs/sftprof.yaml"
    threads: profile_threads
    resources:
        **slurm_resources(),
    params:
        run=profile_params,
    script:
        "../scripts/profile_sft.py"
