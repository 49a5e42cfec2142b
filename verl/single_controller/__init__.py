"""The single-controller control plane: one driver calls methods on a group of workers as on one object.

``Worker`` subclasses mark methods with ``@register(dispatch_mode=...)``; a worker group (here the
in-process :class:`LocalWorkerGroup`) exposes those methods and splits / merges each call per its
:class:`Dispatch` mode.
"""

from verl.single_controller.base import WorkerGroup
from verl.single_controller.dispatch import Dispatch, DispatchError, register_dispatch_mode
from verl.single_controller.errors import WorkerError
from verl.single_controller.local import LocalWorkerGroup
from verl.single_controller.worker import Worker, register

__all__ = [
    "Dispatch",
    "DispatchError",
    "LocalWorkerGroup",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "register",
    "register_dispatch_mode",
]
