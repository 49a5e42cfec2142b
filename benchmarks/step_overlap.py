"""How much reward, reference and critic scoring overlap in a PPO step, read from the step trace.

    python benchmarks/step_overlap.py local      # or: ray

Runs 15 steps of the ppo recipe (KL loss on, so the reference runs too) with trainer.trace=true and
prints, per step, the span from the first of the three steps starting to the last finishing, against
the sum of their run times: span < sum means they ran at the same time.
"""

from __future__ import annotations

import statistics
import sys

from verl.config import load_config
from verl.trainer.prepare import prepare_inputs
from verl.trainer.rl_trainer import RLTrainer

SCORING = ("reward", "ref", "values")  # the step names rl_step gives these calls


def main(backend: str) -> None:
    config = load_config(
        "ppo",
        [
            f"trainer.backend={backend}",
            "trainer.total_training_steps=15",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "data.val_max_samples=64",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"trainer.default_local_dir=outputs/step_overlap_{backend}",
            "trainer.trace=true",
            "trainer.torch_threads=1",
        ],
    )
    config = prepare_inputs(config)
    trainer = RLTrainer(config)
    try:
        trainer.fit()
        spans, sums = [], []
        for dag in trainer.controller.recorder.dags:
            nodes = [n for n in dag.nodes if n.method in SCORING and n.finished is not None]
            if not dag.label.startswith("step") or len(nodes) != len(SCORING):
                continue
            spans.append(max(n.finished for n in nodes) - min(n.started for n in nodes))
            sums.append(sum(n.finished - n.started for n in nodes))
    finally:
        trainer.shutdown()
    print(
        f"{backend}: {len(spans)} steps; reward + ref + values: median span {statistics.median(spans):.3f} s, "
        f"median sum of run times {statistics.median(sums):.3f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "local")
