"""Model FLOPs, MFU and padding (sftprof.analysis.efficiency) with hand-computed numbers; the peak
table's name matching; the GPU's identity from the trace (TraceTables.gpus)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from sftprof.analysis import efficiency
from sftprof.analysis.efficiency import (
    A100,
    B200,
    GH200,
    H100_PCIE,
    H100_SXM,
    H200,
    mfu,
    model_flops_per_step,
    padding,
    peak_for,
    run_precision,
)
from sftprof.trace import load_trace
from sftprof.trace.metrics import read_metrics
from sftprof.trace.tables import COLUMNS

FIXTURES = Path(__file__).parent / "fixtures"

# Llama 2 7B as Hugging Face counts it: 6,738,415,616 parameters, of which the input embedding is
# 32,000 x 4,096 = 131,072,000 (the LM head is a separate, untied matrix and stays in N).
LLAMA_7B = {
    "parameters": 6_738_415_616,
    "weight_dtype": "float32",
    "precision": "bfloat16",
    "model": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 32,
        "vocab_size": 32000,
        "seq_length": 2048,
        "embedding_parameters": 131_072_000,
    },
    "padding": "max_length",
    "device_name": "NVIDIA H200",
}
# micro-batch 4 x 2048, 2 accumulation steps: 16,384 token slots
STEP_7B = {"step": 5, "token_slots": 16_384, "real_tokens": 12_288, "padded_lengths": [2048, 2048], "step_time_s": 1.0}


def test_7b_llama_step_flops_by_hand():
    flops = model_flops_per_step(LLAMA_7B, STEP_7B)
    # N = 6,738,415,616 - 131,072,000 = 6,607,343,616
    # 6·N·T            = 6 x 6,607,343,616 x 16,384            = 649,528,306,827,264
    # 12·L·H·S per slot = 12 x 32 x 4,096 x 2,048 = 3,221,225,472; x 16,384 = 52,776,558,133,248
    assert flops["flops"] == 649_528_306_827_264 + 52_776_558_133_248 == 702_304_864_960_512
    # the usual rule of thumb, 6 x 6.7e9 per token, plus ~8% for attention at 2k tokens
    assert 1.0 < flops["flops"] / (6 * 6.738e9 * 16_384) < 1.1
    assert flops["useful_flops"] == pytest.approx(702_304_864_960_512 * 12_288 / 16_384)


def test_attention_uses_each_micro_batchs_padded_length():
    run = {"parameters": 1000, "model": {"num_layers": 2, "hidden_size": 8, "embedding_parameters": 200}}
    # two micro-batches of 2 rows, padded to 10 and 6: 32 slots
    step = {"token_slots": 32, "real_tokens": 20, "padded_lengths": [10, 6]}
    # 6 x 800 x 32 = 153,600; attention 12 x 2 x 8 x (2 x 10² + 2 x 6²) = 192 x 272 = 52,224
    assert model_flops_per_step(run, step) == {"flops": 205_824.0, "useful_flops": 205_824 * 20 / 32}
    # without padded_lengths, only max_length padding says the length: seq_length
    fixed = {**run, "padding": "max_length", "model": {**run["model"], "seq_length": 16}}
    flops = model_flops_per_step(fixed, {"token_slots": 32, "real_tokens": 20})["flops"]
    assert flops == 6 * 800 * 32 + 12 * 2 * 8 * 16 * 32
    assert model_flops_per_step(run, {"token_slots": 32, "real_tokens": 20}) is None


@pytest.mark.parametrize(
    "run, step",
    [
        ({}, STEP_7B),
        ({**LLAMA_7B, "model": {"num_layers": 32}}, STEP_7B),  # no hidden size
        (LLAMA_7B, {"step": 1, "tokens": 3000, "step_time_s": 1.0}),  # a nemo or older line: no token slots
        (LLAMA_7B, {**STEP_7B, "token_slots": pd.NA}),
    ],
)
def test_flops_need_the_facts(run, step):
    assert model_flops_per_step(run, step) is None


def test_mfu_against_the_dense_bf16_peak_of_the_gpu():
    steps = pd.DataFrame([{**STEP_7B, "step": s, "step_time_s": t} for s, t in ((1, 2.0), (2, 1.0), (3, 1.0))])
    result = mfu(steps, LLAMA_7B)
    assert (result.gpu, result.precision, result.peak_tflops) == ("H200 SXM", "bf16", 989.5)
    per_step = result.steps.set_index("step")
    assert per_step.loc[2, "achieved_tflops"] == pytest.approx(702.304864960512)
    assert per_step.loc[2, "hardware_mfu_pct"] == pytest.approx(100 * 702.304864960512 / 989.5)
    assert per_step.loc[1, "hardware_mfu_pct"] == pytest.approx(100 * 351.152432480256 / 989.5)
    assert result.hardware_mfu_pct == pytest.approx(100 * 702.304864960512 / 989.5)  # the median step
    # useful MFU counts real tokens only: 12,288 of 16,384 slots
    assert result.useful_mfu_pct == pytest.approx(result.hardware_mfu_pct * 0.75)
    # the trace's name wins over the run's; fp32 runs against the fp32 (non-tensor-core) peak
    fp32 = {**LLAMA_7B, "precision": None, "weight_dtype": "float32"}
    assert mfu(steps, fp32, device_name="NVIDIA H100 PCIe").peak_tflops == 51.0


@pytest.mark.parametrize(
    "run, device",
    [
        (LLAMA_7B, "NVIDIA H800"),  # not in the table
        ({**LLAMA_7B, "device_name": "NVIDIA H100"}, None),  # SXM or PCIe? not said
        ({k: v for k, v in LLAMA_7B.items() if k != "precision"}, None),  # precision not recorded
        ({**LLAMA_7B, "precision": "float8_e4m3fn"}, "NVIDIA A100-SXM4-80GB"),  # the A100 has no FP8
        ({}, "NVIDIA H200"),
    ],
)
def test_mfu_is_none_when_anything_is_unknown(run, device):
    assert mfu(pd.DataFrame([STEP_7B]), run, device_name=device) is None


def test_precision_of_the_run():
    assert run_precision({"precision": "bfloat16", "weight_dtype": "float32"}) == "bf16"
    assert run_precision({"precision": None, "weight_dtype": "float32"}) == "fp32"  # no autocast, no TF32
    assert run_precision({"precision": None, "weight_dtype": "bfloat16"}) == "bf16"
    assert run_precision({"weight_dtype": "float32"}) is None and run_precision({"precision": "int4"}) is None


def test_padding_per_step_and_overall():
    steps = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "token_slots": pd.array([100, 300, None], dtype="Int64"),
            "real_tokens": pd.array([50, 270, None], dtype="Int64"),
        }
    )
    result = padding(steps)
    assert result.steps["padding_pct"].tolist() == pytest.approx([50.0, 10.0])
    assert result.steps["step"].tolist() == [0, 1]
    assert result.padding_pct == pytest.approx(100 * (1 - 320 / 400))


@pytest.mark.parametrize("case, padding_pct", [("clean", 0.3), ("padding", 90.2), ("padding_fixed", 26.4)])
def test_padding_of_the_trainers_real_runs(case, padding_pct):
    """The table of tests/fixtures/README.md: steps outside the window, steps 0-2 left out."""
    metrics = read_metrics(FIXTURES / f"h200_sft_{case}.metrics.jsonl")
    steady = metrics.steps[~metrics.steps["in_window"] & (metrics.steps["step"] >= 3)]
    assert len(steady) == 25 and round(padding(steady).padding_pct, 1) == padding_pct


def test_mfu_of_the_trainers_real_runs_by_hand():
    lines = [json.loads(line) for line in (FIXTURES / "h200_sft_padding.metrics.jsonl").read_text().splitlines()]
    run = lines[0]["run"]
    assert (run["parameters"], run["model"]["embedding_parameters"], run["device_name"]) == (
        823_216_128,
        532_480,
        "NVIDIA H200",
    )
    # every step: 2 micro-batches of 4 rows at max_length 2048 = 16,384 slots
    # 6 x (823,216,128 - 532,480) x 16,384 = 80,873,093,332,992; 12 x 16 x 2048 x 4 x 2 x 2048² = 13,194,139,533,312
    flops = 80_873_093_332_992 + 13_194_139_533_312
    metrics = read_metrics(FIXTURES / "h200_sft_padding.metrics.jsonl")
    result = mfu(metrics.steps, metrics.run)
    by_step = result.steps.set_index("step")
    for line in lines:
        assert by_step.at[line["step"], "flops"] == flops
        assert by_step.at[line["step"], "hardware_mfu_pct"] == pytest.approx(
            100 * flops / line["step_time_s"] / 989.5e12
        )
        assert by_step.at[line["step"], "useful_mfu_pct"] == pytest.approx(
            100 * flops * line["real_tokens"] / 16_384 / line["step_time_s"] / 989.5e12
        )
    # 90% padding: the tensor cores are as busy as in the clean run, on work that is mostly padding
    clean = read_metrics(FIXTURES / "h200_sft_clean.metrics.jsonl")
    clean_mfu = mfu(clean.steps, clean.run)
    assert result.hardware_mfu_pct > 0.9 * clean_mfu.hardware_mfu_pct
    assert result.useful_mfu_pct < 0.15 * result.hardware_mfu_pct
    assert clean_mfu.useful_mfu_pct > 0.99 * clean_mfu.hardware_mfu_pct


def test_an_old_metrics_file_has_no_padding_or_mfu():
    old = read_metrics(FIXTURES / "h200_tiny_llama_bf16.metrics.jsonl")
    assert padding(old.steps).padding_pct is None and padding(old.steps).steps.empty
    assert mfu(old.steps, old.run, device_name="NVIDIA H200") is None


# ---------------------------------------------------------------- the peak table


@pytest.mark.parametrize(
    "name, entry",
    [
        ("NVIDIA H200", H200),
        ("NVIDIA GH200 480GB", GH200),
        ("NVIDIA GH200 144G HBM3e", GH200),
        ("NVIDIA H100 80GB HBM3", H100_SXM),
        ("NVIDIA H100 SXM5 80GB", H100_SXM),
        ("NVIDIA H100 PCIe", H100_PCIE),
        ("nvidia h100 pcie", H100_PCIE),
        ("NVIDIA A100-SXM4-80GB", A100),
        ("NVIDIA A100 80GB PCIe", A100),
        ("NVIDIA B200", B200),
        ("NVIDIA H100", None),  # the board is not named: SXM and PCIe peaks differ by 30%
        ("NVIDIA H100 NVL", None),  # other clocks, not in the table
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GB200", None),
        ("NVIDIA H800", None),
        ("NVIDIA H20", None),
        ("NVIDIA A10", None),
        ("NVIDIA A100X", None),
        ("Tesla V100-SXM2-16GB", None),
        ("AMD EPYC 7763 64-Core Processor", None),  # the trainer's device_name on CPU
        ("", None),
        (None, None),
    ],
)
def test_device_names_match_their_entry_or_none(name, entry):
    assert peak_for(name) is entry


def test_peaks_are_dense_halves_of_the_printed_sparse_figures():
    """Hopper and Blackwell sheets print tensor-core figures with sparsity (*): the table holds half."""
    for entry, printed_bf16, sparse_bf16 in (
        (H100_SXM, "BFLOAT16 Tensor Core 1,979 teraFLOPS*", 1979),
        (H100_PCIE, "BFLOAT16 Tensor Core 1,513 teraFLOPS*", 1513),
        (H200, "BFLOAT16 Tensor Core 1,979 TFLOPS*", 1979),
        (B200, "FP16/BF16 Tensor Core 4.5 PFLOPS*", 4500),
    ):
        assert printed_bf16 in entry.printed and "with sparsity" in entry.printed
        assert entry.tflops["bf16"] == sparse_bf16 / 2
        assert entry.tflops["fp8"] == 2 * entry.tflops["bf16"] and entry.tflops["fp16"] == entry.tflops["bf16"]
    # A100 and GH200 sheets print the dense figure first ("312 TFLOPS | 624 TFLOPS*")
    assert A100.tflops == {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5} and "fp8" not in A100.tflops
    assert "312 TFLOPS | 624 TFLOPS*" in A100.printed and "990 TFLOPS | 1,979 TFLOPS*" in GH200.printed
    assert all(entry.source.startswith("https://") for entry in efficiency.PEAKS)


# ---------------------------------------------------------------- the GPU's identity from the trace


def _target_gpus(path: Path) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(
            "SELECT id, name, smCount, totalMemory, clockRate, computeMajor, computeMinor FROM TARGET_INFO_GPU"
        ).fetchall()


@pytest.mark.parametrize("capture", ["h200_tiny_llama_bf16.sqlite", "h200_plant_gemm.sqlite"])
def test_an_nsys_export_names_its_gpu(capture):
    gpus = load_trace(FIXTURES / capture).gpus
    [(device, name, sms, memory, clock, major, minor)] = _target_gpus(FIXTURES / capture)
    assert gpus.to_dict("records") == [
        {
            "device_id": device,
            "name": name,
            "chip_name": "GH100",
            "sm_count": sms,
            "memory_bytes": memory,
            "memory_bandwidth_bytes_per_s": 4_814_304_000_000,
            "clock_hz": clock,
            "compute_capability": f"{major}.{minor}",
        }
    ]
    assert name == "NVIDIA H200" and peak_for(name) is H200


def test_a_kineto_trace_names_its_gpu_and_a_cpu_capture_none():
    gpus = load_trace(FIXTURES / "h200_plant_clean.pt.trace.json.gz").gpus
    assert gpus[["device_id", "name", "sm_count", "memory_bytes", "compute_capability"]].to_dict("records") == [
        {
            "device_id": 0,
            "name": "NVIDIA H200",
            "sm_count": 132,
            "memory_bytes": 150_109_880_320,
            "compute_capability": "9.0",
        }
    ]
    assert gpus["clock_hz"].isna().all()  # Kineto does not record it
    for cpu_capture in ("cpu_tiny_llama.pt.trace.json.gz", "cpu_lock_sched.sqlite"):
        gpus = load_trace(FIXTURES / cpu_capture).gpus
        assert gpus.empty and list(gpus.columns) == COLUMNS["gpus"]


def test_a_damaged_gpu_table_gives_na_not_an_error(tmp_path):
    damaged = tmp_path / "damaged.sqlite"
    shutil.copy(FIXTURES / "h200_plant_clean.sqlite", damaged)
    with sqlite3.connect(damaged) as conn:
        conn.execute("UPDATE TARGET_INFO_GPU SET smCount = 'many', totalMemory = -5, name = 42")
    [row] = load_trace(damaged).gpus.to_dict("records")
    assert row["device_id"] == 0 and row["name"] == "42" and pd.isna(row["sm_count"]) and pd.isna(row["memory_bytes"])
    with sqlite3.connect(damaged) as conn:
        conn.execute("DROP TABLE TARGET_INFO_GPU")
    assert load_trace(damaged).gpus.empty
