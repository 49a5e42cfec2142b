"""One call that seeds every random number generator a run uses."""

from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configure_torch_threads(num_threads: int | None) -> None:
    """Fix the intra-op thread count; results on CPU are reproducible only for a fixed count."""
    if num_threads:
        torch.set_num_threads(num_threads)
