"""Do the built-in steps compute the same numbers as before a refactor? Runs 3 RL steps of every advantage
estimator (and DAPO, and each asynchronous mode) on the tiny model and writes each run's metrics.jsonl.

    python benchmarks/step_parity.py --out /tmp/parity-before      # on the old commit
    python benchmarks/step_parity.py --out /tmp/parity-after --compare /tmp/parity-before

``--compare`` prints, per run, IDENTICAL or the first differences of every non-timing metric
(``benchmarks/compare_metrics.py``'s rule, memory figures skipped too) and exits 1 on any difference.
Each run is in-process, one torch thread, fp32, the same seed: a refactor that leaves the arithmetic alone
gives the same metrics to the last bit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import compare_metrics

RUNS: dict[str, list[str]] = {
    "gae": ["algorithm.adv_estimator=gae"],
    "grpo": ["algorithm.adv_estimator=grpo"],
    "grpo_passk": ["algorithm.adv_estimator=grpo_passk"],
    "rloo": ["algorithm.adv_estimator=rloo"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    "remax": ["algorithm.adv_estimator=remax"],
    "opo": ["algorithm.adv_estimator=opo"],
    "gpg": ["algorithm.adv_estimator=gpg", "actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
    "grpo_kl": ["actor_rollout_ref.actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true"],
    "dapo": ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=0"],
    "separate_async": [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1",
    ],
    "streaming": [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.num_warmup_batches=1",
        "async_training.staleness_threshold=0.5",
    ],
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
}
SKIP = (*compare_metrics.SKIP, "memory/")


def run_all(out: Path, names: list[str]) -> None:
    import torch

    from verl.config import load_config
    from verl.data import write_arithmetic_dataset
    from verl.models import make_tiny_model
    from verl.trainer.rl_trainer import RLTrainer

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="step-parity-"))
    model = make_tiny_model(work / "model", hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    train, test = write_arithmetic_dataset(work / "data", max_operand=9, holdout_frac=0.2, seed=0)
    fp32 = [
        f"{s}.fsdp_config.mixed_precision.param_dtype=fp32"
        for s in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")
    ]
    for name in names:
        run_dir = out / name
        config = load_config(
            "grpo",
            [
                f"data.train_files={train}",
                f"data.val_files={test}",
                "data.train_batch_size=4",
                "data.val_max_samples=8",
                "data.max_response_length=6",
                f"actor_rollout_ref.model.path={model}",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.optim.lr=1e-3",
                "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
                "actor_rollout_ref.rollout.n=4",
                "trainer.total_training_steps=3",
                "trainer.test_freq=3",
                "trainer.logger=[jsonl]",
                "trainer.torch_threads=1",
                f"trainer.default_local_dir={run_dir}",
                "prepare.enable=false",
                *fp32,
                *RUNS[name],
            ],
        )
        RLTrainer(config).fit()
        print(f"{name}: {run_dir / 'metrics.jsonl'}", flush=True)


def differences(a: Path, b: Path) -> list[str]:
    return compare_metrics.differences(compare_metrics.load(a), compare_metrics.load(b), skip=SKIP)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the runs")
    parser.add_argument("--compare", type=Path, help="an earlier --out to compare with")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="these runs only")
    args = parser.parse_args()
    names = args.only or list(RUNS)
    run_all(args.out, names)
    if args.compare is None:
        return 0
    failed = 0
    for name in names:
        found = differences(args.compare / name / "metrics.jsonl", args.out / name / "metrics.jsonl")
        print(f"{name}: " + ("IDENTICAL" if not found else f"{len(found)} differences"))
        for line in found[:10]:
            print("   ", line)
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
