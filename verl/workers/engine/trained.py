"""What the actor and the critic share: a module being trained, data parallel or not."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from verl.models.lora import adapter_config, check_checkpoint_adapters
from verl.utils.checkpoint import atomic_torch_save, rng_state, set_rng_state
from verl.workers.engine.distributed import unwrap, wrap_ddp


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
    - ``trained``: what the optimizer step follows: with an optimizer and distributed on, the scorer in
      DDP (DDP must see the whole forward), else the scorer. Building DDP is a collective, so every
      rank builds it together. Without an optimizer nothing is wrapped.
    """

    def __init__(
        self,
        hf_model: torch.nn.Module,
        config: Any,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        seed: int | None = None,
        scorer: torch.nn.Module | None = None,
    ) -> None:
        self.config = config
        self.hf_model = unwrap(hf_model)
        self.scorer = scorer if scorer is not None else self.hf_model
        self.trained = wrap_ddp(self.scorer) if optimizer is not None else self.scorer
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.generator = shuffle_generator(seed)

    def training_state(self) -> dict[str, Any]:
        """A copy of the weights, optimizer and LR schedule that later steps cannot change."""
        return copy.deepcopy(
            {
                "model": self.hf_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "lr_scheduler": self.lr_scheduler.state_dict(),
            }
        )

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.hf_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])

    # ------------------------------------------------------------------ checkpoints on disk

    def save_checkpoint(
        self, path: str | Path, rank: int, background: bool = False
    ) -> threading.Thread | None:
        """Write this rank's part of a checkpoint into ``path``: weights, optimizer and LR schedule from
        rank 0 (they are the same on every rank), the RNG states and shuffle generator from each rank.
        A ``done_rank<r>`` file is written last, so a reader knows the part is complete. A model with LoRA
        adapters also gets their peft config (``adapter_config.json``): its weights file holds the base and
        adapter weights under peft's layer names, which a reader (``verl export``) must rebuild.

        ``background=True`` copies the state now and writes it in a thread (returned), so training can
        go on while the files are written.
        """
        path = Path(path)
        state = {"rng": rng_state(), "generator": self.generator.get_state()}
        if rank == 0:
            state["model"] = self.hf_model  # safetensors' save_model handles tied weights
            state["optim"] = {
                "optimizer": self.optimizer.state_dict(),
                "lr_scheduler": self.lr_scheduler.state_dict(),
            }
            state["adapter"] = adapter_config(self.hf_model)
        if background:
            state = copy.deepcopy(state)
            thread = threading.Thread(
                target=_write_part, args=(path, rank, state), name="verl-save", daemon=True
            )
            thread.start()
            return thread
        _write_part(path, rank, state)
        return None

    def load_checkpoint(self, path: str | Path, rank: int) -> None:
        """Restore what :meth:`save_checkpoint` wrote; a rank with no RNG file of its own (the run had
        fewer ranks) takes rank 0's."""
        path = Path(path)
        check_checkpoint_adapters(path, self.hf_model)
        load_model(self.hf_model, str(path / "model.safetensors"))
        optim = torch.load(path / "optim.pt", weights_only=False)
        self.optimizer.load_state_dict(optim["optimizer"])
        self.lr_scheduler.load_state_dict(optim["lr_scheduler"])
        rng_file = path / f"rng_rank{rank}.pt"
        rng = torch.load(rng_file if rng_file.exists() else path / "rng_rank0.pt", weights_only=False)
        set_rng_state(rng["rng"])
        self.generator.set_state(rng["generator"])


def _write_part(path: Path, rank: int, state: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if "model" in state:
        tmp = path / ".model.safetensors.tmp"
        save_model(state["model"], str(tmp))
        tmp.replace(path / "model.safetensors")
        atomic_torch_save(state["optim"], path / "optim.pt")
        if state["adapter"] is not None:
            state["adapter"].save_pretrained(str(path))  # adapter_config.json
    atomic_torch_save({"rng": state["rng"], "generator": state["generator"]}, path / f"rng_rank{rank}.pt")
    (path / f"done_rank{rank}").write_text("")
