"""Runs the sections over the models, collects the rows, prints the tables and writes the JSON."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from verl.bench import fsdp, rollout, step, training
from verl.bench.common import load_average, machine_info, write_task_data
from verl.bench.measure import (
    BUSY_PCT,
    MIN_REPEATS,
    Case,
    CaseFailed,
    memory_method,
    run_case,
    wait_for_idle,
)
from verl.bench.models import (
    ModelSpec,
    ModelUnavailable,
    PreparedModel,
    default_specs,
    prepare_model,
    verl_home,
)
from verl.bench.report import render

SECTIONS = {"rollout": rollout, "train": training, "step": step, "fsdp": fsdp}
PRELOAD = [module.__name__ for module in SECTIONS.values()]


@dataclass(frozen=True)
class BenchSizes:
    """How much work each section does, and how often it is repeated."""

    rollout_batches: tuple[int, ...] = (1, 16, 64, 256)
    rollout_lengths: tuple[int, ...] = (32, 128)
    rollout_engines: tuple[str, ...] | None = None
    """the rollout engines to measure; None: every installed one (``verl.bench.rollout.engines``)"""
    train_sequences: int = 64
    train_max_response_length: int = 128
    train_micro_batch: int = 16
    step_micro_batch: int | None = None
    """None: the recipe's own (the whole batch per forward pass; the chunked LM head keeps SmolLM2's
    logits to one 1024-token chunk at a time)"""
    step_prompts: int | None = None
    """prompts per GRPO step (each sampled rollout.n times); None: the recipe's"""
    fsdp_ranks: tuple[int, ...] = (1, 2)
    """rank counts of the fsdp section (each with dp and fsdp2; its update has the train section's sizes)"""
    warmup: int = 1
    repeats: int = 5
    budget_s: float = 60.0
    contention_retries: int = 2
    """measure a case again when other processes took more than BUSY_PCT of the CPUs meanwhile"""
    idle_wait_s: float = 120.0
    """before each attempt, wait at most this long for the machine to go idle"""


FULL = BenchSizes()
QUICK = replace(
    FULL,
    rollout_batches=(1, 16),
    rollout_lengths=(32,),
    train_max_response_length=32,
    repeats=3,
    budget_s=10.0,
    contention_retries=1,
    idle_wait_s=15.0,
)
QUICK_MODELS = ["tiny"]


def section_cases(
    section: str, model: PreparedModel, sizes: BenchSizes, common: dict[str, Any]
) -> list[Case]:
    path = str(model.path)
    if section == "rollout":
        return rollout.cases(
            model.name,
            path,
            list(sizes.rollout_batches),
            list(sizes.rollout_lengths),
            engine_names=sizes.rollout_engines,
            **common,
        )
    if section == "train":
        return training.cases(
            model.name,
            path,
            sizes.train_sequences,
            sizes.train_max_response_length,
            sizes.train_micro_batch,
            **common,
        )
    if section == "fsdp":
        return fsdp.cases(
            model.name,
            path,
            sizes.train_sequences,
            sizes.train_max_response_length,
            sizes.train_micro_batch,
            sizes.fsdp_ranks,
            **common,
        )
    return step.cases(model.name, path, sizes.step_micro_batch, sizes.step_prompts, **common)


def measure(case: Case, isolate: bool, sizes: BenchSizes = FULL) -> dict[str, Any]:
    """One row: the case's parameters, its summary and raw timings, or why it has no numbers.

    An attempt during which other processes took more than BUSY_PCT of the CPUs is repeated (up to
    ``sizes.contention_retries`` times, each after waiting for the machine to go idle); the least
    disturbed attempt is kept, and every attempt's contention is in ``attempts_others_cpu_pct``.
    """
    row: dict[str, Any] = {
        "section": case.section,
        "model": case.model,
        **case.params,
        "status": "ok",
        "reason": None,
    }
    module = SECTIONS[case.section]
    result, attempts = None, []
    for _ in range(1 + sizes.contention_retries):
        wait_for_idle(sizes.idle_wait_s)
        try:
            attempt = run_case(module.setup, case, isolate=isolate, preload=PRELOAD)
        except CaseFailed as e:
            return {**row, "status": "error", "reason": str(e)}
        if hasattr(module, "correct_contention"):  # a case with processes of its own (fsdp's other ranks)
            module.correct_contention(attempt)
        others = attempt["others_cpu_pct"] or 0.0
        attempts.append(attempt["others_cpu_pct"])
        if result is None or others < (result["others_cpu_pct"] or 0.0):
            result = attempt
        if others <= BUSY_PCT:
            break
    # The section's summary comes last: it may restate a harness figure (fsdp: the peaks, max over ranks).
    return {
        **row,
        "repeats": len(result["times_s"]),
        "times_s": result["times_s"],
        "warmup_s": result["warmup_s"],
        "torch_threads": result["torch_threads"],
        "rss_after_setup_mb": result["rss_after_setup_mb"],
        "peak_rss_mb": result["peak_rss_mb"],
        "peak_delta_mb": result["peak_delta_mb"],
        "others_cpu_pct": result["others_cpu_pct"],
        "attempts_others_cpu_pct": attempts,
        "load_average": load_average(),
        **module.summarize(case, result),
    }


def progress_line(row: dict[str, Any]) -> str:
    name = " ".join(
        f"{k}={row[k]}"
        for k in ("engine", "training", "mode", "strategy", "ranks", "batch", "length")
        if k in row
    )
    head = f"[bench] {row['section']} {row['model']} {name}"
    if row["status"] != "ok":
        return f"{head}: {row['status']}"
    tokens = f"{row['tokens_per_s']:,.0f} tokens/s, " if row.get("tokens_per_s") else ""
    others = row.get("others_cpu_pct")
    contention = f", others {others:.0f}%" if others is not None else ""
    attempts = len(row["attempts_others_cpu_pct"])
    retried = f", attempt {attempts}" if attempts > 1 else ""
    held = f", params+grads+optim {row['state_bytes'] / 2**20:,.0f} MB/rank" if row.get("state_bytes") else ""
    return (
        f"{head}: {tokens}{row['median_s']:.3f} s/run, peak {row['peak_rss_mb']:,.0f} MB{held} "
        f"({row['repeats']} runs{contention}{retried})"
    )


def run_bench(
    models: Sequence[str | ModelSpec],
    sections: Sequence[str] = tuple(SECTIONS),
    sizes: BenchSizes = FULL,
    threads: int = 2,
    json_path: str | Path | None = None,
    isolate: bool = True,
    home: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure ``sections`` on ``models`` (names of :func:`default_specs` or specs); returns the report
    that is also printed and written as JSON (default ``$VERL_HOME/bench/bench-<time>.json``).

    Measurements run in processes started by multiprocessing, so a script calling this must do so
    under ``if __name__ == "__main__":`` (each new process imports the main module).
    """
    specs = default_specs()
    wanted = [specs[m] if isinstance(m, str) else m for m in models]
    report: dict[str, Any] = {
        "machine": machine_info(threads),
        "settings": {
            **asdict(sizes),
            "min_repeats": MIN_REPEATS,
            "memory_method": memory_method(),
            "isolated_processes": isolate,
        },
        "models": [],
        "skipped": [],
        "sections": {s: [] for s in sections},
    }
    path = (
        Path(json_path)
        if json_path
        else verl_home() / "bench" / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    report["json_path"] = str(path)
    try:
        _measure_all(report, wanted, sections, sizes, threads, isolate, home, log)
    except KeyboardInterrupt:
        report["interrupted"] = True
        log("[bench] interrupted: reporting what was measured so far")
    report["machine"]["load_average_end"] = load_average()
    _save(report)
    log("")
    log(render(report))
    log(f"\nJSON: {path}")
    return report


def _measure_all(
    report: dict[str, Any],
    specs: list[ModelSpec],
    sections: Sequence[str],
    sizes: BenchSizes,
    threads: int,
    isolate: bool,
    home: Path | None,
    log: Callable[[str], None],
) -> None:
    """Every case of every section on every model, appending rows to ``report`` (saved after each row:
    an interrupted or crashed long run keeps what it measured)."""
    with tempfile.TemporaryDirectory(prefix="verl-bench-data-") as data_dir:
        write_task_data(Path(data_dir))
        common = dict(
            data_dir=data_dir,
            threads=threads,
            warmup=sizes.warmup,
            repeats=sizes.repeats,
            budget_s=sizes.budget_s,
        )
        for spec in specs:
            try:
                model = prepare_model(spec, home)
            except ModelUnavailable as e:
                report["skipped"].append({"what": f"model {spec.name}", "reason": str(e)})
                log(f"[bench] skipping {spec.name}: {e}")
                continue
            report["models"].append({**model.__dict__, "path": str(model.path)})
            for section in sections:
                for case in section_cases(section, model, sizes, common):
                    row = measure(case, isolate, sizes)
                    report["sections"][section].append(row)
                    log(progress_line(row))
                    _save(report)


def _save(report: dict[str, Any]) -> None:
    path = Path(report["json_path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(path)


def _names(value: str | None, choices: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(choices)}")
    return names


def run_cli(
    models: str | None,
    what: str | None,
    quick: bool,
    json_path: str | None,
    threads: int = 2,
    batches: str | None = None,
    lengths: str | None = None,
    step_prompts: int | None = None,
    step_micro_batch: int | None = None,
    engines: str | None = None,
) -> int:
    """``verl bench``: parse the comma lists, run, return the exit status."""
    sizes = QUICK if quick else FULL
    try:
        if batches:
            sizes = replace(sizes, rollout_batches=tuple(int(b) for b in batches.split(",")))
        if lengths:
            sizes = replace(sizes, rollout_lengths=tuple(int(n) for n in lengths.split(",")))
        if engines:
            sizes = replace(sizes, rollout_engines=tuple(_names(engines, rollout.engines(), "engine")))
        if step_prompts:
            sizes = replace(sizes, step_prompts=step_prompts)
        if step_micro_batch:
            sizes = replace(sizes, step_micro_batch=step_micro_batch)
        model_names = _names(models, list(default_specs()), "model") or (
            QUICK_MODELS if quick else list(default_specs())
        )
        sections = _names(what, list(SECTIONS), "section") or list(SECTIONS)
    except ValueError as e:
        print(f"verl bench: {e}", file=sys.stderr)
        return 2
    report = run_bench(model_names, sections, sizes, threads, json_path)
    if report.get("interrupted"):
        return 130
    failed = [r for rows in report["sections"].values() for r in rows if r["status"] == "error"]
    return 1 if failed else 0
