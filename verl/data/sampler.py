"""Reproducible, resumable batch sampling.

Each epoch's order is a pure function of (seed, epoch), so resuming from a checkpoint needs only
``{epoch, position}``: regenerate that epoch's permutation and skip the batches already consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch


class EpochSampler:
    """Yields lists of dataset indices, one epoch per ``iter()``; reshuffled every epoch.

    Iterating yields the *remaining* batches of the current epoch, then advances to the next epoch.
    ``position`` counts batches already handed out in the current epoch, so ``state_dict()`` taken
    right after consuming a batch resumes at the following one.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        key: str = "data.train_batch_size",
    ) -> None:
        """``key`` is the config key of ``batch_size``, named when the data cannot fill one batch."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        if len(self) == 0:
            # An epoch with no batches would make a step-driven trainer loop forever.
            from verl.config.errors import ConfigError

            raise ConfigError(
                f"{key}={batch_size} is more than the {num_samples} usable rows of the training data, so they "
                f"give no batch of size {batch_size} (drop_last={drop_last}); lower {key} or give more data"
            )

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def permutation(self, epoch: int) -> list[int]:
        """The sample order of ``epoch``: deterministic in (seed, epoch), independent of global RNG state."""
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + epoch) % (2**63))
        return torch.randperm(self.num_samples, generator=g).tolist()

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch`` in order."""
        order = self.permutation(epoch)
        return [order[i * self.batch_size : (i + 1) * self.batch_size] for i in range(len(self))]

    def _roll_over(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[list[int]]:
        self._roll_over()
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            batch = batches[self.position]
            self.position += 1
            yield batch
        self._roll_over()

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position"}``, normalised so a finished epoch reads as the start of the next one."""
        if self.position >= len(self):
            return {"epoch": self.epoch + 1, "position": 0}
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume exactly where `state_dict` was taken (same num_samples, batch_size, seed assumed)."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self):
            raise ValueError(f"invalid sampler state {state} for {len(self)} batches per epoch")
        self.epoch, self.position = epoch, position


def iterate_batches(
    dataset: Any, sampler: EpochSampler, collate: Callable[[list[Any]], Any], num_epochs: int | None = 1
) -> Iterator[Any]:
    """Yield ``collate([dataset[i] for i in batch])`` for the sampler's batches over ``num_epochs`` epochs.

    ``num_epochs=None`` loops forever (step-driven training). Resuming works because the sampler
    carries the position: load its state, then call this again.
    """
    if isinstance(dataset, Sized) and len(dataset) != sampler.num_samples:
        raise ValueError(f"sampler is for {sampler.num_samples} samples but the dataset has {len(dataset)}")
    done = 0
    while num_epochs is None or done < num_epochs:
        for batch in sampler:
            yield collate([dataset[i] for i in batch])
        done += 1
