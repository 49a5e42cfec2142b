"""Checkpoints of FSDP2-sharded roles with ``torch.distributed.checkpoint`` (DCP), and moving weights and
optimizer state between the two formats a role checkpoint can have.

- ``dp`` (replicated weights): rank 0 writes ``model.safetensors`` and ``optim.pt`` (optimizer + LR
  schedule, torch's own format: the optimizer state keyed by parameter index).
- ``fsdp2``: every rank writes its shards of the weights and of the optimizer state into
  ``model_optim/`` (DCP: ``.metadata`` and one ``__<rank>_0.distcp`` per rank), keyed by parameter
  name; rank 0 writes the LR schedule into ``optim.pt``.

A DCP checkpoint loads into any number of ranks, sharded or not (DCP reshards on load), and into a
``dp`` role; a ``dp`` checkpoint loads into a sharded role (each rank cuts its shards from the full
tensors). ``verl export`` reads either (`load_sharded` into a model in its own process, or `read_weights`).

A LoRA role saves and loads only the adapters (``names``: the frozen base weights come from ``model.path``),
in either layout; a checkpoint holding more (one written before that) still loads.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

SHARDED_DIR = "model_optim"
"""the DCP directory of a role checkpoint part: weights and optimizer state, all ranks' shards"""


def has_sharded_state(part: str | Path) -> bool:
    return (Path(part) / SHARDED_DIR / ".metadata").is_file()


def _state(
    hf_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model: bool = True,
    names: Collection[str] | None = None,
) -> dict[str, Any]:
    """The state DCP saves and loads in place: parameter-name keyed, each rank's shards (or full tensors
    for a replicated model); the weights unless not ``model`` (only those in ``names`` when given), the
    optimizer's state when one is given."""
    state = {"model": _only(get_model_state_dict(hf_model), names)} if model else {}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(hf_model, optimizer)
    return state


def _only(weights: dict[str, Any], names: Collection[str] | None) -> dict[str, Any]:
    return weights if names is None else {k: v for k, v in weights.items() if k in names}


def sharded_parts(part: Path) -> set[str]:
    """What the DCP checkpoint in ``part`` holds: ``model`` (weights) and/or ``optim`` (optimizer state)."""
    metadata = dcp.FileSystemReader(str(part / SHARDED_DIR)).read_metadata()
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def save_sharded(
    hf_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    part: Path,
    process_group: dist.ProcessGroup | None = None,
    background: bool = False,
    model: bool = True,
    names: Collection[str] | None = None,
) -> Future | None:
    """Write this rank's shards (the weights unless not ``model``, only ``names`` of them when given, the
    optimizer's state when one is given) into ``part / model_optim`` (a collective: every rank calls it).

    ``background``: the shards are copied to CPU memory now and written by DCP's own thread over
    ``process_group`` (a group kept for checkpoints, so its messages never mix with training's);
    returns the future that completes when the files are written."""
    state = _state(hf_model, optimizer, model, names)
    target = str(part / SHARDED_DIR)
    if background:
        return dcp.async_save(state, checkpoint_id=target, process_group=process_group)
    dcp.save(state, checkpoint_id=target)
    return None


def load_sharded(
    hf_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    part: Path,
    model: bool = True,
    names: Collection[str] | None = None,
) -> None:
    """Read ``part / model_optim`` into the model (unless not ``model``; only ``names`` of its weights when
    given) and the optimizer (when given), whatever the number of ranks it was written by and whether the
    model here is sharded."""
    state = _state(hf_model, optimizer, model, names)
    _dcp_load(state, part)
    if model:
        set_model_state_dict(hf_model, state["model"], options=StateDictOptions(strict=names is None))
    if optimizer is not None:
        set_optimizer_state_dict(hf_model, optimizer, state["optim"])


def _dcp_load(state: dict[str, Any], part: Path) -> None:
    with warnings.catch_warnings():
        # Without a process group DCP reads every shard in this process, which is the intent; it warns.
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        dcp.load(state, checkpoint_id=str(part / SHARDED_DIR))


def read_weights(part: Path) -> dict[str, torch.Tensor]:
    """Every weight checkpoint part ``part`` holds, whole, in CPU memory, keyed by parameter name: from
    ``model.safetensors``, or assembled from all ranks' shards in ``model_optim/`` (in this process). No
    model is needed: the tensors' shapes and dtypes come from the files."""
    if not has_sharded_state(part):
        from safetensors.torch import load_file

        return load_file(str(part / "model.safetensors"))
    metadata = dcp.FileSystemReader(str(part / SHARDED_DIR)).read_metadata()
    weights = {
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    state = {"model": weights}
    _dcp_load(state, part)
    return state["model"]


def load_full_into_sharded(
    hf_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    weights: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any] | None,
    strict: bool = True,
) -> None:
    """Load a replicated (``dp``) checkpoint's full weights (only some of them when not ``strict``: a LoRA
    role's adapters), and its index-keyed optimizer state, into a sharded model: each rank keeps its shards.

    The optimizer state's indices are the order of the optimizer's parameters, which `build_optimizer`
    takes from ``hf_model.parameters()`` in both strategies; they become the parameters' names."""
    full = StateDictOptions(full_state_dict=True, strict=strict)
    if weights is not None:
        set_model_state_dict(hf_model, weights, options=full)
    if optimizer is None or optimizer_state is None:
        return
    names = {id(p): n for n, p in hf_model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    by_name = {
        "state": {ordered[i]: s for i, s in optimizer_state["state"].items()},
        "param_groups": [
            {**g, "params": [ordered[i] for i in g["params"]]} for g in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(hf_model, optimizer, by_name, options=full)


def full_weights_on_rank0(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model, in CPU memory, on rank 0 (empty on the other ranks); a
    collective, gathered one tensor at a time."""
    return get_model_state_dict(hf_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
