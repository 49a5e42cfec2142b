"""Does a long run stay healthy? Resident memory of `verl run` sampled every 50 steps.

    python benchmarks/memory_growth.py [steps] [extra key=value overrides...]

Runs the default recipe (in this process) for ``steps`` RL steps (default 500) and prints the
resident set size (RSS, from /proc/self/status) after every 50th step, and the growth after the
warm-up (from step 100 to the end). Validation runs only once, after the last sample.
"""

from __future__ import annotations

import sys

from verl.config import load_config
from verl.trainer.prepare import prepare_inputs
from verl.trainer.rl_trainer import RLTrainer


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(steps: int, extra: list[str]) -> None:
    config = load_config(
        None,
        [
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            "trainer.default_local_dir=outputs/memory_growth",
            "trainer.resume_mode=disable",
            *extra,
        ],
    )
    config = prepare_inputs(config)
    trainer = RLTrainer(config)
    samples: dict[int, float] = {0: rss_mb()}
    train_step = trainer.train_step

    def step_and_sample(*args, **kwargs):
        metrics = train_step(*args, **kwargs)
        if trainer.global_steps % 50 == 0:
            samples[trainer.global_steps] = rss_mb()
            print(f"step {trainer.global_steps:4d}: RSS {samples[trainer.global_steps]:.0f} MB", flush=True)
        return metrics

    trainer.train_step = step_and_sample
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    warm = samples.get(100, samples[min(k for k in samples if k > 0)])
    last = samples[max(samples)]
    print(
        f"RSS after warm-up (step 100) {warm:.0f} MB, at step {max(samples)} {last:.0f} MB: {100 * (last / warm - 1):+.1f}%"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500, sys.argv[2:])
