"""An in-process worker group: all ranks live in the driver's process and run one after another.

The embedded default backend (no Ray, no processes), for tests, debugging and single-device runs.
Data is passed by reference; nothing is copied or serialised.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from verl.single_controller.base import WorkerGroup
from verl.single_controller.errors import WorkerError, describe_error
from verl.single_controller.worker import worker_placement

__all__ = ["LocalWorkerGroup"]


class LocalWorkerGroup(WorkerGroup):
    """``world_size`` instances of ``worker_cls`` in this process, driven as one object.

    Each worker is built with ``worker_cls(**init_kwargs)`` inside :func:`worker_placement`, so a
    :class:`Worker` subclass has ``rank`` and ``world_size`` set before its ``__init__`` runs. Calls on
    one group are serialised by a lock (a worker does one thing at a time, as a Ray actor does); calls
    on different groups may run at the same time from different threads.
    """

    in_process = True

    def __init__(
        self,
        worker_cls: type,
        world_size: int = 1,
        init_kwargs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(worker_cls, world_size, init_kwargs, name)
        self._lock = threading.RLock()
        self.workers: list[Any] = self._build_workers()

    def _build_workers(self) -> list[Any]:
        workers = []
        for rank in range(self.world_size):
            with worker_placement(rank, self.world_size):
                worker = self.worker_cls(**self.init_kwargs)
            if self.saved_state is not None:
                worker.set_state(self.saved_state)
            workers.append(worker)
        return workers

    def _run_ranks(self, method: str, calls: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
        outputs = {}
        with self._lock:
            for rank, (args, kwargs) in sorted(calls.items()):
                try:
                    outputs[rank] = getattr(self.workers[rank], method)(*args, **kwargs)
                except WorkerError:
                    raise
                except MemoryError as error:
                    raise WorkerError(
                        self.name, rank, method, describe_error(error), "oom", os.getpid()
                    ) from error
                except Exception as error:
                    raise WorkerError(
                        self.name, rank, method, describe_error(error), "exception", os.getpid()
                    ) from error
        return outputs

    def restart(self) -> None:
        with self._lock:
            self.workers = self._build_workers()

    def shutdown(self) -> None:
        self.workers = []
