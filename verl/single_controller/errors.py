"""Errors a worker group raises, naming the role, the rank and the cause instead of a bare "actor died"."""

from __future__ import annotations

from verl.errors import describe_error  # noqa: F401  (re-exported: the workers' cause line)

__all__ = ["WorkerError", "describe_error"]


class WorkerError(RuntimeError):
    """One worker of a group failed a call.

    ``kind`` says how: ``"exception"`` (the method raised), ``"died"`` (the worker's process is gone:
    killed, crashed), ``"oom"`` (killed for using too much memory) or ``"hung"`` (no result within the
    group's call deadline, or its process stopped answering heartbeats). ``cause`` is a one-line
    description of the underlying error; the original exception, when there is one, is ``__cause__``.
    ``node`` says where the worker ran on a Ray cluster (its node's short id and address).
    """

    def __init__(
        self,
        role: str,
        rank: int,
        method: str,
        cause: str,
        kind: str = "exception",
        pid: int | None = None,
        node: str | None = None,
    ) -> None:
        self.role = role
        self.rank = rank
        self.method = method
        self.cause = cause
        self.kind = kind
        self.pid = pid
        self.node = node
        details = [f"pid {pid}"] if pid is not None else []
        details += [f"node {node}"] if node is not None else []
        where = f"role {role!r} rank {rank}" + (f" ({', '.join(details)})" if details else "")
        what = {
            "exception": "raised an error",
            "died": "died",
            "oom": "ran out of memory",
            "hung": "stopped responding",
        }
        what = what.get(kind, kind)
        super().__init__(f"{where} {what} in {method}: {cause}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.role, self.rank, self.method, self.cause, self.kind, self.pid, self.node))
