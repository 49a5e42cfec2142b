"""The weight sync's buckets: the actor's weights go to a rollout with its own copy as named tensors, in buckets
of at most ``actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes`` (verl's checkpoint
engine; a tensor larger than a bucket goes alone), so a sync holds about one bucket besides the weights at
either end, never a second whole copy in flight.

Two paths use them (docs/architecture.md, "Weight sync"):

- an engine in the worker's own process (vllm; sglang's engine runs in subprocesses): `bucketed_stream` feeds
  it the full tensors a bucket at a time (FSDP2 shards gathered for that bucket only);
- the separate rollout role (``separate_async``): the actor packs each bucket into one flat buffer per dtype
  (`pack_buckets`); in a Ray worker each packed bucket is put in Ray's object store on its own (shared memory on
  one node, Ray's transfer across nodes), so the rollout fetches, copies in and drops one bucket at a time
  (`receive_buckets`); in-process (``trainer.backend=local``) the buckets are handed over as they are.

``backend``: ``naive`` is the transport above; ``nccl`` (CUDA only, the config maps it to naive elsewhere) is
the same path with the tensors on the GPU for the in-process engine (the gathers are NCCL collectives); the
separate role then still goes through Ray's object store (a direct NCCL group between the actor and the
rollout is not built).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.workers.engine.packed_weights import pack_weights, unpack_weights

SECTION = "actor_rollout_ref.rollout.checkpoint_engine"
DEFAULT_BACKEND = "naive"
DEFAULT_BUCKET_MEGABYTES = 2048
"""verl 0.9.1's defaults"""

Named = Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class SyncSettings:
    backend: str = DEFAULT_BACKEND
    bucket_bytes: int = DEFAULT_BUCKET_MEGABYTES << 20


def sync_settings(config: Any) -> SyncSettings:
    """The checkpoint engine's keys from a trainer config, or from its ``actor_rollout_ref.rollout`` section
    (what an engine is built with); verl's defaults where the section is absent."""
    if config is None:
        return SyncSettings()
    section = OmegaConf.select(config, SECTION, default=None) if OmegaConf.is_config(config) else None
    if section is None:
        section = getattr(config, "checkpoint_engine", None)
    if section is None:
        return SyncSettings()
    backend = section.get("backend", None) or DEFAULT_BACKEND
    megabytes = section.get("update_weights_bucket_megabytes", None) or DEFAULT_BUCKET_MEGABYTES
    return SyncSettings(str(backend), max(1, int(megabytes)) << 20)


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def buckets(weights: Named, limit: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of (name, tensor), in order, holding at most ``limit`` bytes each (a larger tensor
    alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        size_of = nbytes(tensor)
        if bucket and size + size_of > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += size_of
    if bucket:
        yield bucket


def bucketed_stream(
    weights: Named, limit: int, counts: list[int] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` again, one tensor at a time, but produced a bucket at a time (at most one bucket of full
    tensors alive besides the consumer's copy). ``counts``: [buckets, bytes] added to as they pass."""
    for bucket in buckets(weights, limit):
        if counts is not None:
            counts[0] += 1
            counts[1] += sum(nbytes(tensor) for _, tensor in bucket)
        yield from bucket
        bucket.clear()


def in_ray_worker() -> bool:
    """Whether this process is a Ray actor (a rank of a RayWorkerGroup), where the object store is at hand."""
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def pack_buckets(weights: Named, limit: int) -> list[Any]:
    """The weights as packed buckets (`pack_weights` each: one flat CPU buffer per dtype), in order. In a Ray
    worker each bucket is put in the object store as it is packed and only its reference kept, so this process
    holds one bucket at a time."""
    put = None
    if in_ray_worker():
        import ray

        put = ray.put
    out = []
    for bucket in buckets(weights, limit):
        packed = pack_weights(dict(bucket))
        bucket.clear()
        out.append(put(packed) if put is not None else packed)
    return out


def receive_buckets(packed: Iterable[Any]) -> Iterator[dict[str, torch.Tensor]]:
    """The state dicts of `pack_buckets`' buckets, one at a time (a reference into Ray's object store fetched
    when its turn comes)."""
    for item in packed:
        if not isinstance(item, dict):
            import ray

            item = ray.get(item)
        yield unpack_weights(item)


def checksum(named: Named) -> str:
    """A digest of tensors' names, dtypes, shapes and bytes: equal exactly when they are equal bit for bit."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(named, key=lambda item: item[0]):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
