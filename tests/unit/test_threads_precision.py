"""trainer.torch_threads=auto and the compute dtype a role picks (verl.utils.threads, verl.utils.precision)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from verl.utils.precision import (
    choose_compute_dtype,
    compute_in,
    frozen_linear_weights_in,
    hold_frozen_weights_in,
    role_compute_dtype,
    rollout_compute_dtype,
)
from verl.utils.threads import SMALL_MODEL_PARAMS, choose_torch_threads, computing_processes, count_parameters
from verl.workers.engine.scoring import PolicyScorer

CPU = torch.device("cpu")


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A safetensors file with these tensor shapes (zero-filled float32)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * int(torch.tensor(shape).prod()) if shape else 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_parameter_count_from_safetensors_headers(tmp_path: Path) -> None:
    _safetensors(tmp_path / "model-00001.safetensors", {"a": [3, 4], "b": [5]})
    _safetensors(tmp_path / "model-00002.safetensors", {"c": [2, 2, 2]})
    assert count_parameters(tmp_path) == 12 + 5 + 8
    assert count_parameters(tmp_path / "missing") is None and count_parameters("Qwen/Qwen2.5-0.5B") is None
    assert count_parameters(tmp_path.parent) is None  # no weights there


def test_auto_threads_by_model_size_cores_and_processes(tmp_path: Path) -> None:
    big, small = tmp_path / "big", tmp_path / "small"
    big.mkdir(), small.mkdir()
    _safetensors(big / "model.safetensors", {"w": [SMALL_MODEL_PARAMS]})
    _safetensors(small / "model.safetensors", {"w": [SMALL_MODEL_PARAMS - 1]})
    assert choose_torch_threads("auto", model_path=str(big), cores=8).threads == 8
    assert choose_torch_threads("auto", model_path=str(big), cores=8, processes=2).threads == 4
    assert choose_torch_threads("auto", model_path=str(big), cores=2, processes=4).threads == 1
    small_choice = choose_torch_threads("auto", model_path=str(small), cores=8)
    assert small_choice.threads == 1 and "too small to split" in small_choice.describe()
    unknown = choose_torch_threads("auto", model_path="org/model", cores=6, processes=2)
    assert unknown.threads == 3 and "model size unknown" in unknown.reason
    assert choose_torch_threads(3, model_path=str(small), cores=8).threads == 3  # a number is taken as given
    assert choose_torch_threads(None, model_path=str(big), cores=8).threads is None


def test_computing_processes_follow_the_backend() -> None:
    assert computing_processes(OmegaConf.create({"backend": "local", "n_gpus_per_node": 4})) == 1
    assert computing_processes(OmegaConf.create({"backend": "ray", "n_gpus_per_node": 2})) == 2


@pytest.mark.parametrize(
    ("asked", "device", "weights", "bf16_cpu", "expected"),
    [
        (None, "cpu", torch.float32, True, torch.bfloat16),
        (None, "cpu", torch.float32, False, None),  # no bf16 instructions: emulated, slower
        (None, "cpu", torch.bfloat16, True, None),  # bf16 weights compute in bf16 anyway
        (None, "cuda", torch.float32, False, torch.bfloat16),  # verl's GPU default
        ("fp32", "cpu", torch.float32, True, None),
        ("bf16", "cpu", torch.float32, False, torch.bfloat16),  # asked for: taken, even where slow
    ],
)
def test_compute_dtype_choice(
    asked: str | None,
    device: str,
    weights: torch.dtype,
    bf16_cpu: bool,
    expected: torch.dtype | None,
) -> None:
    choice = choose_compute_dtype(
        asked, device=torch.device(device), weights_dtype=weights, cpu_bf16=bf16_cpu
    )
    assert choice.dtype == expected, choice.reason


def test_fsdp2_and_rollout_dtypes() -> None:
    model = torch.nn.Linear(4, 4)
    cfg = OmegaConf.create({"mixed_precision": {"param_dtype": "bf16"}})
    sharded = role_compute_dtype(cfg, device=CPU, weights_dtype=torch.float32, sharded=True, key="k")
    assert sharded.dtype is None and "FSDP2" in sharded.reason  # its policy casts, not an autocast
    actor = role_compute_dtype(cfg, device=CPU, weights_dtype=torch.float32, sharded=False, key="k")
    assert actor.dtype == torch.bfloat16
    assert rollout_compute_dtype(None, actor, model) == torch.bfloat16  # follows the actor
    assert rollout_compute_dtype("fp32", actor, model) is None  # the weights' own dtype
    assert rollout_compute_dtype("bf16", sharded, model) == torch.bfloat16


def test_compute_in_autocasts_only_when_asked() -> None:
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with compute_in(None):
        assert (a @ b).dtype == torch.float32
    with compute_in(torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16


def test_bf16_scorer_is_close_to_fp32(tiny_model_dir) -> None:
    """bf16 autocast changes log-probs by bf16 rounding only (the log-softmax in fp32), and its gradients
    reach the fp32 weights as fp32."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    rows, prompt, response = 4, 6, 5
    input_ids = torch.randint(0, vocab, (rows, prompt + response))
    mask = torch.ones_like(input_ids)
    positions = torch.arange(prompt + response).expand(rows, -1)
    responses, response_mask = input_ids[:, prompt:], torch.ones(rows, response, dtype=torch.long)
    fp32, _ = PolicyScorer(model)(input_ids, mask, positions, responses, response_mask)
    scorer = PolicyScorer(model, compute_dtype=torch.bfloat16)
    logits_dtypes = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits_dtypes.append(o.dtype))
    bf16, _ = scorer(input_ids, mask, positions, responses, response_mask)
    hook.remove()
    assert bf16.dtype == torch.float32 and logits_dtypes == [torch.bfloat16]
    gap = (bf16 - fp32).abs().max().item()
    assert 0 < gap < 0.1  # bf16 rounding (about 3 significant digits) in the body, not a different model
    bf16.sum().backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_a_training_forward_is_not_perturbed_by_autocast_in_another_thread():
    """Autocast's cache of cast weights is one per process and any thread's autocast exit clears it. A
    training forward under `compute_in` does not use it, so roles in threads of one process (the local
    backend) train the same numbers whatever the other threads do. (With the cache, a weight used twice
    got its gradient summed in bf16 or in fp32 depending on timing: most of these sums changed.)"""
    import threading

    from verl.utils.precision import compute_in

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(16, 64)

    def grad_sums(steps: int = 100) -> list[float]:
        sums = []
        for _ in range(steps):
            with compute_in(torch.bfloat16):
                out = layer(layer(x))  # the weight is used twice: a cached cast would be shared
            out.float().square().mean().backward()
            sums.append(layer.weight.grad.sum().item())
            layer.zero_grad()
        return sums

    alone = grad_sums()
    stop = threading.Event()

    def other_thread() -> None:
        while not stop.is_set():
            with torch.no_grad(), compute_in(torch.bfloat16):
                torch.mm(x, x.T)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        beside = grad_sums()
    finally:
        stop.set()
        thread.join()
    assert beside == alone


@pytest.mark.parametrize(
    ("env", "capped"),
    [
        ({}, None),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "ONEDNN_MAX_CPU_ISA=AVX2"),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "ONEDNN_MAX_CPU_ISA=avx512_core"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, None),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None),
        ({"ATEN_CPU_CAPABILITY": "avx2"}, "ATEN_CPU_CAPABILITY=avx2"),
        ({"ATEN_CPU_CAPABILITY": "default"}, "ATEN_CPU_CAPABILITY=default"),
        ({"ATEN_CPU_CAPABILITY": "avx512"}, None),
    ],
)
def test_kernels_capped_below_bf16_are_seen(env, capped) -> None:
    from verl.utils.cpu import bf16_kernels_capped

    assert bf16_kernels_capped(env) == capped


def test_auto_dtype_is_fp32_when_the_kernels_are_capped(monkeypatch) -> None:
    # on a bf16 CPU capped to AVX2 (how the learning matrix computes as an older CPU), auto picked bf16 and
    # oneDNN then refused its bf16 weights: "bf16 path needs the cpu support avx_ne_convert or avx512bw ..."
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    choice = choose_compute_dtype(None, device=torch.device("cpu"), weights_dtype=torch.float32)
    assert choice.dtype is None and "ONEDNN_MAX_CPU_ISA=AVX2 caps the CPU kernels below bf16" in choice.reason


def test_a_damaged_safetensors_file_leaves_the_model_size_unknown(tmp_path) -> None:
    # the model's loading names the damaged file; the thread choice must not fail first with a JSON traceback
    from verl.utils.threads import count_parameters

    (tmp_path / "model.safetensors").write_bytes(b"")
    assert count_parameters(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes((64).to_bytes(8, "little") + b"\x00" * 64)
    assert count_parameters(tmp_path) is None


def _frozen_base_model() -> tuple[torch.nn.ModuleDict, Any]:
    """An embedding, a frozen linear layer, a trained one and an LM head tied to the embedding; and a function
    running a bf16-autocast forward and backward through them, returning the output and the trained grad."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(10, 8)
    frozen, trained, tied = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 10, bias=False)
    tied.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "frozen": frozen, "trained": trained, "tied": tied})
    for module in (embed, frozen):
        module.requires_grad_(False)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        trained.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model["tied"](model["trained"](model["frozen"](model["embed"](ids))))
        out.float().sum().backward()
        return out.detach(), trained.weight.grad.clone()

    return model, run


def test_frozen_linear_weights_are_cast_once_with_the_same_numbers() -> None:
    """Frozen linear weights are held in bf16 for a phase (autocast's matmul would cast them anyway): the
    same bf16-autocast output and gradients; trained weights and a weight tied to an embedding stay fp32;
    the fp32 originals are back afterwards."""
    model, run = _frozen_base_model()
    embed, frozen, trained, tied = (model[k] for k in ("embed", "frozen", "trained", "tied"))
    before = frozen.weight.data_ptr()
    expected = run()
    with frozen_linear_weights_in(model, torch.bfloat16):
        assert frozen.weight.dtype == torch.bfloat16
        assert trained.weight.dtype == tied.weight.dtype == torch.float32
        got = run()
    assert frozen.weight.data_ptr() == before and frozen.weight.dtype == torch.float32
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    with frozen_linear_weights_in(model, None):
        assert frozen.weight.dtype == torch.float32


def test_a_lora_base_held_in_bf16_for_good_gives_the_same_numbers() -> None:
    """hold_frozen_weights_in: the frozen linear weights become bf16 for good (no fp32 copy left), trained and
    tied weights stay fp32, and a bf16-autocast forward and backward are the same as with the fp32 originals."""
    model, run = _frozen_base_model()
    embed, frozen, trained, tied = (model[k] for k in ("embed", "frozen", "trained", "tied"))
    expected = run()
    assert hold_frozen_weights_in(model, None) == 0 and frozen.weight.dtype == torch.float32
    embed_storage = embed.weight.data_ptr()
    assert hold_frozen_weights_in(model, torch.bfloat16) == 8 * 8 * 2  # 4 -> 2 bytes per frozen linear weight
    assert frozen.weight.dtype == torch.bfloat16
    assert trained.weight.dtype == tied.weight.dtype == embed.weight.dtype == torch.float32
    assert tied.weight is embed.weight and embed.weight.data_ptr() != embed_storage  # copied, still tied
    got = run()
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
