"""An in-process worker group: all ranks live in this process and run one after another.

It is the reference implementation of the control plane (no Ray, no processes), for tests, debugging
and single-device runs. A Ray group reuses the same pieces: :func:`registered_methods` to find the
exposed methods, :func:`~verl.single_controller.dispatch.dispatch` / ``collect`` to split and merge.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from verl.single_controller.dispatch import collect, dispatch, get_dispatch_mode
from verl.single_controller.worker import Worker, registered_methods, worker_placement

__all__ = ["LocalWorkerGroup"]


class LocalWorkerGroup:
    """``world_size`` instances of ``worker_cls`` in this process, driven as one object.

    Each worker is built with ``worker_cls(**init_kwargs)`` inside :func:`worker_placement`, so its
    ``rank`` and ``world_size`` are set before its ``__init__`` runs (no rank arguments are passed).
    Every ``@register``-ed method of the class becomes a method of the group: ``group.m(*a, **kw)``
    splits the call per the method's dispatch mode, calls the workers in rank order, and merges the
    outputs. A worker that raises stops the call; the exception propagates unchanged.
    """

    def __init__(
        self, worker_cls: type[Worker], world_size: int = 1, init_kwargs: dict[str, Any] | None = None
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"worker_cls must be a subclass of Worker, got {worker_cls!r}")
        if not isinstance(world_size, int) or world_size <= 0:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.worker_cls = worker_cls
        self.world_size = world_size
        self._methods = registered_methods(worker_cls)
        for name in self._methods:
            if name in ("worker_cls", "world_size", "workers") or hasattr(LocalWorkerGroup, name):
                raise ValueError(
                    f"{worker_cls.__name__}.{name} is registered but its name clashes with an attribute "
                    "of LocalWorkerGroup; rename the method"
                )
        workers = []
        for rank in range(world_size):
            with worker_placement(rank, world_size):
                workers.append(worker_cls(**(init_kwargs or {})))
        self.workers: list[Worker] = workers
        for name, mode in self._methods.items():
            setattr(self, name, self._make_method(name, mode))

    def _make_method(self, name: str, mode: Hashable) -> Callable[..., Any]:
        """Build the group-level callable for one registered method."""
        qualname = f"{self.worker_cls.__name__}.{name}"
        get_dispatch_mode(mode)

        def call(*args: Any, **kwargs: Any) -> Any:
            per_rank_args, per_rank_kwargs, pad_size = dispatch(mode, self.world_size, qualname, args, kwargs)
            outputs = [
                getattr(worker, name)(*per_rank_args[rank], **per_rank_kwargs[rank])
                for rank, worker in enumerate(self.workers)
            ]
            return collect(mode, self.world_size, qualname, outputs, pad_size)

        original = getattr(self.worker_cls, name)
        call.__name__ = name
        call.__qualname__ = f"LocalWorkerGroup[{qualname}]"
        call.__doc__ = original.__doc__
        return call

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails, i.e. for names that are not registered methods.
        worker_cls = self.__dict__.get("worker_cls")
        if worker_cls is not None and not name.startswith("_") and callable(getattr(worker_cls, name, None)):
            raise AttributeError(
                f"{worker_cls.__name__}.{name} is not exposed by the worker group because it is not "
                f"registered; decorate it with @register(dispatch_mode=...) to call it through the group"
            )
        owner = worker_cls.__name__ if worker_cls is not None else "?"
        raise AttributeError(f"LocalWorkerGroup of {owner} has no attribute {name!r}")

    def __len__(self) -> int:
        return self.world_size

    def __repr__(self) -> str:
        return f"LocalWorkerGroup({self.worker_cls.__name__}, world_size={self.world_size})"
