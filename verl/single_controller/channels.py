"""The DAG's parts: a step (``_Node``), the channels its values flow through, and the error of a failed
step. :class:`~verl.single_controller.flow.Controller` builds and runs them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["DataChannel", "StepError", "StepOutputs", "resolved"]

_UNSET = object()


class StepError(RuntimeError):
    """A step of the DAG failed: its own worker failed (``__cause__`` is the :class:`WorkerError`), its
    function raised, or a step it depends on failed."""

    def __init__(self, message: str, role: str, method: str, upstream: bool = False) -> None:
        super().__init__(message)
        self.role = role
        self.method = method
        self.upstream = upstream
        """True when the step did not run because a step it depends on failed."""


class DataChannel:
    """A named value flowing between steps: produced by one step (or given by the program), read by others.

    Reading it waits for the producing step. The seed's examples index and format channels directly
    (``samples["responses"][0]``, ``f"{scores['values'][0]:.3f}"``), so those operations read the value.
    """

    def __init__(self, name: str, producer: _Node | None = None, value: Any = _UNSET) -> None:
        self.name = name
        self.producer = producer
        self._value = value
        self._error: BaseException | None = None
        self._done = threading.Event()
        if value is not _UNSET:
            self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None) -> Any:
        """The value, waiting for the producing step; raises its :class:`StepError` if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"channel {self.name!r} not ready after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    @property
    def value(self) -> Any:
        return self.get()

    def _set(self, value: Any) -> None:
        self._value = value
        self._done.set()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def __getitem__(self, key: Any) -> Any:
        return self.get()[key]

    def __len__(self) -> int:
        return len(self.get())

    def __bool__(self) -> bool:
        # Without this, `if channel:` would fall back to __len__ and silently wait for the value.
        return True

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __format__(self, spec: str) -> str:
        return format(self.get(), spec)

    def __float__(self) -> float:
        return float(self.get())

    def __repr__(self) -> str:
        source = f"{self.producer.role}.{self.producer.method_name}" if self.producer else "program"
        state = "ready" if self.ready() else "pending"
        return f"DataChannel({self.name!r} from {source}, {state})"


def resolved(item: Any) -> Any:
    """A channel's value (waiting for it), or ``item`` itself when it is a plain value."""
    return item.get() if isinstance(item, DataChannel) else item


class StepOutputs(Mapping[str, DataChannel]):
    """The named output channels of one step (``outputs=[...]``)."""

    def __init__(self, node: _Node) -> None:
        self._node = node

    def __getitem__(self, name: str) -> DataChannel:
        try:
            return self._node.outputs[name]
        except KeyError:
            raise KeyError(
                f"step {self._node.label} has no output {name!r}; its outputs are {list(self._node.outputs)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._node.outputs)

    def __len__(self) -> int:
        return len(self._node.outputs)

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the step and return its output values by name."""
        self._node.finished.wait(timeout)
        if self._node.error is not None:
            raise self._node.error
        return {name: channel.get() for name, channel in self._node.outputs.items()}


class _Node:
    """One step of the DAG: a call of ``method`` on ``role`` with named inputs and outputs."""

    def __init__(
        self, role: str, method: str | Callable, inputs: dict[str, Any], outputs: list[str], name: str | None
    ) -> None:
        self.role = role
        self.method = method
        self.method_name = method if isinstance(method, str) else getattr(method, "__name__", "function")
        self.name = name or self.method_name
        self.inputs = inputs
        self.outputs = {name: DataChannel(name, producer=self) for name in outputs}
        self.deps: set[_Node] = set()
        self.dependents: list[_Node] = []
        self.pending = 0
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.started: float | None = None
        self.ended: float | None = None
        self.worker_s: float | None = None  # of its wall time, the seconds in worker processes (Ray)
        self.trace: Any = None  # a NodeTrace when the controller records a trace
        self.trace_dag: Any = None

    @property
    def label(self) -> str:
        return f"{self.role}.{self.method_name}"
