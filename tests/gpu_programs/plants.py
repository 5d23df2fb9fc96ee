"""Training loops that each plant one known GPU performance problem, for real captures.

Run on a CUDA machine under `nsys profile --capture-range=cudaProfilerApi`: steps
WINDOW_START..WINDOW_END are captured. The analysis must name each planted problem and raise
none of them on `clean`. The committed fixtures tests/fixtures/h200_plant_*.sqlite were made
with this file (see tests/fixtures/README.md).

  clean         pinned host batches copied with non_blocking=True, no host syncs
  sync_memcpy   a synchronous cudaMemcpy (the C API, through ctypes) of the logits every micro-step
  pageable      the batch copied from pageable host memory with non_blocking=True
  device_sync   cudaDeviceSynchronize (torch.cuda.synchronize) after every micro-step
  cpu_starved   a 30 ms sleep inside the data range of every micro-step: the GPU waits for input
  elementwise   a model of elementwise ops over large tensors (memory-bound)
  gemm          a model of large bf16 matrix multiplications (compute-bound)
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import time

import torch

from sftprof.capture.sft.annotate import Annotator, CaptureWindow

PLANTS = ("clean", "sync_memcpy", "pageable", "device_sync", "cpu_starved", "elementwise", "gemm")
STEPS, WINDOW_START, WINDOW_END, ACCUM = 6, 3, 4, 2
BATCH, SEQ, VOCAB = 8, 512, 8192
CUDA_MEMCPY_DEVICE_TO_HOST = 2


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime torch loaded, to call cudaMemcpy itself (torch only issues async copies)."""
    torch.cuda.init()
    candidates = sorted(
        glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*"))
    ) + ["libcudart.so"]
    for name in candidates:
        try:
            library = ctypes.CDLL(name)
            library.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            return library
        except (OSError, AttributeError):
            continue
    raise RuntimeError("libcudart not found")


def build_model(plant: str) -> torch.nn.Module:
    if plant == "gemm":
        return torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(8)])
    if plant == "elementwise":

        class Elementwise(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = torch.nn.Parameter(torch.ones(4096))

            def forward(self, x):
                for _ in range(24):
                    x = torch.nn.functional.gelu(x * self.scale + 0.5) - x * 0.25
                return x

        return Elementwise()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


def host_batch(plant: str) -> torch.Tensor:
    if plant in ("gemm", "elementwise"):
        data = torch.randn(BATCH * SEQ, 4096)
    else:
        data = torch.randint(0, VOCAB, (BATCH, SEQ))
    return data if plant == "pageable" else data.pin_memory()


def loss_of(plant: str, model: torch.nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if plant in ("gemm", "elementwise"):
        out = model(batch)
        return out.float().pow(2).mean(), out
    out = model(input_ids=batch, labels=batch)
    return out.loss, out.logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plant", choices=PLANTS)
    plant = parser.parse_args().plant
    torch.manual_seed(0)
    model = build_model(plant).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    annotator = Annotator(on_cuda=True)
    window = CaptureWindow("cudaProfilerApi", WINDOW_START, WINDOW_END, annotator)
    cudart = _cudart() if plant == "sync_memcpy" else None
    for step in range(STEPS):
        window.before_step(step)
        started = time.perf_counter()
        with annotator.range(f"step {step}"):
            for _ in range(ACCUM):
                with annotator.range("data"):
                    if plant == "cpu_starved":
                        time.sleep(0.03)
                    batch = host_batch(plant).to("cuda", non_blocking=True)
                with annotator.range("forward"), torch.autocast("cuda", torch.bfloat16):
                    loss, out = loss_of(plant, model, batch)
                with annotator.range("backward"):
                    (loss / ACCUM).backward()
                if plant == "sync_memcpy":
                    host = torch.empty(out.shape, dtype=out.dtype)
                    cudart.cudaMemcpy(
                        host.data_ptr(), out.data_ptr(), out.numel() * out.element_size(), CUDA_MEMCPY_DEVICE_TO_HOST
                    )
                if plant == "device_sync":
                    torch.cuda.synchronize()
            with annotator.range("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        # Host time only: a synchronize here to time the GPU would itself be a planted sync.
        print(f"{plant} step {step}: {1e3 * (time.perf_counter() - started):.1f} ms on the host", flush=True)
        window.after_step(step)


if __name__ == "__main__":
    main()
