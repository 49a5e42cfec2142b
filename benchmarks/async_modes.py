"""Synchronous against asynchronous training (trainer.v1.trainer_mode=separate_async), on this machine's cores.

Each mode is one `verl run` with the Ray backend, so the rollout role is a process of its own next to the
actor's (on a 2-core machine, one core each: `torch_threads: auto` gives each computing process its share).
Prints, per mode: wall time per 100 steps (the median step x 100, and the whole run's wall time), the
trainer's wait for its batch, the staleness, and held-out accuracy at the end.

    python benchmarks/async_modes.py --setting default --steps 300
    python benchmarks/async_modes.py --setting other_warm_start --steps 1200 --modes sync,ahead1,ahead4,ahead4_tis

Settings: ``default`` is the default recipe; ``other_warm_start`` the setting of benchmarks/other_warm_start.py
(a warm start from which the default recipe climbs), built under --work on first use.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

METRIC = "val-core/arithmetic/acc/mean@1"
ASYNC = "trainer.v1.trainer_mode=separate_async"
MODES = {
    "sync": [],
    "ahead0": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=0"],
    "ahead1": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=1"],
    "ahead4": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=4"],
    # decoupled correction: token-level truncated IS of π_old against the stale π_rollout
    "ahead1_tis": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=1", "algorithm.rollout_correction.rollout_is=token"],
    "ahead4_tis": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=4", "algorithm.rollout_correction.rollout_is=token"],
}  # fmt: skip


def setting_overrides(name: str, work: Path) -> list[str]:
    if name == "default":
        return []
    if name == "other_warm_start":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from other_warm_start import build

        train, test, model = build(work)
        return [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={test}",
        ]
    raise SystemExit(f"--setting {name}: choose default or other_warm_start")


def run(mode: str, base: list[str], steps: int, out: Path, backend: str) -> dict:
    args = [
        *base,
        *MODES[mode],
        f"trainer.backend={backend}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
        "trainer.report=false",
    ]
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "verl.cli", "run", "--config", "grpo", *args], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] > 10]

    def median(key: str) -> float | None:
        values = [r[key] for r in trained if key in r]
        return statistics.median(values) if values else None

    accuracy = [r[METRIC] for r in rows if METRIC in r]
    return {
        "mode": mode,
        "wall_s": wall,
        "step_s": median("timing_s/step"),
        "wait_s": median("timing_s/gen"),
        "generate_s": median("timing_s/generate_async") or median("timing_s/gen"),
        "update_s": median("timing_s/update_actor"),
        "staleness": median("training/off_policy/trajectory_staleness/mean") or 0.0,
        "start": 100 * accuracy[0] if len(accuracy) > 1 else None,
        "end": 100 * accuracy[-1] if accuracy else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setting", default="default")
    parser.add_argument("--modes", default="sync,ahead1")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backend", default="ray", help="ray (a process per role) or local (threads)")
    parser.add_argument("--work", default="outputs/async_modes")
    args = parser.parse_args()
    work = Path(args.work)
    base = [*setting_overrides(args.setting, work), f"trainer.seed={args.seed}"]
    print(f"setting {args.setting}, {args.steps} steps, seed {args.seed}, backend {args.backend}")
    print(
        "| mode | step (median) | x 100 steps | run wall time | trainer waits | generation | update | staleness | held-out start -> end |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        r = run(
            mode, base, args.steps, work / "runs" / args.setting / f"{mode}-seed{args.seed}", args.backend
        )
        start = f"{r['start']:.1f}%" if r["start"] is not None else "-"
        print(
            f"| {mode} | {r['step_s']:.3f} s | {100 * r['step_s']:.1f} s | {r['wall_s']:.0f} s | {r['wait_s']:.3f} s "
            f"| {r['generate_s']:.3f} s | {r['update_s']:.3f} s | {r['staleness']:.1f} | {start} -> {r['end']:.1f}% |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
