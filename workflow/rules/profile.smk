rule profile_sft:
    """Every rank of the SFT run, the listed ones under `nsys profile`, for one window.

    Under Slurm (the slurm profile, or snakemake inside an salloc) the ranks are srun tasks and
    each profiled rank writes NAME.JOBID.NODEID.RANK.HOST.nsys-rep; locally there is one rank.
    """
    input:
        unpack(profile_inputs),
    output:
        capture=directory(layout.CAPTURE_DIR),
    params:
        run=profile_params,
    log:
        layout.PROFILE_LOG,
    threads: profile_threads
    resources:
        **slurm_resources(),
    script:
        "../scripts/profile_sft.py"
