"""Out-of-memory errors that say which setting to turn.

A bare ``CUDA out of memory. Tried to allocate 2.00 GiB`` says nothing about which of a dozen batch
sizes to lower. :func:`explain_oom` wraps a worker method so that an out-of-memory error raised in it
comes out with the config keys that bound that method's memory, and their current values, on the
first line (the line a :class:`~verl.single_controller.WorkerError` keeps). The error keeps its type
(``torch.OutOfMemoryError`` or ``MemoryError``) and chains the original, so handlers that look for
the type and the original traceback both still work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

OOM_ERRORS: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)

# What bounds each worker method's memory, most effective first. "key=value" means "set it to";
# a bare key means "lower it". The row counts apply without use_dynamic_bsz, the token budget with it.
GENERATE_KNOBS = ("actor_rollout_ref.rollout.micro_batch_size", "data.max_response_length")
LOG_PROB_KNOBS = (
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.model.log_prob_chunk_size",
)
REF_LOG_PROB_KNOBS = (
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
)
ACTOR_UPDATE_KNOBS = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    "actor_rollout_ref.model.log_prob_chunk_size",
    "data.max_response_length",
)
VALUES_KNOBS = ("critic.forward_micro_batch_size_per_gpu",)
CRITIC_UPDATE_KNOBS = (
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.model.enable_gradient_checkpointing=true",
)

_UNKNOWN = object()


def _lookup(config: Any, dotted: str) -> Any:
    """``config.a.b.c`` for a DictConfig, dict or plain object; _UNKNOWN when any part is missing."""
    value = config
    for part in dotted.split("."):
        try:
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        except Exception:  # AttributeError, KeyError, omegaconf's missing-key errors
            return _UNKNOWN
    return value


def knob_advice(knob: str, config: Any) -> str | None:
    """``lower key (now 8)``, or ``set key=true``; None for a setting that already has the suggested value."""
    key, _, target = knob.partition("=")
    current = _lookup(config, key)
    if target:
        return None if str(current).lower() == target.lower() else f"set {key}={target}"
    if current is _UNKNOWN:
        return f"lower {key}"
    if current is None:
        return f"set {key} to a small number (now null: the whole batch in one pass)"
    return f"lower {key} (now {current})"


def oom_message(where: str, error: BaseException, knobs: Sequence[str], config: Any = None) -> str:
    """One line: what ran out of memory, the knobs to turn (with current values), the original message."""
    advice = [text for text in (knob_advice(knob, config) for knob in knobs) if text]
    first_line = (str(error).strip().splitlines() or [""])[0]
    original = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__
    return f"{where} ran out of memory. To fit: {'; '.join(advice) or 'lower the batch sizes'}. ({original})"


def explained_oom(
    where: str, error: BaseException, knobs: Sequence[str], config: Any = None
) -> BaseException:
    """A new error of ``error``'s type carrying :func:`oom_message` (MemoryError if the type will not build)."""
    message = oom_message(where, error, knobs, config)
    try:
        return type(error)(message)
    except Exception:
        return MemoryError(message)


def explain_oom(*knobs: str) -> Callable[[F], F]:
    """Decorate a worker method: an out-of-memory error inside it names ``knobs`` (read from ``self.config``).

    Usage (between ``@register`` and ``@on_device``, so moving the batch to the device is covered too)::

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        @explain_oom(*ACTOR_UPDATE_KNOBS)
        @on_device
        def update_actor(self, data): ...
    """

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except OOM_ERRORS as error:
                where = f"{type(self).__name__}.{method.__name__}"
                raise explained_oom(where, error, knobs, getattr(self, "config", None)) from error

        return run  # type: ignore[return-value]

    return decorate
