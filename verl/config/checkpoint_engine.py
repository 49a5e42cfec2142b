"""``actor_rollout_ref.rollout.checkpoint_engine``: which of verl's weight-sync backends run here, and what is
said about the section at start-up.

verl 0.9.1 registers six backends in its ``CheckpointEngineRegistry``: ``naive`` (colocated: the rollout reads
the trainer's weights in place), ``nccl`` (a CUDA collective from the trainer's ranks to the rollout's; on an
Ascend NPU the same name is HCCL), ``nixl`` and ``mooncake`` (RDMA transfer libraries), ``kimi_ckpt_engine`` and
``delta_sharded`` (changed weight shards only, over NCCL). Here the weight sync (``verl.workers.rollout``) reads
``backend`` and ``update_weights_bucket_megabytes``: ``naive`` hands the weights over in memory (over Ray with
``trainer.backend=ray``), ``nccl`` needs CUDA GPUs (``trainer.device=cuda``, or ``auto`` on a machine with one).
Where the workers compute on a CPU, ``nccl`` is mapped to ``naive``, as ``rollout.name=vllm`` is mapped to ``fast``
where vLLM is missing: the same weights arrive, so the same is learned (verl's own scripts set nccl, no device).
The others are refused with what they would need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from verl.config.errors import as_written
from verl.config.value_rules import check_at_least

SECTION = "actor_rollout_ref.rollout.checkpoint_engine"
BACKENDS = ("naive", "nccl")
"""backends the weight sync here runs"""
NOT_RUNNABLE = {
    "nixl": "moves the weights with NVIDIA's NIXL library over RDMA network cards (nixl and cupy are not "
    "dependencies here, and trainer and rollout share their processes' memory)",
    "mooncake": "moves the weights with the Mooncake transfer engine over RDMA network cards (its library is not "
    "a dependency here, and trainer and rollout share their processes' memory)",
    "kimi_ckpt_engine": "Kimi's checkpoint engine for Ascend NPUs (offload to host, then a broadcast): it needs "
    "its library and NPUs",
    "delta_sharded": "sends only the changed weight shards over NCCL to a rollout on GPUs of its own: it needs "
    "CUDA GPUs and a disaggregated rollout, which is not built here",
}
"""verl's other backends, and what each would need"""
DEFAULTS = {"backend": "naive", "update_weights_bucket_megabytes": 2048}


def checkpoint_engine_errors(errors: list[str], cfg: DictConfig) -> None:
    """``backend`` one of verl's names that runs here; the bucket at least 1 MiB."""
    section = cfg.actor_rollout_ref.rollout.checkpoint_engine
    backend = section.backend
    if backend in NOT_RUNNABLE:
        errors.append(
            f"{SECTION}.backend={backend}: {NOT_RUNNABLE[backend]}; accepted here: {' or '.join(BACKENDS)} "
            "(the same weights arrive)"
        )
    elif backend not in BACKENDS:
        errors.append(
            f"{SECTION}.backend must be one of {', '.join(BACKENDS)} (verl's {', '.join(NOT_RUNNABLE)} are not "
            f"built here); got {as_written(backend)}"
        )
    check_at_least(
        errors, f"{SECTION}.update_weights_bucket_megabytes", section.update_weights_bucket_megabytes, 1
    )


def fit_checkpoint_engine(cfg: DictConfig, remap: Callable[[str, Any], None]) -> None:
    """``backend=nccl`` where the workers compute on a CPU (``trainer.device=cpu``, the default, or ``auto``
    with no CUDA device): ``naive``, reported (the same weights arrive)."""
    if cfg.actor_rollout_ref.rollout.checkpoint_engine.backend != "nccl":
        return
    from verl.config.backends import rollout_without_gpu

    if rollout_without_gpu(cfg) is not None:
        remap(f"{SECTION}.backend", "naive")


def mapped_notice(cfg: DictConfig, key: str, asked: Any) -> str | None:
    """The start-up line for a backend :func:`fit_checkpoint_engine` changed, or None for another key."""
    if key != f"{SECTION}.backend":
        return None
    from verl.config.backends import rollout_without_gpu

    return (
        f"{key}={asked}: NCCL needs CUDA GPUs ({rollout_without_gpu(cfg)}); the weight sync hands the weights over "
        f"with backend={cfg.actor_rollout_ref.rollout.checkpoint_engine.backend} (the same weights arrive; "
        "trainer.device=cuda keeps nccl)"
    )


def checkpoint_engine_notices(cfg: DictConfig, mapped: dict[str, Any]) -> list[str]:
    """``backend`` / ``update_weights_bucket_megabytes`` set to other than verl's defaults: read by the weight
    sync (a key mapped to this machine has its own line)."""
    section = cfg.actor_rollout_ref.rollout.checkpoint_engine
    lines = []
    for leaf, default in DEFAULTS.items():
        key, value = f"{SECTION}.{leaf}", section[leaf]
        if value != default and key not in mapped:
            lines.append(
                f"{key}={as_written(value)}: read by the weight sync that sends the actor's weights to the rollout "
                f"engine after every update (backend={section.backend}, buckets of at most "
                f"{section.update_weights_bucket_megabytes} MiB)"
            )
    return lines
