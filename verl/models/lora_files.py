"""LoRA adapters on disk: starting the actor from a saved PEFT adapter (``actor_rollout_ref.model.
lora_adapter_path``), and turning a LoRA checkpoint part into a model directory (``verl export``): the
policy merged into its base weights (the default) or a PEFT adapter directory (``--adapter``).

A PEFT adapter directory is what ``PeftModel.save_pretrained`` writes and ``PeftModel.from_pretrained``
reads: ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``base_model_name_or_path``)
and ``adapter_model.safetensors`` (the adapter weights under peft's names,
``base_model.model.<module>.lora_A.weight``). A LoRA checkpoint part holds the adapter weights under the
adapted model's own names (``<module>.lora_A.default.weight``) and no base weights: those come from the
run's ``model.path``, checked against the part's fingerprint (:mod:`verl.models.base_fingerprint`).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from verl.errors import InputError
from verl.models.lora import ADAPTER_CONFIG, _get_peft_model, _plain, adapter_weight_names

logger = logging.getLogger(__name__)

ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""the file names peft saves an adapter's weights under (safetensors, or torch's format)"""


def check_adapter_dir(path: str | Path, key: str) -> Path:
    """``path`` as a PEFT LoRA adapter directory, or an InputError naming ``key``: it must exist and hold
    ``adapter_config.json`` of a LoRA adapter and its weights."""
    import json

    local = Path(path).expanduser()
    if not local.is_dir():
        what = "is a file; give the adapter's directory" if local.exists() else "does not exist"
        raise InputError(
            f"{key}={path}: {what} (a PEFT adapter directory, as peft or `verl export --adapter` writes)"
        )
    config_file = local / ADAPTER_CONFIG
    if not config_file.is_file():
        raise InputError(
            f"{key}={path} has no {ADAPTER_CONFIG}: not a PEFT adapter directory (as peft's "
            "save_pretrained or `verl export --adapter` writes)"
        )
    try:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    except ValueError as error:
        raise InputError(f"{key}={path}: {ADAPTER_CONFIG} is not valid JSON ({error})") from None
    peft_type = saved.get("peft_type")
    if peft_type != "LORA":
        raise InputError(
            f"{key}={path}: the adapter is a {peft_type} adapter; only LoRA adapters are trained here"
        )
    # Checkpoints, the reference policy (adapters disabled) and the rollout engines know lora_A / lora_B only:
    # weights trained beside them would be dropped at resume and export, and stay on in the reference.
    extra = {
        "modules_to_save": saved.get("modules_to_save"),
        "bias": None if saved.get("bias", "none") == "none" else saved.get("bias"),
    }
    trained_beside = {name: value for name, value in extra.items() if value}
    if trained_beside:
        said = ", ".join(f"{name}={value!r}" for name, value in trained_beside.items())
        raise InputError(
            f"{key}={path}: the adapter also trains weights outside its LoRA layers ({said}); only lora_A / "
            "lora_B adapters are built here (bias='none', no modules_to_save)"
        )
    if not any((local / name).is_file() for name in ADAPTER_WEIGHTS):
        raise InputError(f"{key}={path} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    return local


def load_adapter(model: torch.nn.Module, path: str | Path, model_cfg: Any, key: str) -> torch.nn.Module:
    """``model`` with the LoRA adapter saved at ``path`` injected, trainable (``PeftModel.from_pretrained(...,
    is_trainable=True)``, as verl loads ``lora_adapter_path``); returns the transformers model, adapted in
    place. The adapter's own config decides rank, alpha and target modules, as in verl; keys of ``model_cfg``
    that say otherwise are named in a warning. A directory that is not a LoRA adapter, or an adapter whose
    layers ``model`` lacks or whose weights do not cover them, is an InputError naming ``key``."""
    from peft import PeftModel

    local = check_adapter_dir(path, key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            peft_model = PeftModel.from_pretrained(model, str(local), is_trainable=True)
        except (ValueError, KeyError, RuntimeError) as error:  # modules not found, shapes that do not fit
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise InputError(
                f"{key}={path}: the adapter does not fit {type(model).__name__} ({first})"
            ) from error
    missing = [w for w in caught if "missing adapter keys" in str(w.message)]
    if missing:
        raise InputError(
            f"{key}={path}: the adapter's weights do not cover its layers ({missing[0].message})"
        )
    config = peft_model.peft_config["default"]
    _warn_overridden_keys(config, model_cfg, key)
    return peft_model.get_base_model()


def _warn_overridden_keys(config: Any, model_cfg: Any, key: str) -> None:
    """Say which of the section's LoRA keys the saved adapter's config overrides (only when ``lora_rank`` is
    set: with it at 0 the keys were never asked for)."""
    if not model_cfg.lora_rank:
        return
    section = key.rpartition(".")[0]
    targets = _plain(model_cfg.target_modules)
    saved_targets = config.target_modules
    same_targets = targets == saved_targets or (
        isinstance(targets, list | tuple | set) and set(targets) == set(saved_targets or ())
    )
    differ = [
        f"{section}.{name}={mine} (the adapter's: {theirs})"
        for name, mine, theirs, same in (
            ("lora_rank", model_cfg.lora_rank, config.r, int(model_cfg.lora_rank) == int(config.r)),
            (
                "lora_alpha",
                model_cfg.lora_alpha,
                config.lora_alpha,
                model_cfg.lora_alpha == config.lora_alpha,
            ),
            ("target_modules", targets, saved_targets, same_targets),
        )
        if not same
    ]
    if differ:
        logger.warning(
            "%s: the saved adapter's own config is used, as in verl; ignored: %s", key, "; ".join(differ)
        )


# ------------------------------------------------------------------------------------------------ export


def lora_skeleton(part: Path, hf_config: Any) -> Any:
    """A ``PeftModel`` of checkpoint part ``part``'s architecture (``hf_config``) and adapter config, its
    base weights on the meta device (never allocated): the names and shapes to read adapter weights into."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(hf_config)
    config = LoraConfig.from_pretrained(str(part))
    config.base_model_name_or_path = None  # the training run's; set by the caller that knows the base
    return _get_peft_model(base, config)


def split_weights(
    weights: dict[str, torch.Tensor], adapter_names: frozenset[str], part: Path
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A LoRA part's saved weights as (adapter weights, base weights); the base ones are there only in a
    checkpoint written before adapter-only saves. Adapter weights missing from it are an InputError."""
    missing = sorted(adapter_names - weights.keys())
    if missing:
        raise InputError(
            f"checkpoint {part} lacks {len(missing)} of its adapter's weights ({missing[0]}, ...)"
        )
    adapters = {k: v for k, v in weights.items() if k in adapter_names}
    return adapters, {k: v for k, v in weights.items() if k not in adapter_names}


def adapter_export(
    part: Path, hf_config: Any, weights: dict[str, torch.Tensor], base_name: str | None
) -> torch.nn.Module:
    """A ``PeftModel`` whose ``save_pretrained`` writes checkpoint part ``part``'s adapter as a PEFT adapter
    directory, with ``base_model_name_or_path`` = ``base_name`` (the run's ``model.path``). The base weights
    stay on the meta device: neither read nor written."""
    peft_model = lora_skeleton(part, hf_config)
    names = adapter_weight_names(peft_model.get_base_model())
    adapters, _ = split_weights(weights, names, part)
    peft_model.get_base_model().load_state_dict(adapters, strict=False, assign=True)
    peft_model.peft_config["default"].base_model_name_or_path = base_name
    return peft_model


def merged_export(
    part: Path,
    hf_config: Any,
    weights: dict[str, torch.Tensor],
    load_base: Any,
) -> torch.nn.Module:
    """The plain transformers model of checkpoint part ``part``: its adapters merged into the base weights
    (``merge_and_unload``). The base is the part's own weights when it holds them (an older checkpoint),
    else ``load_base()`` (the run's ``model.path``, loaded by the caller after checking its fingerprint)."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from verl.workers.engine.trained import with_tied_names

    names = adapter_weight_names(lora_skeleton(part, hf_config).get_base_model())
    adapters, base_weights = split_weights(weights, names, part)
    base = AutoModelForCausalLM.from_config(hf_config) if base_weights else load_base()
    config = LoraConfig.from_pretrained(str(part))
    config.base_model_name_or_path = None
    adapted = _get_peft_model(base, config)
    if base_weights:  # base and adapters, under the adapted model's names
        adapted.get_base_model().load_state_dict(with_tied_names(adapted.get_base_model(), weights))
    else:
        adapted.get_base_model().load_state_dict(adapters, strict=False)
    return adapted.merge_and_unload()
