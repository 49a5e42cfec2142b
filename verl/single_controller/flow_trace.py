"""The Controller's record of what ran (:class:`verl.single_controller.flow.Controller` inherits it): the
``dag`` blocks that group one iteration's steps and wait for them, the seconds each step of the last block ran,
the HTML trace of every step's timing and data movement (``trace=True``), and the data-flow log of each
distinct step (:mod:`verl.single_controller.flow_log`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from verl.single_controller.channels import DataChannel, _Node
from verl.single_controller.role import DRIVER


class DagTracing:
    """The tracing and timing half of :class:`~verl.single_controller.flow.Controller`, a mixin: it reads the
    controller's ``recorder``, ``groups``, ``backend``, ``_flow_log`` and its DAG bookkeeping (``_dag``,
    ``_dag_nodes``, ``_last_dag_nodes``)."""

    def _log_data_flow(self, node: _Node, kwargs: dict[str, Any], result: Any) -> None:
        sources = {
            name: _flow_label(value.producer)
            if isinstance(value, DataChannel) and value.producer
            else "driver"
            for name, value in node.inputs.items()
        }
        where = "driver" if node.role == DRIVER else self._where(node.role)
        where = (
            "the driver's process (inputs passed by reference)"
            if where == "driver"
            else f"{where} (inputs pickled across processes)"
        )
        seconds = time.perf_counter() - node.started
        self._flow_log.log(_flow_label(node), kwargs, sources, where, result, seconds, node.worker_s)

    def _where(self, role: str) -> str:
        group = self.groups.get(role)
        if group is None or group.in_process:
            return "driver"
        return "ray pid " + ", ".join(str(pid) for pid in group.pids())

    def _record_edges(self, node: _Node, kwargs: dict[str, Any]) -> None:
        if self.recorder is None:
            return
        from verl.single_controller.trace import estimate_nbytes

        in_process = node.role == DRIVER or self.groups[node.role].in_process
        for name, value in node.inputs.items():
            src = value.producer.trace.node_id if isinstance(value, DataChannel) and value.producer else None
            transport = "in-process" if in_process else "cross-process"
            self.recorder.add_edge(
                node.trace_dag, src, node.trace.node_id, name, estimate_nbytes(kwargs[name]), transport
            )

    def _current_dag(self) -> Any:
        if self._dag is None:
            self._dag = self.recorder.begin_dag(f"dag {self.recorder.dag_count}")
        return self._dag

    @contextlib.contextmanager
    def dag(self, label: str) -> Iterator[None]:
        """Group the steps declared inside into one traced DAG (e.g. one RL step) and wait for them."""
        if self.recorder is not None:
            self._dag = self.recorder.begin_dag(label)
        self._dag_nodes = []
        interrupted = False
        try:
            yield
        except Exception:
            raise
        except (
            BaseException
        ):  # Ctrl-C / SIGTERM: do not wait for steps stuck in user code (verl.utils.stopping)
            interrupted = True
            raise
        finally:
            for node in [] if interrupted else list(self._dag_nodes):  # not the background steps: they run on
                node.finished.wait()
            self._last_dag_nodes, self._dag_nodes = self._dag_nodes, []
            if self.recorder is not None:
                self.recorder.end_dag(self._dag)
                self._dag = None

    def step_durations(self) -> list[tuple[str, float]]:
        """``(step name, seconds it ran)`` for each step of the last :meth:`dag` block that ran."""
        return [
            (n.name, n.ended - n.started)
            for n in self._last_dag_nodes
            if n.started is not None and n.ended is not None
        ]

    def last_step_timings(self) -> dict[str, float]:
        """Seconds the steps of the last :meth:`dag` block ran, summed per step name (a name such as
        ``gen`` may run several times)."""
        timing: dict[str, float] = {}
        for name, seconds in self.step_durations():
            timing[name] = timing.get(name, 0.0) + seconds
        return timing

    def write_trace(
        self, path: str, title: str = "verl step trace", meta: dict[str, str] | None = None
    ) -> str:
        """Render the recorded trace as one self-contained HTML file; returns its path."""
        if self.recorder is None:
            raise RuntimeError("this controller records no trace; create it with Controller(trace=True)")
        from verl.single_controller.trace import write_html

        return str(write_html(path, self.recorder, title, dict(meta or {}, backend=self.backend)))


def _flow_label(node: _Node) -> str:
    """``role.method [name]``: one data-flow entry per distinct step of the DAG."""
    return f"{node.label} [{node.name}]"
