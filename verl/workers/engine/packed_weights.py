"""A model's weights as one flat buffer per dtype: cheap to send between processes (one tensor for Ray's
serialiser instead of one per parameter; measured 15 ms for the 1M default model's ~50 tensors)."""

from __future__ import annotations

from typing import Any

import torch


def pack_weights(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """``{"names", "shapes", "dtypes", "buffers"}``: each tensor flattened into its dtype's buffer, in order."""
    buffers: dict[str, list[torch.Tensor]] = {}
    names, shapes, dtypes = [], [], []
    for name, tensor in state.items():
        key = str(tensor.dtype)
        names.append(name)
        shapes.append(tuple(tensor.shape))
        dtypes.append(key)
        buffers.setdefault(key, []).append(tensor.detach().reshape(-1).to("cpu"))
    flat = {key: torch.cat(parts) for key, parts in buffers.items()}
    return {"names": names, "shapes": shapes, "dtypes": dtypes, "buffers": flat}


def unpack_weights(packed: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The state dict :func:`pack_weights` packed (views into its buffers)."""
    offsets = dict.fromkeys(packed["buffers"], 0)
    state = {}
    for name, shape, key in zip(packed["names"], packed["shapes"], packed["dtypes"], strict=True):
        count = 1
        for dim in shape:
            count *= dim
        start = offsets[key]
        state[name] = packed["buffers"][key][start : start + count].view(shape)
        offsets[key] = start + count
    return state
