"""``trainer.checkpoint_callback_class``: a driver-side hook called after each checkpoint save, as in verl 0.9.1
(``verl/trainer/ppo/checkpoint_callback.py``, importable here under the same name).

The key names a :class:`CheckpointCallback` subclass by its fully qualified name (``my_pkg.callbacks.Upload``).
The trainer builds it once, at construction, with ``cls(config=<the whole config>)``, and calls
``on_save(trainer=<the RLTrainer>, global_step=N, checkpoint_dir=<.../global_step_N>, async_save=<bool>)`` in
the driver after every checkpoint save. With ``trainer.async_save=false`` the checkpoint is complete and in
place when the hook runs; with ``true`` it is still being written in the background (``async_save=True``): the
hook must not assume it durable yet. An exception in the hook stops training, as in verl: callbacks upload
checkpoints or register model versions, and a swallowed failure would lose one silently. Wrap the body in
``try/except`` for best-effort behaviour.
"""

from __future__ import annotations

import importlib
from typing import Any

from verl.errors import UserError

KEY = "trainer.checkpoint_callback_class"


class CheckpointCallbackError(UserError):
    """A checkpoint callback could not be loaded, or its ``on_save`` raised: training stops."""

    label = "checkpoint callback error"


class CheckpointCallback:
    """No-op base class (verl's): subclass it and override :meth:`on_save`, accepting ``**kwargs``."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def on_save(
        self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs: Any
    ) -> None:
        """Called after the checkpoint of ``global_step`` was saved to ``checkpoint_dir``."""


def load_callback_class(fqn: str) -> type:
    """The class named ``module.Class`` (verl's ``load_class_from_fqn``), or a :class:`CheckpointCallbackError`
    saying which part is missing."""
    module_name, dot, class_name = str(fqn).rpartition(".")
    if not dot or not module_name or not class_name:
        raise CheckpointCallbackError(
            f"{KEY}={fqn}: expected a fully qualified class name (e.g. my_pkg.callbacks.MyCheckpointCallback)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CheckpointCallbackError(
            f"{KEY}={fqn}: cannot import module '{module_name}': {error}"
        ) from error
    if not hasattr(module, class_name):
        raise CheckpointCallbackError(f"{KEY}={fqn}: module '{module_name}' has no class '{class_name}'")
    return getattr(module, class_name)


def build_checkpoint_callback(config: Any) -> CheckpointCallback:
    """The callback ``trainer.checkpoint_callback_class`` names, built with ``config=config``; a no-op
    :class:`CheckpointCallback` when it is null or empty."""
    fqn = config.trainer.get("checkpoint_callback_class", None)
    if not fqn:
        return CheckpointCallback(config=config)
    callback_cls = load_callback_class(fqn)
    try:
        return callback_cls(config=config)
    except Exception as error:
        raise CheckpointCallbackError(
            f"{KEY}={fqn}: building it with {callback_cls.__name__}(config=...) raised "
            f"{type(error).__name__}: {error}"
        ) from error


def notify_saved(callback: CheckpointCallback, trainer: Any, step: int, checkpointer: Any) -> None:
    """Call ``callback.on_save`` for the checkpoint of ``step`` that ``checkpointer``
    (:class:`verl.trainer.checkpointing.Checkpointer`) committed; an exception stops training, named."""
    from verl.utils.checkpoint import step_dir

    checkpoint_dir, async_save = step_dir(checkpointer.root, step), bool(checkpointer.background)
    try:
        callback.on_save(
            trainer=trainer, global_step=step, checkpoint_dir=str(checkpoint_dir), async_save=async_save
        )
    except Exception as error:
        name = f"{type(callback).__module__}.{type(callback).__qualname__}"
        raise CheckpointCallbackError(
            f"{KEY}={name}: on_save(global_step={step}, checkpoint_dir={checkpoint_dir}) raised "
            f"{type(error).__name__}: {error}. Training stops, as in verl (a failed upload must not go "
            "unnoticed); the checkpoint itself was saved. Catch the error in on_save for best effort"
        ) from error


__all__ = ["CheckpointCallback", "CheckpointCallbackError", "build_checkpoint_callback", "notify_saved"]
