rule pull_image:
    """The experiment's container image, pulled once into image_dir (a .sif, or for Docker a
    record of the pulled digest) and reused by every window and experiment that names it.
    """
    output:
        image=f"{{image_dir}}/{{image}}.{{kind}}",
    log:
        "logs/pull_image/{image_dir}/{image}.{kind}.log",
    wildcard_constraints:
        kind="sif|digest",
        image="[^/]+",
    conda:
        "../envs/sftprof.yaml"
    params:
        container=lambda wc: image_container(wc),
    script:
        "../scripts/pull_image.py"
