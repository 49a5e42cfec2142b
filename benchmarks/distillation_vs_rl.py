"""On-policy distillation against plain RL, from the same start and for the same training time.

1. Trains a teacher with the task's RL recipe (``--task demo``: `verl run --config grpo`, the demo's tiny model from
   its shipped warm start; ``--task smollm2``: `verl run --config smollm2_arithmetic`, SmolLM2-135M-Instruct +
   LoRA) and exports it with `verl export` (a LoRA adapter merged into the weights); its own held-out accuracy is
   measured with `trainer.val_only=true`.
2. Times a few steps of each method (`--calibrate-steps`, seed 1) to turn ``--budget-s`` seconds of training into
   a number of steps per method: the budget counts the steps' own time (``timing_s/step``), not start-up or
   validation, which both methods pay alike.
3. Runs the task's distillation recipe (``distill_arithmetic`` / ``distill_smollm2``: k3 toward the teacher, no
   task rewards) and its RL recipe for each seed, both from the same start (built once by ``prepare.*`` and shared
   through ``$VERL_HOME``), each validated ``--points`` times over its steps.
4. Prints held-out accuracy at each validation of each run, with the step and the training seconds spent by then,
   and the teacher's own accuracy, as a markdown table; writes everything to ``--json``.

    python benchmarks/distillation_vs_rl.py                                     # the full comparison (long)
    python benchmarks/distillation_vs_rl.py --teacher-steps 4 --budget-s 10 --points 2 --seeds 1 \\
        --calibrate-steps 2 --json /tmp/check.json                               # a check that it runs
    python benchmarks/distillation_vs_rl.py --task smollm2 --teacher-seed 3 --budget-s 300 --points 3 \\
        --calibrate-steps 3                                                       # SmolLM2 + LoRA

Run it on an idle machine: the budget is wall time. Everything it builds goes under ``--work`` (default
outputs/distillation_vs_rl); the teacher is reused when its export exists (``--fresh`` trains it again).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASKS = {
    "demo": {"distillation": "distill_arithmetic", "rl": "grpo"},
    "smollm2": {"distillation": "distill_smollm2", "rl": "smollm2_arithmetic"},
}
"""task -> method -> the recipe it runs (the teacher is trained with the RL one)"""
METHODS = ("distillation", "rl")
RESULTS = Path(__file__).resolve().parent / "results"


def verl(*args: str) -> None:
    """``verl <args>`` in a child process; its stderr's tail in the error when it fails."""
    result = subprocess.run([sys.executable, "-m", "verl.cli", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"verl {' '.join(args[:3])} ... failed:\n{result.stderr[-3000:]}")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def held_out(row: dict) -> float | None:
    """A metrics row's held-out greedy accuracy (``val-core/<data source>/acc/mean@1``), None if not validated."""
    accs = [v for k, v in row.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")]
    return accs[0] if accs else None


def common(run_dir: Path, seed: int) -> list[str]:
    return [f"trainer.default_local_dir={run_dir}", f"trainer.seed={seed}", "trainer.logger=[jsonl]"]


# ------------------------------------------------------------------------------------------------ the teacher


def teacher(work: Path, recipe: str, steps: int | None, seed: int, fresh: bool) -> tuple[Path, float]:
    """The exported teacher (trained with ``recipe``, ``steps`` steps or the recipe's) and its held-out
    accuracy."""
    from verl.config import load_config

    run_dir, exported, evaluated = work / "teacher", work / "teacher-hf", work / "teacher-eval"
    if fresh:
        for path in (run_dir, exported, evaluated):
            shutil.rmtree(path, ignore_errors=True)
    if not (exported / "config.json").exists():
        steps = steps or int(load_config(recipe).trainer.total_training_steps)
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"training the teacher: verl run --config {recipe}, {steps} steps", flush=True)
        verl("run", "--config", recipe, *common(run_dir, seed), f"trainer.total_training_steps={steps}",
             f"trainer.save_freq={steps}", "trainer.test_freq=-1", "trainer.val_before_train=false")  # fmt: skip
        verl("export", str(run_dir), str(exported))
    if not (evaluated / "metrics.jsonl").exists():
        verl("run", "--config", recipe, *common(evaluated, seed), f"actor_rollout_ref.model.path={exported}",
             "trainer.val_only=true")  # fmt: skip
    acc = held_out(records(evaluated)[-1])
    if acc is None:
        raise RuntimeError(f"the teacher's evaluation in {evaluated} logged no val-core/*/acc/mean@1")
    return exported, acc


# ------------------------------------------------------------------------------------------------ the students


def student_args(recipe: str, method: str, teacher_dir: Path, extra: list[str]) -> list[str]:
    args = ["--config", recipe, *extra]
    if method == "distillation":
        args.append(f"distillation.teacher_models.teacher_model.model_path={teacher_dir}")
    return args


def seconds_per_step(
    work: Path, recipe: str, method: str, teacher_dir: Path, steps: int, extra: list[str]
) -> float:
    """The median training step of ``steps`` steps of ``method`` (no validation), the first one (which warms
    up the process) left out when there are more."""
    run_dir = work / "calibrate" / method
    shutil.rmtree(run_dir, ignore_errors=True)
    verl("run", *student_args(recipe, method, teacher_dir, extra), *common(run_dir, 1),
         f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.val_before_train=false")  # fmt: skip
    times = [r["timing_s/step"] for r in records(run_dir) if "timing_s/step" in r]
    return statistics.median(times[1:] or times)


def student(
    work: Path,
    recipe: str,
    method: str,
    seed: int,
    teacher_dir: Path,
    steps: int,
    points: int,
    extra: list[str],
) -> dict:
    """One run of ``steps`` steps validated before training and every ``steps / points`` steps: its curve of
    (step, training seconds so far, held-out accuracy)."""
    run_dir = work / "runs" / f"{method}-seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    test_freq = max(1, math.ceil(steps / points))
    start = time.perf_counter()
    verl("run", *student_args(recipe, method, teacher_dir, extra), *common(run_dir, seed),
         f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}", "trainer.save_freq=-1",
         "trainer.val_before_train=true")  # fmt: skip
    wall = time.perf_counter() - start
    curve, spent = [], 0.0
    for row in records(run_dir):
        spent += row.get("timing_s/step", 0.0)
        if (acc := held_out(row)) is not None:
            curve.append({"step": row["step"], "train_s": round(spent, 1), "acc": acc})
    return {"method": method, "seed": seed, "steps": steps, "wall_s": round(wall, 1), "curve": curve}


# ------------------------------------------------------------------------------------------------ the table


def table(runs: list[dict], teacher_recipe: str, teacher_acc: float, budget_s: float) -> str:
    width = max(len(r["curve"]) for r in runs)
    head = ["run", "steps", *(["start"] + [f"val {i}" for i in range(1, width)])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [f"{100 * p['acc']:.1f}% (step {p['step']}, {p['train_s']:.0f} s)" for p in run["curve"]]
        cells += [""] * (width - len(cells))
        lines.append(f"| {run['method']} seed {run['seed']} | {run['steps']} | " + " | ".join(cells) + " |")
    lines.append(
        f"| teacher ({teacher_recipe}, exported) | | {100 * teacher_acc:.1f}% |" + " |" * (width - 1)
    )
    note = f"\nbudget: {budget_s:.0f} s of training steps per run; held-out greedy accuracy (val-core/*/acc/mean@1)"
    return "\n".join(lines) + note


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=sorted(TASKS), default="demo")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--budget-s", type=float, default=600.0, help="training seconds per run")
    parser.add_argument("--points", type=int, default=6, help="validations per run after the one before it")
    parser.add_argument("--teacher-steps", type=int, default=None, help="default: the RL recipe's")
    parser.add_argument("--teacher-seed", type=int, default=1)
    parser.add_argument("--calibrate-steps", type=int, default=20)
    parser.add_argument("--work", default=None, help="default: outputs/distillation_vs_rl[_<task>]")
    parser.add_argument("--fresh", action="store_true", help="train the teacher again")
    parser.add_argument(
        "--json", default=None, help="default: benchmarks/results/distillation_vs_rl[_<task>].json"
    )
    parser.add_argument(
        "--distill-override", action="append", default=[], help="KEY=VALUE for the distillation runs"
    )
    parser.add_argument("--rl-override", action="append", default=[], help="KEY=VALUE for the RL runs")
    args = parser.parse_args()
    name = "distillation_vs_rl" + ("" if args.task == "demo" else f"_{args.task}")
    work = Path(args.work or f"outputs/{name}")
    recipes = TASKS[args.task]
    extra = {"distillation": args.distill_override, "rl": args.rl_override}
    teacher_dir, teacher_acc = teacher(work, recipes["rl"], args.teacher_steps, args.teacher_seed, args.fresh)
    print(f"teacher {teacher_dir}: {100 * teacher_acc:.1f}% held-out", flush=True)
    steps = {}
    for method in METHODS:
        per_step = seconds_per_step(
            work, recipes[method], method, teacher_dir, args.calibrate_steps, extra[method]
        )
        steps[method] = max(1, int(args.budget_s / per_step))
        print(
            f"{method}: {per_step:.3f} s per step -> {steps[method]} steps in {args.budget_s:.0f} s",
            flush=True,
        )
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for method in METHODS:
            runs.append(
                student(
                    work,
                    recipes[method],
                    method,
                    seed,
                    teacher_dir,
                    steps[method],
                    args.points,
                    extra[method],
                )
            )
            print(f"{method} seed {seed}: {runs[-1]['curve'][-1]}", flush=True)
    print(table(runs, recipes["rl"], teacher_acc, args.budget_s))
    out = Path(args.json or RESULTS / f"{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "work")}
    out.write_text(
        json.dumps({"settings": settings, "teacher_acc": teacher_acc, "steps": steps, "runs": runs}, indent=1)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
