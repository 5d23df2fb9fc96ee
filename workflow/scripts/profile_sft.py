import logging
import os
import subprocess

from sftprof import logs

from sftprof.capture import config, jobs, rank
from sftprof.io import atomic_dir

logs.setup()
run = snakemake.params.run
experiment = {**run, "profile": {**run["profile"], "windows": {}}}
under_slurm = "SLURM_JOB_ID" in os.environ
ranks = config.world_size(experiment)
if ranks > 1 and not under_slurm:
    raise SystemExit(f"{ranks} ranks (slurm.nodes x slurm.ntasks_per_node) need Slurm: run with "
                     "`snakemake --profile slurm`, or inside an salloc allocation")
# Ranks write into a fresh folder (nsys can never find its target there already), which becomes
# the step's output only once every rank has finished and left its record.
with atomic_dir(snakemake.output.capture) as partial, open(snakemake.log[0], "w") as log:
    plan = jobs.launch_plan(snakemake.wildcards.experiment, experiment, snakemake.wildcards.window,
                            run["window"], workdir=os.getcwd(), under_slurm=under_slurm, capture_dir=str(partial))
    log.write(f"[sftprof] slurm job {os.environ.get('SLURM_JOB_ID', '-')}, {ranks} rank(s)\n")
    log.flush()
    result = subprocess.run(plan.argv, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise SystemExit(f"the profiled run failed (exit {result.returncode}); see {snakemake.log[0]}")
    records = rank.read_records(partial)
    missing = sorted(set(range(ranks)) - {record["rank"] for record in records})
    unreported = [r["rank"] for r in records if r["rank"] in run["profile"]["ranks"] and not r["report"]]
    if missing or unreported:
        raise SystemExit(f"rank(s) {missing} left no record, rank(s) {unreported} no report; "
                         f"see {snakemake.log[0]}")
for record in records:
    logging.info("rank %d on %s: %s", record["rank"], record["host"], record["report"] or "not profiled")
