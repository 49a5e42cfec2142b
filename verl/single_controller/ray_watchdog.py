"""The watchdog of a Ray worker group's calls: heartbeats while a call runs, and the stack of a rank that
stopped.

Two things end a wait that would otherwise last forever. A rank whose process stops answering heartbeats
for ``heartbeat_timeout_s`` (``trainer.heartbeat_timeout_s``: stopped, swapped out, or stuck in native code
that holds the GIL) is reported as soon as that is seen; a call with no result by its deadline
(``trainer.worker_timeout_s``) is reported whatever its process does. Either report names the role, rank,
pid and node, and carries the rank's Python stack as ``py-spy dump`` reads it on its node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import ray

from verl.single_controller.errors import describe_error

__all__ = ["Heartbeats", "python_stack", "silent_ranks"]


class Heartbeats:
    """Pings the hosts of the ranks still out, every ``interval_s``, one ping in flight per rank.

    A rank is *silent* once a ping to it has gone unanswered for ``timeout_s``. Only a rank known to be up
    (in ``started``: its worker was built) or that has answered once can be silent: a host still starting
    (importing torch on a loaded machine) is left to the call's deadline. A host answers from a free thread of its threaded actor while its worker computes, so
    a slow call is never silent; a stopped process is.
    """

    def __init__(self, actors: list[Any], timeout_s: float, started: Iterable[int] = ()) -> None:
        self.timeout_s = timeout_s
        self.interval_s = min(10.0, timeout_s / 3)
        self.next_due = time.monotonic() + self.interval_s
        self._actors = actors
        self._in_flight: dict[Any, tuple[int, float]] = {}  # ping -> (rank, sent at)
        self._answered: set[int] = set(started)

    def beat(self, ranks: Iterable[int]) -> list[int]:
        """Collect the answers, ping every rank in ``ranks`` without a ping in flight; the silent ranks."""
        now = time.monotonic()
        if self._in_flight:
            answered, _ = ray.wait(list(self._in_flight), num_returns=len(self._in_flight), timeout=0)
            for ping in answered:
                self._answered.add(self._in_flight.pop(ping)[0])
        waiting = {rank for rank, _ in self._in_flight.values()}
        for rank in ranks:
            if rank not in waiting:
                self._in_flight[self._actors[rank].ping.remote()] = (rank, now)
        self.next_due = now + self.interval_s
        return sorted(
            rank
            for rank, sent in self._in_flight.values()
            if rank in self._answered and now - sent >= self.timeout_s
        )


def silent_ranks(actors: list[Any], ranks: list[int], timeout_s: float) -> list[int]:
    """Ping ``ranks`` once and wait ``timeout_s`` for the answers: the ranks that gave none."""
    pings = {actors[rank].ping.remote(): rank for rank in ranks}
    answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
    return sorted(rank for ref, rank in pings.items() if ref not in answered)


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


def python_stack(node_id: str, pid: int, timeout: float = 45.0) -> str:
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
