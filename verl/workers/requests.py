"""What a worker call needs besides its batch, as typed values instead of string keys in ``meta_info``."""

from __future__ import annotations

from dataclasses import dataclass

from verl.config.sizes import DerivedSizes


@dataclass(frozen=True)
class UpdateRequest:
    """One update call (``update_actor`` / ``update_critic``) of one RL step, decided by the trainer."""

    sizes: DerivedSizes
    """mini- / micro-batch sizes and token budgets (global mini-batch, per-rank micro-batch)"""
    progress: float = 0.0
    """fraction of training done before this step, in [0, 1]: drives the clip-ratio schedule"""
    measure_entropy: bool = False
    """compute ``actor/entropy`` in the update's own forward pass (no old-log-prob pass measured it)"""
