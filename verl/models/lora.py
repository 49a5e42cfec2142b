"""LoRA adapters on the actor, through peft, with verl's keys (``actor_rollout_ref.model.lora_rank``,
``lora_alpha``, ``target_modules``, ``exclude_modules``, ``lora_adapter_path``).

peft injects the adapters into the model in place: each targeted ``nn.Linear`` becomes a LoRA layer that
holds the frozen base layer and the trainable ``lora_A`` / ``lora_B``, and every other parameter is frozen.
The workers keep the plain transformers model that the adapters live in (``PeftModel.get_base_model()``),
not the ``PeftModel`` shell, so the scorers, the rollout engines, DDP / FSDP2 and the checkpoints see the
module they see without LoRA: only its trainable parameters differ, and the optimizer gets only those.
LoRA is on when ``lora_rank > 0`` or ``lora_adapter_path`` names a saved PEFT adapter, whose own config
(rank, alpha, target modules) then wins over the keys, as in verl (:func:`load_adapter`).

Where an adapted model leaves the worker:

- the reference policy is the base model: the actor's own module run with its adapters disabled
  (:func:`adapters_disabled`), as verl does (``ref_in_actor``); there is no second copy of the weights;
- a checkpoint holds the adapter weights (:func:`adapter_weight_names`) and their optimizer state only,
  plus the adapter's peft config (:data:`ADAPTER_CONFIG`, which tells a reader the part is a LoRA one) and
  a fingerprint of the base model's files (:mod:`verl.models.base_fingerprint`): the frozen base weights
  come from ``model.path`` again at resume and export, and a different base there is refused;
- a HuggingFace directory of the policy holds the adapters merged into the base weights (:func:`merged_copy`
  for a live model, :func:`plain_model_with` for gathered shards, ``verl export`` for a checkpoint), so
  ``AutoModelForCausalLM.from_pretrained`` loads it without peft; ``verl export --adapter`` writes the
  adapter alone as a PEFT directory instead (:func:`verl.models.lora_files.adapter_export`);
- the fast rollout engine decodes an adapted model with each adapter merged into a copy of its base weight
  (``verl.workers.rollout.lean_weights.projection``), where the lean step can read it
  (``verl.workers.rollout.decoders.lean_decoder_supported``), else with the model's own forward; vLLM gets
  the base weights once and then the adapters alone (``verl.workers.rollout.vllm``), or merged weights
  (``model.lora_merge``). A merged weight is rounded to the engine's dtype by :func:`round_merged`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from verl.errors import InputError

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
"""peft's file name for a LoRA config, written next to a checkpoint part's ``model.safetensors``"""

SECTION = "actor_rollout_ref.model"
"""the config section whose keys configure the actor's adapters"""


def peft_available() -> bool:
    """Whether the peft package is installed (checked without importing it)."""
    return importlib.util.find_spec("peft") is not None


def peft_missing_message(what: str) -> str:
    """What to say when ``what`` (e.g. ``"actor_rollout_ref.model.lora_rank=8"``) needs peft and it is not
    installed."""
    return f"{what} needs the peft package, which is not installed: pip install peft (or pip install -e '.[peft]')"


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether peft injected adapters into ``model`` (peft records their configs on it as ``peft_config``)."""
    return bool(getattr(model, "peft_config", None))


def adapter_delta(
    module: torch.nn.Module, full: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.detach
) -> torch.Tensor | None:
    """What a peft LoRA layer adds to its base weight: the sum over its active adapters of
    ``B @ A * alpha / r`` (peft's ``get_delta_weight``), transposed for ``fan_in_fan_out``, in float32 whatever
    autocast is on, so a merged weight is rounded once, to its own dtype. None when the adapters are disabled
    (the reference policy), already merged into the base weight, or absent. ``full`` turns each adapter
    weight into a whole tensor (an FSDP2 shard gathered: a collective every rank calls)."""
    adapters = getattr(module, "lora_A", None)
    if adapters is None or module.disable_adapters or module.merged:
        return None
    deltas = []
    with torch.autocast(module.get_base_layer().weight.device.type, enabled=False):
        for name in module.active_adapters:
            if name in adapters:
                delta = (full(module.lora_B[name].weight).float() @ full(adapters[name].weight).float()) * (
                    module.scaling[name]
                )
                deltas.append(delta.T if module.fan_in_fan_out else delta)
    return sum(deltas[1:], deltas[0]) if deltas else None


def round_merged(weight: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A merged weight ``W + delta`` (float32) in ``dtype``, rounded without bias where ``dtype`` is bf16.

    Rounded to nearest, a bf16 merge loses the adapter: the base ``W`` already lies on bf16's grid (a bf16
    checkpoint, or a LoRA base held in bf16, ``verl.utils.precision.hold_frozen_weights_in``), so each
    element whose ``delta`` is under half a bf16 step rounds back to ``W``, and early in training nearly all
    are. Measured on SmolLM2-135M with the adapter of 5 fp32 GRPO steps: greedy held-out accuracy 48% with
    the merged weights in fp32, 38% rounded to nearest bf16 (the base alone: 27%), 51-54% rounded here.

    Here each element rounds up with probability equal to the fraction of a bf16 step it lies above the
    lower neighbour (stochastic rounding: the expected value is the float32 weight), by adding a threshold
    under the 16 bits bf16 drops and truncating. The thresholds are fixed by ``seed`` (the same weights give
    the same rounding) and cheap: a row's draw XOR a column's, uniform over the 2^16 steps for every
    element. Other dtypes are rounded to nearest (float16 keeps 3 more bits; float32 is not rounded)."""
    if dtype != torch.bfloat16 or weight.dtype != torch.float32:
        return weight.to(dtype)
    matrix = weight.detach().contiguous().view(-1, weight.shape[-1]) if weight.dim() else weight.view(1, 1)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 1 << 16, (matrix.shape[0], 1), dtype=torch.int32, generator=generator)
    cols = torch.randint(0, 1 << 16, (1, matrix.shape[1]), dtype=torch.int32, generator=generator)
    bits = matrix.view(torch.int32) + (rows.to(matrix.device) ^ cols.to(matrix.device))
    bits.bitwise_and_(-(1 << 16))  # the low 16 bits bf16 drops: what is left converts exactly
    return bits.view(torch.float32).to(torch.bfloat16).view(weight.shape)


def _plain(value: Any) -> Any:
    """An OmegaConf list or mapping as plain Python (peft checks for ``str`` / ``list`` / ``set``)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def lora_config(model_cfg: Any) -> Any:
    """The ``peft.LoraConfig`` of a model config section, as verl builds it: ``r=lora_rank``,
    ``lora_alpha``, ``target_modules``, ``exclude_modules``, no bias terms, a causal LM task.
    ``exclude_modules`` is passed only when set: peft before 0.14 does not know the keyword."""
    from peft import LoraConfig

    excluded = model_cfg.exclude_modules
    return LoraConfig(
        r=int(model_cfg.lora_rank),
        lora_alpha=model_cfg.lora_alpha,
        target_modules=_plain(model_cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        **({"exclude_modules": _plain(excluded)} if excluded is not None else {}),
    )


def _get_peft_model(model: torch.nn.Module, config: Any) -> Any:
    """``peft.get_peft_model``, without the FutureWarning transformers 5 gives for the property peft reads
    (``is_gradient_checkpointing``, renamed): a warning on every LoRA run that asks nothing of the user."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def linear_layer_names(model: torch.nn.Module, limit: int = 12) -> list[str]:
    """The distinct last name parts of ``model``'s linear layers (``q_proj``, ``up_proj``, ...), in model
    order: the names ``target_modules`` can list."""
    names: list[str] = []
    for name, module in model.named_modules():
        short = name.rpartition(".")[2]
        if isinstance(module, torch.nn.Linear) and short not in names:
            names.append(short)
    return names[:limit]


def lora_enabled(model_cfg: Any) -> bool:
    """Whether a model config section turns LoRA on: ``lora_rank > 0`` or a ``lora_adapter_path`` (verl's
    rule: a saved adapter brings its own rank)."""
    return bool(model_cfg.lora_rank) or getattr(model_cfg, "lora_adapter_path", None) is not None


def apply_lora(model: torch.nn.Module, model_cfg: Any, section: str = SECTION) -> torch.nn.Module:
    """``model`` with LoRA adapters injected when :func:`lora_enabled`, else ``model`` unchanged;
    ``section`` is the config section, for the errors.

    The adapters are new ones from ``lora_rank`` / ``lora_alpha`` / ``target_modules`` / ``exclude_modules``
    (``peft.get_peft_model``), or the saved ones at ``lora_adapter_path`` with their own config
    (:func:`load_adapter`). Returns the transformers model itself, adapted in place,
    with only ``lora_A`` / ``lora_B`` trainable. A ``target_modules`` / ``exclude_modules`` that leaves
    nothing to adapt is a ConfigError naming the key and the model's linear layer names, not peft's
    traceback. Under gradient checkpointing the embeddings' output is made to require grad: with the
    embeddings frozen, reentrant checkpointing would otherwise see no input that needs a gradient and give
    the adapters none.
    """
    if not lora_enabled(model_cfg):
        return model
    from verl.config.errors import ConfigError, short_repr

    adapter_path = getattr(model_cfg, "lora_adapter_path", None)
    if not peft_available():
        key = (
            f"lora_adapter_path={adapter_path}"
            if adapter_path is not None
            else f"lora_rank={model_cfg.lora_rank}"
        )
        raise ConfigError(peft_missing_message(f"{section}.{key}"))
    if adapter_path is not None:
        adapted = load_adapter(model, adapter_path, model_cfg, f"{section}.lora_adapter_path")
    else:
        try:
            adapted = _get_peft_model(model, lora_config(model_cfg)).get_base_model()
        except (ValueError, TypeError) as error:  # nothing matched, a peft config check, an older peft
            excluded = model_cfg.exclude_modules
            also = f" with {section}.exclude_modules={short_repr(_plain(excluded))}" if excluded else ""
            raise ConfigError(
                f"{section}.target_modules={short_repr(_plain(model_cfg.target_modules))}{also}: LoRA cannot "
                f"be applied to {type(model).__name__} ({str(error).strip().splitlines()[0]}); its linear "
                f"layers are named {', '.join(linear_layer_names(model))}: list some of them, or use "
                "'all-linear'"
            ) from error
    if model_cfg.enable_gradient_checkpointing:
        adapted.enable_input_require_grads()
    _keep_input_dtype(adapted)
    return adapted


def _keep_input_dtype(model: torch.nn.Module) -> None:
    """Stop peft casting each adapter's input to the adapter's dtype when base and adapters share one.

    peft casts the input of ``lora_A`` to its weight's dtype (for a bf16 model with fp32 adapters, where the
    matmul needs it). With fp32 weights under bf16 autocast that cast turns the bf16 activation into fp32,
    and autocast casts it straight back for the matmul: two copies of every adapted layer's input in the
    forward and two more in the backward, for the same numbers (measured: ~10% of a SmolLM2 LoRA update).
    peft's switch (``cast_input_dtype_enabled``, what ``peft.helpers.disable_input_dtype_casting`` sets)."""
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled") and hasattr(module, "lora_A"):
            base = module.get_base_layer().weight.dtype
            if all(adapter.weight.dtype == base for adapter in module.lora_A.values()):
                module.cast_input_dtype_enabled = False


# ------------------------------------------------------------------------------- a saved adapter


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""the file names peft saves an adapter's weights under (safetensors, or torch's format)"""


def check_adapter_dir(path: str | Path, key: str) -> Path:
    """``path`` as a PEFT LoRA adapter directory, or an InputError naming ``key``: it must exist and hold
    ``adapter_config.json`` of a LoRA adapter and its weights."""
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


# --------------------------------------------------------------------------- the adapted model


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """``model`` computes as its base model for the duration: the reference policy of a LoRA actor.

    Each LoRA layer's adapters are switched off with peft's ``BaseTunerLayer.enable_adapters(False)`` (what
    ``PeftModel.disable_adapter()`` does; the workers keep no ``PeftModel`` shell to call it on), then on
    again afterwards, also when the body raises. peft's switch also sets the adapters' ``requires_grad``;
    every parameter's flag is put back as it was, by name (FSDP2 swaps sharded and unsharded parameter
    objects, the names stay). The layers are the same modules under DDP and FSDP2, and the switch is a flag
    each forward reads, so it works on a wrapped model too. A model without adapters is left alone.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer) and not m.disable_adapters]
    if not layers:
        yield
        return
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        for layer in layers:
            layer.enable_adapters(False)
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for name, param in model.named_parameters():
            if name in flags and param.requires_grad != flags[name]:
                param.requires_grad_(flags[name])


def adapter_weight_names(model: torch.nn.Module) -> frozenset[str]:
    """The state-dict names of ``model``'s adapter weights (``...q_proj.lora_A.default.weight``), empty
    without adapters: all that a LoRA checkpoint holds of the model (the rest is the frozen base)."""
    if not has_adapters(model):
        return frozenset()
    from peft.tuners.tuners_utils import BaseTunerLayer

    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, BaseTunerLayer):
            for attr in module.adapter_layer_names:
                names.update(
                    f"{prefix}.{attr}.{name}" for name, _ in getattr(module, attr).named_parameters()
                )
    return frozenset(names)


def _without_adapters(model: torch.nn.Module, merge: bool) -> torch.nn.Module:
    """Replace each LoRA layer of ``model`` by its base layer, in place, after adding the adapter's
    ``B @ A * alpha / r`` into the base weight when ``merge`` (peft's own unload, for a model that has no
    ``PeftModel`` shell around it)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            if merge:
                module.merge()
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
    del model.peft_config
    return model


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as a plain transformers model: a copy with each adapter merged into its base weights, or
    ``model`` itself when it has none (what ``save_pretrained`` should write)."""
    if not has_adapters(model):
        return model
    return _without_adapters(copy.deepcopy(model), merge=True)


def plain_model_with(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A new plain transformers model of ``model``'s architecture holding ``weights`` (a full state dict of
    ``model``, gathered from its shards), adapters merged: what ``save_pretrained`` should write."""
    with torch.device("meta"):  # no second random initialisation: the weights are assigned as they are
        fresh = type(model)(copy.deepcopy(model.config))
        if has_adapters(model):
            fresh = _get_peft_model(
                fresh, copy.deepcopy(adapter_config(model))
            ).get_base_model()  # same names
    fresh.load_state_dict(weights, assign=True)
    live_buffers = dict(model.named_buffers())
    for name, buffer in list(fresh.named_buffers()):
        if buffer.is_meta:  # buffers outside the state dict (rotary tables): the live model's
            parent, _, leaf = name.rpartition(".")
            fresh.get_submodule(parent).register_buffer(
                leaf, live_buffers[name].detach().cpu(), persistent=False
            )
    if getattr(model, "generation_config", None) is not None:
        fresh.generation_config = copy.deepcopy(model.generation_config)
    return _without_adapters(fresh, merge=True) if has_adapters(fresh) else fresh


def adapter_config(model: torch.nn.Module) -> Any:
    """The peft config of ``model``'s adapter (None without one): what a checkpoint saves beside the
    weights, so that a reader can rebuild the same layers."""
    configs: Mapping[str, Any] = getattr(model, "peft_config", None) or {}
    if len(configs) > 1:
        raise ValueError(f"the model carries {len(configs)} adapters ({', '.join(configs)}); verl trains one")
    return next(iter(configs.values()), None)


def check_checkpoint_adapters(checkpoint_part: str | Path, model: torch.nn.Module) -> None:
    """Refuse to load checkpoint part ``checkpoint_part`` into ``model`` when one has adapters and the
    other not, or their ranks differ: the weights would not fit, and the fix is a config key."""
    saved_file = Path(checkpoint_part) / ADAPTER_CONFIG
    saved_rank = _saved_rank(saved_file) if saved_file.is_file() else 0
    config = adapter_config(model)
    rank = int(config.r) if config is not None else 0
    if saved_rank != rank:
        raise ValueError(
            f"the checkpoint at {checkpoint_part} was trained with {SECTION}.lora_rank={saved_rank}, but this "
            f"run has {SECTION}.lora_rank={rank}; resume with the checkpoint's lora_rank"
        )


def _saved_rank(path: Path) -> int:
    return int(json.loads(path.read_text(encoding="utf-8")).get("r", 0))
