"""``verl report RUN_DIR [-o PATH]``: the subcommand's parser and its handler (wired into :mod:`verl.cli`)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``report`` on ``verl``'s subparsers; returns the new parser (its ``func`` is :func:`cmd_report`)."""
    report = subparsers.add_parser(
        "report",
        help="write one self-contained HTML page about a run: curves, timing, validation samples, config",
        description="Write an offline HTML report of a run directory (default: RUN_DIR/report.html).",
    )
    report.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the run's directory (trainer.default_local_dir), with metrics.jsonl",
    )
    report.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="PATH",
        help="where to write the page (default: RUN_DIR/report.html); an existing file is replaced only when "
        "it is an earlier report",
    )
    report.set_defaults(func=cmd_report)
    return report


def cmd_report(args: argparse.Namespace) -> int:
    """Build the report and print its path."""
    from verl.report.page import build_report

    print(build_report(args.run_dir, args.output))
    return 0
