"""verl's import path for the worker decorator: ``from verl.single_controller.base.decorator import register,
Dispatch``. A thin re-export of :mod:`verl.single_controller.worker` and :mod:`verl.single_controller.dispatch`."""

from verl.single_controller.dispatch import Dispatch
from verl.single_controller.worker import register

__all__ = ["Dispatch", "register"]
