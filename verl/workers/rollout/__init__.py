"""Rollout engines behind one switch, ``actor_rollout_ref.rollout.name``."""

from verl.workers.rollout import dummy, fast, hf, sglang, vllm  # noqa: F401  (register the engines)
from verl.workers.rollout.base import ROLLOUT_REGISTRY, SamplingParams, get_rollout_class, register_rollout

__all__ = ["ROLLOUT_REGISTRY", "SamplingParams", "get_rollout_class", "register_rollout"]
