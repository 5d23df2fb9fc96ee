"""Where `sftprof analyze` spends its time and memory, phase by phase, with little overhead.

    .venv/bin/python benchmarks/profile_analyze.py FILE.sqlite [-o OUT_DIR]

Runs what `sftprof analyze` runs (load_trace, analyze, results.save, write_html) and reports:
each loader query (rows, seconds, RSS after, deep size of the frame), each section and rule of
the analysis registry (sftprof/analysis/registry.py) and each analysis function called outside
them (inclusive wall and CPU seconds of top-level calls, so nothing is counted twice; CPU is the
whole process, DuckDB's threads included; sections marked `beside` overlap the others), and the
report's plots and tables. Functions are wrapped at run time, so this keeps working while the
analyses change; cProfile's per-call overhead would distort pandas-heavy code.

--in-turn runs the sections one after another (sftprof runs some side by side) and gives each one's exact
peak above what the process held when it started: Linux's high-water mark, reset per section. An RSS sampled
every few milliseconds missed peaks of 70-80 MB that last less than that. The sections that left 20 MB or more
held (or let go) are then listed in the order they ran: what each kept for the ones after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import inspect
import pkgutil
import resource
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_depth = threading.local()  # per thread: analyses run on two
_totals: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])  # name -> [calls, seconds, CPU seconds]


def _rss_gb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize() / 2**30
    except OSError:
        return float("nan")


def _hwm_gb() -> float:
    """The process's peak resident set since the last _reset_hwm (Linux's VmHWM)."""
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM")) / 2**20


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _peaked(compute, name, peaks):
    """`compute`, its peak above its start and what it left appended to `peaks` (sections in turn only)."""

    @functools.wraps(compute)
    def run(*args, **kwargs):
        start = _rss_gb()
        _reset_hwm()
        value = compute(*args, **kwargs)
        peaks.append((name, start, _hwm_gb() - start, _rss_gb() - start))
        return value

    return run


def _timed(func, label):
    @functools.wraps(func)
    def timed(*args, **kwargs):
        if getattr(_depth, "value", 0):
            return func(*args, **kwargs)
        _depth.value = 1
        started, cpu = time.perf_counter(), time.process_time()
        try:
            return func(*args, **kwargs)
        finally:
            _depth.value = 0
            entry = _totals[label]
            entry[0] += 1
            entry[1] += time.perf_counter() - started
            entry[2] += time.process_time() - cpu

    return timed


def _wrap(module, name, func, label):
    timed = _timed(func, label)
    setattr(module, name, timed)
    return timed


# Entry points whose callees are what we want to see: not wrapped themselves.
ENTRY_POINTS = {"analyze", "write_html", "render_html", "_rank_context"}


def instrument(package: str, prefix: str = "") -> None:
    """Wrap every function defined in the package's modules, and the references to it that other
    modules of the package imported by name."""
    pkg = importlib.import_module(package)
    modules = [pkg] + [
        importlib.import_module(f"{package}.{m.name}")
        for m in pkgutil.iter_modules(pkg.__path__)
        if m.name != "__main__"
    ]
    originals = {}
    for module in modules:
        for name, func in list(vars(module).items()):
            if (
                inspect.isfunction(func)
                and func.__module__ == module.__name__
                and not name.startswith("__")
                and name not in ENTRY_POINTS
            ):
                originals[func] = _wrap(module, name, func, f"{prefix}{module.__name__.split('.')[-1]}.{name}")
    for module in modules:  # `from x import f` copies: point them at the wrapper too
        for name, func in list(vars(module).items()):
            if inspect.isfunction(func) and func in originals:
                setattr(module, name, originals[func])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("-o", "--output", type=Path, help="output folder (default: a temporary one)")
    parser.add_argument(
        "--in-turn", action="store_true", help="sections one after another, each with its exact peak (Linux)"
    )
    args = parser.parse_args(argv)
    out = args.output or Path(tempfile.mkdtemp(prefix="sftprof-profile-"))

    from sftprof.trace.nsys import nsys_sqlite

    loads = []

    def timed_table(name, read):
        """The loader's reader of one table (nsys_sqlite._nvtx, ...): its rows, time, RSS and frame size."""

        @functools.wraps(read)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            frame = read(*args, **kwargs)
            size = frame.memory_usage(deep=True).sum() / 2**30 if hasattr(frame, "memory_usage") else 0.0
            rows = len(frame) if hasattr(frame, "__len__") else None  # None: copied into the event store
            loads.append((name, rows, time.perf_counter() - started, _rss_gb(), size))
            return frame

        return timed

    for name in ("_strings", "_threads", "_nvtx", "_osrt", "_memops", "_sync", "_sched", "_gpu_metrics", "_gpus"):
        if hasattr(nsys_sqlite, name):
            setattr(nsys_sqlite, name, timed_table(name.strip("_"), getattr(nsys_sqlite, name)))

    instrument("sftprof.analysis")
    import sftprof.analysis as analysis_pkg

    registry = getattr(analysis_pkg, "registry", None)
    peaks = []
    if registry is not None and hasattr(analysis_pkg, "SECTIONS"):  # analyze() walks the registry's lists
        analysis_pkg.SECTIONS = tuple(
            dataclasses.replace(
                s,
                compute=_peaked(_timed(s.compute, f"section {s.name}"), s.name, peaks)
                if args.in_turn
                else _timed(s.compute, f"section {s.name}"),
                beside=s.beside and not args.in_turn,
            )
            for s in analysis_pkg.SECTIONS
        )
        analysis_pkg.RULES = tuple(
            dataclasses.replace(r, check=_timed(r.check, f"rule {r.name}")) for r in analysis_pkg.RULES
        )
    from sftprof import results
    from sftprof.report import RankReport, write_html
    from sftprof.trace import load_trace

    instrument("sftprof.report", prefix="report.")
    phases = []

    def phase(name, run):
        started, cpu = time.perf_counter(), time.process_time()
        value = run()
        phases.append((name, time.perf_counter() - started, time.process_time() - cpu, _rss_gb()))
        return value

    if args.in_turn:
        _reset_hwm()
    tables = phase("load_trace", lambda: load_trace(args.file))
    load_peak = _hwm_gb() if args.in_turn else None
    _totals.clear()
    analysis = phase("analyze", lambda: analysis_pkg.analyze(tables))
    analysis_totals = dict(_totals)
    _totals.clear()
    phase("results.save", lambda: results.save(analysis, out / "analysis"))
    phase("write_html", lambda: write_html([RankReport("", analysis, None)], out / "report.html", "profile"))
    report_totals = dict(_totals)

    print(f"{args.file}: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
    print("\nphase            seconds  CPU s  RSS after (GB)")
    for name, seconds, cpu, rss in phases:
        print(f"{name:16s} {seconds:8.1f} {cpu:6.1f}  {rss:6.2f}")
    if loads:
        print("\nloader query                        rows  seconds  RSS after  frame GB")
        for table, rows, seconds, rss, size in loads:
            shown = "in store" if rows is None else f"{rows:,}"
            print(f"{table:32s} {shown:>9s} {seconds:8.1f} {rss:9.2f} {size:9.2f}")
    for title, totals in (
        ("analyze(): top-level calls", analysis_totals),
        ("write_html(): top-level calls", report_totals),
    ):
        print(f"\n{title} (inclusive, slowest first)")
        for name, (calls, seconds, cpu) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:30]:
            print(f"  {name:45s} {calls:5d} calls {seconds:8.2f} s {cpu:6.2f} CPU s")
    if args.in_turn:
        print(f"\nsections in turn: load_trace peaked at {load_peak:.2f} GB; the highest peaks (GB)")
        print(f"  {'section':24s} {'start':>6s} {'peak above':>10s} {'left':>6s}")
        for name, start, above, left in sorted(peaks, key=lambda p: -(p[1] + p[2]))[:15]:
            print(f"  {name:24s} {start:6.2f} {above:10.2f} {left:+6.2f}")
        print("  in the order they ran, those that left 20 MB or more held (or let go)")
        for name, start, above, left in peaks:
            if abs(left) >= 0.02:
                print(f"  {name:24s} {start:6.2f} {above:10.2f} {left:+6.2f}")
    inline = phases[1][1] - sum(seconds for _, seconds, _ in analysis_totals.values())
    print(f"\nanalyze() less its sections (negative: sections ran side by side): {inline:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
