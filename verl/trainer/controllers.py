"""Choosing what runs one RL step: a step function (``trainer.step``) or a Controller class
(``trainer.controller``) whose ``_build_dag`` declares the step, as in seed 000."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from verl.algorithms import estimator_needs
from verl.config.errors import ConfigError
from verl.protocol import DataProto
from verl.single_controller.flow import Controller
from verl.trainer.plan import StepPlan
from verl.trainer.step import StepFn, StepResult, rl_step
from verl.utils.imports import load_object


class GRPOController(Controller):
    """Seed 000's ``class GRPOController(Controller)``: GRPO's step is the general RL step with a group
    estimator and no critic; this controller checks that the config says so, then declares it.
    ``verl run --controller GRPOController`` runs it."""

    def _build_dag(self, plan: StepPlan, step: int, prompts: DataProto, more: Any) -> StepResult:
        if plan.critic or not estimator_needs(plan.algorithm.adv_estimator).groups:
            raise ValueError(
                "GRPOController runs critic-free group estimators (grpo, grpo_passk, rloo, ...); "
                f"algorithm.adv_estimator={plan.algorithm.adv_estimator} is not one"
            )
        return rl_step(self, plan, step, prompts, more)


BUILTIN_CONTROLLERS: dict[str, type[Controller]] = {
    "Controller": Controller,
    "RLTrainer": Controller,  # the default: a plain Controller running trainer.step (rl_step)
    "PPOController": Controller,
    "GRPOController": GRPOController,
}


def load_controller_class(name: str) -> type[Controller]:
    """``trainer.controller``: a built-in name, ``package.module:Class`` or ``path/to/file.py:Class``."""
    if name in BUILTIN_CONTROLLERS:
        return BUILTIN_CONTROLLERS[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, BUILTIN_CONTROLLERS, n=1)
        raise ConfigError(
            f"trainer.controller={name!r} is not a built-in controller ({', '.join(BUILTIN_CONTROLLERS)})"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + "; a user controller is written module:Class or path/to/file.py:Class"
        )
    cls = load_object(name, "trainer.controller", "Controller class")
    if not (isinstance(cls, type) and issubclass(cls, Controller)):
        raise ConfigError(f"trainer.controller={name!r} is not a Controller subclass (got {cls!r})")
    return cls


def load_step_function(spec: str | None, controller: Controller) -> StepFn:
    """The step function: ``trainer.step`` when set, else the controller's own ``_build_dag``, else
    :func:`rl_step`. A step function is called ``fn(flow, plan, step, prompts, more) -> StepResult``."""
    own_dag = type(controller)._build_dag is not Controller._build_dag
    if spec:
        if own_dag:
            raise ConfigError(
                f"trainer.step={spec!r} and trainer.controller={type(controller).__name__} (which defines its "
                "own _build_dag) both say what a step is; set one of them"
            )
        fn = load_object(spec, "trainer.step", "step function")
        params = list(inspect.signature(fn).parameters) if callable(fn) else []
        if not callable(fn) or len(params) < 5:
            raise ConfigError(
                f"trainer.step={spec!r} must be a function (flow, plan, step, prompts, more) -> StepResult, like "
                "verl.trainer.step.rl_step"
            )
        return fn
    if own_dag:
        return lambda flow, plan, step, prompts, more: flow._build_dag(plan, step, prompts, more)
    return rl_step
