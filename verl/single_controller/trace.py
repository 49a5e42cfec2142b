"""Step traces: what ran where, when, and what each call waited for, rendered as one HTML file.

The controller runs each RL step as a small DAG of method calls on role workers. To answer "which role
do the others wait for?" it records, per step, a :class:`DagTrace`: one :class:`NodeTrace` per call
(with the times it was declared, got its inputs, started and finished) and one :class:`EdgeTrace` per
value handed from one call to another (with its size and whether it crossed a process boundary).

:class:`TraceRecorder` collects these for a whole run with bounded memory, and :func:`render_html` /
:func:`write_html` turn them into a single self-contained page (inline CSS, JS and SVG, no network) that
draws one step at a time as a DAG plus a timeline, and a summary table over all steps.
"""

from __future__ import annotations

import html
import json
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from verl.utils.checkpoint import atomic_write_bytes

__all__ = [
    "STATES",
    "TRANSPORTS",
    "DagTrace",
    "EdgeTrace",
    "NodeTrace",
    "TraceRecorder",
    "estimate_nbytes",
    "render_html",
    "write_html",
]

STATES = ("waiting", "running", "done", "failed")
TRANSPORTS = ("in-process", "cross-process")


@dataclass
class NodeTrace:
    """One method call in a step. Times are seconds since the recorder was created."""

    node_id: int
    role: str  # role name, or "driver" for a function run in the driver
    method: str
    state: str = "waiting"  # "waiting" (declared, inputs not ready) | "running" | "done" | "failed"
    created: float = 0.0
    ready: float | None = None  # when all inputs were available
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    attempts: int = 1  # >1 when the call was retried after a worker restart
    process: str = "driver"  # where it ran: "driver" (in-process) or e.g. "ray pid 1234, 5678"


@dataclass
class EdgeTrace:
    """A value passed into node ``dst``: from node ``src``, or from the driver program when ``src`` is None."""

    src: int | None
    dst: int
    channel: str
    nbytes: int
    transport: str  # "in-process" | "cross-process"


@dataclass
class DagTrace:
    """One step: the calls made and the values passed between them."""

    index: int
    label: str  # e.g. "step 3"
    started: float
    finished: float | None = None
    nodes: list[NodeTrace] = field(default_factory=list)
    edges: list[EdgeTrace] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Per role+method aggregates


def _node_end(node: NodeTrace, dag: DagTrace) -> float | None:
    """When a node stopped: its finish time, or for a failed node that never recorded one, the step's end.

    A call that died with its worker may never report back, so the step's end (or, failing that, its
    start) is the best bound we have.
    """
    if node.finished is not None:
        return node.finished
    if node.state == "failed":
        return dag.finished if dag.finished is not None else node.started
    return None


@dataclass
class _Aggregate:
    """Running sums for one (role, method), so statistics cover every step even after traces are dropped."""

    count: int = 0
    run_n: int = 0
    run_total: float = 0.0
    run_max: float = 0.0
    input_wait_n: int = 0
    input_wait_total: float = 0.0
    queue_n: int = 0
    queue_total: float = 0.0
    bytes_in: int = 0
    restarts: int = 0
    failures: int = 0

    def add(self, node: NodeTrace, dag: DagTrace, bytes_in: int) -> None:
        self.count += 1
        self.bytes_in += bytes_in
        self.restarts += max(0, node.attempts - 1)
        self.failures += node.state == "failed"
        end = _node_end(node, dag)
        if node.started is not None and end is not None:
            run = max(0.0, end - node.started)
            self.run_n += 1
            self.run_total += run
            self.run_max = max(self.run_max, run)
        if node.ready is not None:
            self.input_wait_n += 1
            self.input_wait_total += max(0.0, node.ready - node.created)
            if node.started is not None:
                self.queue_n += 1
                self.queue_total += max(0.0, node.started - node.ready)

    def row(self, role: str, method: str) -> dict[str, Any]:
        def mean(total: float, n: int) -> float | None:
            return total / n if n else None

        return {
            "role": role,
            "method": method,
            "count": self.count,
            "run_mean": mean(self.run_total, self.run_n),
            "run_max": self.run_max if self.run_n else None,
            "run_total": self.run_total,
            "input_wait_mean": mean(self.input_wait_total, self.input_wait_n),
            "queue_wait_mean": mean(self.queue_total, self.queue_n),
            "bytes_in": self.bytes_in,
            "restarts": self.restarts,
            "failures": self.failures,
        }


def _fold_dag(aggregates: dict[tuple[str, str], _Aggregate], dag: DagTrace) -> None:
    """Add every node of ``dag`` to ``aggregates``; bytes in are the sizes of the edges into the node."""
    bytes_in: dict[int, int] = {}
    for edge in dag.edges:
        bytes_in[edge.dst] = bytes_in.get(edge.dst, 0) + edge.nbytes
    for node in dag.nodes:
        aggregate = aggregates.setdefault((node.role, node.method), _Aggregate())
        aggregate.add(node, dag, bytes_in.get(node.node_id, 0))


def _stat_rows(aggregates: dict[tuple[str, str], _Aggregate]) -> list[dict[str, Any]]:
    """Rows for the summary table, the biggest total run time first (the likeliest bottleneck)."""
    rows = [aggregate.row(role, method) for (role, method), aggregate in aggregates.items()]
    rows.sort(key=lambda row: (-row["run_total"], row["role"], row["method"]))
    return rows


# --------------------------------------------------------------------------------------------------
# Recorder


class TraceRecorder:
    """Collects the DAG of every step of a run; safe to call from several threads.

    Memory stays bounded on long runs: at most ``max_dags`` traces are kept (the first ``keep_first``,
    the most recent ones, and an evenly spaced sample of those in between), while the per role+method
    statistics are running sums over every step ever recorded.
    """

    def __init__(self, max_dags: int = 200, keep_first: int = 20) -> None:
        if max_dags < 1:
            raise ValueError(f"max_dags must be >= 1, got {max_dags}")
        self.max_dags = max_dags
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._head_cap = max(0, min(keep_first, max_dags // 2))
        remaining = max_dags - self._head_cap
        self._tail_cap = max(1, remaining // 2)
        self._middle_cap = remaining - self._tail_cap
        self._head: list[DagTrace] = []
        self._middle: list[DagTrace] = []
        self._tail: deque[DagTrace] = deque()
        self._stride = 1  # the middle keeps dags whose index is a multiple of this
        self._open: dict[int, DagTrace] = {}
        self._aggregates: dict[tuple[str, str], _Aggregate] = {}
        self._dag_count = 0
        self._next_node_id = 0

    def clock(self) -> float:
        """Seconds since this recorder was created."""
        return time.perf_counter() - self._t0

    @property
    def dag_count(self) -> int:
        """How many dags were begun in total, including those no longer kept."""
        with self._lock:
            return self._dag_count

    @property
    def dags(self) -> list[DagTrace]:
        """The kept dags, oldest first."""
        with self._lock:
            return self._kept()

    def _kept(self) -> list[DagTrace]:
        return [*self._head, *self._middle, *self._tail]

    def begin_dag(self, label: str) -> DagTrace:
        """Start recording a step."""
        with self._lock:
            dag = DagTrace(index=self._dag_count, label=label, started=self.clock())
            self._dag_count += 1
            self._open[dag.index] = dag
            if len(self._head) < self._head_cap:
                self._head.append(dag)
            else:
                self._tail.append(dag)
                if len(self._tail) > self._tail_cap:
                    self._sample(self._tail.popleft())
            return dag

    def _sample(self, dag: DagTrace) -> None:
        """Keep ``dag`` in the evenly spaced middle sample, or drop it.

        When the sample overflows, the stride doubles and every other kept dag goes, so the sample stays
        evenly spread over the run however long it gets.
        """
        if self._middle_cap == 0 or dag.index % self._stride:
            return
        self._middle.append(dag)
        while len(self._middle) > self._middle_cap:
            self._stride *= 2
            self._middle = [kept for kept in self._middle if kept.index % self._stride == 0]

    def end_dag(self, dag: DagTrace) -> None:
        """Finish a step and add it to the statistics (once, however often this is called)."""
        with self._lock:
            if self._open.pop(dag.index, None) is None:
                return
            if dag.finished is None:
                dag.finished = self.clock()
            _fold_dag(self._aggregates, dag)

    def add_node(self, dag: DagTrace, role: str, method: str, process: str = "driver") -> NodeTrace:
        """Declare a call in ``dag``; node ids are unique across the whole run."""
        with self._lock:
            node = NodeTrace(
                node_id=self._next_node_id, role=role, method=method, created=self.clock(), process=process
            )
            self._next_node_id += 1
            dag.nodes.append(node)
            return node

    def add_edge(
        self, dag: DagTrace, src: int | None, dst: int, channel: str, nbytes: int, transport: str
    ) -> EdgeTrace:
        """Record a value passed into node ``dst`` (from node ``src``, or from the driver if None)."""
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        edge = EdgeTrace(src=src, dst=dst, channel=channel, nbytes=int(nbytes), transport=transport)
        with self._lock:
            dag.edges.append(edge)
        return edge

    def mark_ready(self, node: NodeTrace) -> None:
        """All of the node's inputs are available (it may still wait for its worker)."""
        with self._lock:
            if node.ready is None:
                node.ready = self.clock()

    def mark(self, node: NodeTrace, state: str, error: str | None = None) -> None:
        """Move a node to ``state`` and stamp the matching time.

        "running" sets ``started`` (the first time only, so a retried call's run time covers every
        attempt) and ``ready`` if nobody marked it; "done" / "failed" set ``finished``. ``error`` is kept
        when given, so a call that succeeded on retry still shows why the first attempt failed.
        """
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        with self._lock:
            now = self.clock()
            node.state = state
            if state == "running":
                if node.started is None:
                    node.started = now
                if node.ready is None:
                    node.ready = node.started
            elif state in ("done", "failed"):
                node.finished = now
            if error is not None:
                node.error = error

    def role_stats(self) -> list[dict[str, Any]]:
        """Per role+method statistics over every step, including steps still running."""
        with self._lock:
            aggregates = {key: _Aggregate(**asdict(value)) for key, value in self._aggregates.items()}
            for dag in self._open.values():
                _fold_dag(aggregates, dag)
        return _stat_rows(aggregates)

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """(kept dags as plain dicts, role statistics, total dag count), consistent with each other."""
        with self._lock:
            dags = [asdict(dag) for dag in self._kept()]
            count = self._dag_count
        return dags, self.role_stats(), count


# --------------------------------------------------------------------------------------------------
# Sizes


def _pickled_len(value: Any) -> int:
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return 0


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "numel") and hasattr(value, "element_size") and callable(value.element_size)


def _mapping_values(value: Any) -> list[Any]:
    """Values of a dict-like field (a dict, a TensorDict, or None)."""
    if value is None:
        return []
    items = getattr(value, "values", None)
    return list(items()) if callable(items) else []


def _holds_arrays(values: Iterable[Any]) -> bool:
    return any(_is_tensor(v) or isinstance(v, np.ndarray) or hasattr(v, "non_tensor_batch") for v in values)


def estimate_nbytes(value: Any) -> int:
    """Bytes ``value`` would take on the wire, cheaply: array payloads by size, other things pickled.

    Tensors and arrays are measured without copying them, since this runs for every edge of every step;
    containers of arrays are summed element-wise for the same reason. Anything unpicklable counts 0.
    """
    if value is None:
        return 0
    if _is_tensor(value):
        return int(value.numel()) * int(value.element_size())
    if isinstance(value, np.ndarray):
        return _pickled_len(value) if value.dtype == object else int(value.nbytes)
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if hasattr(value, "batch") and hasattr(value, "non_tensor_batch"):
        total = sum(estimate_nbytes(v) for v in _mapping_values(value.batch))
        total += sum(estimate_nbytes(v) for v in _mapping_values(value.non_tensor_batch))
        meta = getattr(value, "meta_info", None)
        return total + (_pickled_len(meta) if meta else 0)
    if isinstance(value, dict) and _holds_arrays(value.values()):
        return _pickled_len(list(value)) + sum(estimate_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple) and _holds_arrays(value):
        return sum(estimate_nbytes(v) for v in value)
    return _pickled_len(value)


# --------------------------------------------------------------------------------------------------
# HTML


def _round_times(value: Any) -> Any:
    """Round floats to microseconds: the trace JSON is most of the file, and more digits mean nothing."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _round_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round_times(v) for v in value]
    return value


def _payload(
    recorder_or_dags: TraceRecorder | Iterable[DagTrace], title: str, meta: Mapping[str, Any]
) -> dict[str, Any]:
    if isinstance(recorder_or_dags, TraceRecorder):
        dags, stats, count = recorder_or_dags.snapshot()
    else:
        traces = list(recorder_or_dags)
        aggregates: dict[tuple[str, str], _Aggregate] = {}
        for dag in traces:
            _fold_dag(aggregates, dag)
        dags, stats, count = [asdict(dag) for dag in traces], _stat_rows(aggregates), len(traces)
    return {
        "title": title,
        "meta": {str(k): str(v) for k, v in meta.items()},
        "dag_count": count,
        "dags": _round_times(dags),
        "stats": _round_times(stats),
    }


def _script_json(data: Any) -> str:
    """JSON that is safe inside a <script> element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where their \\u escapes mean the same thing,
    so no string in the data can close the script tag or open a comment.
    """
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(
    recorder_or_dags: TraceRecorder | Iterable[DagTrace], title: str, meta: Mapping[str, Any] | None = None
) -> str:
    """The trace as one self-contained HTML page; all drawing is done by its inline script from the JSON."""
    data = _script_json(_payload(recorder_or_dags, title, meta or {}))
    return (
        _TEMPLATE.replace("__TITLE__", html.escape(title))
        .replace("__STYLE__", _STYLE)
        .replace("__SCRIPT__", _SCRIPT)
        .replace("__DATA__", data)  # last, so nothing in the data is taken for a placeholder
    )


def write_html(
    path: str | os.PathLike[str],
    recorder: TraceRecorder | Iterable[DagTrace],
    title: str,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write the page atomically, so a browser reloading it during a run never sees half a file."""
    path = Path(path)
    atomic_write_bytes(path, render_html(recorder, title, meta).encode("utf-8"), readable=True)
    return path


def _page_part(name: str) -> str:
    """One piece of the page (kept as plain HTML / CSS / JS files beside this module, so editors help)."""
    return resources.files("verl.single_controller").joinpath("trace_page", name).read_text(encoding="utf-8")


_TEMPLATE = _page_part("page.html")
_STYLE = _page_part("style.css").strip()
_SCRIPT = _page_part("script.js").strip()
