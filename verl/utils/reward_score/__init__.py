"""verl's import path for its rule-based scoring, ``verl.utils.reward_score.default_compute_score(
data_source, solution_str, ground_truth, extra_info=None)``: a custom reward function written for verl
that falls back to it imports unchanged. A thin re-export of :mod:`verl.workers.reward.scorers`."""

from verl.workers.reward.scorers import default_compute_score

__all__ = ["default_compute_score"]
