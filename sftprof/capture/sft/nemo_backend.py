"""NeMo 2 fine-tuning (the NeMo 25.02.01 container, NeMo 2.2.1), one process per Slurm rank.

Written against NeMo v2.2.1's sources: `llm.import_ckpt` (nemo/collections/llm/api.py),
`llm.<model>.finetune_recipe` (recipes/llama2_7b.py, recipes/finetune_default.py),
`llm.FineTuningDataModule` (gpt/data/fine_tuning.py) and `NsysCallback`
(nemo/lightning/pytorch/callbacks/nsys.py). It runs only where NeMo is installed; what can be
checked without it (the numbers it derives from sftprof's config) lives in `plan`.

Lightning picks up the Slurm rank layout itself (SLURMEnvironment: SLURM_NTASKS, SLURM_PROCID,
SLURM_LOCALID), and insists that trainer.devices equal the tasks per node and trainer.num_nodes
the node count, which `plan` derives from the same variables.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

PRECISION_PLUGINS = {"bf16-mixed": "bf16_mixed", "16-mixed": "fp16_mixed"}


def plan(sft: dict, window: dict, environ: dict[str, str]) -> dict:
    """The recipe settings for this run, from sftprof's config and the Slurm layout.

    NsysCallback starts at the beginning of step `start_step` and stops at the end of the step
    whose completed-step count equals `end_step`, i.e. after step end_step - 1; so the window's
    inclusive end_step becomes end_step + 1 (and start == end still stops).
    """
    nemo = sft["nemo"]
    world = int(environ.get("WORLD_SIZE", environ.get("SLURM_NTASKS", "1")))
    nodes = int(environ.get("SLURM_NNODES", "1"))
    if world % nodes:
        raise ValueError(f"{world} ranks do not spread evenly over {nodes} nodes")
    model_parallel = nemo["tensor_parallel"] * nemo["pipeline_parallel"]
    if world % model_parallel:
        raise ValueError(f"{world} ranks cannot hold tensor x pipeline parallel groups of {model_parallel}")
    data_parallel = world // model_parallel
    settings = {
        "num_nodes": nodes,
        "devices_per_node": world // nodes,
        "tensor_parallel": nemo["tensor_parallel"],
        "pipeline_parallel": nemo["pipeline_parallel"],
        "data_parallel": data_parallel,
        "micro_batch_size": sft["micro_batch_size"],
        "global_batch_size": sft["micro_batch_size"] * sft["grad_accum_steps"] * data_parallel,
        "seq_length": sft["seq_length"],
        "max_steps": sft["steps"],
        "learning_rate": sft["learning_rate"],
        "precision": nemo["precision"],
        "peft_scheme": None if nemo["peft"] == "none" else nemo["peft"],
        "recipe": nemo["recipe"],
        "nsys_steps": None,
    }
    if window["capture_range"] == "cudaProfilerApi":
        settings["nsys_steps"] = (window["start_step"], window["end_step"] + 1)
    return settings


def import_checkpoint(hf_dir: str | Path, output_dir: str | Path) -> Path:
    """HF Llama checkpoint -> NeMo 2 checkpoint at `output_dir`, a fresh folder of the caller's.

    overwrite=True because NeMo skips the import when the output folder exists, and the caller
    has already made it. The importer reads the architecture from the HF config.json, so the
    Llama2Config7B given here only picks the model class.
    """
    from nemo.collections import llm

    model = llm.LlamaModel(llm.Llama2Config7B())
    return llm.import_ckpt(model=model, source=f"hf://{Path(hf_dir).resolve()}",
                           output_path=Path(output_dir).resolve(), overwrite=True)


def _step_metrics_callback(metrics_path: Path, rank: int, tokens_per_step: int, window_steps):
    """A Lightning callback that writes sftprof's per-step metrics lines (as the torch backend does)."""
    import lightning.pytorch as pl

    class StepMetrics(pl.Callback):
        def __init__(self):
            self._file = open(metrics_path, "w")
            self._started = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            elapsed = time.perf_counter() - self._started
            step = trainer.global_step - 1
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            record = {"step": step, "rank": rank, "loss": float(loss) if loss is not None else None,
                      "step_time_s": elapsed, "tokens": tokens_per_step, "tokens_per_s": tokens_per_step / elapsed,
                      "in_window": window_steps is not None and window_steps[0] <= step < window_steps[1]}
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

        def on_train_end(self, trainer, pl_module):
            self._file.close()

    return StepMetrics()


def train(model_dir: str | Path, train_jsonl: str | Path, metrics_path: str | Path,
          sft: dict, window: dict) -> dict:
    """Fine-tune the NeMo checkpoint at `model_dir` on the splits beside `train_jsonl`."""
    import fiddle as fdl
    import nemo_run as run
    from nemo.collections import llm
    from nemo.collections.llm.recipes import precision as precision_recipes
    from nemo.lightning.pytorch.callbacks import NsysCallback

    settings = plan(sft, window, dict(os.environ))
    rank = int(os.environ.get("RANK", "0"))
    metrics_path = Path(metrics_path)
    log_dir = metrics_path.parent / f"nemo-logs.rank{rank}"
    recipe = getattr(llm, settings["recipe"]).finetune_recipe(
        dir=str(log_dir), name="sftprof", num_nodes=settings["num_nodes"],
        num_gpus_per_node=settings["devices_per_node"], peft_scheme=settings["peft_scheme"],
        seq_length=settings["seq_length"])
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = settings["tensor_parallel"]
    strategy.pipeline_model_parallel_size = settings["pipeline_parallel"]
    recipe.trainer.max_steps = settings["max_steps"]
    # Profiling runs measure training: no validation passes and no checkpoints in the timeline.
    recipe.trainer.val_check_interval = settings["max_steps"]
    recipe.trainer.limit_val_batches = 0
    recipe.trainer.enable_checkpointing = False
    recipe.log.ckpt = None
    if settings["precision"] in PRECISION_PLUGINS:
        recipe.trainer.plugins = getattr(precision_recipes.mixed_precision, PRECISION_PLUGINS[settings["precision"]])()
    recipe.optim.config.lr = settings["learning_rate"]
    recipe.model.config.seq_length = settings["seq_length"]
    recipe.data = run.Config(llm.FineTuningDataModule, dataset_root=str(Path(train_jsonl).parent),
                             seq_length=settings["seq_length"], micro_batch_size=settings["micro_batch_size"],
                             global_batch_size=settings["global_batch_size"])
    recipe.resume.restore_config.path = str(Path(model_dir).resolve())
    if not hasattr(recipe.trainer, "callbacks") or recipe.trainer.callbacks is None:
        recipe.trainer.callbacks = []
    if settings["nsys_steps"] is not None:
        start, end = settings["nsys_steps"]
        world = settings["num_nodes"] * settings["devices_per_node"]
        # Every rank opens the window; only the ranks that run under nsys are recorded.
        recipe.trainer.callbacks.append(run.Config(NsysCallback, start_step=start, end_step=end,
                                                   ranks=list(range(world))))
    log.info("NeMo fine-tuning: %s", settings)
    task = fdl.build(recipe)
    tokens_per_step = settings["micro_batch_size"] * sft["grad_accum_steps"] * settings["seq_length"]
    task.keywords["trainer"].callbacks.append(
        _step_metrics_callback(metrics_path, rank, tokens_per_step, settings["nsys_steps"]))
    task()
    return {"backend": "nemo", "rank": rank, **settings}


def main(argv: list[str] | None = None) -> int:
    """`python -m sftprof.capture.sft.nemo_backend import-checkpoint HF_DIR OUTPUT_DIR` (one process)."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "import-checkpoint":
        print("usage: python -m sftprof.capture.sft.nemo_backend import-checkpoint HF_DIR OUTPUT_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log.info("imported into %s", import_checkpoint(argv[1], argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
