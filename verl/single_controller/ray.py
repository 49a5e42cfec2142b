"""A worker group whose ranks each live in their own Ray actor process.

It runs the same worker classes as :class:`~verl.single_controller.local.LocalWorkerGroup`. Each rank
is hosted by a generic actor (:mod:`verl.single_controller.ray_host`) placed on the cluster's nodes by
:mod:`verl.single_controller.ray_placement`; the host builds the worker after exporting the
torch.distributed rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``), so a worker's ``__init__`` can call ``torch.distributed.init_process_group("gloo")`` and
meet its peers. Colocated groups (``colocate_with=``) share the hosts. Calls to one group are serialised
per host (a worker does one thing at a time); calls to different groups may run at the same time.

Every Ray failure is turned into a :class:`~verl.single_controller.errors.WorkerError` naming the
role, the rank, the method, the host's pid, its node and what Ray reported; a rank that stops answering
is found by the watchdog (:mod:`verl.single_controller.ray_watchdog`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
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
from verl.single_controller.ray_placement import (
    Hosts,
    local_ranks,
    node_alive,
    node_text,
    rank_list,
    ranks_text,
    short_id,
)
from verl.single_controller.ray_watchdog import Heartbeats, python_stack, silent_ranks

__all__ = ["RayWorkerGroup", "ensure_ray"]

_INIT = "__init__"
"""The method name a WorkerError carries when building a worker failed."""

_DIED = (RayActorError, WorkerCrashedError, NodeDiedError)
"""Ray errors meaning the process that ran the call is gone (ActorDiedError, ActorUnavailableError...)."""

_OOM = (OutOfMemoryError, ObjectStoreFullError)

logger = logging.getLogger(__name__)

# Groups are built one at a time in this driver. A worker's __init__ may block in a rendezvous while it
# holds a host's environment; building two colocated groups at once could interleave their MASTER_PORTs.
_BUILD_LOCK = threading.RLock()

_GROUPS: weakref.WeakSet[RayWorkerGroup] = weakref.WeakSet()
"""The live groups of this driver, to say which ranks a lost node held."""


def ensure_ray(**init_kwargs: Any) -> None:
    """Join the cluster named by ``RAY_ADDRESS``, else start a Ray instance of this machine's own, unless
    Ray is already initialised; ``init_kwargs`` override the defaults.

    ``RAY_ADDRESS`` is what ``ray job submit`` sets for its entrypoint; ``RAY_ADDRESS=auto`` joins the
    cluster ``ray start`` runs on this machine. Without it a new local instance starts even when such a
    cluster runs, so a run never lands on a cluster nobody named. The local defaults keep it quiet and
    quick to start: no dashboard, warnings only, but the workers' stdout and stderr still reach the
    driver's terminal (prefixed with the actor and pid).
    """
    if ray.is_initialized():
        return
    options: dict[str, Any] = {"log_to_driver": True, "logging_level": logging.WARNING}
    if not (init_kwargs.get("address") or os.environ.get("RAY_ADDRESS")):
        # A cluster's resources are its nodes'; these options are for a new instance only.
        options.update(address="local", num_cpus=os.cpu_count(), include_dashboard=False)
    options.update(init_kwargs)
    ray.init(**options)


# ---------------------------------------------------------------------------------- the driver side


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
    ``nnodes`` spreads the ranks over that many Ray nodes (see :class:`Hosts`); the rendezvous is led
    from rank 0's node, and ``LOCAL_RANK`` counts the ranks on each node.
    ``colocate_with=other`` puts rank r in the same process as rank r of ``other`` (and its devices, and
    its node). The watchdog (:mod:`~verl.single_controller.ray_watchdog`) ends a wait two ways, each
    reported as a ``WorkerError`` of kind ``"hung"`` with the rank's Python stack: a rank whose process
    answers no heartbeat for ``heartbeat_timeout_s``, and a rank without a result by the call's deadline,
    ``call_timeout_s`` (torch.distributed collectives in the workers time out after as long). None turns
    either off.

    After a failure the group may be left with a dead or stuck rank: call :meth:`restart`.
    """

    in_process = False

    failure_grace_s: float = 5.0
    """After one rank fails, how long to wait for the others before cancelling them. A peer blocked in a
    collective with the failed rank would otherwise hang the driver."""

    deadline_ping_s: float = 5.0
    """At the call's deadline, how long the ranks still out get to answer one last heartbeat."""

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
        nnodes: int = 1,
        call_timeout_s: float | None = None,
        heartbeat_timeout_s: float | None = None,
    ) -> None:
        super().__init__(worker_cls, world_size, init_kwargs, name)
        self.call_timeout_s = call_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        if call_timeout_s:  # a collective waits no longer than a call (verl/workers/engine/distributed.py)
            self._env.setdefault("VERL_COLLECTIVE_TIMEOUT_S", str(call_timeout_s))
        self._pids: dict[int, int] = {}
        self._nodes: dict[int, tuple[str, str]] = {}
        self._hosts: Hosts[RayWorkerGroup] | None = None
        self._calls = threading.local()  # per calling thread: what its last call's ranks reported
        ensure_ray()
        with _BUILD_LOCK:
            self._hosts = self._join_hosts(colocate_with, num_cpus_per_worker, num_gpus_per_worker, nnodes)
            _GROUPS.add(self)
            try:
                self._build()
            except BaseException:
                self.shutdown()
                raise

    def _join_hosts(
        self, colocate_with: RayWorkerGroup | None, num_cpus: float, num_gpus: float, nnodes: int
    ) -> Hosts[RayWorkerGroup]:
        """New hosts, or those of ``colocate_with`` after checking the two groups can share them."""
        if colocate_with is None:
            hosts = Hosts(self.world_size, num_cpus, num_gpus, nnodes)
        else:
            hosts = self._shared_hosts(colocate_with, num_cpus)
        hosts.groups.append(self)
        return hosts

    def _shared_hosts(self, other: RayWorkerGroup, num_cpus: float) -> Hosts[RayWorkerGroup]:
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
        self._nodes = self._gather(
            _INIT, {rank: actor.where.remote() for rank, actor in enumerate(hosts.actors)}
        )
        port = self._gather(_INIT, {0: hosts.actors[0].free_port.remote()})[0]
        rank_on_node, ranks_on_node = local_ranks(self._nodes)
        refs = {}
        for rank, actor in enumerate(hosts.actors):
            env = {
                **self._env,
                "MASTER_ADDR": self._nodes[0][1],  # rank 0 leads the rendezvous, on its node
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(rank_on_node[rank]),
                "LOCAL_WORLD_SIZE": str(ranks_on_node[rank]),
            }
            refs[rank] = actor.build.remote(
                self.name, self.worker_cls, self.init_kwargs, rank, self.world_size, env
            )
        self._pids = self._gather(_INIT, refs)
        if self.saved_state is not None:
            self._run_ranks("set_state", {r: ((self.state_for(r),), {}) for r in range(self.world_size)})

    def _live_hosts(self) -> Hosts[RayWorkerGroup]:
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
        self._calls.worker_s = None
        timed = self._gather(method, refs, failures)
        # the slowest rank's time in its worker; the rest of the call's wall time moved data (and waited)
        self._calls.worker_s = max(seconds for _, seconds in timed.values())
        return {rank: result for rank, (result, _) in timed.items()}

    def last_call_worker_s(self) -> float | None:
        """The seconds the slowest rank's worker ran this thread's last call (None when it failed)."""
        return getattr(self._calls, "worker_s", None)

    def _gather(
        self, method: str, refs: dict[int, Any], failures: dict[int, WorkerError] | None = None
    ) -> dict[int, Any]:
        """Wait for every call, heartbeating the ranks still out; after the first failure wait at most
        ``failure_grace_s`` for the rest.

        Raises the most telling failure: a rank whose process died (its peers' errors are usually
        symptoms of that), else the lowest failing rank.
        """
        failures = dict(failures or {})
        pending = {ref: rank for rank, ref in refs.items()}
        outputs: dict[int, Any] = {}
        started = time.monotonic()
        call_deadline = started + self.call_timeout_s if self.call_timeout_s else None
        grace_deadline = started + self.failure_grace_s if failures else None
        heartbeats = (
            Heartbeats(self._live_hosts().actors, self.heartbeat_timeout_s, started=self._pids)
            if self.heartbeat_timeout_s
            else None
        )
        while pending:
            due = [
                call_deadline,
                grace_deadline,
                heartbeats.next_due if heartbeats and not failures else None,
            ]
            timeout = max(0.0, min(d for d in due if d is not None) - time.monotonic()) if any(due) else None
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if ready:
                rank = pending.pop(ready[0])
                try:
                    outputs[rank] = ray.get(ready[0])
                except Exception as error:
                    failures[rank] = self._worker_error(rank, method, error)
                    if grace_deadline is None:
                        grace_deadline = time.monotonic() + self.failure_grace_s
                continue
            if failures:
                break  # the grace period (or the call's deadline) is over: the failure explains the ranks still out
            now = time.monotonic()
            past_deadline = call_deadline is not None and now >= call_deadline
            silent = heartbeats.beat(pending.values()) if heartbeats and not past_deadline else []
            if past_deadline or silent:
                hung = self._hung_error(method, sorted(pending.values()), now - started, silent)
                failures[hung.rank] = hung
                break
        _cancel(pending)
        if failures:
            # a dead process explains its peers' errors (the ranks blocked in a collective with it)
            raise min(failures.values(), key=lambda e: (e.kind == "exception", e.rank))
        return outputs

    def _hung_error(
        self, method: str, ranks: list[int], waited: float, silent: list[int] | None = None
    ) -> WorkerError:
        """The error for the ranks still out: with ``silent`` (the heartbeats found them) the first of those;
        else (the call's deadline) the first not answering one last heartbeat, or the lowest rank. Its peers
        are usually waiting for it in a collective."""
        if silent:
            state = (
                f"its process answered no heartbeat for {self.heartbeat_timeout_s:g} s "
                "(trainer.heartbeat_timeout_s): stopped, or stuck without releasing the GIL"
            )
            cause = f"{state}; the call has run {waited:.0f} s"
        else:
            silent = silent_ranks(self._live_hosts().actors, ranks, self.deadline_ping_s)
            state = (
                f"its process does not answer a heartbeat within {self.deadline_ping_s:g} s (stopped, or stuck "
                "without releasing the GIL)"
                if silent
                else "its process still answers, so the call itself does not end"
            )
            limit = (
                f"{self.call_timeout_s:g} s (trainer.worker_timeout_s)"
                if self.call_timeout_s
                else "the deadline"
            )
            cause = f"no result after {waited:.0f} s, the limit being {limit}; {state}"
        rank = min(silent) if silent else min(ranks)
        if len(ranks) > 1:
            cause += f"; ranks still out: {rank_list(ranks)}, not answering: {rank_list(silent)}"
        node, pid = self._nodes.get(rank), self._pids.get(rank)
        if node is not None and pid is not None:
            cause += f". Its Python stack (py-spy dump):\n{python_stack(node[0], pid)}"
        where = node_text(node) if node is not None else None
        return WorkerError(self.name, rank, method, cause, "hung", pid, where)

    def _worker_error(self, rank: int, method: str, error: BaseException, context: str = "") -> WorkerError:
        """Translate whatever a call raised into a WorkerError; the original is kept as ``__cause__``."""
        kind, cause, original = _classify(error)
        node = self._nodes.get(rank)
        if kind == "died" and node is not None and not node_alive(node[0]):
            cause += f"; {_node_loss(node)}"
        where = node_text(node) if node is not None else None
        worker_error = WorkerError(
            self.name, rank, method, context + cause, kind, self._pids.get(rank), where
        )
        worker_error.__cause__ = original
        return worker_error

    # ------------------------------------------------------------------ lifecycle

    def pids(self) -> list[int]:
        """The pid of each rank's host process (shared with colocated groups)."""
        return [self._pids[rank] for rank in range(self.world_size)]

    def nodes(self) -> list[tuple[str, str]]:
        """``(node id, node address)`` of the Ray node each rank runs on."""
        return [self._nodes[rank] for rank in range(self.world_size)]

    def describe_placement(self) -> str:
        """Which ranks run on which node, in which processes, e.g. ``ranks 0-1 on node 1a2b3c4d (10.0.0.5,
        pids 4242,4243)``."""
        by_node: dict[tuple[str, str], list[int]] = {}
        for rank, node in sorted(self._nodes.items()):
            by_node.setdefault(node, []).append(rank)
        return ", ".join(
            f"{ranks_text(ranks)} on node {short_id(node_id)} ({address}, "
            f"pid{'s' if len(ranks) > 1 else ''} {','.join(str(self._pids.get(r)) for r in ranks)})"
            for (node_id, address), ranks in by_node.items()
        )

    def restart(self) -> None:
        """Kill this group's host processes and build every worker again in fresh ones.

        The processes are shared with colocated groups, so those groups are rebuilt too (each with
        its ``saved_state`` restored): otherwise they would be left pointing at dead processes. Every
        group gets a new ``MASTER_PORT``, so the workers can form a new torch.distributed group.
        """
        with _BUILD_LOCK:
            hosts = self._live_hosts()
            hosts.kill()
            hosts.start(on_alive_nodes=True)
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
        _GROUPS.discard(self)
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


def _node_loss(node: tuple[str, str]) -> str:
    """What a lost node took with it: every live group's ranks that ran there."""
    lost = []
    for group in sorted(_GROUPS, key=lambda g: g.name):
        ranks = [rank for rank, where in sorted(group._nodes.items()) if where[0] == node[0]]
        if ranks:
            lost.append(f"{group.name} {ranks_text(ranks)}")
    return f"node {node_text(node)} left the cluster, taking " + (", ".join(lost) or "no other ranks")


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
