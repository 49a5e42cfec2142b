"""Data parallelism with torch.distributed: process group, DDP wrapping and metric all-reduces.

One process per data-parallel rank. Whoever starts the processes sets the env:// variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE); with WORLD_SIZE unset or 1 everything here is a
no-op, so single-process code paths stay exactly as they were.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def is_distributed() -> bool:
    """Whether a default process group with more than one rank is active."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init_distributed(backend: str | None = None) -> bool:
    """Join the default process group when the environment asks for more than one rank.

    The backend defaults to nccl when CUDA is available, gloo otherwise (CPU). Calling it again
    once the group exists does nothing. Returns whether data parallelism is on.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dist.init_process_group(
            backend or process_group_backend(device), init_method="env://", timeout=collective_timeout()
        )
    return is_distributed()


def collective_timeout() -> timedelta:
    """How long a collective waits for its peers before it raises (gloo and nccl alike):
    ``VERL_COLLECTIVE_TIMEOUT_S``, which a Ray worker group sets to its call deadline
    (``trainer.worker_timeout_s``); torch's default of 30 minutes otherwise."""
    return timedelta(seconds=float(os.environ.get("VERL_COLLECTIVE_TIMEOUT_S", 1800)))


def process_group_backend(device: torch.device) -> str:
    """gloo on a CPU; on a GPU nccl for CUDA tensors and gloo for CPU ones (FSDP2's CPU offload reduces
    CPU gradients), as verl's workers do."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def destroy_distributed() -> None:
    """Leave the default process group, if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def dp_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def dp_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def _comm_device() -> torch.device:
    """nccl only reduces CUDA tensors; gloo reduces CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum each value over the ranks, in one packed float64 all-reduce (float64 keeps counts exact).

    Every rank must pass the same keys; they are packed in sorted order so insertion order does not
    matter. Without distributed the values come back unchanged.
    """
    if not is_distributed() or not values:
        return dict(values)
    keys = sorted(values)
    packed = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    return dict(zip(keys, packed.tolist(), strict=True))


def all_reduce_max(value: int) -> int:
    """The largest ``value`` over the ranks (``value`` itself without distributed)."""
    if not is_distributed():
        return value
    packed = torch.tensor([value], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(packed, op=dist.ReduceOp.MAX)
    return int(packed.item())


def wrap_ddp(module: torch.nn.Module) -> torch.nn.Module:
    """DDP around a trained module when distributed is on, else the module itself (also if already DDP).

    Building DDP is a collective: every rank must call it, and rank 0's weights are broadcast to all.
    ``find_unused_parameters=False``: every parameter of a causal LM / value model gets a gradient on
    every backward, and finding unused ones costs a graph traversal per step. ``device_ids=None`` is
    what DDP wants for CPU modules and accepts for single-device CUDA ones. Buffers keep DDP's default
    sync (LM buffers are constants, so it changes nothing; its keyword is being renamed across torch
    versions, so it is left alone).
    """
    if not is_distributed() or isinstance(module, DistributedDataParallel):
        return module
    return DistributedDataParallel(module, device_ids=None, find_unused_parameters=False)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The plain module inside a DDP wrapper (the module itself when not wrapped)."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def local_mini_batch_size(mini_batch_size: int, local_size: int) -> int:
    """This rank's share of a GLOBAL mini-batch: ``mini_batch_size // world_size`` rows.

    Every rank must run the same number of mini-batches (each optimizer step is a collective), so the
    global mini-batch must split evenly over the ranks and every shard must hold the same whole number
    of local mini-batches. With several ranks this is a collective (the shard sizes are compared first),
    so a mismatch raises the same ValueError on every rank instead of leaving one hanging.
    """
    world_size = dp_world_size()
    if world_size > 1:
        # Sizes are equal on all ranks iff (sum n)^2 == world_size * sum n^2 (Cauchy-Schwarz); every rank
        # sees the same sums, so all raise or none does.
        sums = all_reduce_sum({"n": local_size, "n2": local_size**2})
        if sums["n"] ** 2 != world_size * sums["n2"]:
            raise ValueError(
                f"data-parallel ranks got batches of different sizes (rank {dp_rank()}: {local_size} rows, "
                f"{sums['n']:.0f} in all over {world_size} ranks)"
            )
    if mini_batch_size <= 0 or mini_batch_size % world_size:
        raise ValueError(
            f"mini_batch_size {mini_batch_size} (global) must be a positive multiple of the "
            f"data-parallel world size {world_size}"
        )
    local = mini_batch_size // world_size
    if local_size % local:
        raise ValueError(
            f"this rank's batch of {local_size} rows is not divisible by its share of the mini-batch, "
            f"{local} rows (mini_batch_size {mini_batch_size} // world size {world_size})"
        )
    return local


@contextlib.contextmanager
def gradient_sync(module: torch.nn.Module, sync: bool) -> Iterator[None]:
    """Backward passes inside accumulate gradients locally, unless ``sync`` (DDP's ``no_sync``).

    Only the last micro-batch of a mini-batch needs the all-reduce: it reduces the gradients accumulated
    over all of them at once. For a module that is not DDP this does nothing.
    """
    if sync or not isinstance(module, DistributedDataParallel):
        yield
    else:
        with module.no_sync():
            yield


def consecutive_group(size: int) -> dist.ProcessGroup:
    """This rank's group of ``size`` consecutive ranks (0..size-1, size..2*size-1, ...): the grouping vLLM gives
    a tensor-parallel engine over the world. Every rank creates every group, as torch.distributed requires."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"{world} ranks do not split into groups of {size}")
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = group
    assert mine is not None
    return mine


def gather_rows(
    tensors: dict[str, torch.Tensor], group: dist.ProcessGroup
) -> tuple[dict[str, torch.Tensor], slice]:
    """Every rank's rows of ``tensors`` (same keys on every rank), concatenated in rank order, and the slice of
    the result that is this rank's."""
    parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, {key: value.cpu() for key, value in tensors.items()}, group=group)
    sizes = [len(next(iter(part.values()))) for part in parts]
    index = dist.get_rank(group)
    start = sum(sizes[:index])
    device = next(iter(tensors.values())).device
    gathered = {key: torch.cat([part[key] for part in parts]).to(device) for key in tensors}
    return gathered, slice(start, start + sizes[index])


def shared_seed(group: dist.ProcessGroup) -> int:
    """A random seed drawn by the group's first rank (from its torch generator), the same on every rank of it."""
    box = [int(torch.randint(0, 2**31 - 1, (1,)).item())]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]
