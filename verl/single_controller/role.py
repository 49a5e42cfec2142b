"""Role: a named participant of the control flow (:class:`verl.single_controller.flow.Controller`) and the
worker class that computes for it, with its workers' count, placement, resources, call deadlines and failure
policy; and :data:`DRIVER`, the name of the steps that run in the driver itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DRIVER = "driver"


@dataclass
class Role:
    """A named participant of the control flow and the worker class that computes for it.

    ``role_type`` is descriptive (actor, critic, reward_model, reference_model, rollout, ...).
    ``num_workers`` ranks are started; ``colocate_with`` names a registered role whose worker
    processes this role shares (Ray backend; in-process every role shares the driver's process).
    ``num_cpus_per_worker`` / ``num_gpus_per_worker`` are the Ray resources each rank reserves;
    ``nnodes`` spreads the ranks over that many Ray nodes (a role colocated with another goes where its
    processes are). ``timeout_s`` is the Ray backend's deadline for each call: a rank without a result by
    then fails the call as hung, named with its Python stack; so does a rank whose process answers no
    heartbeat for ``heartbeat_timeout_s``, as soon as that is seen.
    ``computes=False`` says the role's workers run no heavy torch work (a rule-based reward): in-process,
    their thread then runs torch ops on one OpenMP thread and holds no OpenMP team that would slow the
    computing threads' (:func:`verl.utils.threads.drive_on_one_openmp_thread`).
    ``exclusive=True`` says each call of the role computes on every core the process computes with (torch with
    more than one thread): in-process, exclusive roles take turns on one thread, as verl's colocated roles take
    turns on their GPUs, where side by side their OpenMP teams would contend for the same cores (with Ray each
    worker is a process of its own and this has no effect).
    ``on_failure`` is ``"fail"``, ``"restart"`` (rebuild the workers, restore their saved state,
    retry the step, at most ``max_restarts`` times over the run) or ``"fallback"``: a failed call's result is
    ``fallback(method_name, **inputs)`` instead (degraded, e.g. cached scores), logged and counted in
    ``Controller.fallbacks``. A ``fallback`` given with ``"restart"`` answers once the restarts are used up.
    """

    name: str
    role_type: str = "custom"
    worker_class: type | None = None
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 1
    colocate_with: str | None = None
    num_cpus_per_worker: float = 0.0
    num_gpus_per_worker: float = 0.0
    nnodes: int = 1
    timeout_s: float | None = None
    heartbeat_timeout_s: float | None = None
    on_failure: str = "fail"
    max_restarts: int = 3
    fallback: Callable[..., Any] | None = None
    computes: bool = True
    exclusive: bool = False

    def __post_init__(self) -> None:
        if self.on_failure not in ("fail", "restart", "fallback"):
            raise ValueError(
                f"Role {self.name!r}: on_failure must be 'fail', 'restart' or 'fallback', got {self.on_failure!r}"
            )
        if self.fallback is not None and self.on_failure == "fail":
            raise ValueError(
                f"Role {self.name!r}: fallback= answers failed calls with on_failure='fallback' (or 'restart', once "
                "the restarts are used up); with on_failure='fail' a failure fails the step"
            )
        if self.on_failure == "fallback" and not callable(self.fallback):
            raise ValueError(
                f"Role {self.name!r}: on_failure='fallback' needs fallback=, a function (method_name, **inputs) "
                "-> the result to use when a call fails"
            )
        if self.name == DRIVER:
            raise ValueError(
                f"{DRIVER!r} is reserved for functions that run in the driver; choose another role name"
            )
