"""How a profiled window is launched: locally, as an sbatch script, or inside an salloc.

`launch_plan` gives the argv pieces (srun, container, rank program); `render_sbatch` and
`render_salloc` turn them into text through Jinja2 templates with StrictUndefined, quoting
every value with shlex. The workflow's profile step runs the same plan, so what a user
submits by hand and what Snakemake runs cannot drift apart.

Whatever the config holds, a rendered script keeps its shape: no value can carry a control
character into it (the config refuses them too), and an #SBATCH option that a shell would
have to quote is refused, so the #SBATCH lines stay whole and before the first command.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jinja2

from sftprof import __version__, layout
from sftprof.capture import container, nsys, rank, sft
from sftprof.errors import SftprofError
from sftprof.untrusted import CONTROL_CHARACTER


class SlurmError(SftprofError, RuntimeError):
    """A job could not be rendered or submitted; the message says why (sbatch's own words)."""


def _one_line(value):
    """Jinja's finalize: every value a template writes, refused if it would break a line."""
    if CONTROL_CHARACTER.search(str(value)):
        raise SlurmError(f"a rendered script would hold a control character, in {str(value)[:80]!r}")
    return value


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("sftprof.capture", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
    finalize=_one_line,
)
_ENV.filters["shjoin"] = shlex.join
_ENV.filters["q"] = shlex.quote
# #SBATCH lines are read by sbatch, not by a shell, so a value there cannot be quoted.
_UNSAFE_IN_DIRECTIVE = set(" '\"$`\\;")


@dataclass
class LaunchPlan:
    """The parts of the command that runs every rank of one window."""

    srun: list[str]
    container: list[str]
    rank: list[str]
    nsys: list[str]
    app: list[str]
    capture_dir: str

    @property
    def argv(self) -> list[str]:
        return [*self.srun, *self.container, *self.rank, *self.nsys, *self.app]


def model_dir(experiment_name: str, experiment: dict) -> str:
    """The HF checkpoint folder the SFT reads: a given path, or the one the workflow builds."""
    model = experiment["model"]
    return model["path"] if model["source"] == "path" else layout.MODEL_DIR.format(experiment=experiment_name)


def needs_nemo_checkpoint(experiment: dict) -> bool:
    """The NeMo backend reads a converted NeMo 2 checkpoint, except from a `random` model folder,
    which it builds from NeMo's config class with no import or restore."""
    return experiment["sft"]["backend"] == "nemo" and experiment["model"]["source"] != "random"


def nemo_checkpoint(experiment_name: str, experiment: dict) -> str:
    """Where the NeMo backend keeps the model converted to NeMo 2 format: shared by every
    experiment that fine-tunes the same HF folder."""
    model = experiment["model"]
    if model["source"] == "tiny":
        name = f"{experiment_name}-tiny"
    else:  # named after the checkpoint folder, so experiments fine-tuning the same model share it
        name = Path(model["path"] if model["source"] == "path" else model["repo"]).name
    return layout.NEMO_CHECKPOINT.format(model=name)


def allocation_options(slurm: dict, job_name: str) -> list[str]:
    """sbatch/salloc options for the experiment's allocation; the same list serves both forms."""
    options = [
        f"--job-name={job_name}",
        f"--partition={slurm['partition']}",
        f"--nodes={slurm['nodes']}",
        f"--ntasks-per-node={slurm['ntasks_per_node']}",
        f"--cpus-per-task={slurm['cpus_per_task']}",
        f"--time={slurm['time']}",
    ]
    if slurm["gpus_per_node"]:
        options.append(
            f"--gres=gpu:{slurm['gpus_per_node']}"
            if slurm["gpu_request"] == "gres"
            else f"--gpus-per-node={slurm['gpus_per_node']}"
        )
    if slurm["mem"]:
        options.append(f"--mem={slurm['mem']}")
    options += [f"--{key}={slurm[key]}" for key in ("account", "qos", "constraint", "reservation") if key in slurm]
    return options + list(slurm["extra"])


def minutes(time_limit: str) -> int:
    """A Slurm time limit ([days-]h:mm:ss) in whole minutes, rounded up."""
    days, _, clock = time_limit.rpartition("-")
    hours, mins, secs = (int(part) for part in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 60 + mins + (1 if secs else 0)


def megabytes(memory: str) -> int:
    """An sbatch memory size (`400G`, `512M`, `1T`; bare numbers are MB) in MB; 0 if empty."""
    if not memory:
        return 0
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    unit = memory[-1] if memory[-1] in scale else "M"
    return int(int(memory.rstrip("KMGT")) * scale[unit])


# snakemake-executor-plugin-slurm's resource names, each filled by executor_resources.
EXECUTOR_RESOURCES = (
    "slurm_partition",
    "nodes",
    "tasks_per_node",
    "cpus_per_task",
    "runtime",
    "mem_mb",
    "gres",
    "gpu",
    "slurm_account",
    "qos",
    "constraint",
    "slurm_extra",
)


def executor_resources(slurm: dict) -> dict:
    """The experiment's allocation in the Slurm executor plugin's terms (2.8): what
    `render sbatch` writes as #SBATCH lines, so both routes ask for the same thing. None (or
    0 for numbers) leaves a resource out; slurm_extra may not repeat a flag the plugin manages."""
    gpus = slurm["gpus_per_node"]
    reservation = [f"--reservation={slurm['reservation']}"] if "reservation" in slurm else []
    return {
        "slurm_partition": slurm["partition"],
        "nodes": slurm["nodes"],
        "tasks_per_node": slurm["ntasks_per_node"],
        "cpus_per_task": slurm["cpus_per_task"],
        "runtime": minutes(slurm["time"]),
        "mem_mb": megabytes(slurm["mem"]),
        "gres": f"gpu:{gpus}" if gpus and slurm["gpu_request"] == "gres" else None,
        # The plugin's `gpu` is --gpus, a total over the job.
        "gpu": gpus * slurm["nodes"] if gpus and slurm["gpu_request"] == "gpus" else 0,
        "slurm_account": slurm.get("account"),
        "qos": slurm.get("qos"),
        "constraint": slurm.get("constraint"),
        "slurm_extra": " ".join(reservation + list(slurm["extra"])) or None,
    }


def srun_argv(slurm: dict) -> list[str]:
    """One task per rank over the allocation; a failing rank ends the step rather than hanging it."""
    return [
        "srun",
        f"--nodes={slurm['nodes']}",
        f"--ntasks={slurm['nodes'] * slurm['ntasks_per_node']}",
        f"--ntasks-per-node={slurm['ntasks_per_node']}",
        f"--cpus-per-task={slurm['cpus_per_task']}",
        "--kill-on-bad-exit=1",
    ]


def launch_plan(
    experiment_name: str,
    experiment: dict,
    window_name: str,
    window: dict,
    *,
    workdir: str | Path,
    under_slurm: bool,
    capture_dir: str | None = None,
) -> LaunchPlan:
    """Everything that runs one profiled window. Under Slurm every rank is an srun task and
    profiled ranks get nsys's per-rank report names; outside it there is one rank."""
    names = {"experiment": experiment_name, "window": window_name}
    capture_dir = capture_dir or layout.CAPTURE_DIR.format(**names)
    profile = experiment["profile"]
    python = container.python_for(experiment["container"])
    metrics = str(Path(capture_dir) / rank.METRICS_PATTERN.format(output_name=profile["output_name"]))
    model = (
        nemo_checkpoint(experiment_name, experiment)
        if needs_nemo_checkpoint(experiment)
        else model_dir(experiment_name, experiment)
    )
    app = sft.command(
        model, layout.SFT_SPLIT.format(split="training", **names), metrics, experiment["sft"], window, python=python
    )
    output = nsys.output_pattern(capture_dir, profile["output_name"], per_rank=under_slurm)
    image = container.image_file(experiment["container"])
    return LaunchPlan(
        srun=srun_argv(experiment["slurm"]) if under_slurm else [],
        container=container.exec_prefix(experiment["container"], image, workdir),
        rank=rank.rank_argv(python, profile["ranks"], capture_dir, nsys.profile_environment(window)),
        nsys=nsys.profile_argv(nsys.profile_options(profile, window), output, []),
        app=app,
        capture_dir=capture_dir,
    )


def job_name(experiment_name: str, window_name: str) -> str:
    return f"sftprof-{experiment_name}-{window_name}"


def sbatch_directives(options: list[str], workdir: Path, slurm_log: str) -> list[str]:
    """The options of the #SBATCH lines; SlurmError for one that sbatch would split or misread."""
    directives = [*options, f"--chdir={workdir}", f"--output={slurm_log}"]
    for directive in directives:
        if _UNSAFE_IN_DIRECTIVE & set(directive) or CONTROL_CHARACTER.search(directive):
            raise SlurmError(
                f"#SBATCH {directive!r} holds spaces, quotes, shell or control characters, which an "
                "#SBATCH line cannot carry; use a plainer value (or run from a plainer path)"
            )
    return directives


def _context(experiment_name: str, experiment: dict, window_name: str, window: dict, workdir: Path) -> dict:
    plan = launch_plan(experiment_name, experiment, window_name, window, workdir=workdir, under_slurm=True)
    names = {"experiment": experiment_name, "window": window_name}
    options = allocation_options(experiment["slurm"], job_name(experiment_name, window_name))
    slurm_log = str(workdir / layout.JOB_DIR.format(**names) / "slurm-%j.out")
    return {
        "version": __version__,
        "experiment": experiment_name,
        "window": window_name,
        "workdir": str(workdir),
        "plan": plan,
        "profiled_ranks": experiment["profile"]["ranks"],
        "options": options,
        "directives": sbatch_directives(options, workdir, slurm_log),
    }


def render_sbatch(experiment_name: str, experiment: dict, window_name: str, window: dict, workdir: str | Path) -> str:
    """A batch script for `sbatch FILE`: the allocation as #SBATCH lines, then srun."""
    context = _context(experiment_name, experiment, window_name, window, Path(workdir).resolve())
    return _ENV.get_template("sbatch.sh.j2").render(**context)


def render_salloc(experiment_name: str, experiment: dict, window_name: str, window: dict, workdir: str | Path) -> str:
    """The interactive form: an salloc line, then the commands to type inside the allocation."""
    context = _context(experiment_name, experiment, window_name, window, Path(workdir).resolve())
    return _ENV.get_template("salloc.sh.j2").render(**context)


def write_sbatch(experiment_name: str, experiment: dict, window_name: str, window: dict, workdir: str | Path) -> Path:
    """jobs/EXPERIMENT/WINDOW/job.sbatch under `workdir`; the folder also takes Slurm's log.
    Rendered first, so a refused value leaves nothing behind."""
    names = {"experiment": experiment_name, "window": window_name}
    text = render_sbatch(experiment_name, experiment, window_name, window, workdir)
    script = Path(workdir) / layout.JOB_DIR.format(**names) / "job.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    return script


def submit(script: str | Path, wait: bool = False) -> str:
    """`sbatch --parsable SCRIPT`; the job id, or SlurmError with sbatch's reason."""
    if shutil.which("sbatch") is None:
        raise SlurmError("sbatch is not on PATH: submit from a Slurm login node")
    argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), str(script)]
    result = subprocess.run(argv, capture_output=True, text=True)
    job_id = result.stdout.strip().split(";")[0]
    if result.returncode != 0:
        reason = result.stderr.strip() or f"exit {result.returncode}"
        if job_id:
            raise SlurmError(f"Slurm job {job_id} from {script} failed: {reason}")
        raise SlurmError(f"sbatch rejected {script}: {reason}")
    return job_id
