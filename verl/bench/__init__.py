"""``verl bench``: how fast verl is, and how much memory it needs, on this machine.

Four sections on the same models and the same arithmetic prompts (the default recipe's task):

* ``rollout`` (:mod:`verl.bench.rollout`): tokens/s of every registered rollout engine per batch size
  and response length;
* ``train`` (:mod:`verl.bench.training`): tokens/s of one policy update, padded vs packed;
* ``step`` (:mod:`verl.bench.step`): one full GRPO step of ``RLTrainer`` and its breakdown by stage;
* ``fsdp`` (:mod:`verl.bench.fsdp`): the policy update with strategy dp vs fsdp2 on 1 and 2 ranks, and
  the parameter, gradient and optimizer bytes each rank holds;

each with the peak memory of its process (of each rank, for ``fsdp``). How a number is taken (a fresh
process per measurement, warm-up excluded, median of repeated runs, RSS high-water mark) is in
:mod:`verl.bench.measure`.
"""

from verl.bench.runner import FULL, QUICK, BenchSizes, run_bench, run_cli

__all__ = ["FULL", "QUICK", "BenchSizes", "run_bench", "run_cli"]
