"""From findings to variants: the config change that tests each of a report's top findings.

REMEDIES is the one table of which setting fixes which finding. `sftprof suggest RESULT_DIR` prints
the variants for the findings of one analysis, largest gain first, as YAML to paste under
`experiments.NAME.variants` in config.yaml; the comparison then says whether each paid.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from sftprof.analysis import Analysis


@dataclass(frozen=True)
class Remedy:
    variant: str  # the variant's name in config
    overrides: dict  # merged into the experiment
    why: str  # one line, printed as a comment


# Finding rule id -> what tests it with the built-in trainer's switches (sftprof.capture.sft.torch_backend.SWITCHES).
REMEDIES = {
    # A multiple of 64: each new length costs cuDNN attention a new plan, and on the H200 padding to the exact
    # longest length saved 4.8% of the median step where padding to a multiple of 64 saved 66% (docs/USAGE.md).
    "padding": Remedy(
        "pad-longest",
        {"sft": {"padding": "longest", "pad_to_multiple_of": 64}},
        "pad each batch to its longest sequence (a multiple of 64), not to seq_length",
    ),
    "pageable_memcpy": Remedy(
        "pinned", {"sft": {"pin_memory": True}}, "pinned host batches, copied with non_blocking=True"
    ),
    "foreach_optimizer": Remedy(
        "fused-adamw", {"sft": {"fused_optimizer": True}}, "AdamW(fused=True): one pass over the optimizer state"
    ),
    "sync_in_steps": Remedy(
        "loss-every-50",
        {"sft": {"loss_every": 50}},
        "read the loss every 50 steps, not every step (loss.item() synchronizes)",
    ),
    "sync_memcpy": Remedy(
        "loss-every-50",
        {"sft": {"loss_every": 50}},
        "read the loss every 50 steps, not every step (a synchronous DtoH copy)",
    ),
    "launch_bound": Remedy(
        "compiled", {"sft": {"compile": True}}, "torch.compile: fewer, larger kernels and less Python per step"
    ),
    "memory_bound_kernel_mix": Remedy(
        "compiled", {"sft": {"compile": True}}, "torch.compile fuses chains of elementwise kernels"
    ),
}


def suggest(analysis: Analysis, top: int = 3) -> list[tuple[str, dict, str, float | None]]:
    """(variant name, config entry, why, predicted gain) for the `top` findings with a remedy, largest
    gain first (the analysis ranked them); one variant per remedy."""
    chosen: dict[str, tuple[str, dict, str, float | None]] = {}
    for finding in analysis.findings:
        remedy = REMEDIES.get(finding.rule)
        if remedy is None or remedy.variant in chosen or not finding.gain_pct:
            continue
        entry = {"motivated_by": finding.rule, **remedy.overrides}
        chosen[remedy.variant] = (remedy.variant, entry, remedy.why, finding.gain_pct)
        if len(chosen) == top:
            break
    return list(chosen.values())


def as_yaml(suggestions: list[tuple[str, dict, str, float | None]], source: str) -> str:
    """The variants as config YAML, each with a comment saying what it tests and what it should pay."""
    if not suggestions:
        return f"# {source}: no finding with a gain has a remedy sftprof can switch on; nothing to try.\n"
    lines = [
        f"# Variants that test the top findings of {source}, largest predicted gain first.",
        "# Paste under experiments.NAME.variants in config.yaml; results/NAME/variants/ gives the verdict.",
        "variants:",
    ]
    for name, entry, why, gain in suggestions:
        lines.append(f"  # {entry['motivated_by']}: {why}; predicted gain at most {gain:.1f}% of the median step")
        body = yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=False)
        lines += ["  " + line for line in body.splitlines()]
    return "\n".join(lines) + "\n"
