"""Loading the scoring function of ``custom_reward_function`` (a user file), from a typed
:class:`verl.config.TrainerConfig`; the reward manager that calls it is built in
:mod:`verl.workers.reward.factory`."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from difflib import get_close_matches
from functools import partial
from typing import Any

from verl.config.errors import ConfigError
from verl.errors import InputError
from verl.utils.imports import import_file
from verl.utils.paths import missing_path_hint
from verl.workers.reward.awaiting import run_to_completion
from verl.workers.reward.scoring import ComputeScoreFn


def load_custom_reward_function(
    path: str | os.PathLike[str],
    name: str = "compute_score",
    *,
    path_key: str = "custom_reward_function.path",
    name_key: str = "custom_reward_function.name",
) -> ComputeScoreFn:
    """Import ``name`` from the Python file at ``path`` (a user-provided scoring function); a missing file,
    a file that fails to import, or a missing or non-callable ``name`` is an error naming the key
    (``path_key`` / ``name_key``: the config keys that gave them)."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(path):
        raise InputError(f"{path_key}={path} does not exist{missing_path_hint(path, ('.py',))}")
    module = import_file(path)
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        close = get_close_matches(name, available, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{name_key}={name!r}: {path} has no such function (it defines: "
            f"{', '.join(available) or 'no functions'}){hint}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise ConfigError(f"{name_key}={name!r}: in {path} it is a {type(fn).__name__}, not a function")
    return run_to_completion(fn) if inspect.iscoroutinefunction(fn) else fn


def get_custom_reward_fn(
    config: Any, client_kwargs: Mapping[str, Any] | None = None
) -> ComputeScoreFn | None:
    """The function named by ``config.custom_reward_function`` (with its ``reward_kwargs``), or None.
    ``client_kwargs``: a generative reward model's ``reward_router_address`` and ``reward_model_tokenizer``,
    bound to it as far as its signature takes them (:func:`accepted_kwargs`)."""
    section = config.custom_reward_function
    if not section.path:
        return None
    fn = load_custom_reward_function(section.path, section.name)
    kwargs = {**accepted_kwargs(fn, client_kwargs or {}), **dict(section.reward_kwargs)}
    return partial(fn, **kwargs) if kwargs else fn


def accepted_kwargs(fn: Any, offered: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``offered`` that ``fn`` takes as keyword arguments: those it names, or all with
    ``**kwargs`` (verl calls a reward function with a generative reward model's two arguments whatever its
    signature; here a function written without them keeps working)."""
    if not offered:
        return {}
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: pass nothing
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {key: value for key, value in offered.items() if key in named}
