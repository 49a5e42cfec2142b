"""The worker side of the single-controller model: a :class:`Worker` base class and ``@register``."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from verl.single_controller.dispatch import Dispatch, get_dispatch_mode

__all__ = ["DISPATCH_ATTR", "Worker", "register", "registered_methods", "worker_placement"]

DISPATCH_ATTR = "__verl_dispatch__"
"""Name of the attribute ``@register`` stores the dispatch mode under, on the function itself."""

F = TypeVar("F", bound=Callable[..., Any])

_PLACEMENT: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "verl_worker_placement", default=None
)


@contextlib.contextmanager
def worker_placement(rank: int, world_size: int) -> Iterator[None]:
    """Make Workers constructed inside this block get ``rank`` and ``world_size``.

    Worker groups wrap construction in this so ``self.rank`` is already set when a subclass's
    ``__init__`` runs, without every subclass having to accept and forward rank arguments.
    """
    if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    token = _PLACEMENT.set((rank, world_size))
    try:
        yield
    finally:
        _PLACEMENT.reset(token)


def _current_placement() -> tuple[int, int]:
    """The placement set by :func:`worker_placement`, else the RANK / WORLD_SIZE env vars, else (0, 1)."""
    placement = _PLACEMENT.get()
    if placement is not None:
        return placement
    # A worker alone in its own process (e.g. a Ray actor or a torchrun rank) learns its place from the env.
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class Worker:
    """Base class for everything a worker group runs: one instance per rank.

    The model (HybridFlow's "single controller"): one driver process holds a *worker group* and calls
    methods on it as if it were a single object. The group turns each call into one call per worker
    according to the method's dispatch mode (see :class:`~verl.single_controller.dispatch.Dispatch`),
    runs them, and merges the results. Only methods decorated with :func:`register` are callable through
    a group; everything else is private to the worker.

    ``rank`` (0-based) and ``world_size`` are set before the subclass's ``__init__`` runs, so
    ``__init__`` can use them (e.g. to seed or shard). They come from :func:`worker_placement`, which the
    worker group enters while constructing each instance; outside a group they fall back to the
    ``RANK`` / ``WORLD_SIZE`` environment variables, else rank 0 of 1, so a Worker can be built alone
    in tests. Subclasses need not call ``super().__init__()``.
    """

    rank: int
    world_size: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        instance = super().__new__(cls)
        instance.rank, instance.world_size = _current_placement()
        return instance

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


def register(dispatch_mode: Hashable = Dispatch.ONE_TO_ALL) -> Callable[[F], F]:
    """Mark a Worker method as callable through a worker group, with how its calls are split and merged.

    The function is returned unchanged apart from the ``__verl_dispatch__`` attribute, so calling it
    directly on a single worker still works. Usage: ``@register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)``.
    """
    if callable(dispatch_mode) and not isinstance(dispatch_mode, Dispatch):
        raise TypeError(
            f"register() got the function {getattr(dispatch_mode, '__name__', dispatch_mode)!r} as its "
            "dispatch_mode; write @register() or @register(dispatch_mode=...), with parentheses"
        )
    get_dispatch_mode(dispatch_mode)  # fail at class definition, not at the first call

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@register can only decorate functions, got {type(fn).__name__}")
        setattr(fn, DISPATCH_ATTR, dispatch_mode)
        return fn

    return decorate


def registered_methods(worker_cls: type) -> dict[str, Hashable]:
    """Map each ``@register``-ed method name of ``worker_cls`` (inherited ones included) to its mode."""
    methods: dict[str, Hashable] = {}
    for name in dir(worker_cls):
        mode = getattr(getattr(worker_cls, name, None), DISPATCH_ATTR, None)
        if mode is not None:
            methods[name] = mode
    return methods
