"""Build sftprof's NeMo recipe with real NeMo 2.2.1 code and print what was exercised as JSON.

Run with an interpreter that has nemo_toolkit 2.2.1, megatron-core and nemo_run (.nemo-venv here,
the carried site dir on the GPU machine): `python tests/gpu_programs/nemo_recipe_build.py WORKDIR`.
On a machine without CUDA the trainer is built with accelerator="cpu" (the recipe's "gpu" needs a
GPU); everything else is built as train() builds it. tests/test_nemo_recipe.py runs it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ROWS = [{"input": f"Question {i}: what is {i} plus {i}?", "output": f"It is {2 * i}."} for i in range(24)]


# Each run: (peft, the sft.nemo knobs set, micro_batch_size, the window's op_ranges); `knobs` turns on every knob
# a suggested variant may set, with two examples a micro-batch, which packing turns into one pack of two seq_lengths.
KNOBS = {"packed_sequence": True, "cuda_graphs": True, "overlap_grad_reduce": True, "overlap_param_gather": True}
RUNS = {
    "lora": ("lora", {}, 1, False),
    "lora_ops": ("lora", {}, 1, True),  # NsysCallback (emit_nvtx) opens the window
    "none": ("none", {}, 1, False),
    "knobs": ("none", KNOBS, 2, False),
}


def sft_settings(peft: str, knobs: dict, micro_batch_size: int) -> dict:
    return {
        "backend": "nemo",
        "device": "cuda",
        "steps": 4,
        "micro_batch_size": micro_batch_size,
        "grad_accum_steps": 2,
        "seq_length": 128,
        "learning_rate": 1e-4,
        "precision": "bf16",
        "weight_decay": 0.01,
        "seed": 0,
        "num_threads": 0,
        "nemo": {
            "recipe": "llama2_7b",
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "precision": "bf16-mixed",
            "peft": peft,
            **{knob: False for knob in KNOBS},
            **knobs,
        },
    }


def main(workdir: str) -> int:
    import fiddle as fdl
    import torch

    from sftprof.capture import model as sftprof_model
    from sftprof.capture.sft import nemo_backend

    work = Path(workdir)
    model_dir = work / "model"
    sftprof_model.create_random_model({"architecture": "llama2-7b", "seed": 0}, model_dir)
    data = work / "sft"
    data.mkdir(parents=True, exist_ok=True)
    for split in ("training", "validation", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    report = {"cuda": torch.cuda.is_available(), "runs": {}}
    for name, (peft, knobs, micro_batch_size, op_ranges) in RUNS.items():
        recipe, settings = nemo_backend.build_recipe(
            model_dir,
            data / "training.jsonl",
            sft_settings(peft, knobs, micro_batch_size),
            {"capture_range": "cudaProfilerApi", "start_step": 1, "end_step": 2, "op_ranges": op_ranges},
            {"WORLD_SIZE": "1"},
            work / name,
        )
        if not torch.cuda.is_available():
            recipe.trainer.accelerator = "cpu"
        trainer = fdl.build(recipe.trainer)
        task = nemo_backend.built_task(recipe, settings)
        model, data_module = task.keywords["model"], task.keywords["data"]
        config = model.config
        data_module.tokenizer = model.tokenizer  # what llm.finetune's tokenizer="model" does
        if data_module.packed_sequence_size > 0:  # packs the split for real, as llm.finetune's setup does
            data_module.prepare_data()
            dataset = data_module._create_dataset(
                data_module.train_path_packed,
                pack_metadata_path=data_module.pack_metadata,
                **data_module.dataset_kwargs,
            )
            batch = dataset.collate_fn([dataset[0]])
        else:
            dataset = data_module._create_dataset(data_module.train_path, **data_module.dataset_kwargs)
            batch = dataset.collate_fn([dataset[0], dataset[1]])
        ddp = trainer.strategy.ddp_config
        specs = data_module.packed_sequence_specs
        nsys = [cb for cb in trainer.callbacks if type(cb).__name__ == "NsysCallback"]
        report["runs"][name] = {
            "task": getattr(task.func, "__qualname__", str(task.func)),
            "task_keywords": sorted(task.keywords),
            "trainer": type(trainer).__name__,
            "strategy": type(trainer.strategy).__name__,
            "tensor_parallel": trainer.strategy.tensor_model_parallel_size,
            "max_steps": trainer.max_steps,
            "limit_val_batches": trainer.limit_val_batches,
            "precision_plugin": type(trainer.strategy.precision_plugin).__name__
            if trainer.strategy.precision_plugin
            else None,
            "precision": getattr(trainer.strategy.precision_plugin, "precision", None),
            "nsys_callback": [
                {
                    "start": cb._nsys_profile_start_step,
                    "end": cb._nsys_profile_end_step,
                    "ranks": cb._nsys_profile_ranks,
                }
                for cb in nsys
            ],
            "model": type(model).__name__,
            "config": type(config).__name__,
            "config_fields": {
                key: getattr(config, key)
                for key in (
                    "num_layers",
                    "hidden_size",
                    "ffn_hidden_size",
                    "num_attention_heads",
                    "seq_length",
                    "vocab_size",
                    "cross_entropy_loss_fusion",
                    "apply_rope_fusion",
                    "masked_softmax_fusion",
                    "persist_layer_norm",
                    "enable_cuda_graph",
                    "use_te_rng_tracker",
                )
            },
            "strategy_te_rng_tracker": trainer.strategy.use_te_rng_tracker,
            "overlap_grad_reduce": ddp.overlap_grad_reduce,
            "overlap_param_gather": ddp.overlap_param_gather,
            "packed_sequence_size": data_module.packed_sequence_size,
            "pad_cu_seqlens": specs.pad_cu_seqlens if specs else None,
            "layer_spec": settings["layer_spec"],
            "tokenizer": type(model.tokenizer).__name__,
            "tokenizer_vocab": model.tokenizer.vocab_size,
            "data": type(data_module).__name__,
            "global_batch_size": data_module.global_batch_size,
            "micro_batch_size": data_module.micro_batch_size,
            "batch_keys": sorted(batch),
            "batch_tokens_shape": list(batch["tokens"].shape),
            "peft": type(task.keywords.get("peft")).__name__ if task.keywords.get("peft") is not None else None,
            "resume": task.keywords.get("resume"),
            "optim": type(task.keywords["optim"]).__name__,
            "lr": task.keywords["optim"].config.lr,
            "log_ckpt": task.keywords["log"].ckpt,
        }
    print("NEMO_RECIPE " + json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
