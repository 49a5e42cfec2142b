"""Controller, Role, DataChannel: the control flow of an RL algorithm as a DAG of role method calls.

The driver program reads top to bottom, like the seed's PPO example::

    samples = controller.step(role="actor", method="generate", inputs={"prompt": prompts}, outputs=["responses"])
    values  = controller.step(role="critic", method="score", inputs={"responses": samples["responses"]}, outputs=["values"])
    rewards = controller.step(role="rm", method="score", inputs={"responses": samples["responses"]}, outputs=["rewards"])

``step`` does not wait: it adds a node to the DAG and returns its outputs as :class:`DataChannel` s
(futures). A node runs as soon as its inputs are ready, in a thread of the controller, so the critic
and reward-model steps above run at the same time. Reading a channel (``values["values"].get()``,
or indexing / printing it) waits for it.

Two rules keep this predictable:

* Steps of one role run in the order they were declared (a role is one worker group that does one
  thing at a time), even when no channel links them: ``actor.update`` of step k happens before
  ``actor.generate`` of step k+1.
* A failed step fails the steps that consume its outputs (with an error naming the upstream step),
  never the independent branches. A role whose policy is ``on_failure="restart"`` gets its workers
  rebuilt (state restored from ``group.saved_state``) and the step retried up to ``max_restarts``; with
  ``on_failure="fallback"`` the step takes the role's ``fallback`` result instead.

``method`` may also be a plain function, which then runs in the driver (``role`` omitted): this is how
the driver-side math (advantages) joins the DAG.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from verl.single_controller.base import WorkerGroup
from verl.single_controller.channels import DataChannel, StepError, StepOutputs, _Node, resolved
from verl.single_controller.errors import WorkerError
from verl.single_controller.flow_log import DataFlowLog
from verl.single_controller.flow_trace import DagTracing, _flow_label
from verl.single_controller.role import DRIVER, Role
from verl.utils.threads import drive_on_one_openmp_thread

__all__ = ["Controller", "DataChannel", "Role", "StepError", "StepOutputs"]

logger = logging.getLogger(__name__)


class Controller(DagTracing):
    """Registers roles, builds the DAG of steps, and runs each step when its inputs are ready.

    ``backend``: ``"local"`` (workers in this process; the default) or ``"ray"`` (each worker a Ray
    actor process). ``trace=True`` records every step's timing and data movement; :meth:`write_trace`
    renders it as one HTML file. Subclasses define one iteration of an algorithm in :meth:`_build_dag`.
    """

    def __init__(self, backend: str = "local", trace: bool = False, max_concurrency: int = 16) -> None:
        if backend not in ("local", "ray"):
            raise ValueError(f"unknown backend {backend!r}; choose local or ray")
        self.backend = backend
        self.roles: dict[str, Role] = {}
        self.groups: dict[str, WorkerGroup] = {}
        self.restarts: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        """calls per role answered by the role's fallback (``Role(on_failure="fallback")``)"""
        self._lock = threading.Lock()
        # The step threads only drive (the workers compute): no OpenMP team of theirs (see the function)
        self._pool = ThreadPoolExecutor(
            max_workers=max_concurrency,
            thread_name_prefix="verl-step",
            initializer=drive_on_one_openmp_thread,
        )
        self._last_of_role: dict[str, _Node] = {}
        self._unfinished: set[_Node] = set()
        self._dag_nodes: list[_Node] = []
        self._last_dag_nodes: list[_Node] = []
        self.recorder = None
        self._dag = None
        self._flow_log = DataFlowLog()
        if trace:
            from verl.single_controller.trace import TraceRecorder

            self.recorder = TraceRecorder()

    # ------------------------------------------------------------------ roles

    def register_role(self, role: Role) -> WorkerGroup:
        """Start the role's workers (``role.num_workers`` of ``role.worker_class``) and return their group."""
        if role.name in self.roles:
            raise ValueError(f"role {role.name!r} is already registered")
        if role.worker_class is None:
            raise ValueError(
                f"role {role.name!r} has no worker_class: pass Role(..., worker_class=YourWorker) so the "
                "controller knows what computes for it"
            )
        self.groups[role.name] = self._start_group(role)
        self.roles[role.name] = role
        self.restarts[role.name] = 0
        self.fallbacks[role.name] = 0
        return self.groups[role.name]

    def _start_group(self, role: Role) -> WorkerGroup:
        if self.backend == "local":
            from verl.single_controller.local import LocalWorkerGroup

            return LocalWorkerGroup(
                role.worker_class,
                role.num_workers,
                role.init_kwargs,
                name=role.name,
                computes=role.computes,
                exclusive=role.exclusive,
            )
        from verl.single_controller.ray import RayWorkerGroup

        colocate = None
        if role.colocate_with is not None:
            if role.colocate_with not in self.groups:
                raise ValueError(
                    f"role {role.name!r} asks to colocate with {role.colocate_with!r}, which is not "
                    f"registered yet; registered roles: {sorted(self.groups)}"
                )
            colocate = self.groups[role.colocate_with]
        return RayWorkerGroup(
            role.worker_class,
            role.num_workers,
            role.init_kwargs,
            name=role.name,
            num_cpus_per_worker=role.num_cpus_per_worker,
            num_gpus_per_worker=role.num_gpus_per_worker,
            colocate_with=colocate,
            nnodes=role.nnodes,
            call_timeout_s=role.timeout_s,
            heartbeat_timeout_s=role.heartbeat_timeout_s,
        )

    def group(self, role: str) -> WorkerGroup:
        """The worker group of a registered role, for direct calls outside the DAG."""
        try:
            return self.groups[role]
        except KeyError:
            raise KeyError(
                f"role {role!r} is not registered; registered roles: {sorted(self.groups)}"
            ) from None

    # ------------------------------------------------------------------ the DAG

    def step(
        self,
        role: str | Role | None = None,
        method: str | Callable[..., Any] = "",
        inputs: Mapping[str, Any] | None = None,
        outputs: list[str] | tuple[str, ...] = (),
        name: str | None = None,
        background: bool = False,
    ) -> StepOutputs:
        """Add a step: call ``method`` of ``role`` with ``inputs`` (channels or plain values, passed as
        keyword arguments) once they are ready; its result fills the named ``outputs``.

        ``background=True``: the step may outlive the :meth:`dag` block that declares it (asynchronous
        training generates the next batches while this one trains); the block does not wait for it and its
        time is not in that block's timings (the consumer reads it with :meth:`seconds`).

        The result maps to outputs like this: a dict (or other mapping) gives each output the value of
        the same key; a single output name with any other result gets the whole result. A function
        ``method`` without a role runs in the driver. ``name`` labels the step in timings and the trace
        (default: the method's name).
        """
        role_name = role.name if isinstance(role, Role) else (role or DRIVER)
        self._check_step(role_name, method)
        node = _Node(role_name, method, dict(inputs or {}), list(outputs), name)
        with self._lock:
            deps = {value.producer for value in node.inputs.values() if isinstance(value, DataChannel)}
            if role_name != DRIVER and role_name in self._last_of_role:
                deps.add(self._last_of_role[role_name])
            node.deps = {dep for dep in deps if dep is not None}
            node.pending = sum(1 for dep in node.deps if not dep.finished.is_set())
            for dep in node.deps:
                if not dep.finished.is_set():
                    dep.dependents.append(node)
            if role_name != DRIVER:
                self._last_of_role[role_name] = node
            self._unfinished.add(node)
            if not background:
                self._dag_nodes.append(node)
            if self.recorder is not None:
                node.trace_dag = self._current_dag()
                node.trace = self.recorder.add_node(
                    node.trace_dag, role_name, node.name, self._where(role_name)
                )
            ready = node.pending == 0
        if ready:
            self._submit(node)
        return StepOutputs(node)

    def call(
        self, role: str, method: str, *, name: str | None = None, background: bool = False, **inputs: Any
    ) -> DataChannel:
        """:meth:`step` with one output: the channel of ``role.method(**inputs)``'s whole result.

        ``name`` labels the step in timings (``timing_s/<name>``) and the trace; default: the method.
        ``background``: see :meth:`step`.
        """
        label = name or method
        step = self.step(
            role=role, method=method, inputs=inputs, outputs=[label], name=label, background=background
        )
        return step[label]

    @staticmethod
    def seconds(channel: DataChannel) -> float:
        """How long the step that fills ``channel`` ran (after waiting for it)."""
        channel.get()
        node = channel.producer
        if node is None or node.started is None or node.ended is None:
            return 0.0
        return node.ended - node.started

    def driver(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        outputs: Sequence[str] = (),
        background: bool = False,
        **inputs: Any,
    ) -> Any:
        """Run ``fn(**inputs)`` in the driver once its input channels are ready.

        Without ``outputs``: one channel holding the result. With ``outputs=("batch", "metrics")``: a
        tuple of channels, one per key of the dict ``fn`` returns, in that order. ``background``: see
        :meth:`step`.
        """
        label = name or getattr(fn, "__name__", "function")
        step = self.step(
            method=fn, inputs=inputs, outputs=list(outputs) or [label], name=label, background=background
        )
        return tuple(step[key] for key in outputs) if outputs else step[label]

    def _check_step(self, role: str, method: str | Callable) -> None:
        if role == DRIVER:
            if not callable(method):
                raise TypeError(f"a step without a role runs a function in the driver; got method={method!r}")
            return
        if role not in self.groups:
            raise KeyError(
                f"role {role!r} is not registered; call controller.register_role(...) first "
                f"(registered roles: {sorted(self.groups)})"
            )
        if not isinstance(method, str) or not method:
            raise TypeError(f"step on role {role!r} needs a method name, got {method!r}")
        if not callable(getattr(self.groups[role].worker_cls, method, None)):
            raise AttributeError(
                f"role {role!r} ({self.groups[role].worker_cls.__name__}) has no method {method!r}"
            )

    def _submit(self, node: _Node) -> None:
        if self.recorder is not None:
            self.recorder.mark_ready(node.trace)
        self._pool.submit(self._run_node, node)

    def _run_node(self, node: _Node) -> None:
        try:
            failed_inputs = [
                v for v in node.inputs.values() if isinstance(v, DataChannel) and v._error is not None
            ]
            if failed_inputs:
                upstream = failed_inputs[0].producer
                where = upstream.label if upstream is not None else failed_inputs[0].name
                raise StepError(
                    f"step {node.label} did not run: its input {failed_inputs[0].name!r} comes from step "
                    f"{where}, which failed: {failed_inputs[0]._error}",
                    node.role,
                    node.method_name,
                    upstream=True,
                )
            kwargs = {name: resolved(v) for name, v in node.inputs.items()}
            self._record_edges(node, kwargs)
            if self.recorder is not None:
                self.recorder.mark(node.trace, "running")
            node.started = time.perf_counter()
            result = self._call(node, kwargs)
            if self._flow_log.wanted(_flow_label(node)):
                try:
                    self._log_data_flow(node, kwargs, result)
                except Exception:  # a debugging aid never fails the step
                    logger.debug("could not describe the data flow of %s", node.label, exc_info=True)
            self._fill_outputs(node, result)
            if self.recorder is not None:
                self.recorder.mark(node.trace, "done")
        except BaseException as error:  # noqa: BLE001 - every failure must reach the channels, or readers hang
            if not isinstance(error, StepError):
                error = self._step_error(node, error)
            node.error = error
            for channel in node.outputs.values():
                channel._fail(error)
            if self.recorder is not None:
                self.recorder.mark(node.trace, "failed", error=str(error))
            # Log the failure where it happened; the steps it starves only repeat it. Once Ctrl-C or SIGTERM
            # has arrived, steps fail because the run is stopping: not an error to show.
            stopping = sys.modules.get("verl.utils.stopping")
            quiet = error.upstream or (stopping is not None and stopping.armed())
            logger.log(logging.DEBUG if quiet else logging.ERROR, "%s", error)
        finally:
            self._finish(node)

    def _step_error(self, node: _Node, error: BaseException) -> StepError:
        step_error = StepError(f"step {node.label} failed: {error}", node.role, node.method_name)
        step_error.__cause__ = error
        return step_error

    def _call(self, node: _Node, kwargs: dict[str, Any]) -> Any:
        """Run the node's method; on a worker failure apply the role's policy (restart and retry, the
        fallback's result, or fail)."""
        if node.role == DRIVER:
            return node.method(**kwargs)
        group = self.groups[node.role]
        role = self.roles[node.role]
        first_attempt = True
        while True:
            try:
                result = group.call(node.method, **kwargs)
                if first_attempt and hasattr(group, "last_call_worker_s"):  # Ray: its time in the workers
                    node.worker_s = group.last_call_worker_s()
                return result
            except WorkerError as error:
                first_attempt = False
                if role.on_failure != "restart" or self.restarts[node.role] >= role.max_restarts:
                    if role.fallback is not None:
                        return self._fall_back(node, role, error, kwargs)
                    if role.on_failure == "restart":
                        raise WorkerError(
                            error.role,
                            error.rank,
                            error.method,
                            f"{error.cause} (gave up after {self.restarts[node.role]} restarts of this role)",
                            error.kind,
                            error.pid,
                            error.node,
                        ) from error
                    raise
                self.restarts[node.role] += 1
                logger.warning(
                    "%s; restarting role %r (restart %d of at most %d) and retrying %s",
                    error,
                    node.role,
                    self.restarts[node.role],
                    role.max_restarts,
                    node.label,
                )
                group.restart()
                if node.trace is not None:
                    node.trace.attempts += 1

    def _fall_back(self, node: _Node, role: Role, error: WorkerError, kwargs: dict[str, Any]) -> Any:
        """The role's fallback result for a call its workers failed (logged, counted in ``fallbacks``)."""
        self.fallbacks[node.role] += 1
        logger.warning("%s; step %s takes role %r's fallback result", error, node.label, node.role)
        return role.fallback(node.method_name, **kwargs)

    def _fill_outputs(self, node: _Node, result: Any) -> None:
        names = list(node.outputs)
        if isinstance(result, Mapping) and all(name in result for name in names):
            for name in names:
                node.outputs[name]._set(result[name])
        elif len(names) == 1:
            node.outputs[names[0]]._set(result)
        elif names:
            have = sorted(result) if isinstance(result, Mapping) else type(result).__name__
            raise StepError(
                f"step {node.label} declared outputs {names}, but its result has {have}; return a dict with "
                "those keys, or declare a single output to receive the whole result",
                node.role,
                node.method_name,
            )

    def _finish(self, node: _Node) -> None:
        node.ended = time.perf_counter()
        ready = []
        with self._lock:
            node.finished.set()
            self._unfinished.discard(node)
            for dependent in node.dependents:
                dependent.pending -= 1
                if dependent.pending == 0:
                    ready.append(dependent)
            node.dependents = []
            node.inputs = {}  # let big batches go once consumed
            # ... and the steps it waited for: deps is only read when the node is declared, and kept, it
            # chains every node of the run (each role's last node -> its predecessor -> ...) with their
            # output channels' values, so the driver's memory grew every step.
            node.deps = set()
        for dependent in ready:
            self._submit(dependent)

    def wait_all(self, timeout: float | None = None) -> None:
        """Wait until every declared step has finished (successfully or not)."""
        with self._lock:
            nodes = list(self._unfinished)
        for node in nodes:
            node.finished.wait(timeout)

    # ------------------------------------------------------------------ algorithm hook, lifecycle

    def _build_dag(self, plan: Any, step: int, prompts: Any, more: Any) -> Any:
        """Declare the steps of one iteration of the algorithm. A subclass that overrides it is a step of
        its own for ``verl run --controller``: called with the trainer's step plan, the step number, the
        prompts and an iterator of further prompts; returns a ``verl.trainer.step.StepResult``."""
        raise NotImplementedError(f"{type(self).__name__} does not define _build_dag()")

    def shutdown(self, wait: bool = True) -> None:
        """Wait for running steps (unless ``wait`` is false: an interrupted run does not wait for a step stuck
        in a tool, a reward function or an engine call), then stop every role's workers."""
        if wait:
            self.wait_all()
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        for group in self.groups.values():
            group.shutdown()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
