"""Does a long run stay healthy? Resident memory of `verl run` sampled as it trains.

    python benchmarks/memory_growth.py [--steps 2000] [--warmup 500] [--every 50] [--out rss.json] [key=value ...]

Runs the default recipe (in this process) for ``--steps`` RL steps and prints the resident set size (RSS,
from /proc/self/status) after every ``--every``-th step, then the growth from the end of the warm-up
(``--warmup``: the step from which RSS should stay flat) to the last step, with the slope in MB per step.
Validation runs only once, after the last sample. ``--out`` writes the samples and the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform

from verl.config import load_config
from verl.trainer.prepare import prepare_inputs
from verl.trainer.rl_trainer import RLTrainer


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(steps: int, every: int, overrides: list[str]) -> dict[int, float]:
    """``{step: RSS in MB}`` sampled every ``every`` steps of a ``steps``-step default run (step 0: before)."""
    config = load_config(
        None,
        [
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            "trainer.default_local_dir=outputs/memory_growth",
            "trainer.resume_mode=disable",
            *overrides,
        ],
    )
    trainer = RLTrainer(prepare_inputs(config))
    samples: dict[int, float] = {0: rss_mb()}
    train_step = trainer.train_step

    def step_and_sample(*args, **kwargs):
        metrics = train_step(*args, **kwargs)
        if trainer.global_steps % every == 0:
            samples[trainer.global_steps] = rss_mb()
            print(f"step {trainer.global_steps:4d}: RSS {samples[trainer.global_steps]:.0f} MB", flush=True)
        return metrics

    trainer.train_step = step_and_sample
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return samples


def summary(samples: dict[int, float], warmup: int) -> dict[str, float]:
    """RSS at the warm-up's end and at the last sample, the growth between them in % and in MB per step, and
    the same growth from the least-squares line through every sample from the warm-up on (single samples
    move by 10-20 MB either way): its slope, and slope x steps over the samples' mean RSS in %."""
    start = min((step for step in samples if step >= warmup), default=max(samples))
    last = max(samples)
    steps = [step for step in samples if step >= start]
    mean_step = sum(steps) / len(steps)
    mean_rss = sum(samples[step] for step in steps) / len(steps)
    spread = sum((step - mean_step) ** 2 for step in steps)
    fitted = (
        sum((step - mean_step) * (samples[step] - mean_rss) for step in steps) / spread if spread else 0.0
    )
    return {"from_step": start, "to_step": last, "rss_from_mb": samples[start], "rss_to_mb": samples[last],
            "growth_pct": 100 * (samples[last] / samples[start] - 1),
            "mb_per_step": (samples[last] - samples[start]) / max(last - start, 1),
            "fitted_mb_per_step": fitted, "fitted_growth_pct": 100 * fitted * (last - start) / mean_rss}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--out", help="write the samples and the summary here (JSON)")
    args, overrides = parser.parse_known_args()
    samples = run(args.steps, args.every, overrides)
    result = summary(samples, args.warmup)
    print(
        f"RSS at step {result['from_step']} {result['rss_from_mb']:.0f} MB, at step {result['to_step']} "
        f"{result['rss_to_mb']:.0f} MB: {result['growth_pct']:+.1f}% ({result['mb_per_step']:+.3f} MB/step); "
        f"fitted {result['fitted_growth_pct']:+.1f}% ({result['fitted_mb_per_step']:+.3f} MB/step)"
    )
    if args.out:
        record = {"overrides": overrides, "machine": platform.processor() or platform.machine(),
                  "rss_mb": samples, "summary": result}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
