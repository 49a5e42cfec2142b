"""Does the default recipe learn on every CPU, seed, thread count and compute dtype? Runs `verl run` over a
matrix and prints held-out accuracy before / after RL for each run.

    python benchmarks/learning_matrix.py                                  # seeds 1-5 x threads 1, 2
    python benchmarks/learning_matrix.py --seeds 1,2 --threads 1 --jobs 2 actor_rollout_ref.actor.optim.lr=1e-4
    python benchmarks/learning_matrix.py --isa native,avx2,default --dtypes bf16,fp32 --fresh-cache

Each run is a fresh `verl run` process with `trainer.seed` and `trainer.torch_threads` set and any extra
overrides. ``--isa`` caps the CPU kernels PyTorch, MKL and oneDNN use (``native``: none; ``avx2`` and
``default``: :data:`ISA_CAPS`), so one machine shows what older CPUs compute; ``--dtypes`` sets the actor's
compute dtype (``auto`` leaves it to the machine: bf16 where the CPU has bf16 instructions). A capped CPU has no
bf16 instructions, so capped cells run fp32 only. ``--fresh-cache`` gives every run an empty ``$VERL_HOME`` (the
data, the tiny model and its warm start built again, as a new user's first run). ``--jobs`` runs that many at
once: fine for the accuracy figures (a run's numbers depend on its settings, not on the machine's load), but
wall times are only meaningful with ``--jobs 1`` on an idle machine. Prints a markdown table (start, end, gain,
lowest accuracy after step 100, wall time) and the minimum / median gain; ``--json`` writes the rows.
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
ISA_CAPS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
"""environment that caps the kernels of PyTorch (ATen), MKL and oneDNN to an older instruction set"""
DTYPE_KEY = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"


def run_one(
    seed: int, threads: int, overrides: list[str], out: Path, isa: str = "native", dtype: str = "auto",
    fresh_cache: bool = False,
) -> dict:  # fmt: skip
    run_dir = out / f"{isa}-{dtype}-seed{seed}-threads{threads}"
    env = dict(os.environ, **ISA_CAPS[isa])
    if fresh_cache:
        env["VERL_HOME"] = str(run_dir / "verl_home")
    if dtype != "auto":
        overrides = [*overrides, f"{DTYPE_KEY}={dtype}"]
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
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    row = {"isa": isa, "dtype": dtype, "seed": seed, "threads": threads, "wall_s": round(wall, 1)}
    row["returncode"] = result.returncode
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
    parser.add_argument("--isa", default="native", help="CPU kernel caps, of " + ", ".join(ISA_CAPS))
    parser.add_argument("--dtypes", default="auto", help="actor compute dtypes: auto, bf16, fp32")
    parser.add_argument("--fresh-cache", action="store_true", help="an empty $VERL_HOME for every run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (wall times need 1)")
    parser.add_argument("--out", default="outputs/learning_matrix")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    out = Path(args.out)
    kinds = [
        (isa, dtype)
        for isa in args.isa.split(",")
        for dtype in args.dtypes.split(",")
        # a capped CPU has no bf16 kernels: there auto is fp32, so it runs only when fp32 is not asked for
        if isa == "native" or dtype == "fp32" or (dtype == "auto" and "fp32" not in args.dtypes.split(","))
    ]
    cells = [(s, t, isa, dtype) for isa, dtype in kinds for t in threads for s in seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(
            pool.map(lambda c: run_one(c[0], c[1], args.overrides, out, c[2], c[3], args.fresh_cache), cells)
        )
    print(f"overrides: {' '.join(args.overrides) or '(none: the default recipe)'}; jobs={args.jobs}")
    print(
        "| kernels | dtype | seed | threads | start | end | gain | lowest after step 100 | wall | curve "
        "(every test_freq steps) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        cell = f"| {row['isa']} | {row['dtype']} | {row['seed']} | {row['threads']} |"
        if row["returncode"] != 0:
            print(f"{cell} failed | | | | {row['wall_s']:.0f} s | {row['error'][-200:]!r} |")
            continue
        low = "n/a" if row["min_after_100"] is None else f"{row['min_after_100']:.1f}%"
        curve = " / ".join(f"{v:.1f}" for v in row["curve"].values())
        print(
            f"{cell} {row['start']:.1f}% | {row['end']:.1f}% | {row['gain']:+.1f} | {low} | "
            f"{row['wall_s']:.0f} s | {curve} |"
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
