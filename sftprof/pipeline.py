"""The one place that chains the reading side: export a report -> load a trace -> analyze -> save the
results -> render.

The CLI (`sftprof analyze`), the workflow's export, analyze and report rules and `compare` all call these,
so each runs the same steps in the same order and releases the same resources. It is the one module
that imports every part (capture, trace, analysis, report); none of them imports it (tests/test_style.py).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import duckdb

from sftprof import memory_budget, results, scratch
from sftprof.analysis import Analysis, analyze, compare
from sftprof.capture import container, rank
from sftprof.capture.nsys import EXPORT_SUFFIXES, NsysError, export_kind, nsys_after, run_export
from sftprof.io import OutputError, atomic_dir, atomic_path, check_output
from sftprof.report import RankReport, write_html
from sftprof.trace import TraceTables, load_trace
from sftprof.trace.events import out_of_disk
from sftprof.trace.load import clock_origin, from_nsys, trace_stem
from sftprof.trace.metrics import read_metrics
from sftprof.trace.nsys.nsys_export import (
    ParquetExport,
    TraceFormatError,
    export_source,
    record_source,
    report_fingerprint,
    require_file,
)
from sftprof.trace.nsys.nsys_sqlite import check_export

ANALYSIS_DIR, REPORT_HTML = "analysis", "report.html"  # what `sftprof analyze` writes into its output folder
ANALYZE_OUTPUT = (ANALYSIS_DIR, REPORT_HTML)
log = logging.getLogger(__name__)


# ---------------------------------------------------------------- exports (capture -> trace)


def export_report(
    report: str | Path,
    output: str | Path,
    *,
    nsys: str | None = None,
    prefix: Sequence[str] = (),
    source: dict | None = None,
) -> Path:
    """`nsys export` into `output`, of the type its suffix names (EXPORT_SUFFIXES: a .sqlite file or a
    .parquetdir folder), put in place only once it opens as a whole export: on a full disk nsys exits 0
    and leaves an empty or truncated file. Here, not in capture/ or trace/: capture runs nsys
    (capture/nsys.py), and whether the result is whole is the format's to say (trace/).

    `nsys`: the nsys that captured the report, run after `prefix` (a container's exec prefix, where
    the capture ran in that container: its nsys is then the image's, "nsys" on its PATH); by
    default the one on PATH, as run_profile uses. `source`: the report's fingerprint
    (nsys_export.report_fingerprint), kept in an SQLite export, so that the export is later known to be
    this report's (sqlite_for_report)."""
    output = Path(output)
    kind = next((kind for kind, suffix in EXPORT_SUFFIXES.items() if output.suffix == suffix), None)
    if kind is None:
        raise ValueError(f"{output}: an export's name ends in {' or '.join(EXPORT_SUFFIXES.values())}")
    with atomic_path(output) as tmp:
        tmp.unlink()  # nsys writes the file, or the folder, itself
        said = run_export(report, tmp, kind, nsys or nsys_after(prefix), prefix)
        try:
            if kind == "sqlite":
                check_export(tmp)
            else:
                ParquetExport(tmp).close()  # reads every table's footer: a table cut short is refused
        except TraceFormatError as error:
            last = said[-1:] or ["no message"]
            raise NsysError(
                f"nsys export of {report} is not a complete export ({error}); nsys said: {last[0][-300:]}. "
                f"Is the disk of {output.parent} full?"
            ) from None
        if source is not None and kind == "sqlite":
            record_source(tmp, source)
    return output


def export_capture(capture_dir: str | Path, export_dir: str | Path, container_settings: dict | None) -> None:
    """Export every profiled rank's report into EXPORT_DIR with the nsys that captured it: the container's,
    where the capture ran in one (`container_settings`; None or runtime none: the host's). As a parquetdir
    (rankN.parquetdir) where that nsys writes one, else as rankN.sqlite (nsys.export_kind)."""
    capture_dir = Path(capture_dir)
    prefix: list[str] = []
    if container_settings and container_settings["runtime"] != "none":
        image = container.image_file(container_settings)
        prefix = container.exec_prefix(container_settings, image, os.getcwd())
    nsys_path = nsys_after(prefix)
    kind = export_kind(nsys_path, prefix)
    with atomic_dir(export_dir) as partial:
        for record in rank.profiled_records(capture_dir):
            target = rank.export_path(partial, record["rank"], kind)
            export_report(capture_dir / record["report"], target, nsys=nsys_path, prefix=prefix)
            log.info("rank %d: %s -> %s", record["rank"], record["report"], target.name)


def sqlite_for_report(report: Path) -> tuple[Path, str | None]:
    """The SQLite export of a .nsys-rep: the one beside it where it was made from this very report (its
    fingerprint says so), else a new one beside it, or, where the report's folder cannot be written, in a
    temporary folder (returned second: remove it when done)."""
    require_file(report)
    sqlite_path = report.with_suffix(".sqlite")
    source = report_fingerprint(report)
    if sqlite_path.is_file() and export_source(sqlite_path) == source:
        return sqlite_path, None
    try:
        return export_report(report, sqlite_path, source=source), None
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
    folder = scratch.folder("export")
    try:
        return export_report(report, Path(folder) / sqlite_path.name, source=source), folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _load(trace: Path) -> TraceTables:
    """The tables of `trace`; a .nsys-rep is read from its SQLite export (sqlite_for_report), a temporary
    one removed with the tables' store."""
    if trace.suffix != ".nsys-rep":
        return load_trace(trace)
    sqlite_path, temporary = sqlite_for_report(trace)
    try:
        tables = load_trace(sqlite_path)
    except BaseException:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    if temporary:
        tables.events.remove_on_close(temporary)
    return tables


def analyze_trace(
    trace: str | Path,
    metrics: str | Path | None = None,
    progress: Callable[[str], None] = lambda step: None,
    step_range: str | None = None,
) -> Analysis:
    """Load one trace (nsys .sqlite/.nsys-rep, Kineto JSON) and analyze it with the trainer's metrics;
    `step_range`: the step ranges' pattern where the default does not know them (cpu.step_pattern)."""
    run_metrics = read_metrics(metrics)  # a bad metrics file is refused before any work
    try:
        tables = _load(Path(trace))
        try:
            return analyze(tables, progress=progress, metrics=run_metrics, step_range=step_range)
        finally:
            tables.events.close()  # its temporary database: as large as the trace's kernels and calls
    except duckdb.OutOfMemoryException as exc:
        raise memory_budget.exceeded(exc) from None
    except (duckdb.Error, OSError) as exc:
        full = out_of_disk(exc)
        if full is None:
            raise
        raise full from None


def output_dirs(traces: list[Path], output: str | Path | None) -> list[Path]:
    """`sftprof analyze`'s output folder for each trace, one of its own whatever the names: NAME-sftprof beside
    it (or OUTPUT/NAME with several traces), NAME the file's name less its known suffix. Where two names would
    give one folder, each keeps its whole file name, and where they still would (one name in two folders, with
    -o), the later is numbered; a trace given twice is refused."""
    traces = [Path(trace) for trace in traces]
    first: dict[str, Path] = {}
    for trace in traces:
        same = first.setdefault(os.path.realpath(trace), trace)
        if same is not trace:
            raise OutputError(f"{trace} is given twice (also as {same}): give each trace once")

    def folder(trace: Path, name: str) -> Path:
        if output is None:
            return trace.parent / f"{name}-sftprof"
        return Path(output) / name if len(traces) > 1 else Path(output)

    def key(path: Path) -> str:
        return os.path.abspath(path)

    def shared(paths: list[Path]) -> set[str]:
        keys = [key(path) for path in paths]
        return {k for k in keys if keys.count(k) > 1}

    by_stem = [folder(trace, trace_stem(trace)) for trace in traces]
    by_name = [
        folder(trace, trace.name) if key(path) in shared(by_stem) else path for trace, path in zip(traces, by_stem)
    ]
    chosen = [stem if key(name) in shared(by_name) else name for stem, name in zip(by_stem, by_name)]
    taken = {key(path) for path in chosen}
    dirs: list[Path] = []
    for path in chosen:
        candidate, number = path, 1
        while key(candidate) in {key(d) for d in dirs} or (candidate is not path and key(candidate) in taken):
            number += 1
            candidate = path.with_name(f"{path.name}-{number}")
        dirs.append(candidate)
    return dirs


def analyze_into(
    trace: str | Path,
    out_dir: str | Path,
    metrics: str | Path | None,
    title: str,
    progress: Callable[[str], None] = lambda step: None,
    step_range: str | None = None,
) -> Analysis:
    """`sftprof analyze`: OUT_DIR/analysis/ and OUT_DIR/report.html, which appear together or not at all."""
    check_output(out_dir, ANALYZE_OUTPUT)
    analysis = analyze_trace(trace, metrics, progress, step_range)
    progress("writing tables and HTML")
    with atomic_dir(out_dir, owned=ANALYZE_OUTPUT) as partial:
        results.save(analysis, partial / ANALYSIS_DIR)
        write_html([RankReport("", analysis, metrics)], partial / REPORT_HTML, title)
    return analysis


def _rank_paths(capture_dir: Path, output_name: str, record: dict) -> tuple[Path, str]:
    metrics = capture_dir / rank.METRICS_PATTERN.format(output_name=output_name).format(rank=record["rank"])
    return metrics, rank.RANK_DIR_PATTERN.format(rank=record["rank"])


def analyze_capture(
    capture_dir: str | Path,
    export_dir: str | Path,
    output_name: str,
    out_dir: str | Path,
    step_range: str | None = None,
) -> None:
    """The workflow's analyze step: every profiled rank of one capture folder (its export in EXPORT_DIR), each
    into its own folder of OUT_DIR, which appears whole or not at all. `step_range`: config key step_range."""
    capture_dir, export_dir = Path(capture_dir), Path(export_dir)
    with atomic_dir(out_dir) as partial:
        for record in rank.profiled_records(capture_dir):
            metrics, folder = _rank_paths(capture_dir, output_name, record)
            analysis = analyze_trace(
                rank.find_export(export_dir, record["rank"]),
                metrics if metrics.exists() else None,
                functools.partial(log.info, "rank %d: %s", record["rank"]),
                step_range,
            )
            results.save(analysis, partial / folder)
            for finding in analysis.findings:
                log.info("rank %d [%s] %s", record["rank"], finding.severity, finding.title)
    overrun = memory_budget.overrun()
    if overrun:
        log.warning("%s", overrun)


def render_capture(
    capture_dir: str | Path, analysis_dir: str | Path, output_name: str, html: str | Path, title: str
) -> None:
    """The workflow's report step: one HTML report with a section per profiled rank."""
    capture_dir, analysis_dir = Path(capture_dir), Path(analysis_dir)
    parts = []
    for record in rank.profiled_records(capture_dir):
        metrics, folder = _rank_paths(capture_dir, output_name, record)
        parts.append(
            RankReport(f"Rank {record['rank']} on {record['host']}", results.load(analysis_dir / folder), metrics)
        )
    write_html(parts, html, title)
    log.info("report %s (%d rank(s))", html, len(parts))


def _first_rank(capture_dir: Path, analysis_dir: Path, output_name: str):
    """The analysis and trainer metrics of a window's first profiled rank."""
    from sftprof.analysis.variants import Run

    record = rank.profiled_records(capture_dir)[0]
    metrics, folder = _rank_paths(capture_dir, output_name, record)
    return Run(results.load(analysis_dir / folder).findings, read_metrics(metrics if metrics.exists() else None))


def compare_variants(
    baseline: tuple[str, str | Path, str | Path],
    variants: list[tuple[str, str | None, str | Path, str | Path]],
    output_name: str,
    out_dir: str | Path,
    title: str,
) -> None:
    """The workflow's variants step: each variant (name, motivated_by, capture dir, analysis dir) of one window
    against the baseline (name, capture dir, analysis dir), into OUT_DIR (variants.csv, variants.html)."""
    from sftprof.analysis.variants import verdict
    from sftprof.report import variants as variants_report

    label, capture_dir, analysis_dir = baseline
    base = _first_rank(Path(capture_dir), Path(analysis_dir), output_name)
    runs = {
        name: (rule, _first_rank(Path(capture), Path(analysis), output_name))
        for name, rule, capture, analysis in variants
    }
    table = verdict(base, runs)
    with atomic_dir(out_dir) as partial:
        variants_report.write(table, partial, title, label)
    for row in table.itertuples():
        log.info("variant %s: %s", row.variant, row.verdict)


def compare_paths(paths: list[str | Path]) -> compare.Comparison:
    """`sftprof compare` and the workflow's compare rule: each input an analysis folder (or a folder of rank
    folders, results.analysis_dirs) or a trace, analysed here; labelled by the shortest unique path tails."""
    loaded = []
    for path in map(Path, paths):
        if path.is_file() and path.name == results.SUMMARY_FILE:
            path = path.parent
        if path.is_dir():
            folders = results.analysis_dirs(path)
            if not folders:
                raise compare.CompareError(
                    f"{path}: no {results.SUMMARY_FILE} in it, in its analysis/ folder or in a "
                    "rank folder below; give an analysis folder or a trace file"
                )
            loaded += [(folder, _saved_for_compare(folder)) for folder in folders]
        elif path.exists():
            loaded.append((path, analyze_trace(path)))
        else:
            raise compare.CompareError(f"{path}: no such file or folder")
    labels = compare.unique_labels([path for path, _ in loaded])
    return compare.compare(
        {label: analysis for label, (_, analysis) in zip(labels, loaded)},
        {label: str(path) for label, (path, _) in zip(labels, loaded)},
    )


def _saved_for_compare(folder: Path) -> Analysis:
    """The analysis saved in `folder`, refused naming the damaged file before anything is written."""
    analysis = results.load(folder)
    try:
        compare.check_usable(analysis)
    except compare.UnusableValue as unusable:
        raise compare.CompareError(f"{folder / unusable.file}: {unusable.problem}") from None
    return analysis


# ---------------------------------------------------------------- across ranks (docs/RANKS.md)

RANKS_DIR, RANKS_HTML = "ranks", "ranks.html"  # the cross-rank tables and page, beside a window's report
RANKS_OUTPUT = (*ANALYZE_OUTPUT, RANKS_DIR, RANKS_HTML)


def _rank_input(record: dict, analysis: Analysis | None, metrics: Path | None, trace: Path | None):
    """A rank's input to the cross-rank analysis; without `analysis`, its record's facts alone."""
    from sftprof.analysis.ranks import RankInput

    origin = clock_origin(trace) if trace is not None and from_nsys(trace) else None
    run = read_metrics(metrics if metrics is not None and metrics.exists() else None).run
    return RankInput(
        rank=record["rank"],
        node=record["node"],
        host=record["host"],
        world_size=record["world_size"],
        tables=analysis.tables if analysis else {},
        run=run,
        origin_ns=origin,
        sources=tuple(analysis.sources) if analysis else None,
        job_id=record.get("slurm_job_id"),
        span_ns=int(analysis.span_ns) if analysis else None,
    )


def _write_ranks(result, out_dir: Path, html: Path, title: str, rank_links: dict[int, str]) -> None:
    from sftprof.report import ranks as ranks_report

    ranks_report.save(result, out_dir)
    ranks_report.write_html(result, html, title, rank_links)
    for finding in result.findings:
        log.info("across ranks [%s] %s", finding.severity, finding.title)


def cross_rank_capture(
    capture_dir: str | Path,
    export_dir: str | Path,
    analysis_dir: str | Path,
    output_name: str,
    out_dir: str | Path,
    html: str | Path,
    title: str,
    report_html: str = REPORT_HTML,
):
    """The workflow's cross-rank step: every profiled rank's saved analysis of one window (analysis_dir/rankN)
    compared, into OUT_DIR (tables, ranks.json) and HTML, which links each rank to its section of the window's
    `report_html` (render_capture's anchors)."""
    from sftprof.analysis.ranks import analyze_ranks

    capture_dir, export_dir, analysis_dir = Path(capture_dir), Path(export_dir), Path(analysis_dir)
    records = rank.profiled_records(capture_dir)
    inputs = []
    for record in records:
        metrics, folder = _rank_paths(capture_dir, output_name, record)
        inputs.append(
            _rank_input(
                record,
                results.load(analysis_dir / folder),
                metrics,
                rank.find_export(export_dir, record["rank"]),
            )
        )
    result = analyze_ranks(inputs)
    links = {record["rank"]: f"{report_html}#r{i}-rank" for i, record in enumerate(records)}
    _write_ranks(result, Path(out_dir), Path(html), title, links)
    return result


def _rank_files(folder: Path, record: dict) -> tuple[Path, Path | None]:
    """A rank's trace in a capture folder (its export rankN.sqlite or rankN.parquetdir, else the report its
    record names, exported on loading) and its trainer metrics (*.rankN.metrics.jsonl, where there is one)."""
    from sftprof.analysis.ranks import RanksError

    candidates = [rank.find_export(folder, record["rank"]), folder / record["report"]]
    # Whatever is there, so that one that is no trace (a FIFO, a device, a folder) is refused as such by the loader.
    trace = next((path for path in candidates if os.path.lexists(path)), None)
    if trace is None:
        raise RanksError(
            f"{folder}: rank {record['rank']}'s record names {record['report']}, and neither it nor "
            f"{candidates[0].name} is there"
        )
    metrics = sorted(folder.glob(f"*.rank{record['rank']}.metrics.jsonl"))
    return trace, metrics[0] if len(metrics) == 1 else None


def cross_rank_dirs(
    capture_dirs: list[str | Path],
    out_dir: str | Path,
    title: str,
    progress: Callable[[str], None] = lambda step: None,
    allow_mixed: bool = False,
):
    """`sftprof ranks DIR...`: the profiled ranks recorded in the capture folders DIR (one per node, or one for
    the job), each analysed, then compared: OUT_DIR/analysis/rankN/ and OUT_DIR/report.html (as the workflow
    writes a window's), OUT_DIR/ranks/ and OUT_DIR/ranks.html, which appear together or not at all. Ranks of
    different runs are refused before any analysis, unless `allow_mixed` (the report then says so)."""
    from sftprof.analysis.ranks import RanksError, analyze_ranks, refuse_mixed

    check_output(out_dir, RANKS_OUTPUT)
    found: dict[int, tuple[Path, dict]] = {}
    for folder in map(Path, capture_dirs):
        if not folder.is_dir():
            raise RanksError(f"{folder} is not a folder: give capture folders (rank*.json records with their reports)")
        records = rank.profiled_records(folder)
        if not records:
            raise RanksError(
                f"{folder}: no rank records with a report (rank*.json, as python -m sftprof.capture.rank "
                "writes them beside the reports): is this a capture folder?"
            )
        for record in records:
            if record["rank"] in found:
                name = rank.RECORD_PATTERN.format(rank=record["rank"])
                raise RanksError(
                    f"rank {record['rank']} is recorded twice, in {found[record['rank']][0] / name} and "
                    f"{folder / name}: give each rank's folder once"
                )
            found[record["rank"]] = (folder, record)
    if not allow_mixed:  # before any analysis: each rank's takes a while
        refuse_mixed([_rank_input(record, None, None, None) for _, record in found.values()])
    out_dir = Path(out_dir)
    parts, inputs, links = [], [], {}
    with atomic_dir(out_dir, owned=RANKS_OUTPUT) as partial:
        for index, number in enumerate(sorted(found)):
            folder, record = found[number]
            trace, metrics = _rank_files(folder, record)
            progress(f"rank {number}: analysing {trace.name}")
            analysis = analyze_trace(trace, metrics)
            name = rank.RANK_DIR_PATTERN.format(rank=number)
            results.save(analysis, partial / ANALYSIS_DIR / name)
            parts.append(RankReport(f"Rank {number} on {record['host']}", analysis, metrics))
            inputs.append(_rank_input(record, analysis, metrics, trace))
            links[number] = f"{REPORT_HTML}#r{index}-rank"
        progress("comparing the ranks")
        result = analyze_ranks(inputs, allow_mixed)
        write_html(parts, partial / REPORT_HTML, f"{title}: each rank")
        _write_ranks(result, partial / RANKS_DIR, partial / RANKS_HTML, title, links)
    return result
