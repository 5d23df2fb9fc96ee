"""What kind of work the kernels do: families, tensor-core use and GEMM precision, by kernel name.

Names are the only evidence a trace without GPU metrics has. The markers below are matched
case-insensitively, first on the short name and then, for kernels it leaves unclassified, on the
demangled name: a short name such as cutlass's `Kernel2` says nothing, while its template
argument `cutlass_80_tensorop_bf16_s16816gemm...` says it is a bf16 tensor-core GEMM.
"""

from __future__ import annotations

import re

import pandas as pd

from sftprof.analysis.stats import finish_summary, grouped_summary
from sftprof.trace.events import EventStore

GEMM_FAMILY = "GEMM"
# Family -> name markers; the first family that matches wins, so the order matters
# (cuBLAS's `splitKreduce_kernel` is part of a GEMM, not a reduction).
KERNEL_FAMILIES = (
    (GEMM_FAMILY, r"gemm|xmma|nvjet|cutlass|cublas|splitkreduce"),
    # flash attention and its backward pre/post-processing (`dot_do_o`, `convert_dq`), cuDNN's SDPA
    ("attention", r"flash|fmha|sdpa|attention|dot_do_o|convert_dq"),
    ("optimizer", r"multi_tensor_apply|adam"),
    ("communication", r"nccl"),
    ("reduction/norm", r"reduce|norm|softmax"),
    ("copy/cat", r"copy|cat|memcpy|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
)
OTHER_FAMILY = "other"
# Dense matrix math: limited by the tensor cores when the GPU is busy.
COMPUTE_BOUND_FAMILIES = (GEMM_FAMILY, "attention")
# Streaming kernels that read and write every element once: limited by memory bandwidth.
MEMORY_BOUND_FAMILIES = ("elementwise", "reduction/norm", "copy/cat", "optimizer")

# Kernels that run on tensor cores: Hopper's xmma/nvjet/wgmma GEMMs, mma/hmma instructions in the
# name, cutlass `tensorop` kernels and their MMA shapes (16816, 1688, 884), FP8 (e4m3/e5m2) and
# half-precision GEMMs. SIMT kernels and SGEMMs run on the CUDA cores even when a marker matches.
TENSOR_CORE_MARKERS = re.compile(
    r"xmma|hmma|wgmma|imma|(?<![a-z])mma|nvjet|tensorop|16816|1688|884gemm|e4m3|e5m2"
    r"|(?:bf16|f16|fp16).*gemm|gemm.*(?:bf16|f16|fp16)",
    re.IGNORECASE,
)
NOT_TENSOR_CORE_MARKERS = re.compile(r"simt|sgemm", re.IGNORECASE)

# GEMM input precision by name; first match wins. cuBLASLt's `nvjet` names carry no precision.
GEMM_PRECISIONS = (
    ("fp8", r"e4m3|e5m2|fp8"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"(?<!b)f16|fp16|half|h16816|h1688|hgemm"),
    ("tf32", r"tf32"),
    ("fp32", r"sgemm|f32|fp32|float"),
)
UNKNOWN_PRECISION = "not in the name"
HALF_PRECISIONS = ("fp8", "bf16", "fp16")
ELEMENT_BYTES = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}

# How many elements each of a GEMM's global loads moves, where its name says (CUTLASS's `_align1`, `_align8`,
# also inside cuBLAS's fallback kernels). cuBLAS runs its fast kernels (Hopper's TMA GEMMs among them) only
# where every matrix's leading dimension is a multiple of FULL_ALIGNMENT_BYTES; otherwise it falls back to
# kernels that load 1, 2 or 4 elements at a time.
GEMM_ALIGNMENT = re.compile(r"_align(\d+)", re.IGNORECASE)
FULL_ALIGNMENT_BYTES = 16
UNALIGNED_COLUMNS = ["kernel", "precision", "alignment_bytes", "total_ns", "instances"]


def name_totals(events: EventStore) -> pd.DataFrame:
    """Kernel time (`duration`, summed) and `instances` per distinct name: everything that
    classifying kernels by name needs, a few dozen rows whatever the trace size."""
    return events.query("""
        SELECT n.name, s.name AS short_name, t.instances, t.duration
        FROM (SELECT name_id, short_name_id, count(*) AS instances, sum(duration)::BIGINT AS duration
              FROM kernels GROUP BY ALL) t
        LEFT JOIN kernel_names n ON n.id = t.name_id LEFT JOIN kernel_names s ON s.id = t.short_name_id""")


def name_summary(events: EventStore) -> pd.DataFrame:
    """Kernel time by name over all its launch shapes, as `nsys stats -r cuda_gpu_kern_sum` of nsys
    2023 and later (2022.4's gpukernsum has a row per name, grid and block: gpu.kernel_summary).
    Median and standard deviation are computed over every kernel's duration, as nsys does."""
    summary = events.query(
        "SELECT n.name AS kernel, s.* EXCLUDE (name_id) FROM s LEFT JOIN kernel_names n ON n.id = s.name_id",
        s=grouped_summary(events, "kernels", ["name_id"]),
    )
    return finish_summary(summary, ["kernel"])


def _by_distinct_name(names: pd.Series, classify) -> pd.Series:
    """Apply `classify` (name -> label) once per distinct name: thousands of kernels share a few dozen
    long demangled names."""
    names = names.fillna("").astype(str)
    labels = {name: classify(name) for name in names.unique()}
    return names.map(labels)


def _first_match(names: pd.Series, patterns: tuple[tuple[str, str], ...]) -> pd.Series:
    compiled = [(label, re.compile(pattern, re.IGNORECASE)) for label, pattern in patterns]
    return _by_distinct_name(names, lambda name: next((label for label, p in compiled if p.search(name)), None))


def kernel_families(kernels: pd.DataFrame) -> pd.Series:
    """Each kernel's family (see KERNEL_FAMILIES), from its short name, then its demangled name."""
    by_short = _first_match(kernels["short_name"].fillna(kernels["name"]), KERNEL_FAMILIES)
    by_full = _first_match(kernels["name"], KERNEL_FAMILIES)
    return by_short.fillna(by_full).fillna(OTHER_FAMILY)


def on_tensor_cores(kernels: pd.DataFrame) -> pd.Series:
    return _by_distinct_name(
        kernels["name"].fillna(kernels["short_name"]),
        lambda name: bool(TENSOR_CORE_MARKERS.search(name)) and not NOT_TENSOR_CORE_MARKERS.search(name),
    ).astype(bool)


def family_summary(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel time per family: share of all kernel time, instances, and the family's top kernel.
    `kernels`: name_totals rows."""
    columns = ["family", "time_pct", "total_ns", "instances", "tensor_core_pct", "bound", "top_kernel"]
    if kernels.empty:
        return pd.DataFrame(columns=columns)
    rows = kernels.assign(
        family=kernel_families(kernels),
        tensor_core=on_tensor_cores(kernels),
        kernel=kernels["short_name"].fillna(kernels["name"]),
    )
    total = rows["duration"].sum()
    out = []
    for family, members in rows.groupby("family"):
        by_kernel = members.groupby("kernel")["duration"].sum().sort_values(ascending=False)
        family_ns = int(members["duration"].sum())
        out.append(
            {
                "family": family,
                "time_pct": 100.0 * family_ns / total if total else 0.0,
                "total_ns": family_ns,
                "instances": int(members["instances"].sum()),
                "tensor_core_pct": 100.0 * members.loc[members["tensor_core"], "duration"].sum() / family_ns
                if family_ns
                else 0.0,
                "bound": "compute"
                if family in COMPUTE_BOUND_FAMILIES
                else "memory"
                if family in MEMORY_BOUND_FAMILIES
                else "",
                "top_kernel": by_kernel.index[0],
            }
        )
    frame = pd.DataFrame(out, columns=columns)
    return frame.sort_values(["total_ns", "family"], ascending=[False, True]).reset_index(drop=True)


def gemm_precisions(names: pd.Series) -> pd.Series:
    """Each GEMM name's input precision (GEMM_PRECISIONS), UNKNOWN_PRECISION where the name shows none."""
    return _first_match(names, GEMM_PRECISIONS).fillna(UNKNOWN_PRECISION)


def gemm_precision(kernels: pd.DataFrame) -> pd.DataFrame:
    """GEMM time by input precision, as far as kernel names tell it. `kernels`: name_totals rows."""
    columns = ["precision", "time_pct", "total_ns", "instances", "top_kernel"]
    gemms = kernels[kernel_families(kernels) == GEMM_FAMILY]
    if gemms.empty:
        return pd.DataFrame(columns=columns)
    gemms = gemms.assign(
        precision=gemm_precisions(gemms["name"].fillna(gemms["short_name"])),
        kernel=gemms["name"].fillna(gemms["short_name"]),
    )
    total = gemms["duration"].sum()
    rows = []
    for precision, members in gemms.groupby("precision"):
        rows.append(
            {
                "precision": precision,
                "time_pct": 100.0 * members["duration"].sum() / total,
                "total_ns": int(members["duration"].sum()),
                "instances": int(members["instances"].sum()),
                "top_kernel": members.groupby("kernel")["duration"].sum().idxmax(),
            }
        )
    return pd.DataFrame(rows, columns=columns).sort_values("total_ns", ascending=False).reset_index(drop=True)


def unaligned_gemms(kernels: pd.DataFrame) -> pd.DataFrame:
    """Tensor-core GEMM kernels whose name declares loads narrower than FULL_ALIGNMENT_BYTES (GEMM_ALIGNMENT
    times the element size of the precision the name shows), with their time; names that show neither are left
    out, and so are SIMT kernels (a small fp32 product, such as rotary embeddings' outer product, runs on
    `cutlass_80_simt_sgemm_..._align1` whatever its strides). `kernels`: name_totals rows."""
    gemms = kernels[(kernel_families(kernels) == GEMM_FAMILY) & on_tensor_cores(kernels)]
    if gemms.empty:
        return pd.DataFrame(columns=UNALIGNED_COLUMNS)
    names = gemms["name"].fillna(gemms["short_name"]).astype(str)
    precision = _first_match(names, GEMM_PRECISIONS)
    elements = _by_distinct_name(names, lambda name: int(m.group(1)) if (m := GEMM_ALIGNMENT.search(name)) else None)
    found = pd.DataFrame(
        {
            "kernel": names,
            "precision": precision,
            "alignment_bytes": elements * precision.map(ELEMENT_BYTES),
            "total_ns": gemms["duration"].astype("int64"),
            "instances": gemms["instances"].astype("int64"),
        }
    ).dropna(subset=["alignment_bytes"])
    found = found[found["alignment_bytes"] < FULL_ALIGNMENT_BYTES].astype({"alignment_bytes": "int64"})
    return found.sort_values("total_ns", ascending=False).reset_index(drop=True)[UNALIGNED_COLUMNS]


# Kernels that test values rather than compute with them: any()/all() over booleans, and comparisons of floating
# values yielding booleans (isnan is x != x, isinf and isfinite compare too). A loop needs a few a step (a loss
# scaler's inf check, a mask test); anomaly detection runs two after every backward node.
VALUE_CHECK = re.compile(
    r"ReduceOp<bool, [^>]*(?:or|and)_kernel_cuda"
    r"|Functor<(?:c10::BFloat16|c10::Half|float|double), (?:c10::BFloat16|c10::Half|float|double), bool, "
    r"at::native::(?:<unnamed>::)?CompareEqFunctor"
)
NAMED_COLUMNS = ["kernel", "total_ns", "instances"]


def value_checks(kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernels that test values (VALUE_CHECK, by demangled name) with their time: work a loop that stops
    checking removes. `kernels`: name_totals rows."""
    return _named(kernels, VALUE_CHECK)


def _named(kernels: pd.DataFrame, pattern: re.Pattern) -> pd.DataFrame:
    """The name_totals rows whose demangled name (else short name) `pattern` finds, as `kernel`, `total_ns` and
    `instances`, the longest first."""
    names = kernels["name"].fillna(kernels["short_name"]).astype(str)
    found = _by_distinct_name(names, lambda name: bool(pattern.search(name))).astype(bool).to_numpy(bool)
    rows = pd.DataFrame(
        {
            "kernel": names[found],
            "total_ns": kernels["duration"][found].astype("int64"),
            "instances": kernels["instances"][found].astype("int64"),
        }
    )
    return rows.sort_values("total_ns", ascending=False).reset_index(drop=True)[NAMED_COLUMNS]


# Kernels computing on float64 elements, by demangled name: a template argument or a lambda's parameter of type
# double (`cunn_SoftMaxForward<(int)2, double, ...>`, `FillFunctor<double>`, `[lambda(double)]`), not a scalar
# argument of a kernel on other elements (fused AdamW's learning rate: `..., const float *, double, ...`).
FLOAT64_ELEMENTS = re.compile(r"(?:<|\(int\)\d+,\s*|lambda\()double\b")


def float64_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernels that compute on float64 elements (FLOAT64_ELEMENTS) with their time. `kernels`: name_totals
    rows."""
    return _named(kernels, FLOAT64_ELEMENTS)


# Float32 weights under 16-bit autocast, by demangled name: PyTorch's casts to bf16 or fp16 (autocast casts each
# weight every forward, and the float32 activations its matmuls take), its casts back to float32 (each weight's
# gradient, and the matmuls' outputs added to a float32 residual stream: `direct_copy_kernel_cuda` writing float
# from a load that casts), and optimizer kernels on float32 elements (fused AdamW's `FusedAdamMathFunctor<float,
# ...>`, the foreach implementation's `...Functor<float, ...>`).
CAST_TO_HALF = re.compile(r"(?:bfloat16|float16)_copy_kernel_cuda")
CAST_TO_FLOAT32 = re.compile(r"direct_copy_kernel_cuda.*\[lambda\(float\).*LoadWithCast")
# PyTorch's layer norm kernels reading float32 input (`vectorized_layer_norm_kernel<float, float>`; a bf16 model's
# read `<c10::BFloat16, float>`): autocast runs layer norm in float32 but takes its input's type, so these read a
# float32 residual stream, which bf16 weights halve.
FLOAT32_NORM = re.compile(r"(?:layer_norm|LayerNorm|GammaBeta)\w*<float, float\b")
FLOAT32_FUNCTOR = re.compile(r"\w*Functor<float\b")


def _optimizer_on(elements: str) -> re.Pattern:
    """Optimizer kernels (fused AdamW's math functor, the foreach implementation's) on `elements` (a regex)."""
    return re.compile(rf"multi_tensor_apply.*Functor<{elements}\b|Adam\w*Functor<{elements}\b")


FLOAT32_OPTIMIZER = _optimizer_on("float")
HALF_OPTIMIZER = _optimizer_on(r"c10::(?:BFloat16|Half)")
MASTER_WEIGHT_COLUMNS = ["kind", *NAMED_COLUMNS]


def float32_weights(kernels: pd.DataFrame) -> pd.DataFrame:
    """Where the optimizer updates float32 weights (its float32 kernels take longer than any on bf16 or fp16)
    and kernels cast to bf16 or fp16: those casts (kind `cast`), the casts back to float32 (kind `cast_back`),
    the float32 optimizer kernels (kind `optimizer`) and layer norms on float32 input (kind `norm`), else no rows.
    `kernels`: name_totals rows."""
    casts, back, float32, half, norms = (
        _named(kernels, pattern)
        for pattern in (CAST_TO_HALF, CAST_TO_FLOAT32, FLOAT32_OPTIMIZER, HALF_OPTIMIZER, FLOAT32_NORM)
    )
    if casts.empty or float32["total_ns"].sum() <= half["total_ns"].sum():
        return pd.DataFrame(columns=MASTER_WEIGHT_COLUMNS)
    kinds = [
        casts.assign(kind="cast"),
        back.assign(kind="cast_back"),
        float32.assign(kind="optimizer"),
        norms.assign(kind="norm"),
    ]
    return pd.concat([kind for kind in kinds if len(kind)], ignore_index=True)[MASTER_WEIGHT_COLUMNS]


# Kernels that write one value over a tensor: PyTorch's fill_ (torch.zeros, torch.full, and the NaN with which
# torch.use_deterministic_algorithms fills every new tensor: fill_uninitialized_memory).
FILL = re.compile(r"FillFunctor|fill_kernel")
# Kernels that add two tensors elementwise: PyTorch's add (autograd sums the gradients a tensor gets from its uses).
ADD = re.compile(r"CUDAFunctor_add|AddFunctor")


def fill_share_pct(kernels: pd.DataFrame) -> float:
    """The share of kernel launches (%) that fill memory with one value (FILL, by demangled name). `kernels`:
    name_totals rows."""
    total = int(kernels["instances"].sum()) if len(kernels) else 0
    if not total:
        return 0.0
    names = kernels["name"].fillna(kernels["short_name"]).astype(str)
    filling = _by_distinct_name(names, lambda name: bool(FILL.search(name))).astype(bool).to_numpy(bool)
    return 100.0 * int(kernels["instances"][filling].sum()) / total


def kernel_mix(kernels: pd.DataFrame) -> dict:
    """Shares of kernel time (%) that decide compute- vs memory-bound: dense math, streaming, tensor cores."""
    total = kernels["duration"].sum()
    if not total:
        return {"compute_pct": 0.0, "memory_pct": 0.0, "tensor_core_pct": 0.0}
    families = kernel_families(kernels)
    share = lambda mask: float(100.0 * kernels.loc[mask, "duration"].sum() / total)  # noqa: E731
    return {
        "compute_pct": share(families.isin(COMPUTE_BOUND_FAMILIES)),
        "memory_pct": share(families.isin(MEMORY_BOUND_FAMILIES)),
        "tensor_core_pct": share(on_tensor_cores(kernels)),
    }
