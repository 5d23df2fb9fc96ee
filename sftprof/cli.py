"""`sftprof`: the pipeline's pieces, usable without Snakemake.

sftprof analyze REPORT        analyse an .nsys-rep, .sqlite, .parquetdir folder or PyTorch profiler
                              .json[.gz] into tables, findings and HTML
sftprof compare A B [C...]    compare analyses or traces side by side: headline, deltas, findings
sftprof ranks DIR [DIR...]    compare the ranks of a multi-rank run: stragglers, skew, communication
sftprof render FORM EXP WIN   print how a window runs: local command, sbatch script, salloc line
sftprof submit EXP WIN        write the sbatch script of a window and submit it
sftprof fetch EXP WIN         fetch a window's capture (or report) from the cluster over SSH
sftprof validate [CONFIG]     check a config file and print it with defaults filled in
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from pathlib import Path

import yaml

from sftprof import __version__, memory_budget, scratch
from sftprof.text import terminal_safe


def _for_rich(text) -> str:
    """Names from a trace and paths from the user, as plain text for rich: no markup, no control sequences."""
    from rich.markup import escape

    return escape(terminal_safe(text))


def _cmd_analyze(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sftprof import pipeline
    from sftprof.analysis import STEPS
    from sftprof.step_names import step_pattern
    from sftprof.trace.metrics import read_metrics

    read_metrics(args.metrics)  # a bad metrics file, step pattern or budget is refused before any work
    step_pattern(args.step_range)
    _use_memory_budget(args)
    reports = list(map(Path, args.reports))
    for report, out_dir in zip(reports, pipeline.output_dirs(reports, args.output)):
        # On a terminal's stderr, and gone when done: a 10M-kernel export takes about a minute.
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not sys.stderr.isatty(),
        ) as bar:
            shown = _for_rich(report.name)
            task = bar.add_task(f"{shown}: loading", total=len(STEPS) + 2)

            def step(name: str, task=task, shown=shown) -> None:
                bar.update(task, advance=1, description=f"{shown}: {name}")

            analysis = pipeline.analyze_into(
                report, out_dir, args.metrics, args.title or f"sftprof: {report.name}", step, args.step_range
            )
        _print_summary(report, analysis, out_dir / pipeline.ANALYSIS_DIR, out_dir / pipeline.REPORT_HTML)
    _note_overrun()
    return 0


def _print_summary(report: Path, analysis, tables_dir: Path, html: Path) -> None:
    """Headline numbers and findings for the terminal (warnings in red); soft-wrapped, so piped
    output keeps each line whole."""
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True, highlight=False, emoji=False)
    console.print(f"[bold]{_for_rich(report)}[/bold]")
    headline = Table(show_header=False, box=None, padding=(0, 2))
    headline.add_column(no_wrap=True, min_width=max(map(len, analysis.headline), default=0))
    headline.add_column(no_wrap=True, overflow="ellipsis", max_width=64)  # long kernel names: one line
    for key, value in analysis.headline.items():
        if isinstance(value, (int, float, str)):
            headline.add_row(_for_rich(key), f"{value:,.3f}" if isinstance(value, float) else _for_rich(value))
    console.print(headline)
    for finding in analysis.findings:
        style = "red" if finding.severity == "warning" else "cyan"
        marker = "!" if finding.severity == "warning" else "-"
        console.print(f"  [{style}]{marker} {_for_rich(finding.title)}[/{style}]\n      {_for_rich(finding.evidence)}")
    console.print(f"  tables and findings: {_for_rich(tables_dir)}\n  report: {_for_rich(html)}")


def _cmd_suggest(args) -> int:
    from sftprof import results
    from sftprof.report import suggest

    folder = suggest.first_analysis_dir(args.result)  # the first profiled rank
    run = suggest.run_facts(args.result)
    if args.backend:
        run["backend"] = args.backend
    analysis = results.load(folder)
    text = suggest.as_yaml(suggest.suggest(analysis, args.top, run), str(folder), suggest.ruled_out(analysis, run))
    sys.stdout.write(terminal_safe(text, multiline=True))
    return 0


def _cmd_compare(args) -> int:
    from sftprof import pipeline
    from sftprof.io import check_output
    from sftprof.report import compare

    _use_memory_budget(args)
    check_output(args.output, compare.OUTPUT)
    comparison = pipeline.compare_paths(args.inputs)
    written = compare.write(comparison, args.output, args.title or "sftprof comparison")
    print(compare.summary_text(comparison))
    print("\n" + "\n".join(f"{what}: {terminal_safe(str(path))}" for what, path in written.items()))
    _note_overrun()
    return 0


def _cmd_ranks(args) -> int:
    from sftprof import pipeline

    def step(text: str) -> None:
        print(terminal_safe(text), file=sys.stderr)

    _use_memory_budget(args)
    out = Path(args.output)
    result = pipeline.cross_rank_dirs(args.dirs, out, args.title or "sftprof: across ranks", step, args.allow_mixed)
    headline = result.headline
    print(
        terminal_safe(
            f"{headline['ranks']} ranks on {headline['nodes']} node(s), {headline['common_steps']} common "
            f"step(s), median job step {headline['median_step_ms']:.3f} ms"
        )
    )
    for finding in result.findings:
        marker = "!" if finding.severity == "warning" else "-"
        gain = f" [gain {finding.gain_pct:.1f}%]" if finding.gain_pct is not None else ""
        print(terminal_safe(f"  {marker} {finding.title}{gain}"))
    if not result.findings:
        print("  no rank holds the others back, and no collective runs exposed")
    for what, path in (
        ("cross-rank report", pipeline.RANKS_HTML),
        ("tables and findings", pipeline.RANKS_DIR),
        ("per-rank report", pipeline.REPORT_HTML),
    ):
        print(terminal_safe(f"{what}: {out / path}"))
    _note_overrun()
    return 0


def _experiment_window(args) -> tuple[dict, dict]:
    from sftprof.capture import config

    cfg = config.load(args.config)
    return config.experiment(cfg, args.experiment), config.window(cfg, args.experiment, args.window)


def _cmd_render(args) -> int:
    from sftprof.capture import jobs

    experiment, window = _experiment_window(args)
    if args.form == "local":
        plan = jobs.launch_plan(
            args.experiment, experiment, args.window, window, workdir=args.workdir, under_slurm=False
        )
        text = " \\\n  ".join(shlex.join(part) for part in (plan.container, plan.rank, plan.nsys, plan.app) if part)
        text += "\n"
    else:
        render = jobs.render_sbatch if args.form == "sbatch" else jobs.render_salloc
        text = render(args.experiment, experiment, args.window, window, args.workdir)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_submit(args) -> int:
    from sftprof.capture import jobs

    experiment, window = _experiment_window(args)
    script = jobs.write_sbatch(args.experiment, experiment, args.window, window, args.workdir)
    job_id = jobs.submit(script, wait=args.wait)
    print(terminal_safe(f"submitted {script} as Slurm job {job_id}" + (", finished" if args.wait else "")))
    return 0


def _cmd_fetch(args) -> int:
    from sftprof import layout, logs
    from sftprof.capture import config, remote

    logs.setup()
    cfg = config.load(args.config)
    settings = config.remote_settings(cfg)
    experiment = config.experiment(cfg, args.experiment)
    config.window(cfg, args.experiment, args.window)
    names = {"experiment": args.experiment, "window": args.window}
    if args.report:
        html = Path(args.workdir) / layout.REPORT_HTML.format(**names)
        result = remote.fetch_report(settings, args.experiment, args.window, html, trust_new_host=args.trust_new_host)
        print(terminal_safe(f"{result.local_path} ({result.size} bytes, sha256 {result.sha256})"))
        return 0
    capture = Path(args.workdir) / layout.CAPTURE_DIR.format(**names)
    for result in remote.fetch_capture(
        settings, args.experiment, experiment, args.window, capture, trust_new_host=args.trust_new_host
    ):
        state = "already here" if result.skipped else f"{result.bytes_transferred} bytes transferred"
        print(terminal_safe(f"{result.remote_path} -> {capture / result.local_path.name} ({state})"))
    return 0


def _cmd_validate(args) -> int:
    from sftprof.capture import config

    cfg = config.load(args.config)
    print(yaml.safe_dump(cfg, sort_keys=False) if not args.json else json.dumps(cfg, indent=2))
    return 0


def _add_window_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment")
    parser.add_argument("window")
    parser.add_argument("--config", default="config.yaml", help="config file (default: config.yaml)")
    parser.add_argument("--workdir", default=".", help="the workflow's working directory (default: here)")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """Usage errors quote the arguments given: they reach the terminal as text too."""
        super().error(terminal_safe(message))


def _add_memory_budget(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--memory-budget",
        default=memory_budget.DEFAULT,
        metavar="SIZE",
        help=f"peak memory to aim for while traces are analysed (default {memory_budget.DEFAULT}; 1GB is 2^30 "
        f"bytes): each DuckDB database is held to 1/{memory_budget.DUCKDB_SHARE} of it and spills the rest to a "
        "temporary folder; tables held whole in memory do not obey it yet, so a run that goes over says so",
    )


def _use_memory_budget(args) -> None:
    """The command's --memory-budget, refused before any work if it is not a size."""
    memory_budget.use(memory_budget.parse(args.memory_budget))


def _note_overrun() -> None:
    overrun = memory_budget.overrun()
    if overrun:
        print(f"sftprof: note: {overrun}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sftprof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sftprof {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    analyze = commands.add_parser(
        "analyze",
        help="analyse Nsight Systems reports into tables, findings and an HTML report",
        description="Load each report (an .nsys-rep is exported to .sqlite beside it, once), run every "
        "analysis, and write OUTPUT/analysis/*.csv, OUTPUT/analysis/analysis.json and "
        "OUTPUT/report.html. Findings are also printed.",
    )
    analyze.add_argument(
        "reports",
        nargs="+",
        metavar="REPORT",
        help=".nsys-rep or .sqlite file, .parquetdir folder (nsys export --type=parquetdir), "
        "or a PyTorch profiler trace .json or .json.gz",
    )
    analyze.add_argument(
        "-o",
        "--output",
        help="output folder (default: NAME-sftprof beside each report, NAME its file name less .nsys-rep, .sqlite, "
        ".parquetdir, .json or .json.gz; with several reports, OUTPUT/NAME for each; two reports never share one)",
    )
    analyze.add_argument(
        "--metrics",
        help="the trainer's metrics .jsonl, to add the run's step times (a loop of your own can write one: a JSON "
        "line per step with step, step_time_s, tokens_per_s and in_window); with them, the profiler's overhead is "
        "measured and taken out of the gains",
    )
    analyze.add_argument("--title", help="report title")
    analyze.add_argument(
        "--step-range",
        metavar="REGEX",
        help="the regular expression the loop's NVTX step ranges match, its first group the step number "
        "(default: step N, iteration N, iter N, train_step N, global_step N in any case, or ProfilerStep#N); "
        "without step ranges, steps are inferred from the kernel sequence that repeats",
    )
    _add_memory_budget(analyze)
    analyze.set_defaults(handler=_cmd_analyze)

    compare = commands.add_parser(
        "compare",
        help="compare analyses or traces side by side: headline numbers, deltas, findings",
        description="Compare INPUTs against the first one (the baseline): headline numbers, time by kernel "
        "family, kernel, memory operation, CUDA call, step phase, NVTX range, OS call and thread, "
        "and the findings fired in each. An INPUT is an analysis folder (analysis.json + CSVs, as "
        "`analyze` or the workflow writes them; results/EXP/WINDOW/analysis stands for all its "
        "ranks) or a trace file, analysed first. Writes OUTPUT/comparison.csv, "
        "OUTPUT/findings.csv and OUTPUT/compare.html, and prints a summary.",
    )
    compare.add_argument("inputs", nargs="+", metavar="INPUT", help="analysis folder or trace file")
    compare.add_argument("-o", "--output", default="sftprof-compare", help="output folder (default: sftprof-compare)")
    compare.add_argument("--title", help="title of the HTML page")
    _add_memory_budget(compare)
    compare.set_defaults(handler=_cmd_compare)

    ranks = commands.add_parser(
        "ranks",
        help="compare the profiled ranks of a multi-rank run: stragglers, skew, communication",
        description="Read every profiled rank recorded in the capture folders DIR (rank*.json with its report or "
        "export rankN.sqlite, and metrics; one folder for the job or one per node), analyse each, and "
        "compare them by step number: step time and skew per step, each rank's phases and its waiting "
        "for the others, collectives, and a straggler finding that names the rank, its node and phase "
        "with its attainable gain (docs/RANKS.md). Writes OUTPUT/ranks.html, OUTPUT/ranks/ (tables, "
        "ranks.json), OUTPUT/report.html and OUTPUT/analysis/rankN/.",
    )
    ranks.add_argument("dirs", nargs="+", metavar="DIR", help="capture folder with rank records")
    ranks.add_argument("-o", "--output", default="sftprof-ranks", help="output folder (default: sftprof-ranks)")
    ranks.add_argument("--title", help="title of the HTML pages")
    ranks.add_argument(
        "--allow-mixed",
        action="store_true",
        help="compare ranks whose records name different Slurm jobs or world sizes (refused otherwise); the "
        "report then says so in a mixed_runs finding, and derives no bus bandwidth",
    )
    _add_memory_budget(ranks)
    ranks.set_defaults(handler=_cmd_ranks)

    suggest = commands.add_parser(
        "suggest",
        help="print config variants that test a report's top findings",
        description="Read the findings of one analysis (an analysis folder, a window's results folder, or what "
        "`analyze` wrote) and print, as YAML to paste under experiments.NAME.variants, the variant "
        "that tests each of the top findings sftprof has a switch for, largest predicted gain first. "
        "Run them, and results/NAME/variants/ says whether each paid what was predicted.",
    )
    suggest.add_argument("result", metavar="RESULT_DIR", help="analysis folder, or a folder with one below it")
    suggest.add_argument("--top", type=int, default=3, help="at most this many variants (default 3)")
    suggest.add_argument(
        "--backend",
        choices=("torch", "nemo"),
        help="the backend whose settings to suggest (default: the analysed run's, from the trainer's metrics in "
        "the window's capture/ folder; torch where there are none)",
    )
    suggest.set_defaults(handler=_cmd_suggest)

    render = commands.add_parser(
        "render",
        help="print how one experiment window is launched: locally, as sbatch script or salloc",
        description="Print, shell-quoted, what runs EXPERIMENT's WINDOW. `local`: the command the local "
        "workflow runs (one rank). `sbatch`: a batch script for `sbatch FILE` (partition, nodes, "
        "GPUs, time... from the experiment's slurm section; srun per rank; the container exec "
        "line). `salloc`: the same as an salloc command line, runnable as it is. Every config "
        "value is quoted for the shell.",
    )
    render.add_argument("form", choices=("local", "sbatch", "salloc"))
    _add_window_arguments(render)
    render.add_argument("-o", "--output", help="write to this file instead of standard output")
    render.set_defaults(handler=_cmd_render)

    submit = commands.add_parser(
        "submit",
        help="render the sbatch script of a window and submit it with sbatch",
        description="Write jobs/EXPERIMENT/WINDOW/job.sbatch (see `render sbatch`) and submit it. Reports land "
        "in results/EXPERIMENT/WINDOW/capture/, one per profiled rank; analyse them with "
        "`sftprof analyze` or let the workflow pick them up.",
    )
    _add_window_arguments(submit)
    submit.add_argument("--wait", action="store_true", help="return only when the job has finished (sbatch --wait)")
    submit.set_defaults(handler=_cmd_submit)

    fetch = commands.add_parser(
        "fetch",
        help="fetch a window's capture (or its finished report) from the cluster over SSH",
        description="Fetch EXPERIMENT's WINDOW from the cluster named by the config's `remote` section: each "
        "rank's record, report and metrics into results/EXPERIMENT/WINDOW/capture/ (then `snakemake "
        "--config results_from=remote` or `sftprof analyze` takes it from there), or with --report the "
        "report.html the cluster rendered. Every file is verified by size and SHA-256; an interrupted "
        "fetch resumes where it stopped. Host keys are checked against known_hosts.",
    )
    _add_window_arguments(fetch)
    fetch.add_argument("--report", action="store_true", help="fetch only the rendered report.html")
    fetch.add_argument(
        "--trust-new-host",
        action="store_true",
        help="accept a host that is not in known_hosts yet (prints its fingerprint and records it); "
        "a changed host key is refused regardless",
    )
    fetch.set_defaults(handler=_cmd_fetch)

    validate = commands.add_parser(
        "validate",
        help="validate a config file and print it with defaults filled in",
        description="Check CONFIG against the schema (sftprof/capture/config.schema.yaml) and the cross-field "
        "rules; print the result, or an error naming the offending key.",
    )
    validate.add_argument("config", nargs="?", default="config.yaml")
    validate.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    validate.set_defaults(handler=_cmd_validate)
    return parser


class Stopped(KeyboardInterrupt):
    """SIGTERM (how Slurm ends a job at its time limit), SIGINT (Ctrl-C) or SIGHUP (a closed terminal), raised
    where the run is: it unwinds, removing its temporary files and partial output. A KeyboardInterrupt, so that
    no `except Exception` stops it."""


_stopped_by: list[int] = []  # the signal received: DuckDB turns what the handler raises into its own error


def _stop(signum: int, frame) -> None:
    _stopped_by.append(signum)
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    from sftprof.errors import SftprofError  # each command imports only the modules it needs

    args = build_parser().parse_args(argv)
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {signum: signal.signal(signum, _stop) for signum in stops}
    _stopped_by.clear()
    try:
        return args.handler(args)
    except BaseException as error:
        signum = _stopped_by[0] if _stopped_by else signal.SIGINT if isinstance(error, KeyboardInterrupt) else None
        if signum is not None:
            scratch.sweep(own=True)
            name = signal.Signals(signum).name
            print(f"sftprof: stopped by {name}: temporary files removed, earlier output kept", file=sys.stderr)
            return 128 + signum
        if isinstance(error, SftprofError):
            print(f"sftprof: error: {terminal_safe(str(error))}", file=sys.stderr)  # one line, whatever it quotes
            return 1
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
