"""The built-in PyTorch SFT loop: response-masked loss, AdamW, gradient accumulation.

Every step and phase is an NVTX range ("step N", then "data", "forward", "backward",
"optimizer"), so a profile shows where each step's time goes; the analysis reads those names.

The fixes the analysis recommends are switches of `sft` (SWITCHES), so that each can be tried
and measured; the metrics say per step how many positions were computed and how many carried a
loss, and once per run what a FLOPs estimate needs (`run_facts`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from sftprof.capture.data import read_jsonl
from sftprof.capture.sft.annotate import Annotator, CaptureWindow
from sftprof.errors import SftprofError
from sftprof.io import atomic_path

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value that cross-entropy skips
# The `sft` keys only this backend reads (sftprof.capture.sft.backend_settings leaves them out for nemo).
SWITCHES = (
    "padding",
    "pad_to_multiple_of",
    "pin_memory",
    "fused_optimizer",
    "loss_every",
    "compile",
    "ddp_overlap",
    "attention",
    "cuda_alloc_conf",
    "gradient_checkpointing",
    "pad_vocab_to_multiple_of",
)


class SeqLengthError(SftprofError, ValueError):
    """sft.seq_length leaves no response token to learn from."""


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


def count_label_tokens(labels: list[int]) -> int:
    """Tokens that carry a loss. The causal-LM loss predicts each token from the ones before
    it, so the first position never does."""
    return sum(label != IGNORE_INDEX for label in labels[1:])


def encode_examples(tokenizer, rows, seq_length: int) -> list[dict[str, list[int]]]:
    """Encode every row, dropping those whose response seq_length cuts off entirely.

    Such an example adds compute but no loss, and a micro-batch made only of them has a loss of
    0/0 = NaN; dropping them when encoding means no micro-batch can be one. If every example is
    cut, nothing is left to train on: that is an error naming seq_length.
    """
    encoded = [encode_example(tokenizer, row["input"], row["output"], seq_length) for row in rows]
    kept = [example for example in encoded if count_label_tokens(example["labels"])]
    if encoded and not kept:
        raise SeqLengthError(
            f"sft.seq_length={seq_length} cuts off every response token of all {len(encoded)} "
            "training examples; raise seq_length or drop long prompts"
        )
    if len(kept) < len(encoded):
        log.warning(
            "sft.seq_length=%d cuts off every response token of %d of %d training examples: they are left out",
            seq_length,
            len(encoded) - len(kept),
            len(encoded),
        )
    return kept


class MicroBatches:
    """Endless seeded stream of micro-batches drawn from the training examples."""

    def __init__(self, examples: list[dict], batch_size: int, seed: int):
        if not examples:
            raise ValueError("no training examples")
        self._examples, self._batch_size = examples, batch_size
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def next(self) -> list[dict]:
        batch: list[dict] = []
        while len(batch) < self._batch_size:
            if not self._order:
                self._order = list(range(len(self._examples)))
                self._rng.shuffle(self._order)
            batch.append(self._examples[self._order.pop()])
        return batch


@dataclass
class Batch:
    """A micro-batch's tensors on the device, and its token counts, taken on the host (reading
    them from device tensors would make the host wait for the GPU)."""

    tensors: dict
    padded_length: int
    token_slots: int  # rows x padded length: the positions the model computes on
    real_tokens: int  # attention_mask's sum
    label_tokens: int


def padded_length(examples: list[dict], padding: str, multiple: int) -> int:
    """A micro-batch's length: seq_length (every example is encoded to it), or with `longest` its
    longest example rounded up to `multiple`, never beyond seq_length."""
    seq_length = len(examples[0]["input_ids"])
    if padding == "max_length":
        return seq_length
    longest = max(sum(example["attention_mask"]) for example in examples)
    return min(seq_length, -(-longest // multiple) * multiple)


def collate(examples: list[dict], length: int, device: str, pin_memory: bool) -> Batch:
    """Stack encoded examples, cut to `length`, into a micro-batch on `device`.

    Cutting removes right padding only: it sits after every real token, and the causal mask and
    IGNORE_INDEX labels keep it out of the loss, so only the compute changes. pin_memory builds
    the batch in page-locked host memory and copies it asynchronously; a copy from pageable
    memory makes the host wait for the GPU's queue first.
    """
    import torch

    rows = {key: [example[key][:length] for example in examples] for key in examples[0]}
    if pin_memory:
        tensors = {key: torch.tensor(value).pin_memory().to(device, non_blocking=True) for key, value in rows.items()}
    else:
        tensors = {key: torch.tensor(value, device=device) for key, value in rows.items()}
    return Batch(
        tensors,
        padded_length=length,
        token_slots=len(examples) * length,
        real_tokens=sum(map(sum, rows["attention_mask"])),
        label_tokens=sum(map(count_label_tokens, rows["labels"])),
    )


class StepClock:
    """Wall time of each step, measured without making the host wait for the GPU.

    On CUDA, perf_counter around a step would time only the host's enqueueing; a sync per step
    would time it right but add the very wait that `loss_every` removes. So each step's start
    and end are CUDA events on the current stream: an event's time is when the GPU got through
    everything queued before it, so the interval between them is the step's time whether the GPU
    or the host is the bottleneck. Events are read only at a loss read or at the end (`durations`),
    where the GPU has just been waited for. On CPU, work runs as it is called: perf_counter.
    """

    def __init__(self, device: str):
        self._cuda = device.startswith("cuda")
        self._started = None
        self._pending: list[tuple] = []

    def _now(self):
        if not self._cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._started = self._now()

    def stop(self) -> None:
        self._pending.append((self._started, self._now()))

    def durations(self) -> list[float]:
        """Seconds of each step stopped since the last call, in order."""
        pending, self._pending = self._pending, []
        if not self._cuda:
            return [end - start for start, end in pending]
        if pending:
            pending[-1][1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pending]


@dataclass
class StepRecord:
    """What a step's metrics line holds before its time is known."""

    step: int
    loss: float | None
    in_window: bool
    padded_lengths: list[int] = field(default_factory=list)
    token_slots: int = 0
    real_tokens: int = 0
    label_tokens: int = 0

    def add(self, batch: Batch) -> None:
        self.padded_lengths.append(batch.padded_length)
        self.token_slots += batch.token_slots
        self.real_tokens += batch.real_tokens
        self.label_tokens += batch.label_tokens

    def line(self, rank: int, step_time: float) -> dict:
        """The metrics line: the keys up to in_window are its original form (`tokens` is real_tokens
        under its old name, which the report reads), the rest are for MFU and padding."""
        return {
            "step": self.step,
            "rank": rank,
            "loss": self.loss,
            "step_time_s": step_time,
            "tokens": self.real_tokens,
            "tokens_per_s": self.real_tokens / step_time,
            "in_window": self.in_window,
            "token_slots": self.token_slots,
            "real_tokens": self.real_tokens,
            "label_tokens": self.label_tokens,
            "padded_lengths": self.padded_lengths,
        }


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_facts(model, sft: dict, device: str, optimizer, pin_memory: bool, distributed: bool = False) -> dict:
    """What the run computed with, for an MFU estimate: model FLOPs per token are about
    6 x parameters (less the embedding lookup) plus 12 x num_layers x hidden_size x padded length.
    Switches are as they took effect (pin_memory is off on CPU)."""
    config = model.config
    weights = next(model.parameters())
    return {
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "weight_dtype": str(weights.dtype).removeprefix("torch."),
        "precision": "bfloat16" if sft["precision"] == "bf16" else None,  # the autocast dtype (bf16-true: none)
        "model": {
            "architecture": type(model).__name__,
            "num_layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_heads": config.num_attention_heads,
            "num_kv_heads": config.num_key_value_heads,
            "vocab_size": config.vocab_size,
            "seq_length": sft["seq_length"],
            "embedding_parameters": model.get_input_embeddings().weight.numel(),
        },
        "padding": sft["padding"],
        "pad_to_multiple_of": sft["pad_to_multiple_of"],
        "pin_memory": pin_memory,
        "fused_optimizer": bool(optimizer.defaults["fused"]),
        "loss_every": sft["loss_every"],
        "compile": sft["compile"],
        "ddp_overlap": sft["ddp_overlap"] if distributed else None,  # None: one rank, nothing to all-reduce
        "attention": sft["attention"],
        "cuda_alloc_conf": sft["cuda_alloc_conf"],
        "gradient_checkpointing": sft["gradient_checkpointing"],
        "pad_vocab_to_multiple_of": sft["pad_vocab_to_multiple_of"],
        "device_name": device_name(device),
    }


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("sft.device is cuda but torch sees no CUDA device")
    return requested


def _data_parallel(model, device: str):
    """With WORLD_SIZE > 1 (set per Slurm task by sftprof.capture.rank), wrap the model for data
    parallelism over gloo (CPU) or NCCL (GPU); otherwise return it as it is."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return model
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return DistributedDataParallel(model)


# DDP's default bucket (DistributedDataParallel's bucket_cap_mb=25): with sft.ddp_overlap off the
# gradients travel in buckets of the same size, so only when they travel changes.
GRADIENT_BUCKET_BYTES = 25 * 1024 * 1024


def all_reduce_gradients(model, bucket_bytes: int = GRADIENT_BUCKET_BYTES) -> int:
    """Average every gradient over the ranks, after the backward pass, in buckets of about
    `bucket_bytes` (last parameters first, as DDP orders them); return the number of all-reduces."""
    import torch
    import torch.distributed as dist

    world_size = dist.get_world_size()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    buckets: list[list] = [[]]
    size = 0
    for gradient in reversed(gradients):
        if size >= bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(gradient)
        size += gradient.numel() * gradient.element_size()
    for bucket in filter(None, buckets):
        flat = torch.cat([gradient.reshape(-1) for gradient in bucket])
        dist.all_reduce(flat)  # a sum: gloo has no average
        flat.div_(world_size)
        for gradient, reduced in zip(bucket, flat.split([gradient.numel() for gradient in bucket])):
            gradient.copy_(reduced.view_as(gradient))
    return sum(1 for bucket in buckets if bucket)


def train(model_dir: str | Path, train_jsonl: str | Path, metrics_path: str | Path, sft: dict, window: dict) -> dict:
    """Run `sft["steps"]` optimizer steps; write one JSON line per step to `metrics_path`, the
    first with the run's facts under `run`.

    Weights (and so gradients and optimizer state) are float32 whatever dtype the checkpoint was
    saved in, and precision bf16 adds bf16 autocast; bf16-true casts the weights to bf16 once, before the
    optimizer is made (no autocast). The loss is read from the device every
    `loss_every` steps and at the last step; other steps' lines say "loss": null. Lines are
    written when the loss is read, as that is when their step times are known (StepClock).
    """
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from sftprof.capture.model import load_model

    if sft["cuda_alloc_conf"]:  # read by the caching allocator at its first allocation, so set before any
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = sft["cuda_alloc_conf"]
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") not in ("", "0"):
        log.warning("PYTORCH_NO_CUDA_MEMORY_CACHING is set: every tensor is a cudaMalloc and cudaFree")
    if os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
        log.warning("CUDA_LAUNCH_BLOCKING is set: every kernel launch waits for its kernel to finish")
    rank = int(os.environ.get("RANK", "0"))
    device = resolve_device(sft["device"])
    if device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
        torch.cuda.set_device(device)
    device_type = device.split(":")[0]
    if sft["num_threads"]:
        torch.set_num_threads(sft["num_threads"])
    torch.manual_seed(sft["seed"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_model(
        model_dir, device, sft["seed"], sft["attention"]
    )  # float32; `random` folders are initialised on the device
    if sft["precision"] == "bf16-true":  # weights, gradients and AdamW's state in bf16: nothing cast per step
        model.to(torch.bfloat16)
    model.train()
    if sft["pad_vocab_to_multiple_of"]:  # rows no token uses, so the LM head's GEMMs stay on aligned kernels
        model.resize_token_embeddings(pad_to_multiple_of=sft["pad_vocab_to_multiple_of"], mean_resizing=False)
    if sft["gradient_checkpointing"]:  # each layer's forward run again in the backward pass, from autograd's thread
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trained = _data_parallel(model, device)
    if sft["compile"]:
        trained = torch.compile(trained)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=sft["learning_rate"],
        weight_decay=sft["weight_decay"],
        fused=sft["fused_optimizer"] or None,
    )
    pin_memory = sft["pin_memory"] and device_type == "cuda"
    if sft["pin_memory"] and not pin_memory:
        log.info("sft.pin_memory is ignored on %s: it speeds up copies from host to GPU only", device)
    examples = encode_examples(tokenizer, read_jsonl(train_jsonl), sft["seq_length"])
    # Each rank draws its own micro-batches: data parallelism over one shuffled dataset.
    batches = MicroBatches(examples, sft["micro_batch_size"], sft["seed"] + rank)
    annotator = Annotator(on_cuda=device_type == "cuda")
    capture = CaptureWindow(
        window["capture_range"],
        window.get("start_step"),
        window.get("end_step"),
        annotator,
        op_ranges=window.get("op_ranges", False),
    )
    use_bf16 = sft["precision"] == "bf16"
    clock = StepClock(device)
    facts = run_facts(model, sft, device, optimizer, pin_memory, distributed=dist.is_initialized())
    log.info(
        "rank %d training on %s, NVTX via %s, %d examples; run: %s",
        rank,
        device,
        annotator.route,
        len(examples),
        json.dumps(facts),
    )

    with atomic_path(metrics_path) as partial, open(partial, "w") as metrics:
        pending: list[StepRecord] = []
        last_step = sft["steps"] - 1
        for step in range(sft["steps"]):
            capture.before_step(step)
            clock.start()
            read_loss = (step + 1) % sft["loss_every"] == 0 or step == last_step
            record = StepRecord(step, loss=None, in_window=capture.contains(step))
            micro_losses = []
            with annotator.range(f"step {step}"):
                for micro in range(sft["grad_accum_steps"]):
                    # Gradients are all-reduced once per step, on its last micro-batch: during its
                    # backward pass (DDP), or after it with ddp_overlap off.
                    last = micro == sft["grad_accum_steps"] - 1
                    reduce_in_backward = last and sft["ddp_overlap"]
                    sync = (
                        contextlib.nullcontext()
                        if reduce_in_backward or not hasattr(trained, "no_sync")
                        else trained.no_sync()
                    )
                    with annotator.range("data"):
                        drawn = batches.next()
                        length = padded_length(drawn, sft["padding"], sft["pad_to_multiple_of"])
                        batch = collate(drawn, length, device, pin_memory)
                    with sync:
                        with annotator.range("forward"), torch.autocast(device_type, torch.bfloat16, enabled=use_bf16):
                            loss = trained(**batch.tensors).loss / sft["grad_accum_steps"]
                        with annotator.range("backward"):
                            loss.backward()
                            if last and not sft["ddp_overlap"] and dist.is_initialized():
                                all_reduce_gradients(model)
                    record.add(batch)
                    micro_losses.append(loss.detach())
                with annotator.range("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if read_loss:  # the host waits here for the GPU to finish the step
                    record.loss = round(float(torch.stack(micro_losses).sum()), 6)
            clock.stop()
            capture.after_step(step)
            pending.append(record)
            if read_loss:
                for done, step_time in zip(pending, clock.durations()):
                    line = done.line(rank, step_time)
                    if done.step == 0:
                        line["run"] = facts
                    metrics.write(json.dumps(line) + "\n")
                    log.info("step %d loss %s %.3fs %.0f tok/s", done.step, done.loss, step_time, line["tokens_per_s"])
                metrics.flush()
                pending = []
    if dist.is_initialized():
        # DDP's Reducer goes first, while the group is still registered: freed from the Reducer
        # (with the GIL held), the gloo group's destructor joins a worker thread that may need
        # the GIL to free its last all-reduce, and the rank hangs at exit (seen under load, 1
        # run in 11 on 2 cores). Freed by destroy_process_group, the group lets go of the GIL.
        del trained, loss
        if sft["compile"]:
            torch._dynamo.reset()  # its caches hold the compiled module
        gc.collect()
        dist.destroy_process_group()
    return {"device": device, "rank": rank, "nvtx_route": annotator.route, "steps": sft["steps"]}
