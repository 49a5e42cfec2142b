"""SGLang as the rollout engine (``actor_rollout_ref.rollout.name=sglang``): the vllm engine's shape on
SGLang's offline ``Engine`` API.

Untested against SGLang itself: SGLang needs a GPU and is not installable on the CPU machines this was built
on; tests/unit/test_sglang_adapter.py checks it against a stand-in with the API's documented shape
(``Engine(**server_args)``, ``generate(input_ids=, sampling_params=, return_logprob=True)`` answering
``output_ids`` and ``meta_info.output_token_logprobs`` / ``finish_reason``, ``update_weights_from_tensor``,
``release_memory_occupation`` / ``resume_memory_occupation``). Start-up says so.

The engine runs its scheduler in subprocesses: weights go over in buckets of at most
``rollout.checkpoint_engine.update_weights_bucket_megabytes`` (tensors by HF name, one
``update_weights_from_tensor`` call per bucket; SGLang loads the names it is given). LoRA is not built for it (refused). The log-probs are SGLang's for the sampled tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.models.lora import has_adapters
from verl.workers.rollout.base import SamplingParams, TokenRequest, TokenResponse, register_rollout
from verl.workers.rollout.served import ServedEngine, known_engine_args, start_in_process
from verl.workers.rollout.weight_sync import buckets

__all__ = ["SGLangRollout", "buckets", "import_sglang"]


def import_sglang() -> Any:
    try:
        import sglang
    except ImportError as error:
        raise ImportError(
            f"actor_rollout_ref.rollout.name=sglang needs SGLang ({error}); install it with pip install -e "
            '".[sglang]" on a GPU machine'
        ) from error
    return sglang


@register_rollout("sglang")
class SGLangRollout(ServedEngine):
    """An SGLang engine with its own copy of the policy, synchronised by version (see the module docstring;
    the constructor's arguments: `ServedEngine`)."""

    label = "SGLang"
    package = "sglang"

    def _import(self, model: torch.nn.Module) -> Any:
        if has_adapters(model) and not self.merge_lora:
            raise ValueError(
                "rollout.name=sglang with LoRA adapters (model.lora_rank > 0) is not built; set "
                "actor_rollout_ref.model.lora_merge=true (merged weights at every sync) or use rollout.name=vllm"
            )
        return import_sglang()

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
        on_gpu = device.type == "cuda"
        options: dict[str, Any] = {
            "model_path": str(self.dir),
            "dtype": str(dtype).removeprefix("torch."),
            "context_length": max_model_len,
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "random_seed": seed,
            "mem_fraction_static": float(config.gpu_memory_utilization),
            "max_running_requests": int(config.max_num_seqs),
            "enable_memory_saver": on_gpu and bool(config.free_cache_engine),
            "tp_size": 1,
            "log_level": "error",
        }
        if on_gpu:
            options["base_gpu_id"] = device.index or 0
        try:
            from sglang.srt.server_args import ServerArgs
        except ImportError:  # the arguments are then passed unchecked
            ServerArgs = None  # noqa: N806
        options.update(known_engine_args(config.engine_kwargs.sglang, ServerArgs, "sglang"))
        self.sleeps = bool(options["enable_memory_saver"])
        self.engine = start_in_process(lambda: module.Engine(**options))

    def _load(self, model: torch.nn.Module) -> None:
        # (the stream is produced a bucket at a time already; these are the same buckets)
        for bucket in buckets(self._policy_weights(model), self.sync.bucket_bytes):
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=True)

    def _generate(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        outputs = self.engine.generate(
            input_ids=[request.prompt_ids for request in requests],
            sampling_params=[self._sampling_params(request.sampling) for request in requests],
            return_logprob=True,
        )
        responses = []
        for request, output in zip(requests, outputs, strict=True):
            meta = output["meta_info"]
            log_probs = [float(entry[0]) for entry in meta["output_token_logprobs"]]
            finish = meta.get("finish_reason") or {}
            reason = "stop" if finish.get("type") == "stop" else "length"
            responses.append(TokenResponse(request.request_id, list(output["output_ids"]), log_probs, reason))
        return responses

    def _sampling_params(self, sampling: SamplingParams) -> dict[str, Any]:
        return {
            "temperature": sampling.temperature if sampling.do_sample else 0.0,
            "top_p": sampling.top_p if sampling.do_sample else 1.0,
            "top_k": sampling.top_k if sampling.do_sample and sampling.top_k > 0 else -1,
            "max_new_tokens": sampling.max_new_tokens,
            "stop_token_ids": sampling.stop_tokens(self.stop_ids),
            "ignore_eos": sampling.ignore_eos,
        }

    def _release(self) -> None:
        self.engine.release_memory_occupation()

    def _resume(self) -> None:
        self.engine.resume_memory_occupation()
