"""A worker group whose ranks each live in their own Ray actor process.

It runs the same worker classes as :class:`~verl.single_controller.local.LocalWorkerGroup`. Each rank
is hosted by a generic actor, :class:`_WorkerHost`, which builds the worker inside
:func:`~verl.single_controller.worker.worker_placement` after exporting the torch.distributed
rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), so a
worker's ``__init__`` can call ``torch.distributed.init_process_group("gloo")`` and meet its peers.

A host holds one worker per group, keyed by the group's name, so colocated groups
(``colocate_with=``) share processes: rank r of every group in a colocation set lives in host r. Calls
to one group are serialised per host (a worker does one thing at a time); calls to different groups
may run at the same time (the host is a threaded actor).

Every Ray failure is turned into a :class:`~verl.single_controller.errors.WorkerError` naming the
role, the rank, the method, the host's pid and what Ray reported.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import (
    NodeDiedError,
    ObjectStoreFullError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from verl.single_controller.base import WorkerGroup
from verl.single_controller.errors import WorkerError, describe_error
from verl.single_controller.worker import worker_placement

__all__ = ["RayWorkerGroup", "ensure_ray"]

_INIT = "__init__"
"""The method name a WorkerError carries when building a worker failed."""

_DIED = (RayActorError, WorkerCrashedError, NodeDiedError)
"""Ray errors meaning the process that ran the call is gone (ActorDiedError, ActorUnavailableError...)."""

_OOM = (OutOfMemoryError, ObjectStoreFullError)

# Groups are built one at a time in this driver. A worker's __init__ may block in a rendezvous while it
# holds a host's environment; building two colocated groups at once could interleave their MASTER_PORTs.
_BUILD_LOCK = threading.RLock()


def ensure_ray(**init_kwargs: Any) -> None:
    """Start a local Ray instance unless one is running; ``init_kwargs`` override the defaults.

    The defaults keep it quiet and quick to start: no dashboard, warnings only, but the workers' stdout
    and stderr still reach the driver's terminal (prefixed with the actor and pid).
    """
    if ray.is_initialized():
        return
    options: dict[str, Any] = {
        "num_cpus": os.cpu_count(),
        "include_dashboard": False,
        "log_to_driver": True,
        "logging_level": logging.WARNING,
    }
    options.update(init_kwargs)
    ray.init(**options)


# ---------------------------------------------------------------------------------- the actor side


class _WorkerHost:
    """One process of a colocation set: hosts rank r of every group in it, keyed by group name."""

    def __init__(self, driver_sys_path: list[str]) -> None:
        # Import what the driver can import, e.g. a test module pytest put on the driver's path only;
        # appended, so the host's own entries still win.
        sys.path.extend(path for path in driver_sys_path if path not in sys.path)
        self._workers: dict[str, Any] = {}
        # One thread per hosted worker, for the same reason as LocalWorkerGroup: torch work that hops
        # across a threaded actor's pool leaves an OpenMP team spin-waiting on every thread it touched.
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
        had_process_group = _process_group_initialized()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"verl-{key}")

        def construct() -> Any:
            with worker_placement(rank, world_size):
                return worker_cls(**init_kwargs)

        try:
            worker = thread.submit(construct).result()
        except BaseException:
            thread.shutdown(wait=False)
            raise
        if not had_process_group and _process_group_initialized():
            self._owns_process_group.add(key)
        self._workers[key] = worker
        self._threads[key] = thread
        return os.getpid()

    def call(self, key: str, method: str, args: tuple, kwargs: dict) -> Any:
        """Run one method of group ``key``'s worker, one call at a time per worker."""
        if key not in self._workers:
            raise RuntimeError(f"no worker of group {key!r} lives in this process (pid {os.getpid()})")
        return self._threads[key].submit(getattr(self._workers[key], method), *args, **kwargs).result()

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
            if _process_group_initialized():
                sys.modules["torch.distributed"].destroy_process_group()


def _process_group_initialized() -> bool:
    """Whether this process has a default torch.distributed process group (without importing torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


_HostActor = ray.remote(_WorkerHost)


# ---------------------------------------------------------------------------------- the driver side


class _Hosts:
    """The host processes of one colocation set: one actor per rank, shared by the member groups."""

    def __init__(self, world_size: int, num_cpus: float, num_gpus: float = 0) -> None:
        self.world_size = world_size
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.groups: list[RayWorkerGroup] = []
        self.actors: list[Any] = []
        self.start()

    def start(self) -> None:
        """Create one actor per rank; Ray starts the processes in the background."""
        # max_concurrency > 1 makes the host a threaded actor, so colocated groups can run at once.
        # With num_gpus Ray gives each host its own device(s) and sets CUDA_VISIBLE_DEVICES accordingly.
        options = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_concurrency": 8,
            "max_restarts": 0,
        }
        sys_path = [os.path.abspath(path) for path in sys.path]
        self.actors = [_HostActor.options(**options).remote(sys_path) for _ in range(self.world_size)]

    def kill(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or Ray is shutting down: nothing left to release
                pass
        self.actors = []


class RayWorkerGroup(WorkerGroup):
    """``world_size`` instances of ``worker_cls``, each in its own Ray actor process.

    ``num_cpus_per_worker`` is the number of *logical* Ray CPUs each host reserves. It defaults to 0
    because an RL job holds several roles (actor, rollout, reference, critic, reward) that mostly wait
    on each other: reserving a core each, a 2-core laptop could host only two workers and Ray would
    leave the others pending forever. Ray also sets ``OMP_NUM_THREADS`` to that number (at least 1)
    before the host imports torch, so torch runs single-threaded in a worker by default: raise
    ``num_cpus_per_worker`` or call ``torch.set_num_threads`` in ``__init__`` (``env`` comes too late
    for that). ``num_gpus_per_worker`` GPUs are reserved per host (Ray then sets its
    ``CUDA_VISIBLE_DEVICES``). ``env`` is exported in each host before the worker is built.
    ``colocate_with=other`` puts rank r in the same process as rank r of ``other`` (and its devices).

    After a failure the group may be left with a dead or stuck rank: call :meth:`restart`.
    """

    in_process = False

    failure_grace_s: float = 5.0
    """After one rank fails, how long to wait for the others before cancelling them. A peer blocked in a
    collective with the failed rank would otherwise hang the driver."""

    def __init__(
        self,
        worker_cls: type,
        world_size: int = 1,
        init_kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        *,
        num_cpus_per_worker: float = 0,
        num_gpus_per_worker: float = 0,
        env: dict[str, str] | None = None,
        colocate_with: RayWorkerGroup | None = None,
    ) -> None:
        super().__init__(worker_cls, world_size, init_kwargs, name)
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        self._pids: dict[int, int] = {}
        self._hosts: _Hosts | None = None
        ensure_ray()
        with _BUILD_LOCK:
            self._hosts = self._join_hosts(colocate_with, num_cpus_per_worker, num_gpus_per_worker)
            try:
                self._build()
            except BaseException:
                self.shutdown()
                raise

    def _join_hosts(self, colocate_with: RayWorkerGroup | None, num_cpus: float, num_gpus: float) -> _Hosts:
        """New hosts, or those of ``colocate_with`` after checking the two groups can share them."""
        if colocate_with is None:
            hosts = _Hosts(self.world_size, num_cpus, num_gpus)
        else:
            hosts = self._shared_hosts(colocate_with, num_cpus)
        hosts.groups.append(self)
        return hosts

    def _shared_hosts(self, other: RayWorkerGroup, num_cpus: float) -> _Hosts:
        if not isinstance(other, RayWorkerGroup):
            raise TypeError(f"colocate_with must be a RayWorkerGroup, got {type(other).__name__}")
        if other._hosts is None:
            raise ValueError(f"cannot colocate {self.name!r} with {other.name!r}: that group was shut down")
        if other.world_size != self.world_size:
            raise ValueError(
                f"cannot colocate {self.name!r} (world_size={self.world_size}) with {other.name!r} "
                f"(world_size={other.world_size}): rank r goes into rank r's process, so the sizes must match"
            )
        taken = [group.name for group in other._hosts.groups]
        if self.name in taken:
            raise ValueError(
                f"cannot colocate a second group named {self.name!r} with {other.name!r}: the processes "
                f"key their workers by group name (taken: {taken}); pass name=..."
            )
        if num_cpus and num_cpus != other._hosts.num_cpus:
            raise ValueError(
                f"{self.name!r} asks for num_cpus_per_worker={num_cpus} but shares the processes of "
                f"{other.name!r}, which hold {other._hosts.num_cpus}; set it on the group that creates them"
            )
        return other._hosts

    # ------------------------------------------------------------------ building workers

    def _build(self) -> None:
        """Build every rank's worker at once (their __init__ may wait for each other), then restore state."""
        hosts = self._live_hosts()
        self._pids = {}
        port = _free_port()
        refs = {}
        for rank, actor in enumerate(hosts.actors):
            env = {
                **self._env,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(rank),  # one node: the local rank is the rank
            }
            refs[rank] = actor.build.remote(
                self.name, self.worker_cls, self.init_kwargs, rank, self.world_size, env
            )
        self._pids = self._gather(_INIT, refs)
        if self.saved_state is not None:
            self._run_ranks("set_state", {r: ((self.state_for(r),), {}) for r in range(self.world_size)})

    def _live_hosts(self) -> _Hosts:
        if self._hosts is None:
            raise RuntimeError(f"{self!r} was shut down; create a new group")
        return self._hosts

    # ------------------------------------------------------------------ calls

    def _run_ranks(self, method: str, calls: dict[int, tuple[tuple, dict]]) -> dict[int, Any]:
        """Submit every rank's call, then wait for all of them (the ranks run in parallel)."""
        actors = self._live_hosts().actors
        refs: dict[int, Any] = {}
        failures: dict[int, WorkerError] = {}
        for rank, (args, kwargs) in sorted(calls.items()):
            try:
                refs[rank] = actors[rank].call.remote(self.name, method, args, kwargs)
            except Exception as error:  # e.g. an argument Ray cannot serialise: the call never left
                failures[rank] = self._worker_error(rank, method, error, context="could not send the call: ")
                break
        return self._gather(method, refs, failures)

    def _gather(
        self, method: str, refs: dict[int, Any], failures: dict[int, WorkerError] | None = None
    ) -> dict[int, Any]:
        """Wait for every call; after the first failure wait at most ``failure_grace_s`` for the rest.

        Raises the most telling failure: a rank whose process died (its peers' errors are usually
        symptoms of that), else the lowest failing rank.
        """
        failures = dict(failures or {})
        pending = {ref: rank for rank, ref in refs.items()}
        outputs: dict[int, Any] = {}
        deadline = time.monotonic() + self.failure_grace_s if failures else None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                break  # the grace period is over
            rank = pending.pop(ready[0])
            try:
                outputs[rank] = ray.get(ready[0])
            except Exception as error:
                failures[rank] = self._worker_error(rank, method, error)
                if deadline is None:
                    deadline = time.monotonic() + self.failure_grace_s
        _cancel(pending)
        if failures:
            raise min(failures.values(), key=lambda e: (e.kind == "exception", e.rank))
        return outputs

    def _worker_error(self, rank: int, method: str, error: BaseException, context: str = "") -> WorkerError:
        """Translate whatever a call raised into a WorkerError; the original is kept as ``__cause__``."""
        kind, cause, original = _classify(error)
        worker_error = WorkerError(self.name, rank, method, context + cause, kind, self._pids.get(rank))
        worker_error.__cause__ = original
        return worker_error

    # ------------------------------------------------------------------ lifecycle

    def pids(self) -> list[int]:
        """The pid of each rank's host process (shared with colocated groups)."""
        return [self._pids[rank] for rank in range(self.world_size)]

    def restart(self) -> None:
        """Kill this group's host processes and build every worker again in fresh ones.

        The processes are shared with colocated groups, so those groups are rebuilt too (each with
        its ``saved_state`` restored): otherwise they would be left pointing at dead processes. Every
        group gets a new ``MASTER_PORT``, so the workers can form a new torch.distributed group.
        """
        with _BUILD_LOCK:
            hosts = self._live_hosts()
            hosts.kill()
            hosts.start()
            failures = []
            for group in list(hosts.groups):  # one group failing to build must not strand the others
                try:
                    group._build()
                except WorkerError as error:
                    failures.append(error)
            if failures:
                raise failures[0]

    def shutdown(self) -> None:
        """Release this group's workers; the processes end with the last group that uses them."""
        hosts, self._hosts = self._hosts, None
        if hosts is None or self not in hosts.groups:
            return
        hosts.groups.remove(self)
        if not hosts.groups:
            hosts.kill()
            return
        try:
            ray.get([actor.drop.remote(self.name) for actor in hosts.actors])
        except Exception:  # a dead host holds nothing to release
            pass


# ---------------------------------------------------------------------------------- helpers


def _free_port() -> int:
    """A TCP port free right now on this machine, for one group's torch.distributed rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cancel(refs: Any) -> None:
    """Best-effort cancel of calls nobody will wait for (a running call on a threaded actor keeps running)."""
    for ref in refs:
        try:
            ray.cancel(ref)
        except Exception:
            pass


def _classify(error: BaseException) -> tuple[str, str, BaseException]:
    """``(kind, one-line cause, exception to chain)`` for an error raised by ``ray.get``."""
    if isinstance(error, RayTaskError):
        # The method raised. Ray re-raises it as a class deriving from both RayTaskError and the
        # original type (so ``isinstance(error, KeyError)`` holds) whose message has the remote
        # traceback; chain that one when it has the original's type, else the original itself.
        original = error.cause if isinstance(error.cause, BaseException) else error
        chained = error if isinstance(error, type(original)) else original
        kind = "oom" if _is_oom(original) else "exception"
        return kind, describe_error(original), chained
    if isinstance(error, _OOM):
        return "oom", describe_error(error), error
    if isinstance(error, _DIED):
        if getattr(error, "actor_init_failed", False):  # the host never started: the first line says why
            return "died", describe_error(error), error
        cause = _death_cause(error)
        return ("oom" if _mentions_oom(cause) else "died"), cause, error
    return "exception", describe_error(error), error


def _death_cause(error: BaseException) -> str:
    """Ray's account of a death on one line: its reason and exit detail, without the generic headline
    ("The actor died unexpectedly..."), the actor ids (tab-indented lines) and the list of usual causes."""
    lines = [line for line in str(error).strip().splitlines() if line and not line.startswith("\t")]
    text = " ".join(line.strip() for line in lines[1:] or lines)
    text = text.split(" Some common causes", 1)[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _mentions_oom(cause: str) -> bool:
    lowered = cause.lower()
    return "out of memory" in lowered or "outofmemory" in lowered or "low on memory" in lowered


def _is_oom(error: BaseException) -> bool:
    """MemoryError, or torch's (CUDA) OutOfMemoryError when torch is loaded in this process."""
    torch = sys.modules.get("torch")
    return isinstance(error, MemoryError) or (torch is not None and isinstance(error, torch.OutOfMemoryError))
