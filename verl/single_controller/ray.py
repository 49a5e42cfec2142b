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
import shutil
import socket
import subprocess
import sys
import threading
import time
import weakref
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

from verl.errors import ClusterError
from verl.single_controller.base import WorkerGroup
from verl.single_controller.errors import WorkerError, describe_error
from verl.single_controller.worker import worker_placement

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
    """The host processes of one colocation set: one actor per rank, shared by the member groups.

    With ``nnodes > 1`` the ranks are spread over that many Ray nodes: a placement group with one bundle
    per node (``STRICT_SPREAD``, so no two bundles share a node) holds ranks ``[k * per_node, (k + 1) *
    per_node)`` in bundle k, as verl's resource pools give each node ``n_gpus_per_node`` ranks. After a
    node is lost, a restart spreads them over the nodes still alive.
    """

    placement_timeout_s: float = 120.0
    """How long to wait for the cluster to hold the placement group before naming what is missing."""

    def __init__(self, world_size: int, num_cpus: float, num_gpus: float = 0, nnodes: int = 1) -> None:
        self.world_size = world_size
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.nnodes = nnodes
        self.groups: list[RayWorkerGroup] = []
        self.actors: list[Any] = []
        self.placement_group: Any = None
        self.start()

    def start(self, on_alive_nodes: bool = False) -> None:
        """Create one actor per rank; Ray starts the processes in the background.

        ``on_alive_nodes``: after a failure, spread over as many of the nodes asked for as are alive
        instead of waiting for all of them.
        """
        # max_concurrency > 1 makes the host a threaded actor, so colocated groups can run at once.
        # With num_gpus Ray gives each host its own device(s) and sets CUDA_VISIBLE_DEVICES accordingly.
        options = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_concurrency": 8,
            "max_restarts": 0,
        }
        sys_path = [os.path.abspath(path) for path in sys.path]
        spread = min(self.nnodes, self.world_size) > 1
        strategies = self._spread(on_alive_nodes) if spread else [None] * self.world_size
        self.actors = [
            _HostActor.options(**options, **({"scheduling_strategy": s} if s else {})).remote(sys_path)
            for s in strategies
        ]

    def _spread(self, on_alive_nodes: bool) -> list[Any]:
        """Reserve one bundle per node and return each rank's scheduling strategy (its node's bundle)."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes = wanted = min(self.nnodes, self.world_size)
        alive = _settled_alive_nodes(self.placement_timeout_s) if on_alive_nodes else _alive_nodes()
        if on_alive_nodes and len(alive) < wanted:
            nodes = max(1, len(alive))
            logger.warning(
                "%d of the %d nodes asked for are alive: placing the %d ranks on %d node(s)",
                len(alive), wanted, self.world_size, nodes,
            )  # fmt: skip
        per_node = -(-self.world_size // nodes)
        bundle = {"CPU": self.num_cpus * per_node, "GPU": self.num_gpus * per_node}
        # A bundle must hold something; hosts that reserve nothing take none of this.
        bundle = {name: amount for name, amount in bundle.items() if amount} or {"CPU": 0.01}
        group = placement_group([dict(bundle) for _ in range(nodes)], strategy="STRICT_SPREAD")
        ready, _ = ray.wait([group.ready()], timeout=self.placement_timeout_s)
        if not ready:
            remove_placement_group(group)
            raise ClusterError(
                f"the Ray cluster cannot place {self.world_size} worker(s) on {nodes} different nodes ({per_node} "
                f"per node, reserving {bundle} on each) within {self.placement_timeout_s:g} s; alive nodes: "
                f"{_describe_nodes(_alive_nodes())}. Start more nodes (ray start --address=<head address>) or "
                "lower trainer.nnodes"
            )
        self.placement_group = group
        return [
            PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank // per_node)
            for rank in range(self.world_size)
        ]

    def kill(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone, or Ray is shutting down: nothing left to release
                pass
        self.actors = []
        group, self.placement_group = self.placement_group, None
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(group)
            except Exception:  # Ray is shutting down: the reservation goes with it
                pass


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
    ``nnodes`` spreads the ranks over that many Ray nodes (see :class:`_Hosts`); the rendezvous is led
    from rank 0's node, and ``LOCAL_RANK`` counts the ranks on each node.
    ``colocate_with=other`` puts rank r in the same process as rank r of ``other`` (and its devices, and
    its node). ``call_timeout_s`` is the watchdog's deadline for every call: a rank without a result by
    then is reported as hung (``WorkerError`` kind ``"hung"``) with whether its process still answers a
    heartbeat and its Python stack; torch.distributed collectives in the workers time out after as long.

    After a failure the group may be left with a dead or stuck rank: call :meth:`restart`.
    """

    in_process = False

    failure_grace_s: float = 5.0
    """After one rank fails, how long to wait for the others before cancelling them. A peer blocked in a
    collective with the failed rank would otherwise hang the driver."""

    heartbeat_timeout_s: float = 5.0
    """How long a stuck rank's process gets to answer a heartbeat before it is called unresponsive."""

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
    ) -> None:
        super().__init__(worker_cls, world_size, init_kwargs, name)
        self.call_timeout_s = call_timeout_s
        self._env = {str(k): str(v) for k, v in (env or {}).items()}
        if (
            call_timeout_s
        ):  # a collective waits no longer than a call may take (verl/workers/engine/distributed.py)
            self._env.setdefault("VERL_COLLECTIVE_TIMEOUT_S", str(call_timeout_s))
        self._pids: dict[int, int] = {}
        self._nodes: dict[int, tuple[str, str]] = {}
        self._hosts: _Hosts | None = None
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
    ) -> _Hosts:
        """New hosts, or those of ``colocate_with`` after checking the two groups can share them."""
        if colocate_with is None:
            hosts = _Hosts(self.world_size, num_cpus, num_gpus, nnodes)
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
        self._nodes = self._gather(
            _INIT, {rank: actor.where.remote() for rank, actor in enumerate(hosts.actors)}
        )
        port = self._gather(_INIT, {0: hosts.actors[0].free_port.remote()})[0]
        local_ranks, local_sizes = _local_ranks(self._nodes)
        refs = {}
        for rank, actor in enumerate(hosts.actors):
            env = {
                **self._env,
                "MASTER_ADDR": self._nodes[0][1],  # rank 0 leads the rendezvous, on its node
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(local_ranks[rank]),
                "LOCAL_WORLD_SIZE": str(local_sizes[rank]),
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
        started = time.monotonic()
        call_deadline = started + self.call_timeout_s if self.call_timeout_s else None
        grace_deadline = started + self.failure_grace_s if failures else None
        while pending:
            deadlines = [d for d in (call_deadline, grace_deadline) if d is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                # the call's deadline passed with no rank failed: say which is stuck, and how
                if not failures:
                    stuck = self._stuck_error(method, sorted(pending.values()), time.monotonic() - started)
                    failures[stuck.rank] = stuck
                break  # else the grace period is over, and the failure explains the ranks still out
            rank = pending.pop(ready[0])
            try:
                outputs[rank] = ray.get(ready[0])
            except Exception as error:
                failures[rank] = self._worker_error(rank, method, error)
                if grace_deadline is None:
                    grace_deadline = time.monotonic() + self.failure_grace_s
        _cancel(pending)
        if failures:
            # a dead process explains its peers' errors (the ranks blocked in a collective with it)
            raise min(failures.values(), key=lambda e: (e.kind == "exception", e.rank))
        return outputs

    def _stuck_error(self, method: str, ranks: list[int], waited: float) -> WorkerError:
        """The ranks still out at the call's deadline: heartbeat each; name the first that does not answer
        (its peers are usually waiting for it in a collective), else the lowest, with its Python stack."""
        actors = self._live_hosts().actors
        pings = {actors[rank].ping.remote(): rank for rank in ranks}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=self.heartbeat_timeout_s)
        silent = [rank for ref, rank in pings.items() if ref not in answered]
        rank = min(silent) if silent else min(ranks)
        node, pid = self._nodes.get(rank), self._pids.get(rank)
        state = (
            f"its process does not answer a heartbeat within {self.heartbeat_timeout_s:g} s (stopped, or stuck "
            "without releasing the GIL)"
            if silent
            else "its process still answers, so the call itself does not end"
        )
        if len(ranks) > 1:
            state += f"; ranks still out: {_rank_list(ranks)}, not answering: {_rank_list(silent)}"
        limit = (
            f"{self.call_timeout_s:g} s (trainer.worker_timeout_s)" if self.call_timeout_s else "the deadline"
        )
        cause = f"no result after {waited:.0f} s, the limit being {limit}; {state}"
        if node is not None and pid is not None:
            cause += f". Its Python stack (py-spy dump):\n{_python_stack(node[0], pid)}"
        where = f"{_short(node[0])} at {node[1]}" if node is not None else None
        return WorkerError(self.name, rank, method, cause, "hung", pid, where)

    def _worker_error(self, rank: int, method: str, error: BaseException, context: str = "") -> WorkerError:
        """Translate whatever a call raised into a WorkerError; the original is kept as ``__cause__``."""
        kind, cause, original = _classify(error)
        node = self._nodes.get(rank)
        if kind == "died" and node is not None and not _node_alive(node[0]):
            cause += f"; {_node_loss(node)}"
        where = f"{_short(node[0])} at {node[1]}" if node is not None else None
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
            f"{_ranks_text(ranks)} on node {_short(node_id)} ({address}, "
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


@ray.remote(num_cpus=0)
def _py_spy_dump(pid: int) -> str:
    """``py-spy dump`` of a process on this node; it reads the memory of a stopped process too."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        return "(py-spy is not installed on that node: pip install py-spy, or ray[default])"
    out = subprocess.run(
        [exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True, timeout=30
    )
    return (out.stdout or out.stderr).strip()


def _python_stack(node_id: str, pid: int, timeout: float = 45.0) -> str:
    """The stack of process ``pid`` on node ``node_id``, read by py-spy run there; the threads running verl's
    workers (named ``verl-<group>``) when it names them, every thread otherwise."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        ref = _py_spy_dump.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(pid)
        dump = ray.get(ref, timeout=timeout)
    except Exception as error:  # the node is gone, or py-spy could not run: say so instead of a stack
        return f"(could not read it: {describe_error(error)})"
    blocks: list[list[str]] = [[]]
    for line in dump.splitlines():
        if line.startswith("Thread "):
            blocks.append([])
        blocks[-1].append(line)
    ours = ["\n".join(block).strip() for block in blocks[1:] if '"verl-' in block[0]]
    return "\n".join(ours) if ours else dump


def _local_ranks(nodes: dict[int, tuple[str, str]]) -> tuple[dict[int, int], dict[int, int]]:
    """Each rank's index among the ranks on its node (``LOCAL_RANK``), and how many share its node."""
    local: dict[int, int] = {}
    counts: dict[str, int] = {}
    for rank, (node_id, _) in sorted(nodes.items()):
        local[rank] = counts.get(node_id, 0)
        counts[node_id] = local[rank] + 1
    return local, {rank: counts[node_id] for rank, (node_id, _) in nodes.items()}


def _short(node_id: str) -> str:
    """The first 8 hex digits of a node id, as ``ray status`` and the dashboard abbreviate it."""
    return node_id[:8]


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {_rank_list(ranks)}"


def _rank_list(ranks: list[int]) -> str:
    """``0-2`` for a run of ranks, ``0,2,5`` otherwise, ``none`` for none."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks)) or "none"


def _alive_nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def _node_alive(node_id: str) -> bool:
    """Whether the cluster still has the node and its raylet answers."""
    try:
        return any(node["NodeID"] == node_id and _raylet_answers(node) for node in _alive_nodes())
    except Exception:  # the cluster cannot be asked (Ray shutting down): do not claim a node loss
        return True


def _raylet_answers(node: dict[str, Any], timeout: float = 2.0) -> bool:
    """Whether the node's raylet accepts a connection. Ray's own verdict comes later: it marks a node dead
    after several missed health checks (15 s and more by default), while its processes' deaths are
    reported at once."""
    try:
        with socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout=timeout):
            return True
    except (OSError, KeyError):
        return False


def _settled_alive_nodes(timeout: float) -> list[dict[str, Any]]:
    """The alive nodes once Ray agrees with what answers: a node whose raylet is gone is waited on until
    Ray marks it dead (placing workers on it would fail), at most ``timeout`` seconds, then left out."""
    deadline = time.monotonic() + timeout
    while True:
        alive = _alive_nodes()
        answering = [node for node in alive if _raylet_answers(node)]
        if len(answering) == len(alive) or time.monotonic() > deadline:
            return answering
        time.sleep(1.0)


def _describe_nodes(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "none"
    return "; ".join(
        f"{_short(node['NodeID'])} at {node.get('NodeManagerAddress', '?')} with "
        + ", ".join(
            f"{name} {amount:g}"
            for name, amount in sorted(node.get("Resources", {}).items())
            if name in ("CPU", "GPU")
        )  # fmt: skip
        for node in nodes
    )


def _node_loss(node: tuple[str, str]) -> str:
    """What a lost node took with it: every live group's ranks that ran there."""
    lost = []
    for group in sorted(_GROUPS, key=lambda g: g.name):
        ranks = [rank for rank, where in sorted(group._nodes.items()) if where[0] == node[0]]
        if ranks:
            lost.append(f"{group.name} {_ranks_text(ranks)}")
    return f"node {_short(node[0])} at {node[1]} left the cluster, taking " + (
        ", ".join(lost) or "no other ranks"
    )


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
