"""Synchronous against asynchronous training (trainer.v1.trainer_mode=separate_async), on this machine's cores.

Each mode is one `verl run` with the Ray backend, so the rollout role is a process of its own next to the
actor's (on a 2-core machine, one core each: `torch_threads: auto` gives each computing process its share).
Prints, per mode: wall time per 100 steps (the median step x 100, and the whole run's wall time), the
trainer's wait for its batch, the staleness, and held-out accuracy at the end.

    python benchmarks/async_modes.py --setting default --steps 300
    python benchmarks/async_modes.py --setting other_warm_start --steps 1200 --modes sync,ahead1,ahead4,ahead4_tis

Settings: ``default`` is the default recipe; ``other_warm_start`` the setting of benchmarks/other_warm_start.py
(a warm start from which the default recipe climbs); ``ragged`` that setting's data and model with a warm start
that writes a filler of 0-24 words after its answer ("42 ok ok ..."), so responses run from 2 to ~50 tokens
and a batch's slowest rows set its generation time (the tail the streaming modes leave running). Built under
--work on first use.

    python benchmarks/async_modes.py --setting ragged --steps 300 --modes sync,ahead1,stream,stream_nopartial,colocate
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
    # bypass: π_old is the stale π_rollout, so PPO's clip bounds how far an update moves from the policy that drew
    "ahead4_bypass": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=4", "algorithm.rollout_correction.bypass_mode=true"],
    # decoupled, sequences rejected when their mean k3 divergence from π_rollout exceeds 0.01 (verl's k3 preset)
    "ahead4_k3rs": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=4", "algorithm.rollout_correction.rollout_rs=seq_mean_k3", "algorithm.rollout_correction.rollout_rs_threshold=0.01"],
    "ahead4_seqis": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=4", "algorithm.rollout_correction.rollout_is=sequence"],
    # fully async: the rollout holds half a batch more, hands over the first groups to finish
    "stream": [ASYNC, "async_training.staleness_threshold=0.5"],
    "stream_nopartial": [ASYNC, "async_training.staleness_threshold=0.5", "async_training.partial_rollout=false"],
    "stream0": [ASYNC, "async_training.staleness_threshold=0.5", "trainer.v1.separate_async.num_warmup_batches=0"],
    # the pool on the actor's own workers: one batch more in flight, the slowest carried over the update
    "colocate": ["trainer.v1.trainer_mode=colocate_async"],
    # vLLM as the engine: on the actor's workers (sync), or in the separate rollout role's process, one ahead
    "sync_vllm": ["actor_rollout_ref.rollout.name=vllm"],
    "ahead1_vllm": [ASYNC, "trainer.v1.separate_async.num_warmup_batches=1", "actor_rollout_ref.rollout.name=vllm"],
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
    if name == "ragged":
        train, test, model = build_ragged(work)
        return [
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"data.val_files={test}",
            "data.max_response_length=64",
        ]
    raise SystemExit(f"--setting {name}: choose default, other_warm_start or ragged")


def build_ragged(work: Path) -> tuple[Path, Path, Path]:
    """other_warm_start's data with a response of the answer then 0-24 filler words (the SFT target; the reward
    takes the first integer), and a warm start on it from other_warm_start's initial model (built once)."""
    import hashlib

    import pyarrow.parquet as pq

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from other_warm_start import build, verl

    from verl.data.io import write_rows

    train, test, _ = build(work)
    data = work / "ragged-data"
    if not (data / "test.parquet").exists():
        for split in (train, test):
            rows = pq.read_table(split).to_pylist()
            for row in rows:
                answer = row["reward_model"]["ground_truth"]
                words = int(hashlib.md5(row["prompt"][0]["content"].encode()).hexdigest(), 16) % 25
                row["extra_info"]["ragged_response"] = " ".join([answer] + ["ok"] * words)
            write_rows(data / split.name, rows)
    sft = work / "model-sft-ragged"
    if not (sft / "config.json").exists():
        verl("sft", f"model.path={work / 'model-init'}", f"data.train_files={data / train.name}",
             "data.response_key=extra_info.ragged_response", "data.max_length=96",
             "trainer.total_training_steps=400", f"trainer.default_local_dir={sft}", "trainer.logger=[console]",
             "trainer.torch_threads=1")  # fmt: skip
    return data / train.name, data / test.name, sft


def run(mode: str, base: list[str], steps: int, out: Path, backend: str) -> dict:
    args = [
        *base,
        *MODES[mode],
        f"trainer.backend={backend}",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",  # validated once, after the last step
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
        "idle_s": median("timing_s/rollout_idle"),
        "staleness": median("training/off_policy/trajectory_staleness/mean") or 0.0,
        "length": median("response_length/mean"),
        "partial": median("fully_async/partial/partial_ratio"),
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
        "| mode | step (median) | x 100 steps | run wall time | trainer waits | generation | update | staleness "
        "| rollout idle | response length | partial | held-out start -> end |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        r = run(
            mode, base, args.steps, work / "runs" / args.setting / f"{mode}-seed{args.seed}", args.backend
        )
        start = f"{r['start']:.1f}%" if r["start"] is not None else "-"
        idle = f"{r['idle_s']:.3f} s" if r["idle_s"] is not None else "-"
        print(
            f"| {mode} | {r['step_s']:.3f} s | {100 * r['step_s']:.1f} s | {r['wall_s']:.0f} s | {r['wait_s']:.3f} s "
            f"| {r['generate_s']:.3f} s | {r['update_s']:.3f} s | {r['staleness']:.2f} | {idle} | {r['length']:.1f} "
            f"| {100 * (r['partial'] or 0):.0f}% | {start} -> {r['end']:.1f}% |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
