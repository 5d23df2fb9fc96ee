"""How much of the GPU's arithmetic a run used: model FLOPs per step, MFU against the GPU's dense
peak for the run's precision, and how much of the computed positions were padding.

Inputs are the trainer's metrics (sftprof.trace.metrics: per-step token counts, the run's facts) and,
when known, the GPU's name from the trace (TraceTables.gpus). Nothing here guesses: a GPU not in
PEAK_TFLOPS, a precision that is not recorded, or a run without its model facts gives None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.trace.metrics import RunMetrics
from sftprof.trace.tables import TraceTables

# Sparsity: NVIDIA's Hopper and Blackwell datasheets print tensor-core figures "with sparsity" (2:4
# structured sparsity, which dense training does not use) and say that without it they are half as
# large. Every figure below is DENSE: where the datasheet prints only the sparse figure it is halved;
# `printed` quotes the datasheet as it stands, so the halving can be checked.


@dataclass(frozen=True)
class Peak:
    """One GPU's dense peak per precision, in TFLOP/s, with where the figures come from."""

    gpu: str
    tflops: dict  # precision ("bf16", "fp16", "fp8", "tf32", "fp32") -> dense TFLOP/s
    source: str  # NVIDIA datasheet or spec page
    printed: str  # the figures as the source prints them


A100 = Peak(
    "A100 SXM4 80GB",
    {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    "A100 80GB SXM: FP32 19.5 TFLOPS; TF32 Tensor Core 156 TFLOPS | 312 TFLOPS*; BFLOAT16 Tensor Core "
    "312 TFLOPS | 624 TFLOPS*; FP16 Tensor Core 312 TFLOPS | 624 TFLOPS* (*with sparsity; the dense "
    "figure is printed first). The datasheet prints the same figures for the 80GB PCIe board; no FP8.",
)
H100_SXM = Peak(
    "H100 SXM",
    {"bf16": 989.5, "fp16": 989.5, "fp8": 1979.0, "tf32": 494.5, "fp32": 67.0},
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    "H100 SXM: FP32 67 teraFLOPS; TF32 Tensor Core 989 teraFLOPS*; BFLOAT16 Tensor Core 1,979 "
    "teraFLOPS*; FP16 Tensor Core 1,979 teraFLOPS*; FP8 Tensor Core 3,958 teraFLOPS* (*with sparsity)",
)
H100_PCIE = Peak(
    "H100 PCIe",
    {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.0},
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    "H100 PCIe: FP32 51 teraFLOPS; TF32 Tensor Core 756 teraFLOPS*; BFLOAT16 Tensor Core 1,513 "
    "teraFLOPS*; FP16 Tensor Core 1,513 teraFLOPS*; FP8 Tensor Core 3,026 teraFLOPS* (*with sparsity)",
)
H200 = Peak(
    "H200 SXM",
    {"bf16": 989.5, "fp16": 989.5, "fp8": 1979.0, "tf32": 494.5, "fp32": 67.0},
    "https://www.nvidia.com/en-us/data-center/h200/",
    "H200 SXM: FP32 67 TFLOPS; TF32 Tensor Core 989 TFLOPS*; BFLOAT16 Tensor Core 1,979 TFLOPS*; "
    "FP16 Tensor Core 1,979 TFLOPS*; FP8 Tensor Core 3,958 TFLOPS* (*with sparsity)",
)
GH200 = Peak(
    "GH200",
    {"bf16": 990.0, "fp16": 990.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
    "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
    "GH200 (Hopper GPU): FP32 67 TFLOPS; TF32 Tensor Core 494 TFLOPS | 989 TFLOPS*; BFLOAT16 Tensor Core "
    "990 TFLOPS | 1,979 TFLOPS*; FP16 Tensor Core 990 TFLOPS | 1,979 TFLOPS*; FP8 Tensor Core 1,979 TFLOPS "
    "| 3,958 TFLOPS* (*with sparsity; the dense figure is printed first)",
)
B200 = Peak(
    "B200 (HGX)",
    {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 75.0},
    "https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
    "HGX B200, individual Blackwell GPU: FP32 75 TFLOPS; TF32 Tensor Core 2.2 PFLOPS*; FP16/BF16 Tensor "
    "Core 4.5 PFLOPS*; FP8/FP6 Tensor Core 9 PFLOPS* (*with sparsity)",
)
PEAKS = (A100, H100_SXM, H100_PCIE, H200, GH200, B200)

# A device name (CUDA's, as nsys, Kineto and torch.cuda.get_device_name give it) -> its entry. Rules
# are tried in order on the upper-cased name; the first whose pattern matches and whose `unless` does
# not decides (None: known, but not in the table). A model number counts only as a whole token, so
# "GH200" is not an "H200" and "GB200" is not a "B200". Boards the table does not hold (H100 NVL,
# H200 NVL, GB200: other clocks and power) are named here so that they are never matched to a
# neighbour; a bare "H100" (SXM or PCIe? their peaks differ by 30%) stays unknown.
_TOKEN = r"(?<![A-Z0-9]){}(?![A-Z0-9])"
NAME_RULES = (
    (_TOKEN.format("GH200"), None, GH200),
    (_TOKEN.format("GB200"), None, None),
    (_TOKEN.format("B200"), None, B200),
    (_TOKEN.format("H200"), r"\bNVL\b", H200),
    (_TOKEN.format("H100"), r"\bNVL\b", None),  # H100 NVL: its own figures; sorted out below
    (_TOKEN.format("A100"), None, A100),
)
_H100_FORMS = ((r"PCIE", H100_PCIE), (r"SXM|HBM3", H100_SXM))  # "NVIDIA H100 80GB HBM3" is the SXM5 board


def peak_for(device_name: str | None) -> Peak | None:
    """The PEAKS entry for a device name from the trace or the run's facts ("NVIDIA H200", "NVIDIA
    GH200 480GB", "NVIDIA H100 80GB HBM3" -> H100 SXM, "NVIDIA H100 PCIe"); None for a GPU that is not
    in the table or a name that does not say which board it is (never a guess)."""
    if not isinstance(device_name, str):
        return None
    name = device_name.upper()
    for pattern, unless, entry in NAME_RULES:
        if not re.search(pattern, name):
            continue
        if unless and re.search(unless, name):
            return None
        if pattern == _TOKEN.format("H100"):
            return next((form for marker, form in _H100_FORMS if re.search(marker, name)), None)
        return entry
    return None


# The run's compute precision (torch_backend.run_facts: `precision` is the autocast dtype, null
# without autocast, when the weights' dtype is what the matmuls run in) -> PEAKS' precision keys.
# Plain float32 is "fp32", not "tf32": PyTorch runs float32 matmuls without TF32 unless asked
# (torch.backends.cuda.matmul.allow_tf32 is off by default), and the trainer does not ask.
PRECISIONS = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "tf32": "tf32",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}


def run_precision(run: dict) -> str | None:
    """The precision the run's matmuls ran in (a PRECISIONS value), None when the facts do not say:
    the autocast dtype, else the weights' dtype."""
    if not isinstance(run, dict) or "precision" not in run:
        return None
    dtype = run["precision"] if run["precision"] is not None else run.get("weight_dtype")
    return PRECISIONS.get(str(dtype).lower()) if isinstance(dtype, str) else None


def _fact(mapping: dict, key: str) -> int | None:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _count(row, key: str) -> int | None:
    value = row.get(key) if hasattr(row, "get") else None
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    return int(value) if int(value) >= 0 else None


def model_flops_per_step(run: dict, step_row) -> dict | None:
    """Training FLOPs of one optimizer step of a decoder-only transformer, as MFU counts them
    (PaLM, Chowdhery et al. 2022, appendix B; Megatron-LM's estimate without recomputation):

        FLOPs = 6·N·T + 12·L·H·Σ_micro-batches (rows·S²)

    - 6·N·T: forward (2 FLOPs per weight per token) and backward (4) matmuls over T = token_slots, every
      position the model computed on, padding included; N = parameters less the input embedding
      (`run.model.embedding_parameters`; a lookup, not a matmul; the untied LM head stays in N);
    - 12·L·H·S per token: attention's score and value matmuls, forward and backward, for L layers of
      width H over a sequence of S positions (the micro-batch's padded length, from `padded_lengths`;
      rows = token_slots / Σ padded_lengths). Counted in full, as PaLM does, although causal kernels
      skip the masked half.

    Returns {"flops": on token slots (what the hardware did), "useful_flops": the same per-position
    cost on real tokens only (= flops · real_tokens / token_slots: the work an unpadded batch would have
    needed at this length; an upper bound, since shorter sequences would also attend over less)}.
    None when a fact it needs is missing (an older metrics file, another trainer)."""
    model = run.get("model") if isinstance(run, dict) else None
    parameters, layers, hidden = _fact(run or {}, "parameters"), _fact(model, "num_layers"), _fact(model, "hidden_size")
    slots = _count(step_row, "token_slots")
    if None in (parameters, layers, hidden, slots) or not slots:
        return None
    embedding = _fact(model, "embedding_parameters") or 0
    n = parameters - embedding if embedding < parameters else parameters
    lengths = step_row.get("padded_lengths") if hasattr(step_row, "get") else None
    if isinstance(lengths, (list, tuple)) and lengths and all(isinstance(s, int) and s > 0 for s in lengths):
        rows = slots / sum(lengths)
        attention = 12 * layers * hidden * rows * sum(s * s for s in lengths)
    elif run.get("padding") == "max_length" and _fact(model, "seq_length"):
        attention = 12 * layers * hidden * model["seq_length"] * slots  # every micro-batch at seq_length
    else:
        return None
    flops = 6.0 * n * slots + attention
    real = _count(step_row, "real_tokens")
    return {"flops": flops, "useful_flops": flops * real / slots if real is not None else None}


@dataclass
class Mfu:
    """MFU of a run: `steps` per step (step, step_time_s, flops, useful_flops, achieved_tflops,
    hardware_mfu_pct, useful_mfu_pct) and their medians over the steps, against `peak`'s dense figure
    for `precision`.

    hardware MFU: FLOPs on every token slot (padding included) / time / peak: how busy the run kept
    the tensor cores with the model's math. useful MFU: FLOPs on real tokens only: what MFU is
    usually quoted as for a fixed amount of data; the gap between the two is the padding."""

    gpu: str
    precision: str
    peak_tflops: float
    source: str
    steps: pd.DataFrame
    hardware_mfu_pct: float | None
    useful_mfu_pct: float | None


def mfu(steps: pd.DataFrame, run: dict, device_name: str | None = None) -> Mfu | None:
    """Per-step and median MFU (see Mfu) of the metrics' steps (RunMetrics.steps) against the dense
    peak of the GPU (`device_name`, e.g. from TraceTables.gpus, else the run's `device_name`) for the
    run's precision (bf16 autocast -> the bf16 peak). None when the GPU is not in the peak table,
    the precision or the model facts are unknown, or no step has what the estimate needs."""
    name = device_name if device_name else (run or {}).get("device_name")
    peak, precision = peak_for(name), run_precision(run or {})
    if peak is None or precision is None or precision not in peak.tflops:
        return None
    rows = []
    for row in steps.to_dict("records"):
        flops, seconds = model_flops_per_step(run, row), row.get("step_time_s")
        if flops is None or not isinstance(seconds, float) or not seconds > 0:
            continue
        achieved = flops["flops"] / seconds / 1e12
        useful = flops["useful_flops"] / seconds / 1e12 if flops["useful_flops"] is not None else None
        rows.append(
            {
                "step": row["step"],
                "step_time_s": seconds,
                "flops": flops["flops"],
                "useful_flops": flops["useful_flops"],
                "achieved_tflops": achieved,
                "hardware_mfu_pct": 100.0 * achieved / peak.tflops[precision],
                "useful_mfu_pct": 100.0 * useful / peak.tflops[precision] if useful is not None else None,
            }
        )
    if not rows:
        return None
    frame = pd.DataFrame(rows).astype({"useful_flops": "float64", "useful_mfu_pct": "float64"})
    useful = frame["useful_mfu_pct"].dropna()
    return Mfu(
        gpu=peak.gpu,
        precision=precision,
        peak_tflops=peak.tflops[precision],
        source=peak.source,
        steps=frame,
        hardware_mfu_pct=float(frame["hardware_mfu_pct"].median()),
        useful_mfu_pct=float(useful.median()) if len(useful) else None,
    )


@dataclass
class Padding:
    """Padding per step (step, token_slots, real_tokens, padding_pct = 100·(1 − real/slots)) and over
    all those steps together (`padding_pct`, weighted by slots; None without token counts)."""

    steps: pd.DataFrame
    padding_pct: float | None


def padding(steps: pd.DataFrame) -> Padding:
    """How much of the computed positions were padding, per step and overall, from the metrics'
    token_slots and real_tokens (RunMetrics.steps; steps of an older file, without them, are left out).
    Padding costs compute in proportion: the forward and backward run on every slot."""
    columns = ["step", "token_slots", "real_tokens", "padding_pct"]
    if not {"token_slots", "real_tokens"} <= set(steps.columns):
        return Padding(pd.DataFrame(columns=columns), None)
    known = steps[steps["token_slots"].notna() & steps["real_tokens"].notna()]
    known = known[known["token_slots"].astype("int64") > 0]
    slots, real = known["token_slots"].astype("int64"), known["real_tokens"].astype("int64")
    frame = pd.DataFrame(
        {
            "step": known["step"].to_numpy(),
            "token_slots": slots.to_numpy(),
            "real_tokens": real.to_numpy(),
            "padding_pct": (100.0 * (1 - real / slots)).to_numpy(),
        },
        columns=columns,
    )
    overall = 100.0 * (1 - real.sum() / slots.sum()) if len(known) else None
    return Padding(frame.reset_index(drop=True), float(overall) if overall is not None else None)


def measured_steps(metrics: RunMetrics) -> pd.DataFrame:
    """The trainer's steps that MFU and padding are measured on: all but the first (warm-up:
    allocator growth, autotuning, compilation) where there are more."""
    steps = metrics.steps
    return steps.iloc[1:] if len(steps) > 1 else steps


def device_name(tables: TraceTables) -> str | None:
    """The first GPU's name, which peak_for reads the datasheet peak by."""
    names = tables.gpus["name"].dropna() if len(tables.gpus) else pd.Series(dtype=object)
    return names.iloc[0] if len(names) else None


def utilization(steps: pd.DataFrame, metrics: RunMetrics, device: str | None) -> Mfu | None:
    """mfu of the measured steps, with the run's model facts."""
    return mfu(steps, metrics.run, device)


def metrics_precision(metrics: RunMetrics) -> str | None:
    """run_precision of the trainer's run facts."""
    return run_precision(metrics.run)


def padding_steps(padded: Padding) -> pd.DataFrame:
    """Padding per trainer step: the saved table of padding."""
    return padded.steps


def mfu_steps(result: Mfu | None) -> pd.DataFrame:
    """MFU per trainer step: the saved table of mfu, empty where it is unknown."""
    return result.steps if result else pd.DataFrame()
