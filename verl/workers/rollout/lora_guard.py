"""The LoRA guard: after every weight sync into a rollout with weights of its own, check that it will generate
with the adapters of the version just synced, not from the base model or a stale version.

verl users lost runs to a rollout that silently generated from the base model after a sync (the adapters not
loaded, loaded empty, or not named by the requests). Two places hold adapters of their own:

- the separate rollout role's model (``separate_async``): the digest of its adapter tensors after the copy
  must equal the digest the actor computed of the tensors it sent (`check_model_adapters`), and its LoRA
  layers must be switched on;
- a vLLM engine (the base once, then the adapters through its LoRA loader): the adapter id every generate names
  must be registered in the engine, and the adapter tensors the engine holds (packed as it packs them, in its
  dtype, the scaling folded into B) must equal the policy's (`check_vllm_adapters`); with merged weights
  (``model.lora_merge``) an adapted projection read back from the engine must be the merged weight
  (`check_vllm_merged`).

A failed check stops the run with one line (:class:`LoraSyncError`). Its cost is one pass over the adapter
tensors (small beside the base weights; measured in docs/architecture.md).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.models.lora import adapter_weight_names, has_adapters
from verl.workers.rollout.weight_sync import checksum

logger = logging.getLogger(__name__)


class LoraSyncError(RuntimeError):
    """The rollout would generate from the base model or from stale adapters after a weight sync."""


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s adapter weights by state-dict name (``...q_proj.lora_A.default.weight``); empty without."""
    names = adapter_weight_names(model)
    return {name: t for name, t in model.state_dict(keep_vars=False).items() if name in names}


def adapters_on(model: torch.nn.Module) -> bool:
    """Whether every LoRA layer of ``model`` applies its adapters (none disabled, none merged away)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return all(not m.disable_adapters for m in model.modules() if isinstance(m, BaseTunerLayer))


def check_model_adapters(model: torch.nn.Module, expected: str | None, version: int) -> None:
    """The separate rollout role after a copy: its adapters are the ones the actor sent (``expected``, their
    `checksum`) and switched on. A model without adapters, or no digest sent, is not checked."""
    if expected is None or not has_adapters(model):
        return
    held = checksum(adapter_tensors(model).items())
    if held != expected:
        raise LoraSyncError(
            f"LoRA guard: after the weight sync to policy version {version} the rollout's adapters are not the "
            f"actor's (digest {held[:12]} held, {expected[:12]} sent): it would generate from the base model or "
            "stale adapters"
        )
    if not adapters_on(model):
        raise LoraSyncError(
            f"LoRA guard: after the weight sync to policy version {version} the rollout's LoRA layers are "
            "disabled: it would generate from the base model"
        )


def expected_vllm_adapters(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, ...]]:
    """The policy's adapters as vLLM holds them, in float32: by module name (``model.layers.0.self_attn.q_proj``),
    A and B x scaling (vLLM folds the scaling into B). FSDP2 shards are gathered (every rank calls this)."""
    from peft.tuners.lora import LoraLayer

    from verl.workers.rollout.served import full

    out = {}
    for prefix, module in model.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
            continue
        a = full(module.lora_A["default"].weight).to("cpu", torch.float32)
        b = full(module.lora_B["default"].weight).to("cpu", torch.float32)
        out[prefix] = (a, b * module.scaling["default"])
    return out


def engine_adapter_mismatches(
    worker: Any, lora_id: int, expected: dict[str, tuple[torch.Tensor, ...]]
) -> list[str]:
    """In the vLLM worker: what differs between the adapter ``lora_id`` it holds and ``expected`` (one line
    each; empty when it holds exactly those). Packed modules (qkv_proj, gate_up_proj) are unpacked into the
    modules they pack, by vLLM's own mapping."""
    manager = getattr(worker.model_runner, "lora_manager", None)
    adapters = manager._adapter_manager if manager is not None else None
    held_model = adapters.get_adapter(lora_id) if adapters is not None else None
    if held_model is None:
        return [f"adapter {lora_id} is not registered in the engine"]
    held: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, weights in held_model.loras.items():
        if isinstance(weights.lora_a, list):
            for sub, a, b in zip(
                adapters.packed_modules.get(name, []), weights.lora_a, weights.lora_b, strict=False
            ):
                if a is not None:
                    held[sub] = (a, b)
        else:
            held[name] = (weights.lora_a, weights.lora_b)
    problems = []
    for name, (a, b) in expected.items():
        if name not in held:
            problems.append(f"{name}: no adapter in the engine")
            continue
        for label, want, got in (("A", a, held[name][0]), ("B", b, held[name][1])):
            # in the engine's dtype: the cast and the scaling may each round once there
            got = got.detach().to("cpu")
            want = want.to(got.dtype).float()
            if got.shape != want.shape:
                problems.append(f"{name}.{label}: shape {tuple(got.shape)} held, {tuple(want.shape)} trained")
            elif not torch.allclose(got.float(), want, rtol=2 * torch.finfo(got.dtype).eps, atol=0.0):
                diff = float((got.float() - want).abs().max())
                problems.append(f"{name}.{label}: max |difference| {diff:.3g}")
    return problems


def check_vllm_adapters(llm: Any, lora_request: Any, model: torch.nn.Module, version: int) -> None:
    """After a LoRA sync into a vLLM engine (in this process): the requests will name the adapter, and the
    adapter the engine holds is the policy's (`engine_adapter_mismatches`)."""
    if lora_request is None:
        raise LoraSyncError(
            f"LoRA guard: after the weight sync to policy version {version} the vLLM engine's requests name no "
            "adapter: it would generate from the base model"
        )
    expected = expected_vllm_adapters(model)
    results = llm.collective_rpc(
        lambda worker: engine_adapter_mismatches(worker, lora_request.lora_int_id, expected)
    )
    problems = [line for result in results for line in result]
    if problems:
        raise LoraSyncError(
            f"LoRA guard: after the weight sync to policy version {version} the vLLM engine would not generate "
            f"with the policy's adapters ({len(problems)} differences, first: {problems[0]}): it would generate "
            "from the base model or stale adapters"
        )


def engine_projection(
    worker: Any, widths: dict[str, int], seed: int
) -> tuple[str, torch.Tensor, torch.Tensor, torch.dtype] | None:
    """In the vLLM worker: the first of ``widths``' names (HF weight names, each with its input width; vLLM fuses
    q/k/v and gate/up, so only the projections it keeps apart are found) applied to a random probe of its width
    (drawn from ``seed``) as the engine computes it (on a CPU vLLM repacks the weights for its kernels and keeps
    no readable ``weight``), without bias: its name, the probe, the output in float32 and the dtype it computed
    in; None when none is found."""
    modules = dict(worker.model_runner.model.named_modules())
    for name, width in widths.items():
        module = modules.get(name.removesuffix(".weight"))
        if module is not None and hasattr(module, "quant_method"):
            probe = torch.randn(4, width, generator=torch.Generator().manual_seed(seed))
            dtype = getattr(module, "params_dtype", probe.dtype)
            with torch.no_grad():
                out = module.quant_method.apply(module, probe.to(dtype))
            return name, probe, out.detach().to("cpu", torch.float32), out.dtype
    return None


def check_vllm_merged(llm: Any, model: torch.nn.Module, version: int) -> None:
    """After a sync of merged weights into a vLLM engine (``model.lora_merge``): one adapted projection the
    engine keeps unfused (o_proj, down_proj, ...) computes with the policy's merged weight, checked on a random
    probe against ``probe @ W_merged.T``, within the rounding of the engine's dtype (in bf16 that bound is ~1.6% of
    the sum of |probe| x |W|: a small stale update can pass there, a lost merge of trained adapters does not). A
    base-model or stale weight differs there once the adapters have trained (at the start B = 0 and the merged
    weight is the base, which is then right). Without an unfused adapted projection there is nothing to probe;
    the log says so."""
    from verl.workers.rollout.served import adapted_layers, full, merged_weight

    layers = adapted_layers(model)
    if not layers:
        return
    widths = {name: module.get_base_layer().weight.shape[1] for name, module in layers.items()}
    results = llm.collective_rpc(lambda worker: engine_projection(worker, widths, version))
    found = results[0] if results else None
    if found is None:
        logger.warning(
            "LoRA guard: the vLLM engine keeps none of the adapted projections apart (all fused): merged "
            "weights are not checked"
        )
        return
    name, probe, got, engine_dtype = found
    weight = merged_weight(layers[name], full(layers[name].get_base_layer().weight))
    want = probe @ weight.T
    eps = torch.finfo(engine_dtype).eps
    # the probe rounded to the engine's dtype (half a step), the weight too (`round_merged`: within a step), the
    # sum accumulated in float32
    bound = (2 * eps + widths[name] * torch.finfo(torch.float32).eps) * float(
        (probe.abs() @ weight.abs().T).max()
    )
    error = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
    if error > bound:
        raise LoraSyncError(
            f"LoRA guard: after the weight sync to policy version {version} the vLLM engine's {name} does not "
            f"compute with the policy's merged weight (max |difference| {error:.3g} on a probe, bound "
            f"{bound:.3g}): it would generate from the base model or a stale merge"
        )
