"""An in-process worker group: all ranks live in the driver's process and run one after another.

The embedded default backend (no Ray, no processes), for tests, debugging and single-device runs.
Data is passed by reference; nothing is copied or serialised.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from verl.single_controller.base import WorkerGroup
from verl.single_controller.errors import WorkerError, describe_error
from verl.single_controller.worker import worker_placement
from verl.utils.threads import drive_on_one_openmp_thread

__all__ = ["LocalWorkerGroup"]


class LocalWorkerGroup(WorkerGroup):
    """``world_size`` instances of ``worker_cls`` in this process, driven as one object.

    Each worker is built with ``worker_cls(**init_kwargs)`` inside :func:`worker_placement`, so a
    :class:`Worker` subclass has ``rank`` and ``world_size`` set before its ``__init__`` runs.

    Every call runs on the group's own thread, whichever thread makes it: a worker does one thing at a
    time, as a Ray actor does, and calls on different groups may run at the same time. One fixed thread
    per group also matters for speed: each thread that runs parallel torch ops gets an OpenMP team of its
    own, kept until the thread ends, and once a process holds more OpenMP threads than CPUs each parallel op
    waits for its team to be woken instead of finding it spinning; torch work hopping across a pool of threads
    ran ~50% slower (measured on 2 cores: 0.44 s vs 0.29 s per GRPO step). A group with ``computes=False`` (a rule-based
    reward) runs torch ops on one OpenMP thread, so that it holds no team of its own
    (:func:`verl.utils.threads.drive_on_one_openmp_thread`). Groups built with ``exclusive=True`` (roles whose
    calls compute on every core) share one thread instead, and so take turns: two teams of every core side by
    side contend for the cores and wake each other's helpers. A PPO step of the 4M bench model on 2 cores
    (actor and critic, two threads each) took 0.60-0.61 s with them taking turns against 0.66-0.68 s side by side
    (docs/performance.md, "One OpenMP team per process").
    """

    in_process = True

    def __init__(
        self,
        worker_cls: type,
        world_size: int = 1,
        init_kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        computes: bool = True,
        exclusive: bool = False,
    ) -> None:
        super().__init__(worker_cls, world_size, init_kwargs, name)
        self._owns_thread = not exclusive
        if exclusive:
            self._thread = _exclusive_thread()
        else:
            self._thread = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"verl-{self.name}",
                initializer=None if computes else drive_on_one_openmp_thread,
            )
        self._thread_ident: int | None = None
        self._thread.submit(self._remember_thread).result()
        self.workers: list[Any] = self._on_own_thread(self._build_workers)

    def _build_workers(self) -> list[Any]:
        workers = []
        for rank in range(self.world_size):
            with worker_placement(rank, self.world_size):
                worker = self.worker_cls(**self.init_kwargs)
            if self.saved_state is not None:
                worker.set_state(self.state_for(rank))
            workers.append(worker)
        return workers

    def _on_own_thread(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the group's thread (directly when already there: a worker calling its own group)."""
        if threading.get_ident() == self._thread_ident:
            return fn()
        return self._thread.submit(fn).result()

    def _remember_thread(self) -> None:
        self._thread_ident = threading.get_ident()

    def _run_ranks(self, method: str, calls: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
        return self._on_own_thread(lambda: self._run_ranks_here(method, calls))

    def _run_ranks_here(self, method: str, calls: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
        outputs = {}
        for rank, (args, kwargs) in sorted(calls.items()):
            try:
                outputs[rank] = getattr(self.workers[rank], method)(*args, **kwargs)
            except WorkerError:
                raise
            except (MemoryError, torch.OutOfMemoryError) as error:
                raise WorkerError(
                    self.name, rank, method, describe_error(error), "oom", os.getpid()
                ) from error
            except Exception as error:
                raise WorkerError(
                    self.name, rank, method, describe_error(error), "exception", os.getpid()
                ) from error
        return outputs

    def restart(self) -> None:
        self.workers = self._on_own_thread(self._build_workers)

    def shutdown(self) -> None:
        self.workers = []
        if self._owns_thread:  # the exclusive groups' thread serves the others too
            self._thread.shutdown(wait=False)


@functools.cache
def _exclusive_thread() -> ThreadPoolExecutor:
    """The one thread of this process on which the exclusive groups run, each call in turn."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-exclusive")
