"""overhead_matrix.py's measurements (overhead.jsonl) as the markdown table docs carry.

Per model size, the unprofiled step U is the median over the unprofiled runs of each run's median window
step: the same steps, by number, as the profiled runs time, with no nsys (so whatever those steps do in
every run, such as a new batch length, is in both). Per setting and run, the window's median step W and the
same run's median step outside the window O; the table gives W against U (what the profile costs the steps
it shows) and W against O (what sftprof's profiling_overhead_pct sees in that run's report), each as the
median over the runs with the runs' range. A setting keeps the window's step within 5% of the unprofiled
one when every run does.

    python tests/gpu_programs/overhead_table.py OUT/overhead.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from statistics import median

WITHIN_PCT = 5.0


def _pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0)


def _spread(values: list[float], unit: str = "") -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:+.1f}{unit}" if unit == "%" else f"{values[0]:,.1f}"
    sign = "+" if unit == "%" else ""
    return f"{median(values):{sign},.1f}{unit} ({min(values):{sign}.1f} to {max(values):{sign}.1f})"


def table(lines: list[dict]) -> str:
    """The markdown table: one row per size and setting, in the order measured."""
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in lines:
        if line.get("rc") == 0 and line.get("window_ms") is not None:
            runs[(line["size"], line["setting"])].append(line)
    out = [
        "| model | setting | runs | window step (ms) | unprofiled step (ms) | window vs unprofiled | "
        "window vs outside, same run | within 5% |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for (size, setting), done in runs.items():
        if setting == "unprofiled":
            continue
        base = runs.get((size, "unprofiled"), [])
        unprofiled = median(r["window_ms"] for r in base) if base else None
        window = [r["window_ms"] for r in done]
        vs_unprofiled = [_pct(w, unprofiled) for w in window] if unprofiled else []
        vs_outside = [_pct(r["window_ms"], r["outside_ms"]) for r in done if r["outside_ms"]]
        whole = "no_capture_range" in setting  # the steps outside the window are profiled too
        plural = "" if len(base) == 1 else "s"
        within = "–" if not vs_unprofiled else ("yes" if max(vs_unprofiled) <= WITHIN_PCT else "no")
        out.append(
            f"| {size} | `{setting}` | {len(done)} | {_spread(window)} | "
            f"{f'{unprofiled:,.1f} ({len(base)} run{plural})' if unprofiled else '–'} | {_spread(vs_unprofiled, '%')} | "
            f"{'(all steps profiled) ' if whole else ''}{_spread(vs_outside, '%')} | {within} |"
        )
    skipped = [line for line in lines if line.get("rc") != 0]
    if skipped:
        out.append("")
        out.append(
            "Failed runs: " + ", ".join(f"{r['size']} `{r['setting']}` run {r['run']} (rc {r['rc']})" for r in skipped)
        )
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as source:
        print(table([json.loads(line) for line in source if line.strip()]))
