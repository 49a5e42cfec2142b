"""The process behind each rank of a :class:`~verl.single_controller.ray.RayWorkerGroup`: a Ray actor.

A host holds one worker per group, keyed by the group's name, so colocated groups (``colocate_with=``) share
processes: rank r of every group in a colocation set lives in host r. It builds each worker inside
:func:`~verl.single_controller.worker.worker_placement` after exporting the torch.distributed rendezvous
variables, runs that worker's calls one at a time on a thread of its own, and answers the driver's
heartbeats on another.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from verl.single_controller.worker import worker_placement

__all__ = ["HostActor", "WorkerHost"]


class WorkerHost:
    """One process of a colocation set: hosts rank r of every group in it, keyed by group name."""

    def __init__(self, driver_sys_path: list[str]) -> None:
        # Import what the driver can import, e.g. a test module pytest put on the driver's path only;
        # appended, so the host's own entries still win.
        sys.path.extend(path for path in driver_sys_path if path not in sys.path)
        self._workers: dict[str, Any] = {}
        # One thread per hosted worker, for the same reason as LocalWorkerGroup: torch work that hops
        # across a threaded actor's pool leaves an OpenMP team on every thread it touched, and past one
        # OpenMP thread per CPU every parallel op waits for its team to be woken.
        self._threads: dict[str, ThreadPoolExecutor] = {}
        self._owns_process_group: set[str] = set()

    def build(
        self, key: str, worker_cls: type, init_kwargs: dict[str, Any], rank: int, world_size: int, env: dict
    ) -> int:
        """Construct the worker of group ``key``; return this process's pid.

        The environment is set first and left in place, since libraries such as torch.distributed may
        read it later than ``__init__`` (e.g. in an ``init_model`` method).
        """
        self.drop(key)
        os.environ.update(env)
        had_process_group = process_group_initialized()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"verl-{key}")

        def construct() -> Any:
            with worker_placement(rank, world_size):
                return worker_cls(**init_kwargs)

        try:
            worker = thread.submit(construct).result()
        except BaseException:
            thread.shutdown(wait=False)
            raise
        if not had_process_group and process_group_initialized():
            self._owns_process_group.add(key)
        self._workers[key] = worker
        self._threads[key] = thread
        return os.getpid()

    def ping(self) -> bool:
        """The watchdog's heartbeat: answered by a free thread of this threaded actor while a call runs, so
        only a process that is stopped (or stuck without releasing the GIL) leaves it unanswered."""
        return True

    def where(self) -> tuple[str, str]:
        """``(node id, node address)`` of the node this process runs on."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A TCP port free right now on this node, for a torch.distributed rendezvous led from here."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def call(self, key: str, method: str, args: tuple, kwargs: dict) -> tuple[Any, float]:
        """Run one method of group ``key``'s worker, one call at a time per worker: (its result, the seconds
        it ran here, which the driver subtracts from the call's wall time to tell the data's travel)."""
        if key not in self._workers:
            raise RuntimeError(f"no worker of group {key!r} lives in this process (pid {os.getpid()})")
        start = time.perf_counter()
        result = self._threads[key].submit(getattr(self._workers[key], method), *args, **kwargs).result()
        return result, time.perf_counter() - start

    def drop(self, key: str) -> None:
        """Forget group ``key``'s worker (its group shut down while colocated groups live on).

        If that worker created the default torch.distributed process group, destroy it, so a worker
        built here later can create its own.
        """
        self._workers.pop(key, None)
        thread = self._threads.pop(key, None)
        if thread is not None:
            thread.shutdown(wait=False)
        if key in self._owns_process_group:
            self._owns_process_group.discard(key)
            if process_group_initialized():
                sys.modules["torch.distributed"].destroy_process_group()


def process_group_initialized() -> bool:
    """Whether this process has a default torch.distributed process group (without importing torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


HostActor = ray.remote(WorkerHost)
"""The Ray actor class of a host."""
