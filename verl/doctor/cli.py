"""``verl doctor [--config RECIPE] [--json] [overrides ...]``: will this config run here, and if not, why?

The command takes ``verl run``'s config arguments (a recipe, verl's ``--config-path`` / ``--config-name``,
``key=value`` overrides) and prints the environment against the tested support matrix, the machine, the batch
arithmetic explained and a peak-memory estimate per role, then one line per reason the run would fail.

Exit codes: 0 nothing stops the run, 1 it would fail (does not fit in memory, a version clash it needs, an
input that is missing), 2 a config error, printed as ``verl run`` prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on ``verl``'s subcommand parsers (``parser.add_subparsers()``); returns its parser."""
    doctor = subparsers.add_parser(
        "doctor",
        help="check a config before running it: versions, machine, batch arithmetic, peak-memory estimate",
        description="Will this config run here, and if not, why? Takes verl run's config arguments and reports "
        "the environment against the tested versions, the machine, the batch arithmetic explained and a "
        "peak-memory estimate per role. Exit code 0: nothing stops the run; 1: it would fail; 2: config error.",
    )
    doctor.add_argument("--config", default=None, help="recipe name (grpo, ...) or path to a YAML file")
    doctor.add_argument("--config-path", "-cp", default=None, help="verl/Hydra: directory of the config file")
    doctor.add_argument(
        "--config-name",
        "-cn",
        default=None,
        help="verl/Hydra: config file name in --config-path, or a recipe",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    doctor.add_argument(
        "--gpu-memory",
        type=float,
        default=None,
        metavar="GIB",
        help="plan for another machine: assume as many GPUs of GIB GiB each as the config asks "
        "(trainer.n_gpus_per_node with trainer.backend=ray) and compare the per-GPU estimate with that",
    )
    doctor.add_argument(
        "overrides",
        nargs="*",
        help="key=value config overrides, as for verl run (e.g. actor_rollout_ref.rollout.n=4)",
    )
    doctor.set_defaults(func=cmd_doctor)
    return doctor


def cmd_doctor(args: argparse.Namespace, out: Any = None) -> int:
    """Run the diagnosis for ``args`` and print it; returns the exit code (0 ok, 1 would fail, 2 config error).

    A config error is printed as ``verl run`` prints it (``config error: ...`` on stderr); with ``--json`` the
    JSON on stdout carries it too."""
    from verl.command_line import config_source, debug_requested
    from verl.config import ConfigError
    from verl.doctor.render import render_text, report_json, use_colour
    from verl.doctor.report import diagnose

    out = out or sys.stdout
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        report = diagnose(
            config_source(args), list(args.overrides), gpu_memory=getattr(args, "gpu_memory", None)
        )
    except ConfigError as error:
        if debug_requested(args):
            raise
        print(f"{error.label}: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"exit_code": error.exit_code, "config_error": str(error)}), file=out)
        return error.exit_code
    if args.json:
        print(json.dumps(report_json(report), indent=2), file=out)
    else:
        out.write(render_text(report, colour=use_colour(out)))
    return report.exit_code
