"""LoRA checkpoint parts as model directories (``verl export``): the policy merged into its base weights
(the default) or a PEFT adapter directory (``--adapter``). Starting the actor from a saved PEFT adapter
(``actor_rollout_ref.model.lora_adapter_path``) is :func:`verl.models.lora.load_adapter`.

A PEFT adapter directory is what ``PeftModel.save_pretrained`` writes and ``PeftModel.from_pretrained``
reads: ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ``base_model_name_or_path``)
and ``adapter_model.safetensors`` (the adapter weights under peft's names,
``base_model.model.<module>.lora_A.weight``). A LoRA checkpoint part holds the adapter weights under the
adapted model's own names (``<module>.lora_A.default.weight``) and no base weights: those come from the
run's ``model.path``, checked against the part's fingerprint (:mod:`verl.models.base_fingerprint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from verl.errors import InputError
from verl.models.lora import _get_peft_model, adapter_weight_names


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
