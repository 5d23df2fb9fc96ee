"""`sftprof`: the pipeline's pieces, usable without Snakemake.

  sftprof analyze REPORT        analyse an .nsys-rep or .sqlite into tables, findings and HTML
  sftprof render EXP WINDOW     print the exact `nsys profile` command a window runs
  sftprof validate [CONFIG]     check a config file and print it with defaults filled in
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import yaml

from sftprof import __version__


def _cmd_analyze(args) -> int:
    from sftprof import results
    from sftprof.analysis import analyze
    from sftprof.report import write_html
    from sftprof.trace import load_trace

    for report in map(Path, args.reports):
        stem = report.name.split(".")[0]
        if args.output is None:
            out_dir = report.parent / f"{stem}-sftprof"
        else:
            out_dir = Path(args.output) / stem if len(args.reports) > 1 else Path(args.output)
        analysis = analyze(load_trace(report))
        results.save(analysis, out_dir / "analysis")
        html = write_html(analysis, args.metrics, out_dir / "report.html", args.title or f"sftprof: {report.name}")
        print(f"{report}:")
        for finding in analysis.findings:
            marker = "!" if finding.severity == "warning" else "-"
            print(f"  {marker} {finding.title}\n      {finding.evidence}")
        print(f"  tables and findings: {out_dir / 'analysis'}\n  report: {html}")
    return 0


def _cmd_render(args) -> int:
    from sftprof import config, layout, nsys, sft

    cfg = config.load(args.config)
    experiment = config.experiment(cfg, args.experiment)
    window = config.window(cfg, args.experiment, args.window)
    names = {"experiment": args.experiment, "window": args.window, "report": experiment["profile"]["output_name"],
             "split": "training"}
    app = sft.command(layout.MODEL_DIR.format(**names), layout.SFT_SPLIT.format(**names),
                      layout.METRICS.format(**names), experiment["sft"], window)
    env = nsys.profile_environment(window)
    base = layout.NSYS_REPORT.format(**names).removesuffix(nsys.REPORT_SUFFIX)
    argv = ["nsys", "profile", *nsys.profile_options(experiment["profile"], window), f"--output={base}", *app]
    prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
    print((prefix + " " if prefix else "") + shlex.join(argv))
    return 0


def _cmd_validate(args) -> int:
    from sftprof import config

    cfg = config.load(args.config)
    print(yaml.safe_dump(cfg, sort_keys=False) if not args.json else json.dumps(cfg, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sftprof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sftprof {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    analyze = commands.add_parser(
        "analyze", help="analyse Nsight Systems reports into tables, findings and an HTML report",
        description="Load each report (an .nsys-rep is exported to .sqlite beside it, once), run every "
                    "analysis, and write OUTPUT/analysis/*.csv, OUTPUT/analysis/analysis.json and "
                    "OUTPUT/report.html. Findings are also printed.")
    analyze.add_argument("reports", nargs="+", metavar="REPORT", help=".nsys-rep or .sqlite file")
    analyze.add_argument("-o", "--output", help="output folder (default: NAME-sftprof beside each report; "
                         "with several reports, one subfolder per report)")
    analyze.add_argument("--metrics", help="the trainer's metrics .jsonl, to add the run's step times")
    analyze.add_argument("--title", help="report title")
    analyze.set_defaults(handler=_cmd_analyze)

    render = commands.add_parser(
        "render", help="print the nsys profile command line of one experiment window",
        description="Print, shell-quoted, the command the workflow's profile step runs for EXPERIMENT "
                    "and WINDOW, with the environment it sets. Paths are the workflow's defaults.")
    render.add_argument("experiment")
    render.add_argument("window")
    render.add_argument("--config", default="config.yaml", help="config file (default: config.yaml)")
    render.set_defaults(handler=_cmd_render)

    validate = commands.add_parser(
        "validate", help="validate a config file and print it with defaults filled in",
        description="Check CONFIG against workflow/schemas/config.schema.yaml and the cross-field "
                    "rules; print the result, or an error naming the offending key.")
    validate.add_argument("config", nargs="?", default="config.yaml")
    validate.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    validate.set_defaults(handler=_cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    from sftprof.config import ConfigError
    from sftprof.nsys import NsysError
    from sftprof.trace.nsys_sqlite import TraceFormatError

    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, NsysError, TraceFormatError) as error:
        print(f"sftprof: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
