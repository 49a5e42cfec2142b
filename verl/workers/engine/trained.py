"""What the actor and the critic share: a module being trained, data parallel or not."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, load_model, save_file, save_model
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from verl.errors import InputError
from verl.models.lora import adapter_config, adapter_weight_names, check_checkpoint_adapters
from verl.utils.checkpoint import rng_state, save_data, set_rng_state
from verl.utils.checkpoint_data import check_sharded_files, load_data
from verl.utils.precision import frozen_linear_weights_in, hold_frozen_weights_in
from verl.workers.engine.distributed import unwrap, wrap_ddp
from verl.workers.engine.fsdp import Offload, shard_with_optimizer
from verl.workers.engine.sharded_checkpoint import (
    has_sharded_state,
    load_full_into_sharded,
    load_sharded,
    save_sharded,
    sharded_parts,
)

FULL_CONTENTS = ("model", "optimizer", "extra")
"""what a checkpoint part holds for exact resume (verl's default checkpoint.save_contents)"""


def shuffle_generator(seed: int | None) -> torch.Generator:
    """The generator an update draws its shuffle seeds from: its own, so that other roles in the
    process drawing random numbers do not change this one's shuffles.

    Without a ``seed`` it follows torch's global seed (``torch.initial_seed()``), so a seeded run is
    reproducible. Workers seed each rank differently (``trainer.seed + rank``); pass the same ``seed``
    on every rank (e.g. ``trainer.seed``) for identical shuffles. Either way is correct: each rank only
    shuffles its own shard, so a global mini-batch always takes the same number of rows from each rank.
    """
    generator = torch.Generator()
    generator.manual_seed(torch.initial_seed() if seed is None else seed)
    return generator


class TrainedModel:
    """A model with its role config, optimizer, LR schedule and shuffle generator.

    Three views of one network, one name each:

    - ``hf_model``: the plain HuggingFace model (what checkpoints hold, shared with the rollout);
    - ``scorer``: the module the forward passes go through (a `verl.workers.engine.scoring` wrapper
      around ``hf_model``; ``hf_model`` itself when none is given);
    - ``trained``: what the optimizer step follows: sharded, the scorer itself (FSDP2's root); with an
      optimizer and DDP on, the scorer in DDP (DDP must see the whole forward); else the scorer.

    ``fsdp_config`` (strategy fsdp2) shards the scorer in place over the ranks
    (`verl.workers.engine.fsdp`); ``optimizer`` may have been built over the unsharded parameters and
    then follows their shards. Sharding, like building DDP, is a collective: every rank builds together.

    With LoRA adapters in ``hf_model``, checkpoints and the in-memory training state hold the adapter
    weights alone (``saved_weights``): the frozen base is what the model was loaded with.
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        config: Any,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        seed: int | None = None,
        scorer: torch.nn.Module | None = None,
        fsdp_config: Any = None,
        fsdp_key: str = "fsdp_config",
    ) -> None:
        self.config = config
        self.hf_model = unwrap(hf_model)
        self.saved_weights: frozenset[str] | None = adapter_weight_names(self.hf_model) or None
        """the state-dict names a checkpoint holds: the adapters with LoRA; None: every weight"""
        self.scorer = scorer if scorer is not None else self.hf_model
        self.sharded = fsdp_config is not None
        self.checkpoint_group = None
        self.offload: Offload | None = None
        if self.sharded:
            device = next(self.hf_model.parameters()).device
            shard_with_optimizer(self.scorer, self.hf_model, fsdp_config, device, fsdp_key, optimizer)
            self.trained = self.scorer
            self.offload = Offload(self.scorer, fsdp_config, device, fsdp_key, optimizer)
        else:
            if self.saved_weights is not None:  # LoRA: the frozen base held in the compute dtype for good
                hold_frozen_weights_in(self.hf_model, getattr(self.scorer, "compute_dtype", None))
            self.trained = wrap_ddp(self.scorer) if optimizer is not None else self.scorer
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.generator = shuffle_generator(seed)

    def resident(self, optimizer: bool = False) -> contextlib.AbstractContextManager[None]:
        """The weights (and, with ``optimizer``, the optimizer state) on the device for a phase, when
        ``fsdp_config`` offloads them to CPU memory between phases (`verl.workers.engine.fsdp.Offload`),
        and the frozen linear weights cast once to the autocast dtype for the phase (``frozen_linear_weights_in``)."""
        stack = contextlib.ExitStack()
        if self.offload:
            stack.enter_context(self.offload.resident(optimizer))
        if not self.sharded:
            stack.enter_context(
                frozen_linear_weights_in(self.hf_model, getattr(self.scorer, "compute_dtype", None))
            )
        return stack

    def _saved(self, weights: dict[str, Any]) -> dict[str, Any]:
        """The entries of a model state dict that the role saves (``saved_weights``)."""
        names = self.saved_weights
        return weights if names is None else {k: v for k, v in weights.items() if k in names}

    def training_state(self) -> dict[str, Any]:
        """A copy of the weights (the adapters alone with LoRA), optimizer and LR schedule that later steps
        cannot change (this rank's shards when sharded)."""
        if self.sharded:
            on_cpu = StateDictOptions(cpu_offload=True)  # kept on the driver: not in GPU memory
            with self.resident(optimizer=True):
                model = self._saved(get_model_state_dict(self.hf_model, options=on_cpu))
                optim = get_optimizer_state_dict(self.hf_model, self.optimizer, options=on_cpu)
        else:
            model, optim = self._saved(self.hf_model.state_dict()), self.optimizer.state_dict()
        return copy.deepcopy(
            {"model": model, "optimizer": optim, "lr_scheduler": self.lr_scheduler.state_dict()}
        )

    def load_training_state(self, state: dict[str, Any]) -> None:
        strict = self.saved_weights is None
        if self.sharded:
            with self.resident(optimizer=True):
                set_model_state_dict(self.hf_model, state["model"], options=StateDictOptions(strict=strict))
                set_optimizer_state_dict(self.hf_model, self.optimizer, state["optimizer"])
        else:
            self.hf_model.load_state_dict(state["model"], strict=strict)
            self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    # ------------------------------------------------------------------ checkpoints on disk

    def save_checkpoint(
        self,
        path: str | Path,
        rank: int,
        background: bool = False,
        contents: Sequence[str] = FULL_CONTENTS,
    ) -> threading.Thread | None:
        """Write this rank's part of a checkpoint into ``path`` (layouts: `verl.workers.engine.sharded_checkpoint`).

        ``contents`` (verl's ``checkpoint.save_contents``): ``model`` (the weights), ``optimizer`` (its
        state), ``extra`` (LR schedule, each rank's RNG states and shuffle generator). Replicated, rank 0
        writes weights and optimizer (the same on every rank); sharded, every rank writes its shards (a
        collective). A ``done_rank<r>`` file is written last, so a reader knows the part is complete. A
        model with LoRA adapters saves the adapter weights alone (``saved_weights``, under peft's layer
        names), plus their peft config (``adapter_config.json``), which a reader (``verl export``) rebuilds
        the layers from over the base model.

        ``background=True`` copies the state now and writes it in a thread (returned), so training can
        go on while the files are written.
        """
        path = Path(path)
        model, optimizer, extra = (part in contents for part in FULL_CONTENTS)
        state: dict[str, Any] = {}
        if extra:
            state["rng"] = {"rng": rng_state(), "generator": self.generator.get_state()}
        if rank == 0:
            state["adapter"] = adapter_config(self.hf_model)
            state["optim"] = {"lr_scheduler": self.lr_scheduler.state_dict()} if extra else {}
            if not self.sharded:
                if model and self.saved_weights is None:
                    state["model"] = self.hf_model  # safetensors' save_model handles tied weights
                elif model:
                    state["model"] = {
                        k: v.detach() for k, v in self._saved(self.hf_model.state_dict()).items()
                    }
                if optimizer:
                    state["optim"]["optimizer"] = self.optimizer.state_dict()
        if self.sharded and (model or optimizer):
            path.mkdir(parents=True, exist_ok=True)
            if background and self.checkpoint_group is None:
                # Background saves write over their own group, never interleaved with training's messages
                # (made at the first one: every rank saves together, so every rank makes it together).
                self.checkpoint_group = dist.new_group(backend="gloo")
            with self.resident(optimizer=True):  # a background save copies the shards to CPU memory first
                state["shards"] = save_sharded(
                    self.hf_model,
                    self.optimizer if optimizer else None,
                    path,
                    self.checkpoint_group,
                    background=background,
                    model=model,
                    names=self.saved_weights,
                )
        if background:
            state = {k: (v if k == "shards" else copy.deepcopy(v)) for k, v in state.items()}
            thread = threading.Thread(
                target=_write_part_or_fail, args=(path, rank, state), name="verl-save", daemon=True
            )
            thread.start()
            return thread
        _write_part(path, rank, state)
        return None

    def load_checkpoint(self, path: str | Path, rank: int, contents: Sequence[str] = FULL_CONTENTS) -> None:
        """Restore ``contents`` (verl's ``checkpoint.load_contents``) of what :meth:`save_checkpoint` wrote,
        in either layout and from any number of ranks; a rank with no RNG file of its own (the run had
        fewer ranks) keeps its own seed and takes rank 0's shuffle generator. A part asked for and not in the
        checkpoint is an InputError."""
        path = Path(path)
        check_checkpoint_adapters(path, self.hf_model)
        check_sharded_files(path)  # before torch's DCP reader unpickles them
        optim = _read_optim(path)
        held = _held_contents(path, optim)
        missing = [part for part in contents if part in FULL_CONTENTS and part not in held]
        if missing:
            raise InputError(
                f"checkpoint {path} holds {', '.join(held) or 'nothing'} but not {', '.join(missing)} (it was "
                "saved with checkpoint.save_contents without them); leave them out of checkpoint.load_contents"
            )
        model, optimizer, extra = (part in contents for part in FULL_CONTENTS)
        names = self.saved_weights
        if has_sharded_state(path):
            with self.resident(optimizer=True):
                load_sharded(
                    self.hf_model, self.optimizer if optimizer else None, path, model=model, names=names
                )
        elif self.sharded:
            weights = self._weights_file(path) if model else None
            with self.resident(optimizer=True):
                load_full_into_sharded(
                    self.hf_model,
                    self.optimizer,
                    weights,
                    optim.get("optimizer") if optimizer else None,
                    strict=names is None,
                )
        else:
            if model and names is None:
                load_model(self.hf_model, str(path / "model.safetensors"))
            elif model:
                self.hf_model.load_state_dict(self._weights_file(path), strict=False)
            if optimizer:
                self.optimizer.load_state_dict(optim["optimizer"])
        if extra:
            self.lr_scheduler.load_state_dict(optim["lr_scheduler"])
            rng_file = path / f"rng_rank{rank}.pt"
            if rng_file.exists():
                rng = load_data(rng_file)
                set_rng_state(rng["rng"])
            else:  # more ranks than the run that saved: this rank keeps its own seed (trainer.seed + rank)
                rng = load_data(path / "rng_rank0.pt")
            self.generator.set_state(rng["generator"])  # the shuffle generator is the same on every rank

    def _weights_file(self, part: Path) -> dict[str, torch.Tensor]:
        """``part``'s ``model.safetensors`` under every name of the model's tied parameters; with LoRA it
        must hold every adapter weight (and may hold the base's: a checkpoint from before adapter-only saves)."""
        weights = with_tied_names(self.hf_model, load_file(str(part / "model.safetensors")))
        if self.saved_weights is None:
            return weights
        missing = sorted(self.saved_weights - weights.keys())
        unknown = sorted(weights.keys() - self.hf_model.state_dict().keys())
        if missing or unknown:
            what = f"lacks {len(missing)} of" if missing else f"has {len(unknown)} weights not in"
            first = (missing or unknown)[0]
            raise InputError(
                f"checkpoint {part}: model.safetensors {what} the model's adapter weights ({first}, ...); was "
                "it written by a run with the same LoRA target modules?"
            )
        return weights


def checkpoint_contents(part: Path) -> list[str]:
    """Which of model / optimizer / extra a checkpoint part holds, in either layout."""
    check_sharded_files(part)
    return _held_contents(part, _read_optim(part))


def _read_optim(part: Path) -> dict[str, Any]:
    """A part's ``optim.pt`` (``{}`` when it has none), read as data: a file that would run code is refused
    (`verl.utils.checkpoint_data.load_data`)."""
    if not (part / "optim.pt").is_file():
        return {}
    optim = load_data(part / "optim.pt")
    if not isinstance(optim, dict):
        raise InputError(f"{part / 'optim.pt'} holds no optimizer state (a mapping); was it written by verl?")
    return optim


def _held_contents(part: Path, optim: dict[str, Any]) -> list[str]:
    """`checkpoint_contents`, given the part's ``optim.pt`` already read (``{}`` when it has none)."""
    sharded = sharded_parts(part) if has_sharded_state(part) else set()
    held = {
        "model": "model" in sharded or (part / "model.safetensors").is_file(),
        "optimizer": "optim" in sharded or "optimizer" in optim,
        "extra": "lr_scheduler" in optim and (part / "rng_rank0.pt").is_file(),
    }
    return [name for name in FULL_CONTENTS if held[name]]


def with_tied_names(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` (a safetensors file stores a tied weight once) under every name the model's tied
    parameters have."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    full = dict(weights)
    for aliases in names.values():
        stored = next((weights[n] for n in aliases if n in weights), None)
        if stored is not None:
            full.update(dict.fromkeys(aliases, stored))
    return full


def _write_part_or_fail(path: Path, rank: int, state: dict[str, Any]) -> None:
    """`_write_part` in a background thread: a failure leaves ``failed_rank<r>`` (the error) instead of
    ``done_rank<r>``, so the trainer waiting for the part fails the run rather than waiting forever."""
    try:
        _write_part(path, rank, state)
    except BaseException as error:  # noqa: BLE001 - reported through the marker, whatever it was
        # This rank's files go first: on a full disk they hold the space the marker needs.
        for name in _PART_FILES if rank == 0 else ():
            (path / name).unlink(missing_ok=True)
        (path / f"rng_rank{rank}.pt").unlink(missing_ok=True)
        path.mkdir(parents=True, exist_ok=True)
        (path / f"failed_rank{rank}").write_text(f"{type(error).__name__}: {error}")


_PART_FILES = ("model.safetensors", ".model.safetensors.tmp", "optim.pt", "adapter_config.json")
"""what rank 0 writes into a part (besides its RNG file), removed when its background write fails"""


def _write_part(path: Path, rank: int, state: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if state.get("shards") is not None:
        state["shards"].result()  # the sharded weights and optimizer, written by DCP in the background
    if "model" in state:
        tmp = path / ".model.safetensors.tmp"
        try:
            if isinstance(state["model"], dict):  # a LoRA role's adapter weights
                save_file({k: v.contiguous() for k, v in state["model"].items()}, str(tmp))
            else:
                save_model(state["model"], str(tmp))
            tmp.replace(path / "model.safetensors")
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk: not left holding the space
            raise
    if state.get("optim"):
        save_data(state["optim"], path / "optim.pt")
    if state.get("adapter") is not None:
        state["adapter"].save_pretrained(str(path))  # adapter_config.json
    if "rng" in state:
        save_data(state["rng"], path / f"rng_rank{rank}.pt")
    (path / f"done_rank{rank}").write_text("")
