"""Resuming with a changed config: which changes a resumed run may take, and which would make it another run.

The rule: a resumed run is the same run, so every key that shapes what is learned must keep its saved
value: the algorithm, the model, the data, batch and group sizes, the loss and the optimizer and its
learning-rate schedule. Changing one is refused (start a new run for that). Keys that only say how long,
how fast, where or how loudly it runs may change; each change is applied and reported:

- how long: ``trainer.total_training_steps``, ``trainer.total_epochs`` (a longer run continues its schedule)
- how often: ``trainer.save_freq``, ``test_freq``, the checkpoint caps, ``val_before_train``, ``val_only``
- how fast: micro-batch sizes and token budgets per device, ``use_dynamic_bsz``, gradient checkpointing,
  padding removal, prompt sharing, log-prob chunks, ``balance_batch``, ``torch_threads``, ``async_save``,
  ``trainer.backend`` / ``device``, reward workers and time limits
- where and how loudly: logger, names, output paths, traces, ``prepare.*`` (what it builds is compared
  through the paths it fills), the validation set and its sampling (``val_kwargs``)
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from omegaconf import OmegaConf

from verl.errors import RunDirError

MAY_CHANGE = (
    "trainer.total_training_steps",
    "trainer.total_epochs",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
    "trainer.val_before_train",
    "trainer.val_only",
    "trainer.resume_mode",
    "trainer.on_existing_run",
    "trainer.async_save",
    "trainer.torch_threads",
    "trainer.backend",
    "trainer.device",
    "trainer.logger",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.default_local_dir",
    "trainer.rollout_data_dir",  # where samples are dumped: an output path, not what is learned
    "trainer.validation_data_dir",
    "trainer.trace",
    "trainer.trace_path",
    "trainer.on_worker_failure",
    "trainer.max_worker_restarts",
    "trainer.worker_state_freq",
    "trainer.worker_timeout_s",
    "trainer.heartbeat_timeout_s",
    "prepare.*",
    "data.val_files",
    "data.val_batch_size",
    "data.val_max_samples",
    "*.val_kwargs.*",
    "*micro_batch_size*",
    "*max_token_len*",
    "*.use_dynamic_bsz",
    "*.enable_gradient_checkpointing",
    "*.use_remove_padding",
    "*.share_prompts",
    "*.skip_zero_advantage",
    "*.log_prob_chunk_size",
    "trainer.balance_batch",
    "reward_model.num_workers",
    "reward_model.timeout_s",
    "reward_model.num_examine",
    # how many ranks train and how they hold the model: batch sizes are global, and a checkpoint loads on
    # any number of ranks in either strategy (mixed precision, which changes the numbers, must stay)
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "actor_rollout_ref.actor.strategy",
    "*.fsdp_config.fsdp_size",
    "*.fsdp_config.reshard_after_forward",
    "*.fsdp_config.*offload*",
    "*.fsdp_config.wrap_policy.*",
    "*.checkpoint.*",
    # how verl's settings were read: keys with no effect, and what was mapped to this machine (the values
    # used are the keys above and the rest of the config, compared as usual)
    "compat.*",
)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}  # a value, or an empty mapping (reward_kwargs: {})


def _complete(saved: Any) -> dict[str, Any]:
    """The saved config with the keys this verl version added since (at their defaults), so that a key on
    one side only is a real change (an entry of a free-form mapping such as reward_kwargs)."""
    from verl.config import TrainerConfig

    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainerConfig), OmegaConf.create(saved))
    except Exception:  # a config of another version with keys this one lacks: compare it as it is
        merged = OmegaConf.create(saved)
    return OmegaConf.to_container(merged, resolve=True)


def may_change(key: str) -> bool:
    return any(fnmatchcase(key, pattern) for pattern in MAY_CHANGE)


def config_changes(saved: Any, new: Any) -> tuple[list[str], list[str]]:
    """``(refused, applied)``: one ``key: saved -> new`` line per changed key; a key on one side only (an
    entry of a free-form mapping) is a change too."""
    old_flat = _flat(_complete(saved))
    new_flat = _flat(OmegaConf.to_container(OmegaConf.create(new), resolve=True))
    absent = "(absent)"
    refused, applied = [], []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        before, after = old_flat.get(key, absent), new_flat.get(key, absent)
        if before != after:
            line = f"{key}: {before!r} -> {after!r}"
            (applied if may_change(key) else refused).append(line)
    return refused, applied


def _listed(lines: list[str], limit: int = 6) -> str:
    more = f"; and {len(lines) - limit} more" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more


def check_resume_config(saved: Any, new: Any, checkpoint: str) -> list[str]:
    """Refuse a resume that changes the run's meaning; return the changes it applies (for the log)."""
    refused, applied = config_changes(saved, new)
    if refused:
        raise RunDirError(
            f"resuming {checkpoint} with a different run: {_listed(refused)}. A resumed run keeps the "
            "keys that shape what it learns; run with the saved values, or start a new run (another "
            "trainer.default_local_dir or trainer.resume_mode=disable trainer.on_existing_run=move_aside)"
        )
    return applied
