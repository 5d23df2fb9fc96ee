"""The built-in PyTorch SFT loop: response-masked loss, AdamW, gradient accumulation.

Every step and phase is an NVTX range ("step N", then "data", "forward", "backward",
"optimizer"), so a profile shows where each step's time goes; the analysis reads those names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
from pathlib import Path

from sftprof.data import read_jsonl
from sftprof.io import atomic_path
from sftprof.sft.annotate import Annotator, CaptureWindow

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value that cross-entropy skips


def encode_example(tokenizer, prompt: str, response: str, seq_length: int) -> dict[str, list[int]]:
    """Token ids and labels for one example; only response (and EOS) tokens carry a label."""
    prompt_ids = [tokenizer.bos_token_id] + tokenizer.encode(prompt, add_special_tokens=False)
    response_ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
    input_ids = (prompt_ids + response_ids)[:seq_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + response_ids)[:seq_length]
    padding = seq_length - len(input_ids)
    return {
        "input_ids": input_ids + [tokenizer.pad_token_id] * padding,
        "labels": labels + [IGNORE_INDEX] * padding,
        "attention_mask": [1] * len(input_ids) + [0] * padding,
    }


class MicroBatches:
    """Endless seeded stream of micro-batches drawn from the training examples."""

    def __init__(self, examples: list[dict], batch_size: int, seed: int):
        if not examples:
            raise ValueError("no training examples")
        self._examples, self._batch_size = examples, batch_size
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def next(self) -> list[dict]:
        batch = []
        while len(batch) < self._batch_size:
            if not self._order:
                self._order = list(range(len(self._examples)))
                self._rng.shuffle(self._order)
            batch.append(self._examples[self._order.pop()])
        return batch


def _collate(batch: list[dict], device):
    import torch

    return {key: torch.tensor([ex[key] for ex in batch], device=device) for key in batch[0]}


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("sft.device is cuda but torch sees no CUDA device")
    return requested


def _data_parallel(model, device: str):
    """With WORLD_SIZE > 1 (set per Slurm task by sftprof.rank), wrap the model for data
    parallelism over gloo (CPU) or NCCL (GPU); otherwise return it as it is."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return model
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistributedDataParallel(model)


def train(model_dir: str | Path, train_jsonl: str | Path, metrics_path: str | Path,
          sft: dict, window: dict) -> dict:
    """Run `sft["steps"]` optimizer steps; write one JSON line per step to `metrics_path`."""
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer, LlamaForCausalLM

    rank = int(os.environ.get("RANK", "0"))
    device = resolve_device(sft["device"])
    if device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(device)
    if sft["num_threads"]:
        torch.set_num_threads(sft["num_threads"])
    torch.manual_seed(sft["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = _data_parallel(LlamaForCausalLM.from_pretrained(model_dir).to(device), device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft["learning_rate"], weight_decay=sft["weight_decay"])
    examples = [encode_example(tokenizer, row["input"], row["output"], sft["seq_length"])
                for row in read_jsonl(train_jsonl)]
    # Each rank draws its own micro-batches: data parallelism over one shuffled dataset.
    batches = MicroBatches(examples, sft["micro_batch_size"], sft["seed"] + rank)
    device_type = device.split(":")[0]
    annotator = Annotator(on_cuda=device_type == "cuda")
    capture = CaptureWindow(window["capture_range"], window.get("start_step"), window.get("end_step"), annotator)
    use_bf16 = sft["precision"] == "bf16"
    log.info("rank %d training on %s, NVTX via %s, %d examples", rank, device, annotator.route, len(examples))

    with atomic_path(metrics_path) as partial, open(partial, "w") as metrics:
        for step in range(sft["steps"]):
            capture.before_step(step)
            started = time.perf_counter()
            tokens, loss_sum = 0, 0.0
            with annotator.range(f"step {step}"):
                for micro in range(sft["grad_accum_steps"]):
                    # Gradients are all-reduced once per step, on its last micro-batch.
                    last = micro == sft["grad_accum_steps"] - 1
                    sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
                    with annotator.range("data"):
                        batch = _collate(batches.next(), device)
                    with sync:
                        with annotator.range("forward"), torch.autocast(device_type, torch.bfloat16,
                                                                         enabled=use_bf16):
                            loss = model(**batch).loss / sft["grad_accum_steps"]
                        with annotator.range("backward"):
                            loss.backward()
                    tokens += int(batch["attention_mask"].sum())
                    loss_sum += float(loss.detach())
                with annotator.range("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            step_time = time.perf_counter() - started
            capture.after_step(step)
            record = {"step": step, "rank": rank, "loss": round(loss_sum, 6), "step_time_s": step_time, "tokens": tokens,
                      "tokens_per_s": tokens / step_time, "in_window": capture.contains(step)}
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()
            log.info("step %d loss %.4f %.3fs %.0f tok/s", step, loss_sum, step_time, tokens / step_time)
    if dist.is_initialized():
        dist.destroy_process_group()
    return {"device": device, "rank": rank, "nvtx_route": annotator.route, "steps": sft["steps"]}
