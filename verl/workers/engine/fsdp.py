"""FSDP2: each rank keeps 1/N of the parameters, gradients and optimizer state (verl's ``strategy=fsdp2``).

Built on ``torch.distributed.fsdp.fully_shard`` (gloo on CPU, nccl on GPU). A trained module is sharded
the way verl shards it: one FSDP unit per decoder layer (the model's ``_no_split_modules`` classes, or
``wrap_policy.transformer_layer_cls_to_wrap``), then the root. The root is the *scorer*
(`verl.workers.engine.scoring`), not the HF model: the scorer calls the decoder and the LM head
separately, and the root's hooks must see that whole forward to gather and reduce the embeddings,
final norm and head (as DDP must, for the same reason).

What each phase does with the shards:

- forward / backward of an update: each layer's parameters are all-gathered just before it runs and
  freed after (``reshard_after_forward``), its gradients reduce-scattered in the backward; every rank
  therefore runs the same number of forward passes (`verl.workers.engine.batching.lockstep_micro_batches`);
- rollout: `gathered` all-gathers every unit once and keeps the full weights until generation ends, so
  each rank may decode a different number of steps (no collective per step). That is the hybrid
  engine's resharding: one full copy of the weights per rank while generating, none after;
- checkpoints: each rank writes its shards with ``torch.distributed.checkpoint`` (`TrainedModel`), and
  a checkpoint loads on any number of ranks.

One rank alone still runs FSDP2 (a one-process group), so ``strategy=fsdp2`` means the same mixed
precision and the same checkpoint format at any scale.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from verl.models.loading import resolve_dtype
from verl.utils.precision import choose_compute_dtype, model_dtype, role_compute_dtype
from verl.workers.engine.distributed import process_group_backend

logger = logging.getLogger(__name__)


def ensure_process_group(device: torch.device) -> None:
    """FSDP2 needs a process group, also for one rank: a one-process group (no rendezvous) when none
    was formed (one worker, or the in-process backend)."""
    if not dist.is_initialized():
        dist.init_process_group(process_group_backend(device), store=dist.HashStore(), rank=0, world_size=1)


def device_mesh(fsdp_size: int, device: torch.device) -> DeviceMesh:
    """The ranks' mesh: all of them shard (``fsdp_size`` -1 or >= the world), or hybrid sharding, each
    group of ``fsdp_size`` ranks sharding one replica and the replicas averaging their gradients."""
    world = dist.get_world_size()
    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    if world % fsdp_size:
        raise ValueError(
            f"fsdp_config.fsdp_size={fsdp_size} must divide the number of ranks, {world} (or be -1: all ranks)"
        )
    return init_device_mesh(device.type, (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def mixed_precision(
    fsdp_cfg: Any, device: torch.device, key: str, weights_dtype: torch.dtype = torch.float32
) -> MixedPrecisionPolicy:
    """``fsdp_config.mixed_precision``: the dtype of the gathered parameters (forward and backward) and
    of the gradient reduction; the sharded parameters, and so the optimizer, stay in their own dtype.

    ``param_dtype`` None is chosen as strategy dp chooses it (`verl.utils.precision.choose_compute_dtype`):
    verl's bf16 on a GPU; on a CPU bf16 where it has bf16 instructions (AMX / avx512_bf16) and the kernels
    are not capped below them, the weights' own dtype elsewhere (there bf16 matrix products are emulated,
    several times slower than fp32)."""
    mp = fsdp_cfg.mixed_precision
    param_dtype = choose_compute_dtype(
        mp.param_dtype, device=device, weights_dtype=weights_dtype, key=f"{key}.mixed_precision.param_dtype"
    ).dtype
    reduce_dtype = resolve_dtype(mp.reduce_dtype, f"{key}.mixed_precision.reduce_dtype")
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def layer_classes(hf_model: torch.nn.Module, fsdp_cfg: Any) -> set[str]:
    """The module classes that become one FSDP unit each: the configured ones, else the model's own
    ``_no_split_modules`` (its decoder layer, as verl's wrap policy)."""
    configured = fsdp_cfg.wrap_policy.transformer_layer_cls_to_wrap
    if configured:
        return {configured} if isinstance(configured, str) else set(configured)
    return set(getattr(hf_model, "_no_split_modules", None) or ())


def shard(
    root: torch.nn.Module, hf_model: torch.nn.Module, fsdp_cfg: Any, device: torch.device, key: str
) -> None:
    """``fully_shard`` each layer of ``hf_model``, then ``root`` (the scorer around it), in place.

    Building the shards is a collective: every rank calls it together. Rank 0's weights are broadcast
    first, so the shards are cut from one copy even where ranks initialised a part differently.
    """
    ensure_process_group(device)
    _broadcast_from_rank0(root)
    options = {
        "mesh": device_mesh(fsdp_cfg.fsdp_size, device),
        "reshard_after_forward": bool(fsdp_cfg.reshard_after_forward),
        "mp_policy": mixed_precision(fsdp_cfg, device, key, model_dtype(hf_model)),
    }
    if fsdp_cfg.offload_policy:
        if device.type != "cuda":
            raise ValueError(
                f"{key}.offload_policy=true keeps the shards in CPU memory between uses of a GPU; training "
                "here runs on the CPU already, so there is nothing to offload (set it to false)"
            )
        from torch.distributed.fsdp import CPUOffloadPolicy

        options["offload_policy"] = CPUOffloadPolicy()
    classes = layer_classes(hf_model, fsdp_cfg)
    layers = [m for m in hf_model.modules() if type(m).__name__ in classes]
    if classes and not layers:
        raise ValueError(
            f"{key}.wrap_policy.transformer_layer_cls_to_wrap={sorted(classes)}: no module of "
            f"{type(hf_model).__name__} has that class"
        )
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(root, **options)
    # FSDP2 settles which module is the root at its first forward; the rollout may run the decoder
    # layers (inside `gathered`) before the root ever runs, so settle it now.
    root._get_fsdp_state()._lazy_init()
    root.verl_reshard_after_forward = options["reshard_after_forward"]  # restored after `gathered`


def _broadcast_from_rank0(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (what DDP does when it is built): a freshly
    initialised value head or LoRA adapter differs per rank, and the shards are cut from each rank's own
    copy."""
    if dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def shard_with_optimizer(
    root: torch.nn.Module,
    hf_model: torch.nn.Module,
    fsdp_cfg: Any,
    device: torch.device,
    key: str,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """`shard`, and point ``optimizer`` (built over the unsharded parameters, with no state yet) at the
    shards that replace them, group by group, by parameter name."""
    names = {id(p): n for n, p in root.named_parameters()}
    groups = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups] if optimizer else []
    if optimizer is not None and optimizer.state:
        raise RuntimeError("shard the model before the optimizer takes a step: its state would be lost")
    shard(root, hf_model, fsdp_cfg, device, key)
    if optimizer is not None:
        sharded = dict(root.named_parameters())
        for group, group_names in zip(optimizer.param_groups, groups, strict=True):
            group["params"] = [sharded[n] for n in group_names]


def fsdp_modules(module: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def is_fsdp(module: torch.nn.Module) -> bool:
    return isinstance(module, FSDPModule)


def needs_lockstep(module: torch.nn.Module) -> bool:
    """Whether every rank must run the same number of forward passes through ``module``: sharded over
    more than one rank (each pass gathers its layers from all of them)."""
    return is_fsdp(module) and dist.get_world_size() > 1


@contextlib.contextmanager
def gathered(module: torch.nn.Module) -> Iterator[None]:
    """Full weights in every FSDP unit of ``module`` for the duration (the rollout's), then the shards
    again. Nothing is gathered twice: forward passes inside find their layers already gathered, so a
    rank may run any number of them without waiting for the others."""
    units = fsdp_modules(module)
    if not units:
        yield
        return
    root = units[0]
    root.set_reshard_after_forward(False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        # Every unit, the root too, back to the setting `shard` gave it (the root's gathered embeddings and
        # head would otherwise stay allocated after every no-grad pass).
        root.set_reshard_after_forward(getattr(root, "verl_reshard_after_forward", True))


def local_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes this rank holds of ``tensors`` (its shard of a DTensor, the whole of a plain tensor)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


class Offload:
    """``fsdp_config.param_offload`` / ``optimizer_offload`` on a GPU: the parameter shards (and their
    gradients) and the optimizer state live in CPU memory between phases, and come to the GPU only for
    the phase that uses them (:meth:`resident`), as verl's FSDP workers do. On a CPU device everything
    is in CPU memory already, and with ``offload_policy`` FSDP2 itself keeps the shards there: nothing
    moves (said once)."""

    def __init__(
        self,
        module: torch.nn.Module,
        fsdp_cfg: Any,
        device: torch.device,
        key: str,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        asked = [name for name in ("param_offload", "optimizer_offload") if fsdp_cfg[name]]
        moves = device.type == "cuda" and not fsdp_cfg.offload_policy
        if asked and not moves:
            why = (
                "with offload_policy=true (FSDP2 keeps the shards, and steps the optimizer, on the CPU)"
                if fsdp_cfg.offload_policy
                else "on the CPU (the weights and optimizer state are in CPU memory already)"
            )
            logger.warning("%s: no effect %s", ", ".join(f"{key}.{name}=true" for name in asked), why)
        self.module, self.device, self.optimizer = module, device, optimizer
        self.params = moves and "param_offload" in asked
        self.optimizer_state = moves and "optimizer_offload" in asked and optimizer is not None
        self._depth = 0  # phases can nest (a save inside an update): only the outermost one moves
        if self.params:
            module.to("cpu")

    @contextlib.contextmanager
    def resident(self, optimizer: bool = False) -> Iterator[None]:
        """The parameters (and, with ``optimizer``, the optimizer state) on the device for the duration."""
        outermost = self._depth == 0
        params = outermost and self.params
        optim = outermost and optimizer and self.optimizer_state
        if params:
            self.module.to(self.device)
        if optim:
            _move_optimizer_state(self.optimizer, self.device)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if optim:
                _move_optimizer_state(self.optimizer, torch.device("cpu"))
            if params:
                self.module.to("cpu")


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and name != "step":  # AdamW keeps its step count on the CPU
                # To the GPU asynchronously (the step waits on the stream); back to the CPU synchronously, so
                # nothing reads a half-copied tensor between phases.
                state[name] = value.to(device, non_blocking=device.type == "cuda")


def place_frozen(
    scorer: torch.nn.Module,
    model: torch.nn.Module,
    fsdp_cfg: Any,
    device: torch.device,
    *,
    sharded: bool,
    key: str,
) -> Offload | None:
    """Hold a frozen model's scorer (the reference, a distillation teacher) as its role's ``fsdp_cfg`` (``key``)
    says: its compute dtype, and with FSDP2 (``sharded``) its layers sharded over the ranks and offloaded between
    passes (a collective: every rank places its frozen models together, in the same order). The `Offload` when
    sharded, else None."""
    weights_dtype = model_dtype(model)
    compute = role_compute_dtype(
        fsdp_cfg, device=device, weights_dtype=weights_dtype, sharded=sharded, key=key
    )
    scorer.compute_dtype = compute.dtype
    if not sharded:
        return None
    shard(scorer, model, fsdp_cfg, device, key)
    return Offload(scorer, fsdp_cfg, device, key)
