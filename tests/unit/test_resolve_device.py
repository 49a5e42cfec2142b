"""trainer.device -> the torch.device a worker computes on (the CUDA branch with torch's CUDA queries faked)."""

from __future__ import annotations

import pytest
import torch

from verl.config.errors import ConfigError
from verl.models.plumbing import resolve_device


def test_cpu_and_auto_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="trainer.device=cuda but this process sees no CUDA device"):
        resolve_device("cuda")


@pytest.mark.parametrize(
    ("local_rank", "gpus", "index"), [(None, 1, 0), ("0", 4, 0), ("3", 4, 3), ("5", 4, 1)]
)
def test_cuda_always_has_an_index(
    monkeypatch: pytest.MonkeyPatch, local_rank: str | None, gpus: int, index: int
) -> None:
    # torch.cuda.set_device(torch.device("cuda")) raises "Expected a torch.device with a specified index":
    # the first GPU run of benchmarks/gpu_check.py failed every check on it.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    for name in ("cuda", "auto"):
        device = resolve_device(name)
        assert (device.type, device.index) == ("cuda", index)
