"""A finding: what the trace shows, the numbers behind it, what to do about it, and what doing it
could save.

`gain_pct` is the share of the median step time that fixing the problem could save at most, read off
the timeline (see gains.py), and `gain_basis` says in one line how it was computed; a finding that
is a fact rather than a fixable cost (a verdict, a note about the trace) has no gain (None).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# A problem whose attainable gain reaches this share of the median step is a warning; below, info.
WARNING_SHARE_PCT = 5.0
# Findings about the capture itself rather than the program (rows left out as damaged, trace kinds
# that recorded nothing, a capture that slowed the run): reports say them once, before the findings they qualify.
CAPTURE_NOTES = ("dropped_rows", "empty_trace_kind", "profiling_overhead")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # "info" | "warning"
    title: str
    evidence: str
    recommendation: str = ""
    gain_pct: float | None = None
    gain_basis: str = ""
    few_steps: bool = False  # its time is in a few of the steps (most have none): what makes those steps slow

    def to_dict(self) -> dict:
        return asdict(self)


def pct(part, whole) -> float:
    """`part` as a share of `whole` in %; 0 when `whole` is 0 (an empty capture, no steps)."""
    return 100.0 * part / whole if whole else 0.0


def ms(ns, digits: int = 3) -> str:
    """Nanoseconds as evidence text shows them: `1,234.567 ms`."""
    return f"{ns / 1e6:,.{digits}f} ms"


def severity_of(gain_pct: float) -> str:
    return "warning" if gain_pct >= WARNING_SHARE_PCT else "info"


# Findings that say where time went but not why (steps slower than the median): ranked after a finding of work in
# a few of the steps (few_steps) priced at least CAUSE_SHARE of their gain, likely what made them slow (an
# evaluation every few steps is both a slow step and an extra forward pass; the pass is what to change).
SYMPTOMS = ("slow_steps",)
CAUSE_SHARE = 0.75


def ranked(findings: list[Finding]) -> list[Finding]:
    """By attainable gain, largest first; findings without a gain after them, warnings first, each
    group in the order the rules produced it (sorted() is stable); a symptom just after the largest cause
    in its steps nearly as large."""
    order = sorted(findings, key=lambda f: (f.gain_pct is None, -(f.gain_pct or 0.0), f.severity != "warning"))
    for symptom in [f for f in order if f.rule in SYMPTOMS and f.gain_pct]:
        at = order.index(symptom)
        cause = next((i for i in range(at + 1, len(order)) if _is_cause_of(order[i], symptom)), None)
        if cause is not None:
            order.insert(cause, order.pop(at))
    return order


def _is_cause_of(finding: Finding, symptom: Finding) -> bool:
    return finding.few_steps and (finding.gain_pct or 0.0) >= CAUSE_SHARE * (symptom.gain_pct or 0.0)


def gain_text(gain_pct: float | None) -> str:
    """A gain as reports and comparisons print it: "12.3%", "<0.1%" for a small non-zero one."""
    if gain_pct is None:
        return "–"
    return "<0.1%" if 0 < gain_pct < 0.05 else f"{gain_pct:.1f}%"
