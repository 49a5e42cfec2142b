"""One GRPO step in fp32 against bf16 autocast, per model and thread count: the before/after rows of
``fsdp_config.mixed_precision.param_dtype`` on a CPU (docs/performance.md, "bf16 on a CPU").

    python -m benchmarks.compute_dtype --models tiny,4m,smollm2 --threads 1,2 --prompts 8

Each model gets two trainers in one process, the default recipe's GRPO step on the arithmetic task (the
fast engine, shared prompts, 8 samples per prompt) with ``actor_rollout_ref.actor.fsdp_config.
mixed_precision.param_dtype`` fp32 and bf16 (the rollout follows the actor's dtype), and their steps
alternate: fp32, bf16, fp32, ... On a shared machine whatever else runs slows both alike, so the ratio of
the medians holds where the absolute times do not. The first ``--warmup`` steps of each are not counted.
On a CPU without ``avx512_bf16`` or AMX the bf16 rows measure torch's emulation, which is slower: the
first line says which CPU it ran on.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from verl.bench.common import load_average, machine_info, write_task_data
from verl.bench.measure import Case
from verl.bench.models import default_specs, prepare_model
from verl.bench.step import step_config, step_runner
from verl.trainer.rl_trainer import RLTrainer

DTYPE_KEY = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
DTYPES = ("fp32", "bf16")
STAGES = ("step", "gen", "update_actor")


def compare(name: str, threads: int, prompts: int, steps: int, warmup: int, data_dir: str) -> dict[str, dict]:
    """Median ``timing_s/*`` of each dtype's steps, taken alternately."""
    model = prepare_model(default_specs()[name])
    torch.set_num_threads(threads)
    runs, trainers, outs = {}, {}, []
    for dtype in DTYPES:
        params = {
            "engine": "fast",
            "training": "shared",
            "micro_batch": None,
            "prompts": prompts,
            "overrides": [f"{DTYPE_KEY}={dtype}"],
        }
        out = tempfile.TemporaryDirectory(prefix="verl-bench-dtype-")
        outs.append(out)
        case = Case("step", name, str(model.path), params, data_dir, threads=threads)
        trainers[dtype] = RLTrainer(step_config(case, out.name))
        runs[dtype] = step_runner(trainers[dtype])
    times: dict[str, list[dict[str, float]]] = {dtype: [] for dtype in DTYPES}
    for index in range(warmup + steps):
        for dtype in DTYPES:
            metrics = runs[dtype]()
            if index >= warmup:
                times[dtype].append(metrics)
    for trainer in trainers.values():
        trainer.shutdown()
    for out in outs:
        out.cleanup()
    result = {}
    for dtype, rows in times.items():
        medians = {s: statistics.median(r[f"timing_s/{s}"] for r in rows) for s in STAGES}
        medians["tokens_per_s"] = statistics.median(r["perf/throughput"] for r in rows)
        result[dtype] = medians
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,4m")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (x 8 samples)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each dtype")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    info = machine_info(0)
    print(f"cpu: {info['cpu']}, {info['cpu_count']} cores; bf16 instructions: {info['cpu_bf16']}", flush=True)
    print("| model | threads | step fp32 -> bf16 | gen | update_actor | tokens/s | load |")
    print("|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="verl-bench-data-") as data_dir:
        write_task_data(Path(data_dir))
        for name in args.models.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                r = compare(name, threads, args.prompts, args.steps, args.warmup, data_dir)
                a, b = r["fp32"], r["bf16"]
                cells = [f"{a[s]:.3f} -> {b[s]:.3f} s ({a[s] / b[s]:.2f}x)" for s in STAGES]
                tps = f"{a['tokens_per_s']:,.0f} -> {b['tokens_per_s']:,.0f}"
                print(f"| {name} | {threads} | {' | '.join(cells)} | {tps} | {load_average()} |", flush=True)


if __name__ == "__main__":
    main()
