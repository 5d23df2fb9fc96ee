"""NCCL all-reduce bandwidth between the GPUs of one machine, measured with PyTorch, as nccl-tests'
all_reduce_perf reports it: algorithm bandwidth (bytes / time) and bus bandwidth (algbw x 2(n-1)/n).
The yardstick for the bus bandwidth the cross-rank analysis estimates from a capture (docs/RANKS.md).

    python tests/gpu_programs/allreduce_bandwidth.py [GPUS]      (default: every GPU)

One process a GPU, float32 sums, 5 warm-ups then 20 timed all-reduces per size (CUDA events, the mean);
25 MiB is DDP's default bucket. Prints one tab-separated line per size.
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist

MiB = 1 << 20
SIZES = [1 * MiB, 4 * MiB, 25 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB, 4096 * MiB]
WARMUP, TIMED = 5, 20


def run(rank: int, world: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if rank == 0:
        print("bytes\tmean_us\talgbw_GBps\tbusbw_GBps", flush=True)
    for size in SIZES:
        data = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(data)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(TIMED):
            dist.all_reduce(data)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / TIMED
        algbw = size / seconds / 1e9
        if rank == 0:
            print(f"{size}\t{seconds * 1e6:.1f}\t{algbw:.1f}\t{algbw * 2 * (world - 1) / world:.1f}", flush=True)
        del data
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(run, args=(world, port), nprocs=world)
