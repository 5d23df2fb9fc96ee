"""A finding: what the trace shows, the numbers behind it, and what to do about it."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # "info" | "warning"
    title: str
    evidence: str
    recommendation: str = ""

    def to_dict(self) -> dict:
        return asdict(self)
