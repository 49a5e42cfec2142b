"""What every worker group shares, whatever runs the workers (this process, or Ray actor processes).

A worker group is one handle over ``world_size`` instances of a :class:`Worker` class. Every
``@register``-ed method of the class becomes a method of the group: ``group.m(*a, **kw)`` splits the
call per the method's dispatch mode, runs one call per worker (subclasses decide how: :meth:`_run`),
and merges the outputs. ``group.call("m", ...)`` is the same by name; it also accepts a method that is
not registered when the group has a single worker (then the worker's answer comes back unchanged), so
plain classes can serve as roles too.

A failing worker surfaces as :class:`~verl.single_controller.errors.WorkerError` naming the group's
role name, the rank, the method and the cause.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable
from typing import Any

from verl.single_controller.dispatch import Dispatch, collect, dispatch, get_dispatch_mode
from verl.single_controller.worker import Worker, register, registered_methods

# verl's import paths: ``from verl.single_controller.base import Worker`` and
# ``from verl.single_controller.base.decorator import register, Dispatch``.
__all__ = ["Dispatch", "Worker", "WorkerGroup", "register"]

_RESERVED = {
    "name",
    "worker_cls",
    "world_size",
    "workers",
    "in_process",
    "init_kwargs",
    "saved_state",
    "state_for",
}


class WorkerGroup(abc.ABC):
    """Base class of :class:`LocalWorkerGroup` and :class:`RayWorkerGroup`."""

    in_process: bool = True
    """True when the workers live in the driver's process (data is passed by reference, not copied)."""

    def __init__(
        self,
        worker_cls: type,
        world_size: int = 1,
        init_kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(worker_cls, type):
            raise TypeError(f"worker_cls must be a class, got {worker_cls!r}")
        if not isinstance(world_size, int) or world_size <= 0:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.worker_cls = worker_cls
        self.world_size = world_size
        self.init_kwargs = dict(init_kwargs or {})
        self.name = name or worker_cls.__name__
        self.saved_state: Any = None
        self._rank_states: list[Any] = []
        self._methods = registered_methods(worker_cls)
        for method in self._methods:
            if method in _RESERVED or hasattr(WorkerGroup, method) or hasattr(type(self), method):
                raise ValueError(
                    f"{worker_cls.__name__}.{method} is registered but its name clashes with an attribute "
                    f"of {type(self).__name__}; rename the method"
                )
        for method, mode in self._methods.items():
            setattr(self, method, self._make_method(method, mode))

    # ------------------------------------------------------------------ what subclasses provide

    @abc.abstractmethod
    def _run_ranks(self, method: str, calls: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
        """Call ``method`` on each rank in ``calls`` with its ``(args, kwargs)``; return ``{rank: output}``.

        Ranks run at the same time where the backend allows. Must raise :class:`WorkerError` (not the
        raw exception) when a worker fails.
        """

    @abc.abstractmethod
    def restart(self) -> None:
        """Replace every worker with a fresh one (same class and init kwargs); restore ``saved_state``.

        Where workers share processes with other groups (Ray colocation), those groups' workers are
        rebuilt too, each with its own ``saved_state``.
        """

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the workers (processes, memory). The group is unusable afterwards."""

    # ------------------------------------------------------------------ calls

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` through the group by name (see the module docstring)."""
        if method in self._methods:
            return getattr(self, method)(*args, **kwargs)
        if not callable(getattr(self.worker_cls, method, None)):
            raise AttributeError(f"{self.worker_cls.__name__} has no method {method!r}")
        if self.world_size != 1:
            raise AttributeError(
                f"{self.worker_cls.__name__}.{method} is not registered, so a group of {self.world_size} "
                "workers does not know how to split it; decorate it with @register(dispatch_mode=...)"
            )
        return self._run(method, [args], [kwargs])[0]

    def save_state(self) -> Any:
        """Ask every rank for ``get_state()`` and keep the answers on the driver: :meth:`restart` gives each
        rank its own back (:meth:`state_for`). A rank whose state is rank 0's (replicated weights, as with
        DDP) may answer None and gets rank 0's. Returns rank 0's state."""
        states = self._run("get_state", [()] * self.world_size, [{}] * self.world_size)
        self._rank_states = states
        self.saved_state = states[0]
        return self.saved_state

    def state_for(self, rank: int) -> Any:
        """The state :meth:`restart` restores on ``rank``: its own from :meth:`save_state`, else rank 0's."""
        own = self._rank_states[rank] if rank < len(self._rank_states) else None
        return own if own is not None else self.saved_state

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on rank 0 only (registered or not) and return its answer."""
        return self._run_ranks(method, {0: (args, kwargs)})[0]

    def _run(self, method: str, per_rank_args: list[tuple], per_rank_kwargs: list[dict]) -> list[Any]:
        """Call ``method`` on every rank with its own arguments; the outputs in rank order."""
        outputs = self._run_ranks(
            method, {r: (per_rank_args[r], per_rank_kwargs[r]) for r in range(self.world_size)}
        )
        return [outputs[r] for r in range(self.world_size)]

    def _make_method(self, name: str, mode: Hashable) -> Callable[..., Any]:
        """Build the group-level callable for one registered method."""
        qualname = f"{self.worker_cls.__name__}.{name}"
        get_dispatch_mode(mode)

        def call(*args: Any, **kwargs: Any) -> Any:
            per_rank_args, per_rank_kwargs, pad_size = dispatch(mode, self.world_size, qualname, args, kwargs)
            outputs = self._run(name, per_rank_args, per_rank_kwargs)
            return collect(mode, self.world_size, qualname, outputs, pad_size)

        call.__name__ = name
        call.__qualname__ = f"{type(self).__name__}[{qualname}]"
        call.__doc__ = getattr(self.worker_cls, name).__doc__
        return call

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails, i.e. for names that are not registered methods.
        worker_cls = self.__dict__.get("worker_cls")
        if worker_cls is not None and not name.startswith("_") and callable(getattr(worker_cls, name, None)):
            raise AttributeError(
                f"{worker_cls.__name__}.{name} is not exposed by the worker group because it is not "
                f"registered; decorate it with @register(dispatch_mode=...) or use group.call({name!r}, ...)"
            )
        owner = worker_cls.__name__ if worker_cls is not None else "?"
        raise AttributeError(f"{type(self).__name__} of {owner} has no attribute {name!r}")

    def __len__(self) -> int:
        return self.world_size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}: {self.worker_cls.__name__}, world_size={self.world_size})"
        )
