"""Where a Ray worker group's ranks run: its host actors, spread over the cluster's nodes, and what the
driver knows of those nodes (alive, answering, what they hold).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Any, Generic, TypeVar

import ray

from verl.errors import ClusterError
from verl.single_controller.ray_host import HostActor

Group = TypeVar("Group")
"""the worker groups sharing one set of hosts: ``verl.single_controller.ray.RayWorkerGroup``, which builds on
this module (placement knows nothing of a group but that it is one)"""

logger = logging.getLogger(__name__)


class Hosts(Generic[Group]):
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
        self.groups: list[Group] = []  # the member groups, the creator first
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
        if on_alive_nodes and not spread:
            # Ray lists a lost node for a while yet (until its health checks time out) and may place the new
            # hosts there, where they die before they run: wait until it agrees (`_spread` waits the same way)
            settled_alive_nodes(self.placement_timeout_s)
        strategies = self._spread(on_alive_nodes) if spread else [None] * self.world_size
        self.actors = [
            HostActor.options(**options, **({"scheduling_strategy": s} if s else {})).remote(sys_path)
            for s in strategies
        ]

    def _spread(self, on_alive_nodes: bool) -> list[Any]:
        """Reserve one bundle per node and return each rank's scheduling strategy (its node's bundle)."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        nodes = wanted = min(self.nnodes, self.world_size)
        alive = settled_alive_nodes(self.placement_timeout_s) if on_alive_nodes else alive_nodes()
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
                f"{describe_nodes(alive_nodes())}. Start more nodes (ray start --address=<head address>) or "
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


def local_ranks(nodes: dict[int, tuple[str, str]]) -> tuple[dict[int, int], dict[int, int]]:
    """Each rank's index among the ranks on its node (``LOCAL_RANK``), and how many share its node."""
    local: dict[int, int] = {}
    counts: dict[str, int] = {}
    for rank, (node_id, _) in sorted(nodes.items()):
        local[rank] = counts.get(node_id, 0)
        counts[node_id] = local[rank] + 1
    return local, {rank: counts[node_id] for rank, (node_id, _) in nodes.items()}


def short_id(node_id: str) -> str:
    """The first 8 hex digits of a node id, as ``ray status`` and the dashboard abbreviate it."""
    return node_id[:8]


def node_text(node: tuple[str, str]) -> str:
    """``1a2b3c4d at 10.0.0.5`` for a ``(node id, address)`` pair, as errors name a rank's node."""
    return f"{short_id(node[0])} at {node[1]}"


def ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {rank_list(ranks)}"


def rank_list(ranks: list[int]) -> str:
    """``0-2`` for a run of ranks, ``0,2,5`` otherwise, ``none`` for none."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks)) or "none"


def alive_nodes() -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def node_alive(node_id: str) -> bool:
    """Whether the cluster still has the node and its raylet answers."""
    try:
        return any(node["NodeID"] == node_id and raylet_answers(node) for node in alive_nodes())
    except Exception:  # the cluster cannot be asked (Ray shutting down): do not claim a node loss
        return True


def raylet_answers(node: dict[str, Any], timeout: float = 2.0) -> bool:
    """Whether the node's raylet accepts a connection. Ray's own verdict comes later: it marks a node dead
    after several missed health checks (15 s and more by default), while its processes' deaths are
    reported at once."""
    try:
        with socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout=timeout):
            return True
    except (OSError, KeyError):
        return False


def settled_alive_nodes(timeout: float) -> list[dict[str, Any]]:
    """The alive nodes once Ray agrees with what answers: a node whose raylet is gone is waited on until
    Ray marks it dead (placing workers on it would fail), at most ``timeout`` seconds, then left out."""
    deadline = time.monotonic() + timeout
    while True:
        alive = alive_nodes()
        answering = [node for node in alive if raylet_answers(node)]
        if len(answering) == len(alive) or time.monotonic() > deadline:
            return answering
        time.sleep(1.0)


def describe_nodes(nodes: list[dict[str, Any]]) -> str:
    if not nodes:
        return "none"
    return "; ".join(
        f"{short_id(node['NodeID'])} at {node.get('NodeManagerAddress', '?')} with "
        + ", ".join(
            f"{name} {amount:g}"
            for name, amount in sorted(node.get("Resources", {}).items())
            if name in ("CPU", "GPU")
        )  # fmt: skip
        for node in nodes
    )
