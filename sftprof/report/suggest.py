"""From findings to variants: the config change that tests each of a report's top findings.

REMEDIES is the one table of which setting fixes which finding. `sftprof suggest RESULT_DIR` prints
the variants for the findings of one analysis, largest gain first, as YAML to paste under
`experiments.NAME.variants` in config.yaml; the comparison then says whether each paid.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from sftprof.analysis import Analysis
from sftprof.capture.sft import nemo_backend
from sftprof.errors import SftprofError
from sftprof.io import atomic_write_text
from sftprof.text import terminal_safe

log = logging.getLogger(__name__)


class SuggestError(SftprofError, ValueError):
    """A request suggest cannot answer as asked."""


@dataclass(frozen=True)
class Remedy:
    variant: str  # the variant's name in config
    overrides: dict  # merged into the experiment
    why: str  # one line, printed as a comment


# Finding rule id -> backend -> the setting that tests it: the built-in trainer's switches
# (sftprof.capture.sft.torch_backend.SWITCHES) and the NeMo backend's knobs (config `sft.nemo`), each read
# only by its own backend, so a rule with no remedy for a backend suggests nothing there.
REMEDIES = {
    # A multiple of 64: each new length costs cuDNN attention a new plan, and on the H200 padding to the exact
    # longest length saved 4.8% of the median step where padding to a multiple of 64 saved 66% (docs/USAGE.md).
    "padding": {
        "torch": Remedy(
            "pad-longest",
            {"sft": {"padding": "longest", "pad_to_multiple_of": 64}},
            "pad each batch to its longest sequence (a multiple of 64), not to seq_length",
        ),
        "nemo": Remedy(
            "packed",
            {"sft": {"nemo": {"packed_sequence": True}}},
            "pack examples into each sequence (NeMo's packed_sequence_specs) instead of padding each to seq_length",
        ),
    },
    "pageable_memcpy": {
        "torch": Remedy("pinned", {"sft": {"pin_memory": True}}, "pinned host batches, copied with non_blocking=True"),
    },
    "foreach_optimizer": {
        "torch": Remedy(
            "fused-adamw", {"sft": {"fused_optimizer": True}}, "AdamW(fused=True): one pass over the optimizer state"
        ),
    },
    "sync_in_steps": {
        "torch": Remedy(
            "loss-every-50",
            {"sft": {"loss_every": 50}},
            "read the loss every 50 steps, not every step (loss.item() synchronizes)",
        ),
    },
    "sync_memcpy": {
        "torch": Remedy(
            "loss-every-50",
            {"sft": {"loss_every": 50}},
            "read the loss every 50 steps, not every step (a synchronous DtoH copy)",
        ),
    },
    "launch_bound": {
        "torch": Remedy(
            "compiled", {"sft": {"compile": True}}, "torch.compile: fewer, larger kernels and less Python per step"
        ),
        "nemo": Remedy(
            "cuda-graphs",
            {"sft": {"nemo": {"cuda_graphs": True}}},
            "replay each transformer layer as a CUDA graph: one launch instead of many",
        ),
    },
    "fp32_gemm": {
        "torch": Remedy("bf16", {"sft": {"precision": "bf16"}}, "bf16 autocast: GEMMs on bf16 tensor cores"),
    },
    "float32_weights": {
        "torch": Remedy(
            "bf16-true",
            {"sft": {"precision": "bf16-true"}},
            "weights, gradients and AdamW's state in bf16: no casts each forward, half the optimizer's traffic",
        ),
    },
    "unfused_attention": {
        "torch": Remedy("sdpa", {"sft": {"attention": "sdpa"}}, "SDPA: fused attention kernels, no seq x seq scores"),
    },
    "allocator_churn": {
        "torch": Remedy(
            "expandable-segments",
            {"sft": {"cuda_alloc_conf": "expandable_segments:True"}},
            "the caching allocator grows segments instead of calling cudaMalloc/cudaFree as sizes change",
        ),
    },
    "unaligned_gemm": {
        "torch": Remedy(
            "pad-vocab",
            {"sft": {"pad_vocab_to_multiple_of": 64}},
            "grow the vocabulary to a multiple of 64: the LM head's GEMMs on aligned kernels",
        ),
    },
    "recomputation": {
        "torch": Remedy(
            "no-checkpointing",
            {"sft": {"gradient_checkpointing": False}},
            "no activation checkpointing: keep the activations rather than run each layer's forward twice",
        ),
    },
    "memory_bound_kernel_mix": {
        "torch": Remedy(
            "compiled",
            {"sft": {"compile": True}},
            "torch.compile fuses elementwise kernels with the norms and reductions beside them",
        ),
    },
    "exposed_communication": {
        "torch": Remedy(
            "ddp-overlap",
            {"sft": {"ddp_overlap": True}},
            "all-reduce gradient buckets during the backward pass (DDP), not after it",
        ),
        "nemo": Remedy(
            "overlap-grad-reduce",
            {"sft": {"nemo": {"overlap_grad_reduce": True}}},
            "overlap the gradient reduction with the backward pass, bucket by bucket (Megatron DDP)",
        ),
    },
}


def _remedies(analysis: Analysis, run: dict):
    """(finding, remedy) for each finding with a gain that has a remedy for the run's backend, largest gain
    first (the analysis ranked them)."""
    for finding in analysis.findings:
        remedy = REMEDIES.get(finding.rule, {}).get(run.get("backend", "torch"))
        if remedy is not None and finding.gain_pct:
            yield finding, remedy


def _ruled_out(remedy: Remedy, run: dict) -> str | None:
    """Why the run cannot take the remedy, or None: a NeMo knob the backend refuses without Transformer
    Engine (nemo_backend.NEEDS_TRANSFORMER_ENGINE), on a run whose metrics say it had none; or switches the
    run's facts say were already set so. It would fail, or test nothing."""
    knobs = set(remedy.overrides.get("sft", {}).get("nemo", {})) & set(nemo_backend.NEEDS_TRANSFORMER_ENGINE)
    if knobs and run.get("layer_spec") == nemo_backend.LOCAL_SPEC:
        return f"needs Transformer Engine, which the run lacked (layer_spec {nemo_backend.LOCAL_SPEC})"
    switches = {key: value for key, value in remedy.overrides.get("sft", {}).items() if key != "nemo"}
    if switches and all(run.get(key) == value for key, value in switches.items()):
        return "is what the run already did"
    return None


def suggest(analysis: Analysis, top: int = 3, run: dict | None = None) -> list[tuple[str, dict, str, float | None]]:
    """(variant name, config entry, why, predicted gain) for the `top` findings with a remedy the run can take
    (`run`: the trainer's run facts, backend torch where absent), largest gain first; one variant per remedy."""
    if top < 1:
        raise SuggestError(f"--top must be at least 1, not {top}")
    run = run or {}
    chosen: dict[str, tuple[str, dict, str, float | None]] = {}
    for finding, remedy in _remedies(analysis, run):
        if remedy.variant in chosen or _ruled_out(remedy, run):
            continue
        entry = {"motivated_by": finding.rule, **copy.deepcopy(remedy.overrides)}
        chosen[remedy.variant] = (remedy.variant, entry, remedy.why, finding.gain_pct)
        if len(chosen) == top:
            break
    return list(chosen.values())


def ruled_out(analysis: Analysis, run: dict) -> list[str]:
    """One line per remedy that suggest leaves out because the run cannot take it, saying which finding it
    answers and why: a user should know a remedy exists before changing the stack for it."""
    lines = {}
    for finding, remedy in _remedies(analysis, run):
        why = _ruled_out(remedy, run)
        if why and remedy.variant not in lines:
            lines[remedy.variant] = f"{finding.rule}: `{remedy.variant}` ({remedy.why}) {why}"
    return list(lines.values())


def run_facts(result_dir: str | Path) -> dict:
    """What the trainer said of the run a result folder analysed (backend, layer_spec, ...), from its metrics:
    the window's capture/ beside (or above) the analysis holds them; {} where there are none."""
    from sftprof.trace.metrics import read_metrics

    folder = Path(result_dir)
    for candidate in (folder, *folder.parents[:2]):
        metrics = sorted((candidate / "capture").glob("*.metrics.jsonl"))
        if metrics:
            return read_metrics(metrics[0]).run
    return {}


def first_analysis_dir(result_dir: str | Path) -> Path:
    """The analysis folder of a result folder's first profiled rank (what suggest reads)."""
    from sftprof import results

    folders = results.analysis_dirs(Path(result_dir))
    if not folders:
        raise results.ResultsError(
            f"{result_dir}: no {results.SUMMARY_FILE} in it, in its analysis/ folder or in a rank folder below"
        )
    return folders[0]


def write_suggestions(analysis_dir: str | Path, backend: str, top: int, out_path: str | Path) -> None:
    """The workflow's suggest step (config suggested_variants): what `sftprof suggest` prints, into OUT_PATH."""
    from sftprof import results

    folder = first_analysis_dir(analysis_dir)
    analysis, run = results.load(folder), {**run_facts(analysis_dir), "backend": backend}
    suggestions = suggest(analysis, top, run)
    atomic_write_text(out_path, as_yaml(suggestions, str(folder), ruled_out(analysis, run)))
    log.info("suggested variants for %s: %s", folder, ", ".join(name for name, *_ in suggestions) or "none")


def read_suggestions(path: str | Path) -> dict[str, dict]:
    """The variants in a file write_suggestions wrote, by name ({} when there were none)."""
    return (yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}).get("variants", {})


def as_yaml(suggestions: list[tuple[str, dict, str, float | None]], source: str, left_out: Sequence[str] = ()) -> str:
    """The variants as config YAML, each with a comment saying what it tests and what it should pay; the
    remedies the run could not take, as comments after them. SOURCE is written on one line, its control
    characters escaped: a newline in a folder name would otherwise end the comment and add YAML of its own."""
    source = terminal_safe(source)
    notes = [f"# Not suggested, {line}." for line in left_out]
    if not suggestions:
        return (
            "\n".join(
                [f"# {source}: no finding with a gain has a remedy this run can switch on; nothing to try.", *notes]
            )
            + "\n"
        )
    lines = [
        f"# Variants that test the top findings of {source}, largest predicted gain first.",
        "# Paste under experiments.NAME.variants in config.yaml; results/NAME/variants/ gives the verdict.",
        "variants:",
    ]
    for name, entry, why, gain in suggestions:
        lines.append(f"  # {entry['motivated_by']}: {why}; predicted gain at most {gain:.1f}% of the median step")
        body = yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=False)
        lines += ["  " + line for line in body.splitlines()]
    return "\n".join([*lines, *notes]) + "\n"
