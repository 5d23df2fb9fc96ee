"""PyTorch profiler (Kineto) traces: a real CPU capture of the SFT loop, a GPU snippet in Kineto's
documented format, and damaged files.

Regenerate the committed fixture with: .venv/bin/python tests/test_kineto.py
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sftprof.analysis import analyze
from sftprof.cli import main as sftprof_main
from sftprof.report import RankReport, render_html
from sftprof.trace import load_trace
from sftprof.trace.kineto import kernel_short_name
from sftprof.trace.nsys.nsys_sqlite import TraceFormatError

FIXTURES = Path(__file__).parent / "fixtures"
CPU_FIXTURE = FIXTURES / "cpu_tiny_llama.pt.trace.json.gz"
NSYS_FIXTURE = FIXTURES / "h200_tiny_llama_bf16.sqlite"
SFTPROF = str(Path(sys.executable).with_name("sftprof"))

# The fixture's run: step 0 warms up outside the profiler, steps 1-3 are profiled.
FIXTURE_STEPS = range(4)
FIXTURE_PROFILED = range(1, 4)
GRAD_ACCUM_STEPS = 2


def profile_sft_steps(
    trace_path: Path | None,
    steps=FIXTURE_STEPS,
    profiled=FIXTURE_PROFILED,
    grad_accum_steps: int = GRAD_ACCUM_STEPS,
    trace_dir: Path | None = None,
):
    """The built-in trainer's loop (sftprof.capture.sft.torch_backend) on a tiny Llama, on CPU, with every step
    and phase a `record_function` range instead of an NVTX range; only `profiled` steps run under
    torch.profiler. Writes with export_chrome_trace(trace_path) or tensorboard_trace_handler(trace_dir).
    Returns the profiler, whose own event list is the reference the loader is checked against."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler
    from transformers import LlamaConfig, LlamaForCausalLM

    from sftprof.capture.data import generate_sample, to_sft_example
    from sftprof.capture.model import SPECIAL_TOKENS, build_byte_tokenizer
    from sftprof.capture.sft.torch_backend import MicroBatches, encode_example

    torch.manual_seed(0)
    tokenizer = build_byte_tokenizer()
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            pad_token_id=SPECIAL_TOKENS["<pad>"],
            bos_token_id=SPECIAL_TOKENS["<s>"],
            eos_token_id=SPECIAL_TOKENS["</s>"],
        )
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    examples = [
        encode_example(tokenizer, ex["input"], ex["output"], 64)
        for ex in map(to_sft_example, generate_sample(16, seed=0))
    ]
    batches = MicroBatches(examples, batch_size=2, seed=0)

    def train_step(step: int) -> None:
        with record_function(f"step {step}"):
            for _ in range(grad_accum_steps):
                with record_function("data"):
                    batch = {k: torch.tensor([ex[k] for ex in batches.next()]) for k in examples[0]}
                with record_function("forward"):
                    loss = model(**batch).loss / grad_accum_steps
                with record_function("backward"):
                    loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    handler = tensorboard_trace_handler(str(trace_dir), use_gzip=True) if trace_dir else None
    # One intra-op thread: a tiny model's ops run faster without, most of all on a busy small machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in steps:
            if step == profiled[0]:
                profiler = profile(activities=[ProfilerActivity.CPU], on_trace_ready=handler)
                profiler.__enter__()
            train_step(step)
            if step == profiled[-1]:
                profiler.__exit__(None, None, None)
    finally:
        torch.set_num_threads(threads)
    if trace_path is not None:
        profiler.export_chrome_trace(str(trace_path))
    return profiler


@pytest.fixture(scope="module")
def fresh_capture(tmp_path_factory):
    """A capture taken now, written the way training scripts usually do (tensorboard_trace_handler)."""
    trace_dir = tmp_path_factory.mktemp("kineto")
    profiler = profile_sft_steps(None, trace_dir=trace_dir)
    [trace] = trace_dir.glob("*.pt.trace.json.gz")
    return trace, profiler


def test_fresh_capture_ranges_match_the_profilers_own_events(fresh_capture):
    trace, profiler = fresh_capture
    tables = load_trace(trace)
    reference = {e.name: e.time_range for e in profiler.events() if e.name.startswith("step ")}
    steps = tables.nvtx[tables.nvtx["name"].str.startswith("step ")].set_index("name")
    assert sorted(steps.index) == sorted(reference) == [f"step {s}" for s in FIXTURE_PROFILED]
    for name, time_range in reference.items():  # FunctionEvent keeps float microseconds: within 2 ns
        assert steps.loc[name, "duration"] == pytest.approx(time_range.elapsed_us() * 1000, abs=2)
    assert tables.sources == {"nvtx"} and tables.kernels.empty and tables.osrt.empty
    # One host thread (the trainer's), named as the OS knows it, owning every range.
    [thread] = tables.threads.itertuples()
    assert thread.pid == thread.tid and set(tables.nvtx["global_tid"]) == {thread.global_tid}


def test_fresh_capture_analyses_end_to_end(fresh_capture):
    trace, _ = fresh_capture
    result = analyze(load_trace(trace))
    steps = result.tables["steps"]
    assert list(steps["step"]) == list(FIXTURE_PROFILED) and result.headline["steps_captured"] == 3
    for phase in ("data", "forward", "backward", "optimizer"):
        assert (steps[f"{phase}_ns"] > 0).all()
    assert (steps["other_ns"] >= 0).all()  # phases nest inside their step, to the nanosecond
    phases = result.tables["phases"]["name"].value_counts()
    assert phases["forward"] == phases["backward"] == phases["data"] == GRAD_ACCUM_STEPS * 3
    assert phases["optimizer"] == 3
    assert result.tables["threads"].iloc[0]["role"] == "main"


def test_committed_fixture_loads_and_renders():
    tables = load_trace(CPU_FIXTURE)
    with gzip.open(CPU_FIXTURE, "rt") as stream:
        document = json.load(stream)
    annotations = [e for e in document["traceEvents"] if e.get("cat") == "user_annotation"]
    step_names = sorted(e["name"] for e in annotations if e["name"].startswith("step "))
    assert step_names == [f"step {s}" for s in FIXTURE_PROFILED]
    cpu_ops = sum(e.get("cat") == "cpu_op" for e in document["traceEvents"])
    assert len(tables.nvtx) == len(annotations) + cpu_ops
    timed = [e for e in document["traceEvents"] if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    first_us = min(e["ts"] for e in timed)
    last_us = max(e["ts"] + e.get("dur", 0) for e in timed)
    assert tables.span_ns == pytest.approx((last_us - first_us) * 1000, abs=2)
    assert tables.nvtx["start"].min() >= 0 and tables.nvtx["end"].max() <= tables.span_ns

    result = analyze(tables)
    assert result.headline["steps_captured"] == len(FIXTURE_PROFILED)
    assert {f.rule for f in result.findings} >= {"no_gpu_activity", "dominant_phase"}
    html = render_html([RankReport("", result)], "kineto")
    assert "Step time by phase" in html and "No NVTX <code>step N</code> ranges" not in html


# Mirrors the documented Kineto Chrome-trace format (libkineto output_json.cpp ChromeTraceLogger and
# CuptiActivity.cpp metadataJson): GPU activities have pid = device and tid = stream; kernels carry
# device/stream/correlation/grid/block in args, memcpys are named "Memcpy <kind> (<src> -> <dst>)" with
# bytes, runtime calls carry cbid and correlation; gpu_user_annotation replays a range on the GPU
# (1 ns earlier, 2 ns longer); ts/dur are microseconds with three decimals relative to baseTimeNanoseconds.
GPU_SNIPPET = r"""
{
  "schemaVersion": 1,
  "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150754820096}],
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1790000000000000000,
  "traceEvents": [
  {"name": "process_name", "ph": "M", "ts": 100.000, "pid": 4242, "tid": 0, "args": {"name": "python"}},
  {"name": "process_labels", "ph": "M", "ts": 100.000, "pid": 4242, "tid": 0, "args": {"labels": "CPU"}},
  {"name": "thread_name", "ph": "M", "ts": 100.000, "pid": 4242, "tid": 4242, "args": {"name": "thread 4242 (python)"}},
  {"name": "thread_name", "ph": "M", "ts": 100.000, "pid": 4242, "tid": 4250, "args": {"name": "thread 4250 (pt_autograd_0)"}},
  {"name": "process_name", "ph": "M", "ts": 100.000, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
  {"name": "thread_name", "ph": "M", "ts": 100.000, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
  {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 100.000},
  {"ph": "X", "cat": "user_annotation", "name": "step 3", "pid": 4242, "tid": 4242, "ts": 100.000, "dur": 50.000,
   "args": {"External id": 1, "Record function id": 0, "Ev Idx": 0}},
  {"ph": "X", "cat": "user_annotation", "name": "forward", "pid": 4242, "tid": 4242, "ts": 101.000, "dur": 20.000,
   "args": {"External id": 2, "Record function id": 0, "Ev Idx": 1}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": 4242, "tid": 4242, "ts": 102.000, "dur": 5.000,
   "args": {"External id": 10, "Record function id": 0, "Ev Idx": 2}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242, "ts": 103.000, "dur": 4.000,
   "args": {"External id": 10, "cbid": 211, "correlation": 501}},
  {"ph": "s", "id": 501, "pid": 4242, "tid": 4242, "ts": 103.000, "cat": "ac2g", "name": "ac2g"},
  {"ph": "X", "cat": "gpu_user_annotation", "name": "step 3", "pid": 0, "tid": 7, "ts": 105.499, "dur": 34.502,
   "args": {"External id": 1}},
  {"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
   "pid": 0, "tid": 7, "ts": 105.500, "dur": 2.250,
   "args": {"External id": 10, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 501,
            "registers per thread": 16, "shared memory": 0, "blocks per SM": 0.484848, "warps per SM": 1.939394,
            "grid": [64, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3}},
  {"ph": "f", "id": 501, "pid": 0, "tid": 7, "ts": 105.500, "cat": "ac2g", "name": "ac2g", "bp": "e"},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 4242, "tid": 4242, "ts": 110.000, "dur": 6.000,
   "args": {"External id": 11, "cbid": 41, "correlation": 502}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 112.000, "dur": 3.000,
   "args": {"External id": 11, "device": 0, "context": 1, "stream": 7, "correlation": 502, "bytes": 4096,
            "memory bandwidth (GB/s)": 1.365333}},
  {"ph": "X", "cat": "user_annotation", "name": "backward", "pid": 4242, "tid": 4242, "ts": 122.000, "dur": 25.000,
   "args": {"External id": 3, "Record function id": 0, "Ev Idx": 3}},
  {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 4242, "tid": 4250, "ts": 125.000, "dur": 3.000,
   "args": {"External id": 12, "cbid": 307, "correlation": 503}},
  {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 126.000, "dur": 10.000,
   "args": {"External id": 12, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 503,
            "registers per thread": 122, "shared memory": 33280, "blocks per SM": 0.060606, "warps per SM": 0.484848,
            "grid": [4, 2, 1], "block": [256, 1, 1], "est. achieved occupancy %": 0}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 4242, "tid": 4242, "ts": 138.000, "dur": 2.000,
   "args": {"External id": 13, "cbid": 51, "correlation": 504}},
  {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 139.000, "dur": 1.000,
   "args": {"External id": 13, "device": 0, "context": 1, "stream": 7, "correlation": 504, "bytes": 512,
            "memory bandwidth (GB/s)": 0.512}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 4242, "tid": 4242, "ts": 141.000, "dur": 8.000,
   "args": {"cbid": 165, "correlation": 505}},
  {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 160.000}
  ],
  "traceName": "gpu_snippet.json"
}
"""


@pytest.fixture
def gpu_tables(tmp_path):
    path = tmp_path / "gpu_snippet.json"
    path.write_text(GPU_SNIPPET)
    return load_trace(path)


def test_gpu_events_map_onto_the_nsys_tables(gpu_tables):
    t = gpu_tables
    assert t.sources == {"cuda", "nvtx"}
    assert t.span_ns == 60_000  # Iteration Start at 100 µs to Record Window End at 160 µs
    kernels = t.kernels.set_index("short_name")
    assert list(kernels.index) == ["vectorized_elementwise_kernel", "ampere_sgemm_128x64_tn"]
    fill = kernels.loc["vectorized_elementwise_kernel"]
    assert (fill.start, fill.end, fill.duration) == (5_500, 7_750, 2_250)
    assert (fill.device_id, fill.stream_id, fill.correlation_id, fill.pid) == (0, 7, 501, 4242)
    assert (fill.grid, fill.block) == ("  64    1    1", " 128    1    1")
    assert kernels.loc["ampere_sgemm_128x64_tn", "grid"] == "   4    2    1"
    memops = t.memops.set_index("operation")
    assert list(memops.index) == ["[CUDA memcpy HtoD]", "[CUDA memset]"]
    assert memops["bytes"].tolist() == [4096, 512] and memops["duration"].tolist() == [3_000, 1_000]
    assert t.cuda_api["name"].tolist() == [
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cuLaunchKernel",
        "cudaMemsetAsync",
        "cudaDeviceSynchronize",
    ]
    launch = t.cuda_api[t.cuda_api["name"] == "cuLaunchKernel"].iloc[0]
    assert (launch.tid, launch.correlation_id, launch.global_tid) == (4250, 503, (4242 << 24) | 4250)
    # record_function ranges once each, on the host; the GPU-timeline replay of "step 3" is not a range.
    assert sorted(t.nvtx["name"]) == ["aten::fill_", "backward", "forward", "step 3"]
    assert set(t.nvtx["pid"]) == {4242}
    assert t.threads[["tid", "thread_name", "process_name"]].values.tolist() == [
        [4242, "python", "python"],
        [4250, "pt_autograd_0", "python"],
    ]


def test_gpu_snippet_analyses(gpu_tables):
    result = analyze(gpu_tables)
    busy = result.tables["gpu_busy"].iloc[0]
    # Busy: kernels 2.25 + 10 µs, memcpy 3 µs, memset 1 µs, none overlapping; span 105.5 -> 140 µs.
    assert (busy.busy_ns, busy.span_ns) == (16_250, 34_500)
    rules = {f.rule: f for f in result.findings}
    assert rules["memory_transfer_share"].title == "Memory operations are 24.6% of GPU time"  # 4 / (12.25 + 4)
    assert rules["top_kernel"].evidence.startswith("ampere_sgemm_128x64_tn (1 instances")
    threads = result.tables["threads"].set_index("thread_name")
    assert threads.loc["pt_autograd_0", "role"] == "autograd" and threads.loc["pt_autograd_0", "cuda_api_calls"] == 1
    [step] = result.tables["steps"].itertuples()
    assert (step.step, step.forward_ns, step.backward_ns) == (3, 20_000, 25_000)


def test_kernel_short_names_equal_nsys_short_names():
    """nsys stores its own short name beside each demangled name: derive ours from the latter."""
    kernels = load_trace(NSYS_FIXTURE).kernels.drop_duplicates("name")
    derived = kernels["name"].map(kernel_short_name)
    assert (derived == kernels["short_name"]).all(), kernels[derived != kernels["short_name"]][["name", "short_name"]]
    assert len(kernels) > 20
    assert kernel_short_name("void at::native::(anonymous namespace)::foo<float>(float*)") == "foo"


def _gzip_cut_short(path: Path) -> None:
    whole = gzip.compress(GPU_SNIPPET.encode())
    path.write_bytes(whole[: len(whole) // 2])


@pytest.mark.parametrize(
    "name, write, message",
    [
        ("empty.json", lambda p: p.write_bytes(b""), "file is empty"),
        ("cut.pt.trace.json.gz", _gzip_cut_short, "damaged or truncated gzip"),
        ("notgzip.json.gz", lambda p: p.write_bytes(b"plain text, not gzip"), "damaged or truncated gzip"),
        ("cut.json", lambda p: p.write_text(GPU_SNIPPET[: len(GPU_SNIPPET) // 2]), "not valid JSON, or cut short"),
        ("binary.json", lambda p: p.write_bytes(bytes(range(256)) * 4), "not a text"),
        ("config.json", lambda p: p.write_text('{"model": "llama"}'), "not a Chrome trace"),
        (
            "other.json",
            lambda p: p.write_text('{"traceEvents": [{"ph": "X", "cat": "gc", "ts": 1, "dur": 2}]}'),
            "not one written by the PyTorch profiler",
        ),
        ("trace.txt", lambda p: p.write_text(GPU_SNIPPET), "unsupported trace type '.txt'"),
    ],
)
def test_bad_inputs_are_one_clear_cli_error(tmp_path, capsys, name, write, message):
    path = tmp_path / name
    write(path)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)
    assert sftprof_main(["analyze", str(path), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sftprof: error: {path}: ") and message in err
    assert not (tmp_path / "out").exists()


def test_truncated_trace_through_the_installed_command(tmp_path):
    path = tmp_path / "rank0.pt.trace.json.gz"
    _gzip_cut_short(path)
    result = subprocess.run([SFTPROF, "analyze", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"sftprof: error: {path}: damaged or truncated gzip file")


if __name__ == "__main__":
    profile_sft_steps(CPU_FIXTURE)
    print(f"wrote {CPU_FIXTURE} ({CPU_FIXTURE.stat().st_size} bytes)")
