"""sft.ddp_overlap off: the gradients all-reduced after the backward pass equal what DDP's overlapped buckets
give, rank by rank, on two real gloo processes."""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))


def _rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sftprof.capture.sft.torch_backend import all_reduce_gradients

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(100 + rank)  # each rank its own batches
    batches = [torch.randn(4, 16) for _ in range(2)]
    overlapped = DistributedDataParallel(_model())
    with overlapped.no_sync():
        overlapped(batches[0]).square().sum().backward()
    overlapped(batches[1]).square().sum().backward()  # DDP reduces during this backward
    after = DistributedDataParallel(_model())
    for batch in batches:
        with after.no_sync():
            after(batch).square().sum().backward()
    # 600 bytes a bucket: the 8x32 weight (1 KiB) fills one, the rest another
    buckets = all_reduce_gradients(after.module, bucket_bytes=600)
    results.put(  # plain lists: tensors would travel as shared memory the exiting process takes along
        (
            rank,
            buckets,
            [p.grad.tolist() for p in overlapped.module.parameters()],
            [p.grad.tolist() for p in after.module.parameters()],
        )
    )
    dist.destroy_process_group()


def test_gradients_reduced_after_backward_equal_ddps_on_every_rank():
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_rank, args=(rank, port, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got = sorted(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    (_, buckets0, ddp0, after0), (_, buckets1, ddp1, after1) = got
    assert buckets0 == buckets1 == 2
    for ddp, after in ((ddp0, after0), (ddp1, after1)):
        for expected, actual in zip(ddp, after):
            torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected))
    # averaged, so both ranks hold the same gradients, and neither holds only its own
    for mine, theirs in zip(after0, after1):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs))
