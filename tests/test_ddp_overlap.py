"""The built-in trainer's data parallelism on two real gloo processes: sft.ddp_overlap off all-reduces
the same gradients as DDP's overlapped buckets, rank by rank, and the trainer ends without the exit
hang that a process group freed from DDP's Reducer can cause."""

from __future__ import annotations

import copy
import gc
import os
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
    del overlapped, after  # before the group: see test_trainer_frees_ddp_before_its_process_group
    gc.collect()
    dist.destroy_process_group()


def _two_ranks(target, *args, timeout: float) -> list:
    """Run `target(rank, port, *args, results)` as ranks 0 and 1 in spawned processes; what each put in
    `results`, by rank, once both have exited cleanly."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [context.Process(target=target, args=(rank, port, *args, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got = sorted(results.get(timeout=timeout) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return got


def test_gradients_reduced_after_backward_equal_ddps_on_every_rank():
    got = _two_ranks(_rank, timeout=120)
    (_, buckets0, ddp0, after0), (_, buckets1, ddp1, after1) = got
    assert buckets0 == buckets1 == 2
    for ddp, after in ((ddp0, after0), (ddp1, after1)):
        for expected, actual in zip(ddp, after):
            torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected))
    # averaged, so both ranks hold the same gradients, and neither holds only its own
    for mine, theirs in zip(after0, after1):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs))


def _train_rank(rank: int, port: int, folder: str, settings: dict, results) -> None:
    """Train as rank `rank` of 2, recording which DDP wrappers are still alive when the trainer
    destroys the process group."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sftprof.capture.sft.torch_backend import train

    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    destroy = dist.destroy_process_group
    alive: list[int] = []

    def recording_destroy(*args, **kwargs):
        alive.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    dist.destroy_process_group = recording_destroy
    done = train(
        f"{folder}/model", f"{folder}/training.jsonl", f"{folder}/rank{rank}.jsonl", settings, {"capture_range": "none"}
    )
    results.put((rank, done["steps"], alive))


@pytest.mark.ci_sample(1)
@pytest.mark.parametrize("ddp_overlap", [True, False])
def test_trainer_frees_ddp_before_its_process_group(tmp_path, ddp_overlap):
    """Freed last by DDP's Reducer, with the GIL held, a gloo group's destructor can wait on a worker
    thread that waits for the GIL (a rank hung at exit in CI): the trainer must free DDP first."""
    from sftprof.capture import config
    from sftprof.capture.data import generate_sample, to_sft_example, write_jsonl
    from sftprof.capture.model import create_tiny_llama

    from conftest import SMALL_DEMO

    experiment = config.validate(copy.deepcopy(SMALL_DEMO))["experiments"]["demo"]
    create_tiny_llama(experiment["model"], tmp_path / "model")
    write_jsonl(tmp_path / "training.jsonl", [to_sft_example(record) for record in generate_sample(16, seed=0)])
    settings = {**experiment["sft"], "steps": 2, "seq_length": 128, "num_threads": 1, "ddp_overlap": ddp_overlap}
    got = _two_ranks(_train_rank, str(tmp_path), settings, timeout=180)
    assert got == [(0, 2, [0]), (1, 2, [0])]
