"""What the actor and the critic share: a module being trained, data parallel or not."""

from __future__ import annotations

import copy
from typing import Any

import torch

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
    """A module with its optimizer, LR schedule and shuffle generator.

    ``model`` may be a plain module or one already wrapped in DDP. With an optimizer (it is trained)
    and distributed on, it is wrapped in DDP here: a collective, so every rank builds it together.
    ``self.model`` is what is trained (DDP or plain), ``self.module`` the plain one, used for inference
    (and shared with the rollout). Without an optimizer (e.g. a frozen reference) it is never wrapped.
    """

    def __init__(
        self, model: torch.nn.Module, optimizer: Any = None, lr_scheduler: Any = None, seed: int | None = None
    ) -> None:
        self.module = unwrap(model)
        self.model = wrap_ddp(model) if optimizer is not None else model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.generator = shuffle_generator(seed)

    def training_state(self) -> dict[str, Any]:
        """A copy of the weights, optimizer and LR schedule that later steps cannot change."""
        return copy.deepcopy(
            {
                "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "lr_scheduler": self.lr_scheduler.state_dict(),
            }
        )

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
