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

from sftprof.errors import SftprofError

log = logging.getLogger(__name__)

PRECISION_PLUGINS = {"bf16-mixed": "bf16_mixed", "16-mixed": "fp16_mixed"}
# The layer spec NeMo builds without Transformer Engine (megatron-core's local one), and the sft.nemo knobs
# it cannot run: its DotProductAttention asserts that no packed sequence reaches it, and
# GPTConfig.configure_model asserts TE for CUDA graphs (NeMo 2.2.1, megatron-core 0.11).
LOCAL_SPEC = "local"
NEEDS_TRANSFORMER_ENGINE = ("packed_sequence", "cuda_graphs")


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
    # NeMo packs into micro-batches of one example (FineTuningDataModule refuses more); as its message
    # advises, a micro-batch of N examples becomes one pack of N x seq_length tokens.
    packed = nemo["packed_sequence"]
    micro_batch = 1 if packed else sft["micro_batch_size"]
    settings = {
        "num_nodes": nodes,
        "devices_per_node": world // nodes,
        "tensor_parallel": nemo["tensor_parallel"],
        "pipeline_parallel": nemo["pipeline_parallel"],
        "data_parallel": data_parallel,
        "micro_batch_size": micro_batch,
        "global_batch_size": micro_batch * sft["grad_accum_steps"] * data_parallel,
        "seq_length": sft["seq_length"],
        "packed_sequence_size": sft["micro_batch_size"] * sft["seq_length"] if packed else None,
        "cuda_graphs": nemo["cuda_graphs"],
        "overlap_grad_reduce": nemo["overlap_grad_reduce"],
        "overlap_param_gather": nemo["overlap_param_gather"],
        "max_steps": sft["steps"],
        "learning_rate": sft["learning_rate"],
        "precision": nemo["precision"],
        "peft_scheme": None if nemo["peft"] == "none" else nemo["peft"],
        "recipe": nemo["recipe"],
        "nsys_steps": None,
        "op_ranges": window.get("op_ranges", False),
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
    return llm.import_ckpt(
        model=model, source=f"hf://{Path(hf_dir).resolve()}", output_path=Path(output_dir).resolve(), overwrite=True
    )


def _step_metrics_callback(metrics_path: Path, rank: int, settings: dict, grad_accum_steps: int):
    """A Lightning callback that writes sftprof's per-step metrics lines (as the torch backend does).

    Every micro-batch is padded to seq_length, or to the pack size when packing (build_recipe sets
    pad_to_max_length), so a step's token slots are micro_batch_size x grad_accum_steps x that length. Step times are host wall
    time between batch start and end: Megatron's step ends with a loss reduction that waits for
    the GPU. Step 0's line carries the run's facts for an MFU estimate (`run`, as run_facts)."""
    import lightning.pytorch as pl

    seq_length = settings["packed_sequence_size"] or settings["seq_length"]
    slots = settings["micro_batch_size"] * grad_accum_steps * seq_length
    window_steps = settings["nsys_steps"]

    import torch

    from sftprof.capture.sft.annotate import Annotator, CaptureWindow

    annotator = Annotator(torch.cuda.is_available())
    # Without op ranges this callback opens the capture window at NsysCallback's steps, without its emit_nvtx.
    opens = window_steps is not None and not settings["op_ranges"]
    capture = CaptureWindow(
        "cudaProfilerApi" if opens else "none",
        window_steps[0] if opens else None,
        window_steps[1] - 1 if opens else None,
        annotator,
    )

    class StepMetrics(pl.Callback):
        def __init__(self):
            self._file = None
            self._started = 0.0
            self._facts = None

        def on_train_start(self, trainer, pl_module):
            import torch

            self._file = open(metrics_path, "w")
            config = pl_module.config
            embedding = sum(p.numel() for name, p in pl_module.named_parameters() if "word_embeddings" in name)
            self._facts = {
                "parameters": sum(p.numel() for p in pl_module.parameters()),
                "trainable_parameters": sum(p.numel() for p in pl_module.parameters() if p.requires_grad),
                "weight_dtype": str(next(pl_module.parameters()).dtype).removeprefix("torch."),
                "precision": {"bf16-mixed": "bfloat16", "16-mixed": "float16"}.get(settings["precision"]),
                "model": {
                    "architecture": type(pl_module).__name__,
                    "num_layers": config.num_layers,
                    "hidden_size": config.hidden_size,
                    "intermediate_size": config.ffn_hidden_size,
                    "num_heads": config.num_attention_heads,
                    "num_kv_heads": config.num_query_groups or config.num_attention_heads,
                    "vocab_size": getattr(config, "vocab_size", None),
                    "seq_length": seq_length,
                    "embedding_parameters": embedding,
                },
                "padding": "packed" if settings["packed_sequence_size"] else "max_length",
                "backend": "nemo",
                "layer_spec": settings["layer_spec"],
                "cuda_graphs": settings["cuda_graphs"],
                "overlap_grad_reduce": settings["overlap_grad_reduce"],
                "overlap_param_gather": settings["overlap_param_gather"],
                "peft": settings["peft_scheme"],
                "op_ranges": settings["op_ranges"],
                "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            }

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            # A `step N` NVTX range per optimizer step, as the torch trainer writes: NeMo writes none, and
            # without them the analysis has no steps to account (sftprof.analysis.cpu.STEP_RANGE).
            capture.before_step(trainer.global_step)
            annotator.push(f"step {trainer.global_step}")
            self._started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            elapsed = time.perf_counter() - self._started
            annotator.pop()
            step = trainer.global_step - 1
            capture.after_step(step)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            record = {
                "step": step,
                "rank": rank,
                "loss": float(loss) if loss is not None else None,
                "step_time_s": elapsed,
                "tokens": slots,
                "tokens_per_s": slots / elapsed,
                "in_window": window_steps is not None and window_steps[0] <= step < window_steps[1],
                "token_slots": slots,
                "padded_lengths": [seq_length] * grad_accum_steps,
            }
            if step == 0 and self._facts is not None:
                record["run"] = self._facts
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

        def on_train_end(self, trainer, pl_module):
            if self._file is not None:
                self._file.close()

    return StepMetrics()


def _have_transformer_engine() -> bool:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # not installed, or installed without its CUDA libraries
        return False
    return True


def build_recipe(
    model_dir: str | Path,
    train_jsonl: str | Path,
    sft: dict,
    window: dict,
    environ: dict[str, str],
    log_dir: str | Path,
):
    """NeMo's `finetune_recipe` (a nemo_run Partial of llm.finetune) with sftprof's settings: the
    plan's parallel layout, batch, steps and precision; the data module over sftprof's splits; no
    validation or checkpoints; NsysCallback on the capture window. Returns (recipe, settings).

    A `random` model folder (sftprof.capture.model) gets the architecture's NeMo config class,
    the folder's tokenizer and no AutoResume: nothing is restored. Otherwise `model_dir` is a NeMo
    2 checkpoint that AutoResume restores.
    """
    import nemo_run as run
    from nemo import lightning as nl
    from nemo.collections import llm
    from nemo.collections.common.tokenizers.huggingface.auto_tokenizer import AutoTokenizer
    from nemo.collections.llm.recipes.precision import mixed_precision
    from nemo.lightning.pytorch.callbacks import NsysCallback

    from sftprof.capture import model as sftprof_model

    settings = plan(sft, window, environ)
    recipe = getattr(llm, settings["recipe"]).finetune_recipe(
        dir=str(log_dir),
        name="sftprof",
        num_nodes=settings["num_nodes"],
        num_gpus_per_node=settings["devices_per_node"],
        peft_scheme=settings["peft_scheme"],
        seq_length=settings["seq_length"],
    )
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = settings["tensor_parallel"]
    strategy.pipeline_model_parallel_size = settings["pipeline_parallel"]
    recipe.trainer.max_steps = settings["max_steps"]
    # Profiling runs measure training: no validation passes and no checkpoints in the timeline.
    recipe.trainer.val_check_interval = settings["max_steps"]
    recipe.trainer.limit_val_batches = 0
    recipe.trainer.enable_checkpointing = False
    recipe.trainer.log_every_n_steps = 1
    recipe.log.ckpt = None
    if settings["precision"] in PRECISION_PLUGINS:
        recipe.trainer.plugins = getattr(mixed_precision, PRECISION_PLUGINS[settings["precision"]])()
    else:  # "32": no mixed-precision plugin (the recipe's default is bf16_mixed)
        recipe.trainer.plugins = run.Config(nl.MegatronMixedPrecision, precision="32")
    recipe.optim.config.lr = settings["learning_rate"]
    model_length = settings["packed_sequence_size"] or settings["seq_length"]
    recipe.model.config.seq_length = model_length
    recipe.data = run.Config(
        llm.FineTuningDataModule,
        dataset_root=str(Path(train_jsonl).parent),
        seq_length=settings["seq_length"],
        micro_batch_size=settings["micro_batch_size"],
        global_batch_size=settings["global_batch_size"],
        num_workers=2,
        dataset_kwargs={"pad_to_max_length": True},
    )
    facts = sftprof_model.model_facts(model_dir)
    if facts.get("weights") == "random":
        config = run.Config(getattr(llm, facts["nemo_config"]), seq_length=model_length)
        if settings["peft_scheme"]:  # as the recipe sets it for LoRA
            config.cross_entropy_loss_fusion = False
        tokenizer = run.Config(AutoTokenizer, pretrained_model_name=str(Path(model_dir).resolve()), use_fast=True)
        recipe.model = run.Config(llm.LlamaModel, config=config, tokenizer=tokenizer)
        recipe.resume = None
        settings["model"] = {
            "weights": "random",
            "nemo_config": facts["nemo_config"],
            "vocab_size": facts["vocab_size"],
        }
    else:
        recipe.resume.restore_config.path = str(Path(model_dir).resolve())
        settings["model"] = {"weights": "checkpoint", "path": str(Path(model_dir).resolve())}
    _apply_knobs(recipe, settings)
    # Without Transformer Engine, GPTConfig's default_layer_spec is megatron-core's local spec;
    # Llama's fused RoPE needs TE or Apex (TransformerConfig refuses it otherwise) and the fused
    # masked softmax needs megatron's compiled kernels: both off, as the local spec runs them unfused.
    settings["layer_spec"] = "transformer_engine" if _have_transformer_engine() else LOCAL_SPEC
    if settings["layer_spec"] == LOCAL_SPEC:
        recipe.model.config.apply_rope_fusion = False
        recipe.model.config.masked_softmax_fusion = False
        # The local spec's norm is WrappedTorchNorm, which refuses persist_layer_norm (Llama's is
        # True): found on the H200, "AssertionError: persist_layer_norm not supported by torch LayerNorm".
        recipe.model.config.persist_layer_norm = False
    recipe.trainer.callbacks = list(recipe.trainer.callbacks or [])
    if settings["nsys_steps"] is not None and settings["op_ranges"]:
        start, end = settings["nsys_steps"]
        world = settings["num_nodes"] * settings["devices_per_node"]
        # Every rank opens the window; only the ranks that run under nsys are recorded. NsysCallback also
        # turns on emit_nvtx; without op_ranges the metrics callback opens the window (_step_metrics_callback).
        recipe.trainer.callbacks.append(
            run.Config(NsysCallback, start_step=start, end_step=end, ranks=list(range(world)))
        )
    return recipe, settings


def _apply_knobs(recipe, settings: dict) -> None:
    """The `sft.nemo` knobs that a report's findings may suggest, set as NeMo 2.2.1's own recipes set them:
    packing as llama2_7b.finetune_recipe(packed_sequence=True), DDP overlap as its
    finetune_performance_optimizations (DistributedDataParallelConfig), CUDA graphs on the model config."""
    import nemo_run as run
    from megatron.core.distributed import DistributedDataParallelConfig
    from nemo.collections.llm.gpt.data.packed_sequence import PackedSequenceSpecs

    if settings["packed_sequence_size"]:
        # Graphs replay fixed shapes: the packs' cu_seqlens are padded to one size for them.
        recipe.data.packed_sequence_specs = run.Config(
            PackedSequenceSpecs,
            packed_sequence_size=settings["packed_sequence_size"],
            pad_cu_seqlens=settings["cuda_graphs"],
        )
    if settings["overlap_grad_reduce"] or settings["overlap_param_gather"]:
        recipe.trainer.strategy.ddp = run.Config(
            DistributedDataParallelConfig,
            check_for_nan_in_grad=True,  # as the strategy's default "megatron" DDP has it
            overlap_grad_reduce=settings["overlap_grad_reduce"],
            overlap_param_gather=settings["overlap_param_gather"],
        )
    if settings["cuda_graphs"]:
        # megatron-core's per-layer graphs; GPTConfig.configure_model insists on TE's RNG tracker with them,
        # which the strategy initialises.
        recipe.model.config.enable_cuda_graph = True
        recipe.model.config.use_te_rng_tracker = True
        recipe.trainer.strategy.use_te_rng_tracker = True


class StackError(SftprofError, ValueError):
    """A knob this Python's NeMo stack cannot run."""


def _check_stack(nemo: dict, layer_spec: str) -> None:
    """Refuse, before any training, the `nemo` knobs (config sft.nemo) that `layer_spec` cannot run
    (NEEDS_TRANSFORMER_ENGINE): they would fail mid-run with an assertion from deep inside NeMo."""
    knobs = [knob for knob in NEEDS_TRANSFORMER_ENGINE if nemo.get(knob)] if layer_spec == LOCAL_SPEC else []
    if knobs:
        raise StackError(
            f"sft.nemo.{' and sft.nemo.'.join(knobs)} {'need' if len(knobs) > 1 else 'needs'} Transformer Engine, "
            "which this Python lacks "
            "(megatron-core's local spec runs here); run in the NeMo container, or switch them off"
        )


def built_task(recipe, settings: dict):
    """fdl.build of the recipe: llm.finetune as a functools.partial over built objects. A random
    model keeps its published vocabulary size (NeMo would otherwise size the embedding from the
    tokenizer, 260 byte tokens padded to 384): GPTConfig.configure_model uses a preset
    `vocab_size` attribute when there is one."""
    import fiddle as fdl

    task = fdl.build(recipe)
    if settings["model"]["weights"] == "random":
        task.keywords["model"].config.vocab_size = settings["model"]["vocab_size"]
    return task


def train(model_dir: str | Path, train_jsonl: str | Path, metrics_path: str | Path, sft: dict, window: dict) -> dict:
    """Fine-tune the NeMo checkpoint (or random model folder) at `model_dir` on the splits beside `train_jsonl`."""
    rank = int(os.environ.get("RANK", "0"))
    metrics_path = Path(metrics_path)
    recipe, settings = build_recipe(
        model_dir, train_jsonl, sft, window, dict(os.environ), metrics_path.parent / f"nemo-logs.rank{rank}"
    )
    log.info("NeMo fine-tuning: %s", settings)
    _check_stack(sft["nemo"], settings["layer_spec"])
    task = built_task(recipe, settings)
    task.keywords["trainer"].callbacks.append(
        _step_metrics_callback(metrics_path, rank, settings, sft["grad_accum_steps"])
    )
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
