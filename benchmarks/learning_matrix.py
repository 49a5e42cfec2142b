"""Does the default recipe learn on every seed and thread count? Runs `verl run` over a matrix and prints
held-out accuracy before / after RL for each run.

    python benchmarks/learning_matrix.py                                  # seeds 1-5 x threads 1, 2
    python benchmarks/learning_matrix.py --seeds 1,2 --threads 1 --jobs 2 actor_rollout_ref.actor.optim.lr=1e-4

Each run is a fresh `verl run` process (its own warm start too: the seed and the thread count are part of
the warm start's cache key), with `trainer.seed` and `trainer.torch_threads` set and any extra overrides.
``--jobs`` runs that many at once: fine for the accuracy figures (a run's numbers depend on its seed and
thread count, not on the machine's load), but wall times are only meaningful with ``--jobs 1`` on an
idle machine. Prints a markdown table (start, end, gain, lowest accuracy after step 100, wall time) and
the minimum / median gain; ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

METRIC = "val-core/arithmetic/acc/mean@1"


def run_one(seed: int, threads: int, overrides: list[str], out: Path) -> dict:
    run_dir = out / f"seed{seed}-threads{threads}"
    cmd = [
        sys.executable,
        "-m",
        "verl.cli",
        "run",
        f"trainer.seed={seed}",
        f"trainer.torch_threads={threads}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        *overrides,
    ]
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    wall = time.perf_counter() - start
    row = {"seed": seed, "threads": threads, "wall_s": round(wall, 1), "returncode": result.returncode}
    if result.returncode != 0:
        row["error"] = result.stderr[-2000:]
        return row
    curve = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if METRIC in record:
            curve[record["step"]] = record[METRIC]
    steps = sorted(curve)
    row["curve"] = {str(s): round(100 * curve[s], 1) for s in steps}
    row["start"] = 100 * curve[steps[0]]
    row["end"] = 100 * curve[steps[-1]]
    row["gain"] = row["end"] - row["start"]
    later = [100 * curve[s] for s in steps if s > 100]
    row["min_after_100"] = min(later) if later else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (wall times need 1)")
    parser.add_argument("--out", default="outputs/learning_matrix")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    out = Path(args.out)
    cells = [(s, t) for t in threads for s in seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda cell: run_one(*cell, args.overrides, out), cells))
    print(f"overrides: {' '.join(args.overrides) or '(none: the default recipe)'}; jobs={args.jobs}")
    print(
        "| seed | threads | start | end | gain | lowest after step 100 | wall | curve (every test_freq steps) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["returncode"] != 0:
            print(
                f"| {row['seed']} | {row['threads']} | failed | | | | {row['wall_s']:.0f} s | {row['error'][-200:]!r} |"
            )
            continue
        low = "n/a" if row["min_after_100"] is None else f"{row['min_after_100']:.1f}%"
        curve = " / ".join(f"{v:.1f}" for v in row["curve"].values())
        print(
            f"| {row['seed']} | {row['threads']} | {row['start']:.1f}% | {row['end']:.1f}% | "
            f"{row['gain']:+.1f} | {low} | {row['wall_s']:.0f} s | {curve} |"
        )
    gains = [r["gain"] for r in rows if r["returncode"] == 0]
    if gains:
        dips = [r for r in rows if r.get("min_after_100") is not None and r["min_after_100"] < r["start"]]
        print(
            f"\ngain: min {min(gains):+.1f}, median {statistics.median(gains):+.1f}, max {max(gains):+.1f} "
            f"points over {len(gains)} runs; runs below their start after step 100: {len(dips)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"overrides": args.overrides, "rows": rows}, indent=2))
    return 0 if len(gains) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
