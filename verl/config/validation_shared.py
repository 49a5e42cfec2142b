"""The value rules the RL trainer config (:mod:`verl.config.validation`) and the SFT config share, and the
actor_rollout_ref sections' rules (:mod:`verl.config.validation_workers`) build on: an optimizer section, the
trainer loop keys, ``data.apply_chat_template_kwargs`` and the LoRA keys of a model section. Written with the
checks of ``value_rules.py``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.config.errors import short_repr
from verl.config.value_rules import (
    check_at_least,
    check_choice,
    check_in_range,
    check_off_or_at_least,
    check_seed,
    check_torch_threads,
)
from verl.utils.trackers import BUILT as BUILT_TRACKERS
from verl.utils.trackers import missing_packages

ON_EXISTING_RUN = ("refuse", "move_aside")
LOGGERS = BUILT_TRACKERS
LR_SCHEDULERS = ("constant", "cosine")

ARR = "actor_rollout_ref"

CHAT_TEMPLATE_OWN_ARGS = (
    "conversation",
    "add_generation_prompt",
    "tokenize",
    "continue_final_message",
    "return_dict",
    "return_tensors",
)
"""arguments of ``apply_chat_template`` that verl sets itself when rendering prompts"""


def optim_errors(errors: list[str], prefix: str, optim: Any) -> None:
    check_choice(errors, f"{prefix}.lr_scheduler_type", optim.lr_scheduler_type, LR_SCHEDULERS)
    check_in_range(errors, f"{prefix}.lr", optim.lr, 0)
    check_in_range(errors, f"{prefix}.weight_decay", optim.weight_decay, 0)
    check_off_or_at_least(
        errors, f"{prefix}.lr_warmup_steps", optim.lr_warmup_steps, -1, "use lr_warmup_steps_ratio", 0
    )
    check_in_range(errors, f"{prefix}.lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio, 0, 1)
    check_in_range(errors, f"{prefix}.min_lr_ratio", optim.min_lr_ratio, 0, 1)
    if len(optim.betas) != 2:
        errors.append(f"{prefix}.betas must be two numbers [beta1, beta2]; got {list(optim.betas)}")
    else:
        for i, beta in enumerate(optim.betas):
            check_in_range(errors, f"{prefix}.betas[{i}]", beta, 0, 1, high_open=True)
    for key in ("eps", "grad_clip"):  # only some optim sections have them (SFT's has grad_clip)
        if key in optim:
            check_in_range(errors, f"{prefix}.{key}", optim[key], 0, low_open=True)


def trainer_loop_errors(errors: list[str], trainer: Any) -> None:
    """Keys shared by the RL and the SFT trainer sections."""
    check_at_least(
        errors, "trainer.total_training_steps", trainer.total_training_steps, 1, null="total_epochs of data"
    )
    check_at_least(errors, "trainer.total_epochs", trainer.total_epochs, 1)
    check_seed(errors, "trainer.seed", trainer.seed)
    check_torch_threads(errors, "trainer.torch_threads", trainer.torch_threads)
    if "log_val_generations" in trainer:  # RL only
        check_at_least(errors, "trainer.log_val_generations", trainer.log_val_generations, 0)
    for name in trainer.logger:
        check_choice(errors, "each of trainer.logger", name, LOGGERS)
        if name in LOGGERS and missing_packages(name):
            errors.append(
                f"trainer.logger {name} needs {', '.join(missing_packages(name))}, not installed: "
                f"pip install {' '.join(missing_packages(name))} (or pip install -e '.[tracking]')"
            )
    check_choice(errors, "trainer.on_existing_run", trainer.on_existing_run, ON_EXISTING_RUN)


def chat_template_kwargs_errors(errors: list[str], data: Any) -> None:
    """``data.apply_chat_template_kwargs`` (RL and SFT): none of the arguments the renderer sets itself."""
    kwargs = data.apply_chat_template_kwargs
    taken = [k for k in kwargs if k in CHAT_TEMPLATE_OWN_ARGS]
    if taken:
        errors.append(
            f"data.apply_chat_template_kwargs may not set {', '.join(map(str, taken))}: prompts are rendered "
            f"with {', '.join(CHAT_TEMPLATE_OWN_ARGS)} chosen by verl; pass only what the template reads "
            "(e.g. enable_thinking: false)"
        )


def lora_errors(errors: list[str], cfg: DictConfig, prefix: str = f"{ARR}.model") -> None:
    """The LoRA keys of the model section ``prefix`` (the actor's, or ``model`` of verl sft): rank and
    alpha in range, module names of the forms peft takes, and peft installed when LoRA is on (it is an
    optional dependency: the message says what to install)."""
    import importlib.util

    model = OmegaConf.select(cfg, prefix)
    check_at_least(errors, f"{prefix}.lora_rank", model.lora_rank, 0)
    check_in_range(errors, f"{prefix}.lora_alpha", model.lora_alpha, 0, low_open=True)
    for key, nullable in (("target_modules", False), ("exclude_modules", True)):
        value = model[key]
        if value is None and nullable:
            continue
        names = OmegaConf.to_container(value) if isinstance(value, ListConfig) else [value]
        if not names or not all(isinstance(name, str) and name for name in names):
            null = " or null" if nullable else ""
            errors.append(
                f"{prefix}.{key} must be a module name or regular expression, or a list of module names "
                f"(e.g. [q_proj, v_proj]){null}; got {short_repr(value)}"
            )
    if model.lora_rank > 0 and importlib.util.find_spec("peft") is None:
        errors.append(
            f"{prefix}.lora_rank={model.lora_rank} needs the peft package, which is not installed: "
            "pip install peft (or pip install -e '.[peft]')"
        )
