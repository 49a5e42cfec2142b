"""Default-recipe step times before and after one full validation pass, at a given thread count.

    python benchmarks/steps_after_validation.py 2     # torch threads; try 1 and 2

Runs 15 RL steps, then ``validate()`` (all held-out prompts in one batch), then 15 more steps, and
prints the median step and update times of each half (the first 3 steps of each are warm-up). On
the 2-core development machine two threads ran the steps after validation about 1.7x slower than
before it, one thread did not (docs/performance.md).
"""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile

from verl.config import load_config
from verl.data import collate_rl, iterate_batches
from verl.trainer.prepare import prepare_inputs
from verl.trainer.rl_trainer import RLTrainer


def main(threads: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        config = load_config(
            "grpo",
            [f"trainer.torch_threads={threads}", f"trainer.default_local_dir={out}", "trainer.logger=[]"],
        )
        config = prepare_inputs(config)
        trainer = RLTrainer(config)
        collate = functools.partial(collate_rl, pad_token_id=trainer.tokenizer.pad_token_id)
        batches = iterate_batches(trainer.train_dataset, trainer.sampler, collate, num_epochs=None)

        def steps(count: int) -> str:
            times = []
            for _ in range(count):
                metrics = trainer.train_step(trainer.global_steps + 1, next(batches), batches)
                times.append((metrics["timing_s/step"], metrics["timing_s/update_actor"]))
            step = statistics.median(t[0] for t in times[3:])
            update = statistics.median(t[1] for t in times[3:])
            return f"step {step:.3f} s, update_actor {update:.3f} s"

        print(f"torch threads {threads}")
        print("before validation:", steps(15))
        trainer.validate()
        print("after validation: ", steps(15))
        trainer.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
