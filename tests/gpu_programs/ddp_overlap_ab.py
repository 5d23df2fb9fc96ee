"""Does DDP's overlap pay? The what-if of the `exposed_communication` finding, measured without a profiler.

    python tests/gpu_programs/ddp_overlap_ab.py [--cpu] OUT_DIR [ROUNDS] [STEPS]

The experiment of tests/fixtures/ranks/make_nccl_captures.py (2 ranks, DDP over NCCL, Llama 3.2 1B's
shapes), run with `sft.ddp_overlap` on and off in turn, ROUNDS times each (default 3), STEPS steps a run
(default 30), no nsys, each rank bound to half the CPUs. Prints one line per run (the median step of each
rank over the steps after WARMUP_STEPS) and, at the end, the median over runs of each setting and the
measured saving of turning the overlap on. Metrics files stay in OUT_DIR. `--cpu`: the tiny model over gloo,
to try the script where there is no GPU.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "ranks"))
import make_captures  # noqa: E402  (prepare())
import make_nccl_captures  # noqa: E402  (the experiment, rank_cpus())

WARMUP_STEPS = 3
NO_WINDOW = {"capture_range": "none"}


def run(workdir: Path, experiment: dict, overlap: bool, metrics: Path, port: int) -> list[float]:
    """One 2-rank run; each rank's median step in seconds."""
    from sftprof import layout
    from sftprof.capture import sft

    settings = {**experiment["sft"], "ddp_overlap": overlap}
    argv = sft.command(
        workdir / layout.MODEL_DIR.format(experiment="ranks"),
        workdir / layout.SFT_SPLIT.format(experiment="ranks", split="training"),
        str(metrics).replace(".jsonl", ".rank{rank}.jsonl"),
        settings,
        NO_WINDOW,
    )
    cpus = make_nccl_captures.rank_cpus(2)
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(REPO)}
    processes = [
        subprocess.Popen(
            ["taskset", "-c", cpus[rank], *argv],
            cwd=workdir,
            env={**os.environ, **common, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in (0, 1)
    ]
    if any(process.wait(timeout=600) for process in processes):
        raise SystemExit(f"a rank failed (ddp_overlap {overlap})")
    medians = []
    for rank in (0, 1):
        lines = Path(str(metrics).replace(".jsonl", f".rank{rank}.jsonl")).read_text().splitlines()
        medians.append(statistics.median(json.loads(line)["step_time_s"] for line in lines[WARMUP_STEPS:]))
    return medians


def main(argv: list[str]) -> int:
    cpu = "--cpu" in argv
    argv = [arg for arg in argv if arg != "--cpu"]
    out = Path(argv[0]).resolve()
    rounds = int(argv[1]) if len(argv) > 1 else 3
    steps = int(argv[2]) if len(argv) > 2 else 30
    out.mkdir(parents=True, exist_ok=True)
    if not cpu:
        make_captures.CONFIG = {"run": ["ranks"], "experiments": {"ranks": copy.deepcopy(make_nccl_captures.GPU)}}
    make_captures.CONFIG["experiments"]["ranks"]["sft"]["steps"] = steps
    results: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="sftprof-overlap-") as tmp:
        workdir = Path(tmp)
        experiment, _ = make_captures.prepare(workdir)
        for round_number in range(rounds):
            for overlap in (True, False) if round_number % 2 == 0 else (False, True):
                port = 29500 + 2 * round_number + overlap
                medians = run(workdir, experiment, overlap, out / f"r{round_number}.{overlap}.jsonl", port)
                results[overlap].append(max(medians))  # the job moves at its slower rank's pace
                print(f"round {round_number} ddp_overlap={overlap}: median step per rank (s) {medians}", flush=True)
    on, off = statistics.median(results[True]), statistics.median(results[False])
    print(
        f"ddp_overlap on: {on * 1e3:.1f} ms, off: {off * 1e3:.1f} ms; turning it on saves {100 * (1 - on / off):.1f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
