"""Rewards: rule scorers, the data_source dispatch, reward managers, weighted terms and the reward model."""

from verl.workers.reward import dapo, limited  # noqa: F401  (register "dapo", "limited")
from verl.workers.reward.batch import BatchRewardManager, score_batch
from verl.workers.reward.factory import load_reward_manager
from verl.workers.reward.formats import register_answer_format
from verl.workers.reward.loading import get_custom_reward_fn, load_custom_reward_function
from verl.workers.reward.manager import (
    REWARD_MANAGERS,
    NaiveRewardManager,
    get_reward_manager_cls,
    register_reward_manager,
)
from verl.workers.reward.scorers import SCORERS, default_compute_score, register_scorer
from verl.workers.reward.scoring import (
    ERROR_POLICIES,
    REWARD_ERROR_KEY,
    RewardBatchError,
    RewardFunctionError,
    RewardSample,
    ScoreResult,
    score_samples,
)
from verl.workers.reward.timeout import CallTimeout, TimeLimit, TimeLimitExhausted

__all__ = [
    "ERROR_POLICIES",
    "REWARD_ERROR_KEY",
    "REWARD_MANAGERS",
    "SCORERS",
    "BatchRewardManager",
    "CallTimeout",
    "NaiveRewardManager",
    "RewardBatchError",
    "RewardFunctionError",
    "RewardSample",
    "ScoreResult",
    "default_compute_score",
    "get_custom_reward_fn",
    "get_reward_manager_cls",
    "load_custom_reward_function",
    "load_reward_manager",
    "register_answer_format",
    "register_reward_manager",
    "register_scorer",
    "score_batch",
    "score_samples",
    "TimeLimit",
    "TimeLimitExhausted",
]
