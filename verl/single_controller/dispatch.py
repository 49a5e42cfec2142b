"""How one call on a worker group becomes one call per worker, and how the answers come back.

A dispatch mode is a pair of pure functions, kept free of any transport so that the in-process
:class:`~verl.single_controller.local.LocalWorkerGroup` and a later Ray group share them:

* ``dispatch_fn(world_size, *args, **kwargs) -> Dispatched(args_per_rank, kwargs_per_rank, pad_size)``
  turns the controller's call into ``world_size`` calls. ``pad_size`` is the number of padding rows the
  dispatch added (0 for modes that do not pad); it is handed back to ``collect_fn`` so it can remove them.
  ``Dispatched`` is a NamedTuple, so ``args, kwargs, pad_size = dispatch_fn(...)`` works.
* ``collect_fn(world_size, outputs, pad_size) -> result`` turns the per-rank outputs (in rank order) back
  into the single value the controller sees.

Both raise :class:`DispatchError` on bad input; :func:`dispatch` and :func:`collect` add the method name
to the message so the user learns which call was wrong. New modes go in with
:func:`register_dispatch_mode`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

__all__ = [
    "DISPATCH_MODES",
    "Dispatch",
    "DispatchError",
    "DispatchMode",
    "Dispatched",
    "collect",
    "dispatch",
    "get_dispatch_mode",
    "register_dispatch_mode",
]


class Dispatch(enum.Enum):
    """The built-in dispatch modes; the functions behind each live in :data:`DISPATCH_MODES`."""

    ONE_TO_ALL = "one_to_all"
    """Every worker gets the same arguments; the result is a list with one output per worker."""
    ALL_TO_ALL = "all_to_all"
    """Every argument is a list of length world_size; worker i gets element i; result is a list."""
    DP_COMPUTE_PROTO = "dp_compute_proto"
    """DataProto arguments are padded, chunked across workers, and the outputs concatenated and unpadded."""
    DP_COMPUTE_METRICS = "dp_compute_metrics"
    """Dispatched like DP_COMPUTE_PROTO; every worker returns the same metrics dict (a data-parallel update
    all-reduces them), and the result is rank 0's."""


class DispatchError(ValueError):
    """The arguments or outputs of a call do not fit its dispatch mode."""


class Dispatched(NamedTuple):
    """What a dispatch function returns: per-rank positional args and kwargs, and the padding it added."""

    args: list[tuple[Any, ...]]
    kwargs: list[dict[str, Any]]
    pad_size: int = 0


DispatchFn = Callable[..., Dispatched]
CollectFn = Callable[[int, Sequence[Any], int], Any]


@dataclass(frozen=True)
class DispatchMode:
    """A registered mode: how to split a call (``dispatch_fn``) and how to merge the outputs (``collect_fn``)."""

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size <= 0:
        raise DispatchError(f"world_size must be a positive int, got {world_size!r}")


def _check_outputs(world_size: int, outputs: Sequence[Any]) -> None:
    if len(outputs) != world_size:
        raise DispatchError(f"expected {world_size} outputs (one per worker), got {len(outputs)}")


def _check_output_types(outputs: Sequence[Any], expected: type, requirement: str) -> None:
    """Every rank's output is an ``expected``; the error says the mode's ``requirement`` and the culprit."""
    for rank, output in enumerate(outputs):
        if not isinstance(output, expected):
            raise DispatchError(f"{requirement}; rank {rank} returned {type(output).__name__}")


# ---------------------------------------------------------------- ONE_TO_ALL


def dispatch_one_to_all(world_size: int, *args: Any, **kwargs: Any) -> Dispatched:
    """Give every worker the same arguments (the objects themselves, not copies: in-process they are shared)."""
    _check_world_size(world_size)
    return Dispatched([args] * world_size, [dict(kwargs) for _ in range(world_size)], 0)


def collect_all_to_list(world_size: int, outputs: Sequence[Any], pad_size: int) -> list[Any]:
    """Return the outputs as a list in rank order; used by ONE_TO_ALL and ALL_TO_ALL."""
    _check_outputs(world_size, outputs)
    return list(outputs)


# ---------------------------------------------------------------- ALL_TO_ALL


def dispatch_all_to_all(world_size: int, *args: Any, **kwargs: Any) -> Dispatched:
    """Worker i gets element i of every argument, so each argument must be a list or tuple of world_size."""
    _check_world_size(world_size)
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in named:
        if not isinstance(value, (list, tuple)):
            raise DispatchError(
                f"ALL_TO_ALL needs every argument to be a list of length world_size={world_size} "
                f"(one element per worker); {where} is a {type(value).__name__}"
            )
        if len(value) != world_size:
            raise DispatchError(
                f"ALL_TO_ALL needs every argument to be a list of length world_size={world_size} "
                f"(one element per worker); {where} has length {len(value)}"
            )
    per_rank_args = [tuple(a[rank] for a in args) for rank in range(world_size)]
    per_rank_kwargs = [{k: v[rank] for k, v in kwargs.items()} for rank in range(world_size)]
    return Dispatched(per_rank_args, per_rank_kwargs, 0)


# ---------------------------------------------------------------- DP_COMPUTE_PROTO


def dispatch_dp_compute_proto(world_size: int, *args: Any, **kwargs: Any) -> Dispatched:
    """Pad every DataProto argument to a multiple of world_size and give worker i chunk i; other
    arguments go unchanged to every worker. All DataProto arguments must have the same length, since one
    ``pad_size`` has to describe them all."""
    _check_world_size(world_size)
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    protos = [(where, v) for where, v in named if isinstance(v, DataProto)]
    if protos and len({len(v) for _, v in protos}) > 1:
        sizes = ", ".join(f"{where} has {len(v)} rows" for where, v in protos)
        raise DispatchError(
            f"DP_COMPUTE_PROTO needs all DataProto arguments to have the same length; {sizes}"
        )

    pad_size = 0

    def split(value: Any) -> list[Any]:
        nonlocal pad_size
        if not isinstance(value, DataProto):
            return [value] * world_size
        padded, pad_size = pad_dataproto_to_divisor(value, world_size)
        return padded.chunk(world_size)

    split_args = [split(a) for a in args]
    split_kwargs = {k: split(v) for k, v in kwargs.items()}
    per_rank_args = [tuple(s[rank] for s in split_args) for rank in range(world_size)]
    per_rank_kwargs = [{k: s[rank] for k, s in split_kwargs.items()} for rank in range(world_size)]
    return Dispatched(per_rank_args, per_rank_kwargs, pad_size)


def collect_dp_compute_proto(world_size: int, outputs: Sequence[Any], pad_size: int) -> DataProto:
    """Concatenate the per-rank DataProtos in rank order and drop the ``pad_size`` padding rows.

    This assumes each worker returns one output row per input row (the usual compute_* contract); a worker
    that changes its row count would make the trailing rows removed here not be the padding.
    """
    _check_outputs(world_size, outputs)
    _check_output_types(outputs, DataProto, "DP_COMPUTE_PROTO needs every worker to return a DataProto")
    try:
        merged = DataProto.concat(list(outputs))
        return unpad_dataproto(merged, pad_size)
    except ValueError as error:
        raise DispatchError(f"DP_COMPUTE_PROTO could not merge the worker outputs: {error}") from error


def collect_rank0_metrics(world_size: int, outputs: Sequence[Any], pad_size: int) -> dict[str, float]:
    """Rank 0's metrics dict: the ranks of a data-parallel update all-reduce their metrics, so any rank's
    dict is the global one."""
    _check_outputs(world_size, outputs)
    _check_output_types(outputs, dict, "DP_COMPUTE_METRICS needs every worker to return a dict of metrics")
    return outputs[0]


# ---------------------------------------------------------------- registry

DISPATCH_MODES: dict[Hashable, DispatchMode] = {}
"""Every known mode, keyed by a :class:`Dispatch` member (or any hashable key a user registers)."""


def register_dispatch_mode(
    mode: Hashable, dispatch_fn: DispatchFn, collect_fn: CollectFn, *, override: bool = False
) -> DispatchMode:
    """Add a dispatch mode so ``@register(dispatch_mode=mode)`` accepts it; refuses to replace one silently."""
    if mode in DISPATCH_MODES and not override:
        raise ValueError(f"dispatch mode {mode!r} is already registered; pass override=True to replace it")
    name = mode.name if isinstance(mode, enum.Enum) else str(mode)
    entry = DispatchMode(name, dispatch_fn, collect_fn)
    DISPATCH_MODES[mode] = entry
    return entry


def get_dispatch_mode(mode: Hashable) -> DispatchMode:
    """Look up a mode, with an error listing the known ones."""
    try:
        return DISPATCH_MODES[mode]
    except (KeyError, TypeError):
        known = ", ".join(m.name for m in DISPATCH_MODES.values())
        raise ValueError(f"unknown dispatch mode {mode!r}; known modes: {known}") from None


register_dispatch_mode(Dispatch.ONE_TO_ALL, dispatch_one_to_all, collect_all_to_list)
register_dispatch_mode(Dispatch.ALL_TO_ALL, dispatch_all_to_all, collect_all_to_list)
register_dispatch_mode(Dispatch.DP_COMPUTE_PROTO, dispatch_dp_compute_proto, collect_dp_compute_proto)
register_dispatch_mode(Dispatch.DP_COMPUTE_METRICS, dispatch_dp_compute_proto, collect_rank0_metrics)


# ---------------------------------------------------------------- entry points for worker groups


def dispatch(
    mode: Hashable, world_size: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Dispatched:
    """Run the mode's dispatch_fn, prefixing any DispatchError with the method name and mode."""
    entry = get_dispatch_mode(mode)
    try:
        return entry.dispatch_fn(world_size, *args, **kwargs)
    except DispatchError as error:
        raise DispatchError(f"{method_name} (dispatch mode {entry.name}): {error}") from error


def collect(mode: Hashable, world_size: int, method_name: str, outputs: Sequence[Any], pad_size: int) -> Any:
    """Run the mode's collect_fn, prefixing any DispatchError with the method name and mode."""
    entry = get_dispatch_mode(mode)
    try:
        return entry.collect_fn(world_size, outputs, pad_size)
    except DispatchError as error:
        raise DispatchError(f"{method_name} (dispatch mode {entry.name}): {error}") from error
