"""What the ``verl`` subcommands read from their command line, shared by :mod:`verl.cli` and
:mod:`verl.doctor.cli` (``verl doctor`` diagnoses the run ``verl run`` would start from the same arguments):
the config source (``--config``, or verl's Hydra pair ``--config-path`` / ``--config-name``), ``--debug``, and
the recipe lines the start-up log shows.

The config package is imported inside the functions: ``verl --version`` and ``verl --help`` stay fast.
"""

from __future__ import annotations

import argparse
import os


def config_source(args: argparse.Namespace) -> str | None:
    """``--config`` or verl's Hydra pair ``--config-path DIR --config-name NAME`` (a file ``DIR/NAME.yaml``;
    a name alone is one of our recipes: ``ppo_trainer`` holds verl's defaults). verl's scripts pass
    ``--config-path=config``, which Hydra reads next to verl's own module: a relative directory that is not
    here falls back to the recipes of that name."""
    from verl.config import ConfigError
    from verl.config.loader import list_recipes

    path, name = getattr(args, "config_path", None), getattr(args, "config_name", None)
    if path is None and name is None:
        return args.config
    if args.config is not None:
        raise ConfigError("give either --config or verl's --config-path / --config-name, not both")
    if name is None:
        raise ConfigError(f"--config-path {path} needs --config-name (the YAML file in it, e.g. ppo_trainer)")
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    if "megatron" in stem:
        raise ConfigError(f"--config-name {name}: Megatron training is not built here; use ppo_trainer")
    if path is not None:
        file = os.path.join(os.path.expanduser(path), f"{stem}.yaml")
        if os.path.isfile(file):
            return file
        if os.path.isabs(os.path.expanduser(path)) or stem not in list_recipes():
            raise ConfigError(f"--config-path {path} --config-name {name}: no file {file}")
    return stem


def debug_requested(args: argparse.Namespace) -> bool:
    """``--debug`` or ``VERL_DEBUG``: show the Python traceback of user errors too."""
    return bool(getattr(args, "debug", False)) or os.environ.get("VERL_DEBUG", "") not in ("", "0")


SETTINGS_SHOWN = (
    ("data.train_batch_size", "prompts/step"),
    ("actor_rollout_ref.rollout.n", "samples/prompt"),
    ("data.max_prompt_length", "prompt tokens"),
    ("data.max_response_length", "response tokens"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "prompts/optimizer step"),
    ("actor_rollout_ref.actor.optim.lr", "lr"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "warm-up steps"),
    ("actor_rollout_ref.model.attn_implementation", "attention"),
    ("trainer.torch_threads", "torch threads"),
)
"""the settings the start-up log shows: the ones a recipe tuned for one model gets wrong for another"""


def recipe_lines(source: str | None, overrides: list[str], config) -> list[str]:
    """Which recipe a run uses and why (``source``: what :func:`config_source` gave), and the settings that
    most depend on it (for the start-up log)."""
    from omegaconf import OmegaConf

    from verl.config import TrainerConfig
    from verl.config.loader import default_recipe

    if source is None:
        name, why = default_recipe(TrainerConfig, overrides)
        head = f"recipe: {name} ({why})"
    else:
        head = f"recipe: {source}"
    values = ((label, OmegaConf.select(config, key)) for key, label in SETTINGS_SHOWN)
    shown = ", ".join(f"{label} {'default' if value is None else value}" for label, value in values)
    return [head, f"settings: {shown}"]
