"""Operators: an RL step written as a pipeline, ``rollout >> reward >> advantage >> training``.

Each operator does two things:

* it contributes **config overrides** (dotted TrainerConfig keys): ``RolloutOperator(engine="hf",
  n_samples_per_prompt=5)`` sets ``actor_rollout_ref.rollout.name=hf`` and ``actor_rollout_ref.rollout.n=5``;
* a ``RewardOperator`` may bring its own scoring function.

The flow then runs the one RL step every trainer runs (:func:`verl.trainer.step.rl_step`) on an
:class:`~verl.trainer.rl_trainer.RLTrainer`: operators are another way to write the config of that
step, not another copy of it.

Example::

    rollout_task = RolloutOperator(model="path/to/model", engine="hf", n_samples_per_prompt=5)
    reward_task = RewardOperator(reward_fn="arithmetic")
    adv_task = GRPOAdvantageOperator(baseline="group_mean")
    train_task = TrainingOperator(engine="dp", loss_components=["policy_loss", "kl_loss"])
    training_flow = rollout_task >> reward_task >> adv_task >> train_task
    summary = training_flow.run(overrides=["data.train_files=...", "trainer.total_training_steps=2"])

``>>`` checks the order as the flow is written (a reward needs a rollout before it, an advantage a
reward, the training an advantage), so a wrong pipeline fails where it is written, not at step one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verl.trainer.rl_trainer import RLTrainer
from verl.trainer.seed_api import scoring_function

__all__ = [
    "Flow",
    "GRPOAdvantageOperator",
    "Operator",
    "RewardOperator",
    "RolloutOperator",
    "TrainingOperator",
]

ComputeScore = Callable[..., Any]

# baseline name -> (algorithm.adv_estimator, algorithm.norm_adv_by_std_in_grpo)
BASELINES = {
    "group_mean": ("grpo", True),  # GRPO: (r - group mean) / group std
    "group_mean_no_std": ("grpo", False),  # Dr. GRPO: r - group mean
    "leave_one_out": ("rloo", True),  # RLOO: r - mean of the other responses of the group
}

# training engine name -> actor_rollout_ref.actor.strategy
TRAINING_ENGINES = {"fsdp2": "fsdp2", "fsdp": "fsdp2", "dp": "dp", "ddp": "dp"}
NOT_BUILT_ENGINES = ("megatron",)

LOSS_COMPONENTS = ("policy_loss", "kl_loss", "entropy")


class Operator:
    """One stage of a :class:`Flow`.

    ``kind`` names the stage; ``requires`` lists the kinds that must come earlier in the flow.
    Subclasses return their config overrides from :meth:`overrides`.
    """

    kind: str = ""
    requires: tuple[str, ...] = ()

    def overrides(self) -> dict[str, Any]:
        """Dotted TrainerConfig keys this operator sets (e.g. ``{"actor_rollout_ref.rollout.n": 5}``)."""
        return {}

    def __rshift__(self, other: Operator | Flow) -> Flow:
        return Flow([self]) >> other

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({settings})"


class RolloutOperator(Operator):
    """Repeat each prompt ``n_samples_per_prompt`` times (one group) and sample responses.

    ``engine`` is a rollout engine registered in ``verl.workers.rollout`` (``hf``, ``dummy``, ...); it
    sets ``actor_rollout_ref.rollout.name`` and nothing else, so swapping engines changes nothing else.
    ``model`` (a model directory) sets ``actor_rollout_ref.model.path``; None keeps the config's.
    """

    kind = "rollout"

    def __init__(
        self,
        model: str | Path | None = None,
        engine: str = "hf",
        n_samples_per_prompt: int = 8,
        temperature: float | None = None,
    ) -> None:
        from verl.workers.rollout import ROLLOUT_REGISTRY

        if engine not in ROLLOUT_REGISTRY:
            raise ValueError(
                f"RolloutOperator(engine={engine!r}): no such rollout engine; registered engines: "
                f"{', '.join(sorted(ROLLOUT_REGISTRY))}"
            )
        if n_samples_per_prompt < 1:
            raise ValueError(
                f"RolloutOperator: n_samples_per_prompt must be >= 1, got {n_samples_per_prompt}"
            )
        self.model = model
        self.engine = engine
        self.n_samples_per_prompt = n_samples_per_prompt
        self.temperature = temperature

    def overrides(self) -> dict[str, Any]:
        keys: dict[str, Any] = {
            "actor_rollout_ref.rollout.name": self.engine,
            "actor_rollout_ref.rollout.n": self.n_samples_per_prompt,
        }
        if self.model is not None:
            keys["actor_rollout_ref.model.path"] = str(self.model)
        if self.temperature is not None:
            keys["actor_rollout_ref.rollout.temperature"] = self.temperature
        return keys


class RewardOperator(Operator):
    """Score every response with ``reward_fn``.

    ``reward_fn`` is a built-in scorer name (``arithmetic``, ``gsm8k``, ...: every response is scored by
    it, whatever its ``data_source``), a function ``compute_score(data_source, solution_str, ground_truth,
    extra_info=None) -> float | dict`` (it must pickle for ``trainer.backend=ray``), or None to choose the
    scorer by each sample's ``data_source`` (the config's default). The same function scores validation.
    """

    kind = "reward"
    requires = ("rollout",)

    def __init__(self, reward_fn: str | ComputeScore | None = None) -> None:
        self.reward_fn = reward_fn
        self.compute_score = scoring_function(reward_fn, f"RewardOperator(reward_fn={reward_fn!r})")


class GRPOAdvantageOperator(Operator):
    """Group-relative advantages, critic-free: each response's reward against its group's baseline.

    ``baseline``: ``group_mean`` (GRPO: minus the group mean, divided by the group std),
    ``group_mean_no_std`` (Dr. GRPO: no std division, which biases towards easy/hard prompts less) or
    ``leave_one_out`` (RLOO: minus the mean of the group's other responses).

    """

    kind = "advantage"
    requires = ("reward",)

    def __init__(self, baseline: str = "group_mean") -> None:
        if baseline not in BASELINES:
            raise ValueError(
                f"GRPOAdvantageOperator(baseline={baseline!r}): choose one of {', '.join(BASELINES)}"
            )
        self.baseline = baseline

    def overrides(self) -> dict[str, Any]:
        estimator, norm_by_std = BASELINES[self.baseline]
        return {
            "algorithm.adv_estimator": estimator,
            "algorithm.norm_adv_by_std_in_grpo": norm_by_std,
            "critic.enable": False,
        }


class TrainingOperator(Operator):
    """Update the policy on the batch with advantages.

    ``engine``: ``fsdp2`` (alias ``fsdp``): the weights, gradients and optimizer state sharded over the
    ``trainer.n_gpus_per_node`` Ray workers (``trainer.backend=ray``); ``dp`` (alias ``ddp``): each worker
    holds the whole model, DDP between them. Megatron is not built.
    ``loss_components``: ``policy_loss`` (required), ``kl_loss`` (``actor.use_kl_loss``, coefficient
    ``kl_loss_coef``) and ``entropy`` (an entropy bonus with ``entropy_coeff``).
    """

    kind = "training"
    requires = ("advantage",)

    def __init__(
        self,
        engine: str = "dp",
        loss_components: Sequence[str] = ("policy_loss",),
        kl_loss_coef: float | None = None,
        entropy_coeff: float = 1e-3,
    ) -> None:
        self.engine = engine
        self._strategy = _training_strategy(engine)
        self.loss_components = tuple(loss_components)
        _check_loss_components(self.loss_components)
        self.kl_loss_coef = kl_loss_coef
        self.entropy_coeff = entropy_coeff

    def overrides(self) -> dict[str, Any]:
        keys: dict[str, Any] = {
            "actor_rollout_ref.actor.strategy": self._strategy,
            "actor_rollout_ref.actor.use_kl_loss": "kl_loss" in self.loss_components,
            "actor_rollout_ref.actor.entropy_coeff": (
                self.entropy_coeff if "entropy" in self.loss_components else 0.0
            ),
        }
        if self.kl_loss_coef is not None:
            keys["actor_rollout_ref.actor.kl_loss_coef"] = self.kl_loss_coef
        return keys


class Flow:
    """Operators in pipeline order; ``>>`` returns a new, longer flow (a flow is never changed in place)."""

    STAGES = ("rollout", "reward", "advantage", "training")

    def __init__(self, operators: Sequence[Operator] = ()) -> None:
        self.operators: tuple[Operator, ...] = ()
        for operator in operators:
            self.operators = self._append(operator)

    def _append(self, operator: Operator) -> tuple[Operator, ...]:
        if not isinstance(operator, Operator):
            raise TypeError(f"a flow is built from operators; got {type(operator).__name__} {operator!r}")
        kinds = [op.kind for op in self.operators]
        name = type(operator).__name__
        if operator.kind in kinds:
            raise ValueError(f"{name}: this flow already has a {operator.kind} operator ({self})")
        missing = [kind for kind in operator.requires if kind not in kinds]
        if missing:
            raise ValueError(
                f"{name} needs a {' and a '.join(missing)} operator before it, but the flow so far is "
                f"{self or 'empty'}; write the flow in the order {' >> '.join(self.STAGES)}"
            )
        return (*self.operators, operator)

    def __rshift__(self, other: Operator | Flow) -> Flow:
        flow = Flow(self.operators)
        for operator in other.operators if isinstance(other, Flow) else [other]:
            flow.operators = flow._append(operator)
        return flow

    def __bool__(self) -> bool:
        return bool(self.operators)

    def __str__(self) -> str:
        return " >> ".join(type(op).__name__ for op in self.operators)

    def __repr__(self) -> str:
        return f"Flow({list(self.operators)!r})"

    def check_complete(self) -> None:
        """A flow that trains needs every stage; say which are missing."""
        missing = [kind for kind in self.STAGES if kind not in {op.kind for op in self.operators}]
        if missing:
            raise ValueError(
                f"the flow {self or '(empty)'} cannot train: it has no {', '.join(missing)} operator; a "
                f"training flow is {' >> '.join(self.STAGES)}"
            )

    def overrides(self) -> list[str]:
        """``key=value`` overrides contributed by the operators, in flow order."""
        return [f"{key}={_yaml(value)}" for op in self.operators for key, value in op.overrides().items()]

    def config(self, config: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
        """The TrainerConfig: recipe ``config`` (None = grpo) <- the operators' settings <- ``overrides``.

        An override of a key an operator sets is refused: the operator argument is the one place to set it.
        """
        from verl.config import load_config

        _check_conflicts(self.operators, overrides)
        return load_config(config, [*self.overrides(), *overrides])

    def build(self, config: str | Path | None = None, overrides: Sequence[str] = ()) -> RLTrainer:
        """Load the config, write missing inputs (as ``verl run`` does, when ``prepare.enable``) and start the
        roles' workers; ``fit()`` on the result trains."""
        from verl.trainer.prepare import prepare_inputs

        self.check_complete()
        loaded = prepare_inputs(self.config(config, overrides))
        reward = next(op for op in self.operators if isinstance(op, RewardOperator))
        return RLTrainer(loaded, compute_score=reward.compute_score)

    def run(self, config: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
        """Train (``trainer.total_training_steps`` RL steps) and return the trainer's summary."""
        trainer = self.build(config, overrides)
        try:
            return trainer.fit()
        finally:
            trainer.shutdown()


# ---------------------------------------------------------------------------------------- helpers


def _training_strategy(engine: str) -> str:
    if engine in TRAINING_ENGINES:
        return TRAINING_ENGINES[engine]
    available = ", ".join(TRAINING_ENGINES)
    if engine in NOT_BUILT_ENGINES:
        raise ValueError(
            f"TrainingOperator(engine={engine!r}): {engine} is not built in this repository; available: "
            f"{available} (set trainer.backend=ray and trainer.n_gpus_per_node=N for N workers)"
        )
    raise ValueError(f"TrainingOperator(engine={engine!r}): unknown engine; available: {available}")


def _check_loss_components(components: tuple[str, ...]) -> None:
    unknown = [c for c in components if c not in LOSS_COMPONENTS]
    if unknown:
        raise ValueError(
            f"TrainingOperator: unknown loss component(s) {unknown}; valid: {', '.join(LOSS_COMPONENTS)}"
        )
    if "policy_loss" not in components:
        raise ValueError(
            f"TrainingOperator: loss_components={list(components)} has no 'policy_loss'; the update needs it"
        )


def _check_conflicts(operators: Sequence[Operator], overrides: Sequence[str]) -> None:
    owners = {key: op for op in operators for key in op.overrides()}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+")
        if key in owners:
            raise ValueError(
                f"override {override!r} sets a key that {owners[key]!r} sets; change the operator's "
                "argument instead"
            )


def _yaml(value: Any) -> str:
    """An override value as ``load_config`` parses it (YAML): strings quoted (a path may hold ``:`` or
    ``#``), booleans lower-case, numbers as written."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
