"""A PyTorch profiler (Kineto) trace of plants.py's clean loop, two steps, on a CUDA machine:
`PYTHONPATH=. OUT=DIR python3 tests/gpu_programs/kineto_trace.py` writes
DIR/h200_plant_clean.pt.trace.json.gz, with record_function ranges where plants.py has NVTX."""

import gzip
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import plants  # noqa: E402

model = plants.build_model("clean").cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def step(index: int) -> None:
    with torch.profiler.record_function(f"step {index}"):
        for _ in range(plants.ACCUM):
            with torch.profiler.record_function("data"):
                batch = plants.host_batch("clean").to("cuda", non_blocking=True)
            with torch.profiler.record_function("forward"), torch.autocast("cuda", torch.bfloat16):
                loss, _ = plants.loss_of("clean", model, batch)
            with torch.profiler.record_function("backward"):
                (loss / plants.ACCUM).backward()
        with torch.profiler.record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


for warmup in range(plants.WINDOW_START):
    step(warmup)
torch.cuda.synchronize()
activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=activities) as profiler:
    for index in range(plants.WINDOW_START, plants.WINDOW_END + 1):
        step(index)
    torch.cuda.synchronize()
trace = os.path.join(os.environ["OUT"], "h200_plant_clean.pt.trace.json")
profiler.export_chrome_trace(trace)
with open(trace, "rb") as plain, gzip.open(trace + ".gz", "wb") as packed:
    shutil.copyfileobj(plain, packed)
os.remove(trace)
