"""The subcommands of the ``verl`` command (:mod:`verl.cli`): ``verl run``, ``verl sft``, ``verl export``,
``verl model fetch`` and ``verl bench``, with what ``verl run`` prints at its start and end."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from verl.command_line import config_source, recipe_lines


def _headline(metrics: dict) -> dict[str, float]:
    """The validation metrics worth a line at the end: accuracy where the scorer reports one (``acc``),
    else the mean reward (a custom reward's scale is its own, so it is never shown as a percentage)."""
    core = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
    acc = {k: v for k, v in core.items() if "/acc/" in k}
    return acc or {k: v for k, v in core.items() if "/reward/" in k}


def _headline_line(key: str, before: float | None, after: float | None, trained: bool = True) -> str:
    as_percent = "/acc/" in key
    fmt = (lambda v: f"{v:.1%}") if as_percent else (lambda v: f"{v:.4g}")
    if not trained:  # trainer.val_only: one evaluation, no RL to be before or after
        return (
            f"held-out {key}: {fmt(before) if before is not None else 'n/a'} (trainer.val_only: no training)"
        )
    line = f"held-out {key}: " + (f"before RL {fmt(before)}" if before is not None else "before RL n/a")
    line += f" -> after RL {fmt(after)}" if after is not None else ""
    if as_percent and after is not None and before is not None:
        line += f" ({(after - before) * 100:+.1f} points)"
    return line


def _print_config(config, plan_lines: list[str], recipe: list[str] = ()) -> None:
    """The resolved config as YAML, then as YAML comments: the recipe, what is built for it and how verl's keys
    were read."""
    from verl.config import to_yaml
    from verl.config.verl_compat import notices

    print(to_yaml(config))
    for line in recipe:
        print(f"# {line}")
    for line in plan_lines:
        print(f"# prepare: {line}")
    for line in notices(config):
        print(f"# verl: {line}")


def report_notices(config) -> None:
    """Once at start-up: how verl's settings were read here (mapped, deprecated, no effect)."""
    from verl.config.verl_compat import notices

    lines = notices(config)
    if lines:
        print("verl settings read with a difference here:", file=sys.stderr)
        for line in lines:
            print(f"  - {line}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from verl.config import TrainerConfig, load_config
    from verl.config.loader import default_recipe
    from verl.errors import InputError
    from verl.trainer.prepare import check_inputs, plan_inputs, prepare_inputs, resolve_inputs
    from verl.trainer.rl_trainer import RLTrainer
    from verl.trainer.run_dir import check_run_directory
    from verl.utils.threads import drive_on_one_openmp_thread

    # The run computes on its workers' threads; this one only drives, and must hold no OpenMP team of its
    # own from the data and model preparation below (see the function).
    drive_on_one_openmp_thread()
    overrides = list(args.overrides)
    if args.controller:
        overrides.append(f"trainer.controller={args.controller}")
    if args.step:
        overrides.append(f"trainer.step={args.step}")
    if args.trace:
        overrides.append("trainer.trace=true")
    source = config_source(args)
    # Without --config the command line chooses: the demo, or verl's defaults for the user's model or data.
    config = load_config(source or default_recipe(TrainerConfig, overrides)[0], overrides)
    recipe = recipe_lines(source, overrides, config)
    if args.print_config:
        plan_lines = [a.describe() for a in plan_inputs(config).artifacts()]
        _print_config(resolve_inputs(config), plan_lines, recipe)
        return 0
    for line in recipe:
        print(line)
    report_notices(config)
    # Refuse missing inputs and a locked or occupied run directory before minutes of building data and models.
    if args.summary_json and not os.path.isdir(os.path.dirname(os.path.abspath(args.summary_json))):
        raise InputError(f"--summary-json {args.summary_json}: its directory does not exist")
    check_inputs(config)
    check_run_directory(resolve_inputs(config))
    start = time.perf_counter()
    trainer = RLTrainer(prepare_inputs(config))
    try:
        summary = trainer.fit()
    except BaseException as error:
        # Ctrl-C / SIGTERM (not an Exception): stop without waiting for a step stuck in user code
        trainer.shutdown(wait=isinstance(error, Exception))
        raise
    trainer.shutdown()
    before, after = _headline(summary["val_before"]), _headline(summary["val_after"])
    if os.path.isfile(summary["metrics_path"]):  # only with trainer.logger jsonl
        print(f"\nmetrics: {summary['metrics_path']}")
    for key in sorted(set(before) | set(after)):
        print(_headline_line(key, before.get(key), after.get(key), trained=not config.trainer.val_only))
    if summary.get("trace_path"):
        print(f"trace: {summary['trace_path']}")
    if config.trainer.report and os.path.isfile(summary["metrics_path"]):
        _write_report(os.path.dirname(summary["metrics_path"]))
    print(f"wall time: {time.perf_counter() - start:.0f}s")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "last_metrics"}, f, indent=2)
    return 0


def _write_report(run_dir: str) -> None:
    """The run's HTML report (``verl report``); a report that cannot be drawn does not fail a finished run."""
    try:
        from verl.report import build_report

        print(f"report: {build_report(run_dir)}")
    except Exception as e:  # noqa: BLE001 - the run itself succeeded; say why there is no report
        print(
            f"report: not written ({type(e).__name__}: {e}); `verl report {run_dir}` retries", file=sys.stderr
        )


def cmd_sft(args: argparse.Namespace) -> int:
    from verl.config import SFTConfig, load_config
    from verl.trainer.sft_trainer import run_sft

    config = load_config(config_source(args), args.overrides, schema=SFTConfig)
    if args.print_config:
        _print_config(config, [])
        return 0
    report_notices(config)
    out = run_sft(config)
    print(f"SFT model saved to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Export a checkpoint's model. An output the OS refuses (a read-only or immutable directory, ``/sys``, a
    path through a file, a full disk) is one line naming it and the reason (exit 3, like the other errors of
    the path given; 5 for a full or failing file system, :class:`~verl.errors.StorageError`). A failed or
    interrupted export leaves nothing at ``out_dir`` that was not there before: the directories it created
    are removed again (an existing ``out_dir`` is export_hf's to guard: it stages the model in a sibling)."""
    import shutil
    from pathlib import Path

    from verl.errors import InputError, UserError
    from verl.report.output import (
        STORAGE_ERRNOS,
        concerns,
        missing_dirs,
        os_error_of,
        reason,
        remove_created,
        unwritable,
    )
    from verl.trainer.checkpointing import export_hf

    adapter = args.format == "adapter"
    out_dir = Path(args.out_dir).expanduser()
    created = missing_dirs(out_dir)  # deepest first: out_dir itself when it is new, then its new parents
    try:
        out = export_hf(
            args.checkpoint,
            args.out_dir,
            part=args.part,
            overwrite=args.overwrite,
            adapter=adapter,
            base_model=args.base_model,
        )
    except UserError:  # already one line (a file in the way, a damaged checkpoint, ...)
        raise
    except BaseException as error:  # a failure, Ctrl-C or SIGTERM: no half-written model is left behind
        if created and created[0] == out_dir:  # new, so all in it is this export's
            shutil.rmtree(out_dir, ignore_errors=True)
        remove_created(created)
        # a library's write error may carry the OS's only as text (safetensors: "(os error 28)")
        os_error = os_error_of(error) if isinstance(error, Exception) else None
        if os_error is None:
            raise
        if concerns(os_error, out_dir) or os_error.errno in STORAGE_ERRNOS:
            raise unwritable(out_dir, os_error, InputError, "give a writable directory") from None
        name = os.fsdecode(os_error.filename) if os_error.filename is not None else args.checkpoint
        raise InputError(f"cannot read {name}: {reason(os_error)}; nothing was exported") from None
    print(f"{'PEFT adapter' if adapter else 'HuggingFace model'} written to {out}")
    return 0


def cmd_model_fetch(args: argparse.Namespace) -> int:
    from verl.models.gguf import fetch_model

    home = args.cache_dir or os.environ.get("VERL_HOME", "~/.cache/verl")
    path = fetch_model(args.name, home, log=lambda line: print(line, file=sys.stderr))
    print(path)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from verl.bench import run_cli

    return run_cli(
        args.models,
        args.what,
        args.quick,
        args.json,
        args.threads,
        batches=args.batches,
        lengths=args.lengths,
        step_prompts=args.step_prompts,
        step_micro_batch=args.step_micro_batch,
        engines=args.engines,
    )
