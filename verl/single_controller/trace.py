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
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_html(recorder, title, meta)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp makes the file private (0600); a report should stay readable like the page it replaces.
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
__STYLE__
</style>
</head>
<body data-rendered="pending">
<header>
<h1>__TITLE__</h1>
<dl id="meta"></dl>
<p id="overview"></p>
</header>
<div id="render-error" class="render-error" hidden></div>
<section id="step-section">
<div class="controls">
<button id="prev" type="button" title="previous step (left arrow)">&#9664; prev</button>
<select id="step-select" aria-label="step"></select>
<button id="next" type="button" title="next step (right arrow)">next &#9654;</button>
<span id="step-summary"></span>
</div>
<div class="legend">
<span class="swatch state-waiting"></span>waiting
<span class="swatch state-running"></span>running
<span class="swatch state-done"></span>done
<span class="swatch state-failed"></span>failed
<span class="swatch critical"></span>critical path
<svg class="legend-line" width="44" height="10"><line x1="2" y1="5" x2="42" y2="5" class="edge in-process"></line></svg>in-process
<svg class="legend-line" width="44" height="10"><line x1="2" y1="5" x2="42" y2="5" class="edge cross-process"></line></svg>cross-process
<svg class="legend-line" width="44" height="10"><line x1="2" y1="5" x2="42" y2="5" class="edge in-process slowest"></line></svg>slowest input
</div>
<div id="step-errors"></div>
<div class="scroll"><svg id="dag" role="img" aria-label="step DAG"></svg></div>
<div id="node-details" class="details">Click a node for details.</div>
<h2>Timeline</h2>
<div class="legend">
<span class="swatch bar-inputs"></span>waiting for inputs (declared &rarr; ready)
<span class="swatch bar-queued"></span>queued (ready &rarr; started)
<span class="swatch state-done solid"></span>running (started &rarr; finished)
</div>
<div class="scroll"><svg id="timeline" role="img" aria-label="step timeline"></svg></div>
</section>
<section>
<h2>Summary over all steps</h2>
<p id="summary-note"></p>
<div class="scroll"><table id="summary"><thead></thead><tbody></tbody></table></div>
</section>
<script type="application/json" id="trace-data">__DATA__</script>
<script>
__SCRIPT__
</script>
</body>
</html>
"""

_STYLE = """
:root { --waiting: #e0a100; --running: #2f7bd1; --done: #3a9a3e; --failed: #d03030;
  --waiting-bg: #fdeab8; --running-bg: #d3e5fa; --done-bg: #d2edd3; --failed-bg: #f8cccc;
  --in-process: #555; --cross-process: #8e44ad; --critical: #e8590c; }
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 6px; }
h2 { font-size: 16px; margin: 22px 0 6px; }
dl#meta { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; margin: 6px 0; }
dl#meta dt { font-weight: 600; color: #555; }
dl#meta dd { margin: 0; font-family: ui-monospace, monospace; }
.render-error { background: var(--failed-bg); border: 1px solid var(--failed); padding: 8px; white-space: pre-wrap; }
.controls { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 8px 0; }
.controls select { min-width: 180px; }
#step-summary { color: #444; }
.legend { display: flex; gap: 6px 10px; align-items: center; flex-wrap: wrap; font-size: 12px; color: #444; margin: 4px 0; }
.swatch { display: inline-block; width: 14px; height: 14px; border: 2px solid #888; border-radius: 3px; margin-left: 6px; vertical-align: middle; }
.swatch.state-waiting { background: var(--waiting-bg); border-color: var(--waiting); }
.swatch.state-running { background: var(--running-bg); border-color: var(--running); }
.swatch.state-done { background: var(--done-bg); border-color: var(--done); }
.swatch.state-done.solid { background: var(--done); }
.swatch.state-failed { background: var(--failed-bg); border-color: var(--failed); }
.swatch.critical { background: #fff; border: 3px solid var(--critical); }
.swatch.bar-inputs { background: repeating-linear-gradient(45deg, #fff 0 3px, #f0c850 3px 5px); border-color: #d8b040; }
.swatch.bar-queued { background: #ddd; border-color: #aaa; }
.legend-line { vertical-align: middle; margin-left: 6px; }
.scroll { overflow-x: auto; border: 1px solid #e4e4e4; border-radius: 4px; background: #fcfcfc; }
svg text { font-size: 12px; fill: #222; }
.edge { fill: none; stroke-width: 1.4; }
.edge.in-process { stroke: var(--in-process); }
.edge.cross-process { stroke: var(--cross-process); stroke-dasharray: 6 4; }
.edge.slowest { stroke-width: 3; }
.edge.critical { stroke: var(--critical); }
.edge-label { font-size: 11px; paint-order: stroke; stroke: #fcfcfc; stroke-width: 4px; stroke-linejoin: round; }
.edge-label.cross-process { fill: var(--cross-process); }
.node { cursor: pointer; }
.node rect.box { stroke-width: 1.6; }
.node.state-waiting rect.box { fill: var(--waiting-bg); stroke: var(--waiting); }
.node.state-running rect.box { fill: var(--running-bg); stroke: var(--running); }
.node.state-done rect.box { fill: var(--done-bg); stroke: var(--done); }
.node.state-failed rect.box { fill: var(--failed-bg); stroke: var(--failed); }
.node.critical rect.box { stroke: var(--critical); stroke-width: 3.5; }
.node.selected rect.box { stroke-dasharray: 4 2; }
.node .role { font-weight: 700; }
.node .err { fill: #a01010; font-size: 11px; }
.driver circle { fill: #eee; stroke: #777; }
.bar.state-waiting { fill: var(--waiting); }
.bar.state-running { fill: var(--running); }
.bar.state-done { fill: var(--done); }
.bar.state-failed { fill: var(--failed); }
.bar.critical { stroke: var(--critical); stroke-width: 2.5; }
.bar-queued { fill: #ddd; }
.bar-label { font-size: 11px; fill: #fff; pointer-events: none; }
.row-label { font-weight: 600; }
.grid { stroke: #e6e6e6; }
.row-sep { stroke: #ddd; }
.details { margin: 8px 0; padding: 8px 10px; border: 1px solid #e4e4e4; border-radius: 4px; background: #fafafa; font-size: 13px; }
.details pre, #step-errors pre { white-space: pre-wrap; margin: 4px 0; background: #fff3f3; padding: 6px; border-radius: 3px; }
#step-errors .failure { border-left: 4px solid var(--failed); padding: 2px 8px; margin: 6px 0; }
table#summary { border-collapse: collapse; font-size: 13px; }
#summary th, #summary td { padding: 3px 10px; border-bottom: 1px solid #e8e8e8; text-align: right; white-space: nowrap; }
#summary th { background: #f2f2f2; }
#summary td.text, #summary th.text { text-align: left; }
#summary tr.bottleneck td { background: #fff1e6; }
#summary td.bad { color: var(--failed); font-weight: 600; }
""".strip()

_SCRIPT = r"""
"use strict";
(() => {
  const dagSvg = document.getElementById("dag");
  const SVG_NS = dagSvg.namespaceURI; // taken from the page, so the file holds no URL at all

  // ---------------------------------------------------------------- small DOM helpers
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined) node.setAttribute(key, String(value));
    }
    return node;
  }
  function html(tag, attrs, text) {
    const node = setAttrs(document.createElement(tag), attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs, text) {
    const node = setAttrs(document.createElementNS(SVG_NS, tag), attrs);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  function truncate(text, max) {
    text = String(text);
    return text.length > max ? text.slice(0, max - 1) + "\u2026" : text;
  }

  // ---------------------------------------------------------------- formatting
  function fmtDuration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "\u2013";
    const s = Math.max(0, seconds);
    if (s === 0) return "0 s";
    if (s < 1e-3) return Math.round(s * 1e6) + " \u00b5s";
    if (s < 1) return (s * 1e3).toFixed(s < 0.1 ? 1 : 0) + " ms";
    if (s < 60) return s.toFixed(2) + " s";
    const minutes = Math.floor(s / 60);
    return minutes + "m " + String(Math.round(s - minutes * 60)).padStart(2, "0") + "s";
  }
  function fmtBytes(n) {
    if (n === null || n === undefined) return "\u2013";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let value = n;
    let unit = 0;
    while (value >= 1000 && unit < units.length - 1) {
      value /= 1000;
      unit += 1;
    }
    return (unit === 0 ? String(value) : value.toFixed(value < 10 ? 1 : 0)) + " " + units[unit];
  }
  function nodeName(node) {
    return node.role + "." + node.method;
  }

  // ---------------------------------------------------------------- analysis of one DAG
  // Everything the drawing needs, with times made relative to the step's start.
  function analyse(dag) {
    const nodes = dag.nodes || [];
    const edges = dag.edges || [];
    const byId = new Map(nodes.map((n) => [n.node_id, n]));
    const t0 = dag.started || 0;
    const stamps = [];
    for (const n of nodes) {
      for (const t of [n.created, n.ready, n.started, n.finished]) if (typeof t === "number") stamps.push(t);
    }
    const end = typeof dag.finished === "number" ? dag.finished : Math.max(t0, ...stamps);

    // When each node stopped: a failed node without a finish time ends with the step (or at its start).
    const nodeEnd = (n) => {
      if (typeof n.finished === "number") return n.finished;
      if (n.state === "failed") return typeof dag.finished === "number" ? dag.finished : n.started;
      if (n.state === "running") return end;
      return null;
    };
    const times = new Map();
    for (const n of nodes) {
      const stop = nodeEnd(n);
      const readyOrNow = typeof n.ready === "number" ? n.ready : n.state === "waiting" ? end : null;
      times.set(n.node_id, {
        created: n.created - t0,
        ready: typeof n.ready === "number" ? n.ready - t0 : null,
        started: typeof n.started === "number" ? n.started - t0 : null,
        end: typeof stop === "number" ? stop - t0 : null,
        run: typeof n.started === "number" && typeof stop === "number" ? stop - n.started : null,
        inputWait: readyOrNow === null ? null : readyOrNow - n.created,
        inputsPending: n.ready === null || n.ready === undefined,
        queued: typeof n.started === "number" && typeof n.ready === "number" ? n.started - n.ready : null,
      });
    }

    // Incoming edges and, per node, the input that arrived last: the one it waited for longest.
    const incoming = new Map(nodes.map((n) => [n.node_id, []]));
    const outgoing = new Map(nodes.map((n) => [n.node_id, []]));
    edges.forEach((e, i) => {
      if (!incoming.has(e.dst)) return;
      incoming.get(e.dst).push(i);
      if (e.src !== null && outgoing.has(e.src)) outgoing.get(e.src).push(i);
    });
    const arrival = (id) => {
      const t = times.get(id);
      return t && t.end !== null ? t.end : end - t0;
    };
    const slowest = new Map(); // node id -> edge index
    for (const n of nodes) {
      let best = null;
      for (const i of incoming.get(n.node_id)) {
        const e = edges[i];
        if (e.src === null || !byId.has(e.src) || e.src === e.dst) continue;
        if (best === null || arrival(e.src) > arrival(edges[best].src)) best = i;
      }
      if (best !== null) slowest.set(n.node_id, best);
    }

    // Critical path: from the node that finished last, follow slowest inputs back to a source.
    const criticalNodes = new Set();
    const criticalEdges = new Set();
    let last = null;
    for (const n of nodes) {
      const t = times.get(n.node_id);
      const key = t.end !== null ? t.end : t.created;
      if (last === null || key > last.key) last = { id: n.node_id, key: key };
    }
    let cursor = last ? last.id : null;
    while (cursor !== null && !criticalNodes.has(cursor)) {
      criticalNodes.add(cursor);
      const edgeIndex = slowest.get(cursor);
      if (edgeIndex === undefined) break;
      criticalEdges.add(edgeIndex);
      cursor = edges[edgeIndex].src;
    }

    return {
      dag, nodes, edges, byId, t0, duration: Math.max(0, end - t0), times, incoming, outgoing,
      slowest, criticalNodes, criticalEdges, depth: depths(nodes, edges, byId),
      criticalOrder: nodes.filter((n) => criticalNodes.has(n.node_id))
        .sort((a, b) => times.get(a.node_id).created - times.get(b.node_id).created ||
          (times.get(a.node_id).end || 0) - (times.get(b.node_id).end || 0)),
    };
  }

  // Column of each node: the longest path from a source (Kahn's order; a cycle just goes last).
  function depths(nodes, edges, byId) {
    const indegree = new Map(nodes.map((n) => [n.node_id, 0]));
    const next = new Map(nodes.map((n) => [n.node_id, []]));
    for (const e of edges) {
      if (e.src === null || !byId.has(e.src) || !byId.has(e.dst) || e.src === e.dst) continue;
      next.get(e.src).push(e.dst);
      indegree.set(e.dst, indegree.get(e.dst) + 1);
    }
    const depth = new Map(nodes.map((n) => [n.node_id, 0]));
    const queue = nodes.filter((n) => indegree.get(n.node_id) === 0).map((n) => n.node_id);
    const seen = new Set();
    while (queue.length) {
      const id = queue.shift();
      seen.add(id);
      for (const dst of next.get(id)) {
        depth.set(dst, Math.max(depth.get(dst), depth.get(id) + 1));
        indegree.set(dst, indegree.get(dst) - 1);
        if (indegree.get(dst) === 0) queue.push(dst);
      }
    }
    const deepest = Math.max(0, ...depth.values());
    for (const n of nodes) if (!seen.has(n.node_id)) depth.set(n.node_id, deepest + 1);
    return depth;
  }

  function describeNode(info, n) {
    const t = info.times.get(n.node_id);
    const lines = [
      nodeName(n) + "  [" + n.state + "]",
      "ran in: " + n.process + (n.attempts > 1 ? "  (attempts: " + n.attempts + ")" : ""),
      "run: " + fmtDuration(t.run) + "   waiting for inputs: " + fmtDuration(t.inputWait) +
        (t.inputsPending ? " (still pending)" : "") + "   queued: " + fmtDuration(t.queued),
      "declared +" + fmtDuration(t.created) + ", ready +" + fmtDuration(t.ready) + ", started +" +
        fmtDuration(t.started) + ", ended +" + fmtDuration(t.end),
    ];
    const slow = info.slowest.get(n.node_id);
    if (slow !== undefined) {
      const e = info.edges[slow];
      lines.push("waited longest for: " + nodeName(info.byId.get(e.src)) + " (" + e.channel + ", ended +" +
        fmtDuration(info.times.get(e.src).end) + ")");
    }
    for (const i of info.incoming.get(n.node_id)) {
      const e = info.edges[i];
      const from = e.src === null ? "driver" : info.byId.has(e.src) ? nodeName(info.byId.get(e.src)) : "#" + e.src;
      lines.push("  in: " + e.channel + " \u00b7 " + fmtBytes(e.nbytes) + " from " + from + " (" + e.transport + ")");
    }
    if (n.error) lines.push("error: " + n.error);
    else if (n.state === "failed") lines.push("failed (no error message)");
    return lines;
  }

  // ---------------------------------------------------------------- DAG drawing
  const NODE_W = 210;
  const NODE_H = 74;
  const GAP_X = 150;
  const GAP_Y = 28;
  const PAD = 20;
  const DRIVER_W = 150;
  const TOP = 12; // room above the first row for driver stubs

  function arrowMarker(id, color) {
    const marker = svg("marker", {
      id: id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 9, markerHeight: 9,
      markerUnits: "userSpaceOnUse", orient: "auto",
    });
    marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: color }));
    return marker;
  }

  function layoutDag(info) {
    const hasDriver = info.edges.some((e) => e.src === null && info.depth.get(e.dst) === 0);
    const columns = [];
    for (const n of info.nodes) {
      const d = info.depth.get(n.node_id);
      (columns[d] = columns[d] || []).push(n);
    }
    const x0 = PAD + (hasDriver ? DRIVER_W : 0);
    const rows = Math.max(1, ...columns.map((c) => (c ? c.length : 0)));
    const height = TOP + PAD * 2 + rows * (NODE_H + GAP_Y) - GAP_Y + 14;
    const pos = new Map();
    columns.forEach((column, d) => {
      if (!column) return;
      column.sort((a, b) => a.created - b.created || a.node_id - b.node_id);
      const top = TOP + PAD + ((rows - column.length) * (NODE_H + GAP_Y)) / 2;
      column.forEach((n, i) => pos.set(n.node_id, { x: x0 + d * (NODE_W + GAP_X), y: top + i * (NODE_H + GAP_Y) }));
    });
    const width = x0 + Math.max(1, columns.length) * (NODE_W + GAP_X) - GAP_X + PAD;
    return { pos, width, height, hasDriver, driver: { x: PAD + 16, y: height / 2 } };
  }

  // Spread the ends of several edges along a box side, ordered by where the other end is.
  function anchorOffsets(edgeIndexes, otherY) {
    const sorted = edgeIndexes.slice().sort((a, b) => otherY(a) - otherY(b) || a - b);
    const offsets = new Map();
    sorted.forEach((i, k) => offsets.set(i, ((k + 1) / (sorted.length + 1) - 0.5) * (NODE_H - 16)));
    return offsets;
  }

  function drawDag(info, onSelect) {
    clear(dagSvg);
    const layout = layoutDag(info);
    setAttrs(dagSvg, { width: layout.width, height: layout.height, viewBox: "0 0 " + layout.width + " " + layout.height });
    const defs = svg("defs");
    defs.appendChild(arrowMarker("arrow-in-process", "#555"));
    defs.appendChild(arrowMarker("arrow-cross-process", "#8e44ad"));
    defs.appendChild(arrowMarker("arrow-critical", "#e8590c"));
    dagSvg.appendChild(defs);

    // Driver values for the first column come from one driver marker on the left; values for deeper
    // nodes get a small driver stub above the node, so no edge has to cross the whole DAG.
    const isStub = (e) => e.src === null && info.depth.get(e.dst) > 0;
    const srcPoint = (e) => (isStub(e) ? null : e.src === null ? layout.driver : layout.pos.get(e.src));
    const centerY = (p) => (p === layout.driver ? p.y : p.y + NODE_H / 2);
    const inOffsets = new Map();
    const outOffsets = new Map();
    for (const n of info.nodes) {
      const ins = info.incoming.get(n.node_id).filter((i) => srcPoint(info.edges[i]));
      for (const [i, o] of anchorOffsets(ins, (i) => centerY(srcPoint(info.edges[i])))) inOffsets.set(i, o);
      const outs = info.outgoing.get(n.node_id).filter((i) => layout.pos.has(info.edges[i].dst));
      for (const [i, o] of anchorOffsets(outs, (i) => centerY(layout.pos.get(info.edges[i].dst)))) outOffsets.set(i, o);
    }

    const edgeLayer = svg("g", { class: "edges" });
    const labelLayer = svg("g", { class: "edge-labels" });
    const pairCount = new Map();
    info.edges.forEach((e, i) => {
      const from = srcPoint(e);
      const to = layout.pos.get(e.dst);
      if (!from || !to) return;
      const sx = from === layout.driver ? from.x + 16 : from.x + NODE_W;
      const sy = from === layout.driver ? from.y : from.y + NODE_H / 2 + (outOffsets.get(i) || 0);
      const tx = to.x;
      const ty = to.y + NODE_H / 2 + (inOffsets.get(i) || 0);
      const dx = Math.max(30, (tx - sx) / 2);
      const transport = e.transport === "cross-process" ? "cross-process" : "in-process";
      const critical = info.criticalEdges.has(i);
      const slowest = info.slowest.get(e.dst) === i;
      const cls = ["edge", transport, slowest ? "slowest" : "", critical ? "critical" : ""].join(" ").trim();
      const path = svg("path", {
        d: "M" + sx + "," + sy + " C" + (sx + dx) + "," + sy + " " + (tx - dx) + "," + ty + " " + tx + "," + ty,
        class: cls, "marker-end": "url(#arrow-" + (critical ? "critical" : transport) + ")",
        "data-src": e.src === null ? "driver" : e.src, "data-dst": e.dst,
      });
      const fromName = e.src === null ? "driver" : nodeName(info.byId.get(e.src));
      path.appendChild(svg("title", {}, e.channel + " \u00b7 " + fmtBytes(e.nbytes) + " (" + e.transport + ")\n" +
        fromName + " \u2192 " + nodeName(info.byId.get(e.dst)) + (slowest ? "\nslowest input of its target" : "")));
      edgeLayer.appendChild(path);
      // Labels of parallel edges between the same pair are stacked instead of overprinted.
      const pair = String(e.src) + ">" + e.dst;
      const k = pairCount.get(pair) || 0;
      pairCount.set(pair, k + 1);
      labelLayer.appendChild(svg("text", {
        x: (sx + tx) / 2, y: (sy + ty) / 2 - 4 + k * 13, "text-anchor": "middle", class: "edge-label " + transport,
      }, truncate(e.channel, 22) + " \u00b7 " + fmtBytes(e.nbytes)));
    });
    dagSvg.appendChild(edgeLayer);

    if (layout.hasDriver) {
      const g = svg("g", { class: "driver" });
      g.appendChild(svg("circle", { cx: layout.driver.x, cy: layout.driver.y, r: 16 }));
      g.appendChild(svg("text", { x: layout.driver.x, y: layout.driver.y + 32, "text-anchor": "middle" }, "driver"));
      g.appendChild(svg("title", {}, "values given by the driver program"));
      dagSvg.appendChild(g);
    }

    for (const n of info.nodes) {
      const stubs = info.incoming.get(n.node_id).map((i) => info.edges[i]).filter(isStub);
      if (stubs.length) dagSvg.appendChild(drawDriverStub(stubs, layout.pos.get(n.node_id)));
      dagSvg.appendChild(drawNode(info, n, layout.pos.get(n.node_id), onSelect));
    }
    dagSvg.appendChild(labelLayer);
  }

  function drawDriverStub(edges, p) {
    const transport = edges.some((e) => e.transport === "cross-process") ? "cross-process" : "in-process";
    const label = edges.map((e) => truncate(e.channel, 18) + " \u00b7 " + fmtBytes(e.nbytes)).join(", ");
    const g = svg("g", { class: "driver stub", "data-dst": edges[0].dst });
    g.appendChild(svg("circle", { cx: p.x + 14, cy: p.y - 18, r: 4 }));
    g.appendChild(svg("path", {
      d: "M" + (p.x + 14) + "," + (p.y - 14) + " L" + (p.x + 14) + "," + p.y,
      class: "edge " + transport, "marker-end": "url(#arrow-" + transport + ")", "data-src": "driver",
    }));
    g.appendChild(svg("text", { x: p.x + 24, y: p.y - 9, class: "edge-label " + transport }, "driver: " + truncate(label, 40)));
    g.appendChild(svg("title", {}, edges.map((e) => "driver \u2192 " + e.channel + " \u00b7 " + fmtBytes(e.nbytes) +
      " (" + e.transport + ")").join("\n")));
    return g;
  }

  function drawNode(info, n, p, onSelect) {
    const t = info.times.get(n.node_id);
    const critical = info.criticalNodes.has(n.node_id);
    const g = svg("g", {
      class: "node state-" + n.state + (critical ? " critical" : ""), "data-node-id": n.node_id,
      transform: "translate(" + p.x + "," + p.y + ")", tabindex: 0,
    });
    g.appendChild(svg("rect", { class: "box", width: NODE_W, height: NODE_H, rx: 6, ry: 6 }));
    g.appendChild(svg("text", { x: 10, y: 18, class: "role" },
      truncate(n.role, 22) + (n.attempts > 1 ? "  \u00d7" + n.attempts + " attempts" : "")));
    g.appendChild(svg("text", { x: 10, y: 34 }, truncate(n.method, 30)));
    const wait = t.inputsPending && n.state === "waiting" ? "inputs pending" : "inputs " + fmtDuration(t.inputWait);
    g.appendChild(svg("text", { x: 10, y: 51 }, "run " + fmtDuration(t.run) + " \u00b7 " + wait));
    if (n.state === "failed") {
      g.appendChild(svg("text", { x: 10, y: 67, class: "err" }, "\u26a0 " + truncate(n.error || "failed", 30)));
    } else if (n.process && n.process !== "driver") {
      g.appendChild(svg("text", { x: 10, y: 67, class: "proc" }, truncate(n.process, 32)));
    }
    g.appendChild(svg("title", {}, describeNode(info, n).join("\n")));
    g.addEventListener("click", () => onSelect(n.node_id));
    g.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") onSelect(n.node_id);
    });
    return g;
  }

  // ---------------------------------------------------------------- timeline (Gantt)
  const LABEL_W = 150;
  const LANE_H = 20;
  const AXIS_H = 24;
  const TL_WIDTH = 1100;

  function niceStep(span, ticks) {
    const raw = span / ticks;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
    return 10 * power;
  }

  // Per role, put nodes whose [declared, ended] intervals overlap on separate lanes.
  function lanes(info) {
    const order = info.nodes.slice().sort((a, b) =>
      info.depth.get(a.node_id) - info.depth.get(b.node_id) || a.created - b.created || a.node_id - b.node_id);
    const roles = new Map();
    for (const n of order) {
      if (!roles.has(n.role)) roles.set(n.role, []);
      const t = info.times.get(n.node_id);
      const stop = t.end !== null ? t.end : info.duration;
      const laneEnds = roles.get(n.role);
      let lane = laneEnds.findIndex((laneEnd) => laneEnd.end <= t.created + 1e-9);
      if (lane < 0) {
        lane = laneEnds.length;
        laneEnds.push({ end: stop, nodes: [] });
      }
      laneEnds[lane].end = stop;
      laneEnds[lane].nodes.push(n);
    }
    return roles;
  }

  function drawTimeline(info, svgNode, onSelect) {
    clear(svgNode);
    const roles = lanes(info);
    let laneCount = 0;
    for (const laneList of roles.values()) laneCount += Math.max(1, laneList.length);
    const height = AXIS_H + laneCount * LANE_H + roles.size * 6 + 10;
    setAttrs(svgNode, { width: TL_WIDTH, height: height, viewBox: "0 0 " + TL_WIDTH + " " + height });
    const defs = svg("defs");
    const hatch = svg("pattern", { id: "hatch", patternUnits: "userSpaceOnUse", width: 6, height: 6, patternTransform: "rotate(45)" });
    hatch.appendChild(svg("rect", { width: 6, height: 6, fill: "#fff8e0" }));
    hatch.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#e0b030", "stroke-width": 2 }));
    defs.appendChild(hatch);
    svgNode.appendChild(defs);

    const span = info.duration > 0 ? info.duration : 1e-3;
    const plotW = TL_WIDTH - LABEL_W - PAD;
    const x = (t) => LABEL_W + (Math.min(Math.max(t, 0), span) / span) * plotW;
    const step = niceStep(span, 8);
    for (let tick = 0; tick <= span + 1e-12; tick += step) {
      svgNode.appendChild(svg("line", { x1: x(tick), y1: AXIS_H - 6, x2: x(tick), y2: height, class: "grid" }));
      svgNode.appendChild(svg("text", { x: x(tick), y: AXIS_H - 10, "text-anchor": "middle" }, fmtDuration(tick)));
    }

    let y = AXIS_H;
    for (const [role, laneList] of roles) {
      const rowHeight = Math.max(1, laneList.length) * LANE_H + 6;
      svgNode.appendChild(svg("text", { x: 6, y: y + rowHeight / 2 + 4, class: "row-label" }, truncate(role, 20)));
      laneList.forEach((lane, k) => {
        for (const n of lane.nodes) svgNode.appendChild(drawBars(info, n, x, y + 3 + k * LANE_H, onSelect));
      });
      y += rowHeight;
      svgNode.appendChild(svg("line", { x1: 0, y1: y, x2: TL_WIDTH, y2: y, class: "row-sep" }));
    }
  }

  function drawBars(info, n, x, top, onSelect) {
    const t = info.times.get(n.node_id);
    const g = svg("g", { class: "bars", "data-node-id": n.node_id });
    const h = LANE_H - 4;
    const bar = (from, to, attrs) => {
      if (from === null || to === null || to < from) return;
      g.appendChild(svg("rect", Object.assign({ x: x(from), y: top, width: Math.max(1, x(to) - x(from)), height: h }, attrs)));
    };
    // A node whose inputs never arrived waited for them until it failed or the step ended.
    const stillWaiting = n.state === "waiting" || (n.state === "failed" && t.started === null);
    const readyAt = t.ready !== null ? t.ready : stillWaiting ? (t.end !== null ? t.end : info.duration) : null;
    bar(t.created, readyAt, { fill: "url(#hatch)", class: "bar-inputs" });
    bar(t.ready, t.started !== null ? t.started : n.state === "waiting" ? info.duration : null, { class: "bar-queued" });
    const critical = info.criticalNodes.has(n.node_id) ? " critical" : "";
    bar(t.started, t.end, { class: "bar state-" + n.state + critical });
    if (t.started !== null && t.end !== null && x(t.end) - x(t.started) > 7 * n.method.length + 8) {
      g.appendChild(svg("text", { x: x(t.started) + 4, y: top + h - 4, class: "bar-label" }, n.method));
    }
    g.appendChild(svg("title", {}, describeNode(info, n).join("\n")));
    g.addEventListener("click", () => onSelect(n.node_id));
    return g;
  }

  // ---------------------------------------------------------------- page sections
  function renderHeader(data) {
    const meta = document.getElementById("meta");
    for (const [key, value] of Object.entries(data.meta || {})) {
      meta.appendChild(html("dt", {}, key));
      meta.appendChild(html("dd", {}, value));
    }
    const kept = (data.dags || []).length;
    const total = data.dag_count || 0;
    document.getElementById("overview").textContent = total === 0 ? "No steps were recorded." :
      total + " step" + (total === 1 ? "" : "s") + " recorded" +
      (kept < total ? "; " + kept + " kept in this file (the first, the latest and an even sample)." : ".");
  }

  function renderSummary(data) {
    const head = document.querySelector("#summary thead");
    const body = document.querySelector("#summary tbody");
    const columns = [
      ["role", "text"], ["method", "text"], ["calls"], ["mean run"], ["max run"], ["total run"],
      ["mean wait for inputs"], ["mean queued"], ["bytes in"], ["restarts"], ["failures"],
    ];
    const headRow = html("tr");
    for (const [name, cls] of columns) headRow.appendChild(html("th", { class: cls }, name));
    head.appendChild(headRow);
    const stats = data.stats || [];
    document.getElementById("summary-note").textContent = "Per role and method over all " + (data.dag_count || 0) +
      " steps, sorted by total run time (the top row is where the time goes).";
    if (!stats.length) {
      const row = html("tr");
      row.appendChild(html("td", { class: "text", colspan: columns.length }, "No calls recorded."));
      body.appendChild(row);
      return;
    }
    stats.forEach((s, i) => {
      const row = html("tr", { class: i === 0 && s.run_total > 0 ? "bottleneck" : null });
      const cells = [
        [s.role, "text"], [s.method, "text"], [s.count], [fmtDuration(s.run_mean)], [fmtDuration(s.run_max)],
        [fmtDuration(s.run_total)], [fmtDuration(s.input_wait_mean)], [fmtDuration(s.queue_wait_mean)],
        [fmtBytes(s.bytes_in)], [s.restarts, s.restarts ? "bad" : null], [s.failures, s.failures ? "bad" : null],
      ];
      for (const [value, cls] of cells) row.appendChild(html("td", { class: cls }, value));
      body.appendChild(row);
    });
  }

  function renderStep(data, position) {
    const dag = data.dags[position];
    const info = analyse(dag);
    const details = document.getElementById("node-details");
    const select = (id) => {
      for (const g of dagSvg.querySelectorAll(".node")) g.classList.toggle("selected", g.dataset.nodeId === String(id));
      clear(details);
      details.appendChild(html("pre", {}, describeNode(info, info.byId.get(id)).join("\n")));
    };
    drawDag(info, select);
    drawTimeline(info, document.getElementById("timeline"), select);
    clear(details);
    details.textContent = "Click a node or a bar for details.";

    const path = info.criticalOrder.map((n) => nodeName(n) + " " + fmtDuration(info.times.get(n.node_id).run));
    document.getElementById("step-summary").textContent = dag.label + " \u00b7 " + info.nodes.length + " node" +
      (info.nodes.length === 1 ? "" : "s") + " \u00b7 took " + fmtDuration(info.duration) +
      (typeof dag.finished === "number" ? "" : " (still running)") +
      (path.length ? " \u00b7 critical path: " + path.join(" \u2192 ") : "");

    const errors = document.getElementById("step-errors");
    clear(errors);
    for (const n of info.nodes.filter((m) => m.state === "failed")) {
      const box = html("div", { class: "failure" });
      box.appendChild(html("strong", {}, nodeName(n) + " failed" + (n.attempts > 1 ? " after " + n.attempts + " attempts" : "")));
      box.appendChild(html("pre", {}, n.error || "(no error message)"));
      errors.appendChild(box);
    }
  }

  function setupSteps(data) {
    const dags = data.dags || [];
    const select = document.getElementById("step-select");
    const prev = document.getElementById("prev");
    const next = document.getElementById("next");
    if (!dags.length) {
      document.getElementById("step-section").hidden = true;
      return;
    }
    const optionText = (dag) => (dag.label.includes(String(dag.index)) ? dag.label : dag.label + "  (#" + dag.index + ")");
    dags.forEach((dag, i) => select.appendChild(html("option", { value: i }, optionText(dag))));
    const show = (position) => {
      position = Math.min(Math.max(position, 0), dags.length - 1);
      select.value = String(position);
      prev.disabled = position === 0;
      next.disabled = position === dags.length - 1;
      try {
        renderStep(data, position);
        document.body.dataset.rendered = "ok";
      } catch (err) {
        fail(err);
      }
      try {
        history.replaceState(null, "", "#step=" + dags[position].index); // a link to this step
      } catch (err) {
        // some browsers refuse this for local files; the link is only a nicety
      }
    };
    select.addEventListener("change", () => show(Number(select.value)));
    prev.addEventListener("click", () => show(Number(select.value) - 1));
    next.addEventListener("click", () => show(Number(select.value) + 1));
    document.addEventListener("keydown", (event) => {
      if (event.target && event.target.tagName === "SELECT") return;
      if (event.key === "ArrowLeft") show(Number(select.value) - 1);
      if (event.key === "ArrowRight") show(Number(select.value) + 1);
    });
    // Open the step named in the address (#step=<index>), else the latest one.
    const wanted = /^#step=(\d+)$/.exec(window.location.hash);
    const position = wanted ? dags.findIndex((dag) => dag.index === Number(wanted[1])) : -1;
    show(position >= 0 ? position : dags.length - 1);
  }

  function fail(err) {
    const message = err && err.message ? err.message : String(err);
    document.body.dataset.rendered = "error: " + message;
    const box = document.getElementById("render-error");
    box.hidden = false;
    box.textContent = "Could not render the trace: " + message + (err && err.stack ? "\n" + err.stack : "");
  }

  try {
    const data = JSON.parse(document.getElementById("trace-data").textContent);
    renderHeader(data);
    renderSummary(data);
    setupSteps(data);
    if (!String(document.body.dataset.rendered).startsWith("error")) document.body.dataset.rendered = "ok";
  } catch (err) {
    fail(err);
  }
})();
""".strip()
