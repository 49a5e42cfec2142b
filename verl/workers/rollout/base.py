"""What every rollout engine shares: the registry and the layout of a generated batch.

An engine takes a DataProto of left-padded prompts (``input_ids``, ``attention_mask``,
``position_ids``) and returns one with ``prompts``, ``responses`` (right-padded to
``response_length`` with the pad token), ``response_mask`` (1 up to and including the first EOS),
and the full-sequence ``input_ids``, ``attention_mask``, ``position_ids`` the actor scores.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verl.config.errors import ConfigError
from verl.models.plumbing import position_ids
from verl.protocol import DataProto
from verl.utils.registry import Registry

ROLLOUT_REGISTRY = Registry("rollout engine (actor_rollout_ref.rollout.name)")


def register_rollout(name: str) -> Callable:
    return ROLLOUT_REGISTRY.register(name)


def package_version(module: str | None) -> str:
    """`` <version>`` of an imported module (empty for None, or a module without one)."""
    if module is None:
        return ""
    import importlib

    version = getattr(importlib.import_module(module), "__version__", None)
    return f" {version}" if version else ""


def get_rollout_class(name: str) -> Callable[..., Any]:
    return ROLLOUT_REGISTRY.lookup(name)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: read from ``rollout`` (training) or ``rollout.val_kwargs`` (validation)."""

    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 32
    ignore_eos: bool = False
    """keep generating after an end-of-sequence token: every response is ``max_new_tokens`` long"""

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"SamplingParams(do_sample=True, temperature={self.temperature}): sampling needs a "
                "temperature > 0; greedy decoding is do_sample=False"
            )

    def stop_tokens(self, eos_token_ids: list[int]) -> list[int]:
        """The token ids that end a response: the EOS ids, or none with ``ignore_eos``."""
        return [] if self.ignore_eos else list(eos_token_ids)

    @classmethod
    def from_config(cls, section: Any, max_new_tokens: int, ignore_eos: bool = False) -> SamplingParams:
        """``do_sample`` alone decides between sampling and greedy decoding: a temperature <= 0 with
        ``do_sample=true`` is refused (as config validation does) instead of silently decoding greedily."""
        if section.do_sample and not section.temperature > 0:
            raise ConfigError(
                f"temperature must be > 0 when do_sample=true; got {section.temperature} (temperature 0 is "
                "greedy decoding: set do_sample=false for it)"
            )
        return cls(
            bool(section.do_sample),
            float(section.temperature),
            float(section.top_p),
            int(section.top_k),
            max_new_tokens,
            ignore_eos,
        )


ROLLOUT_ENTROPY_KEY = "rollout_entropys"
"""optional ``[rows, response_length]`` tensor in a generated batch: the entropy of the distribution each response
token was scored under, softmax(logits / T) untruncated (what the actor's ``entropys`` are), 0 at padding. The
fast engine returns it; the trainer takes ``actor/entropy`` from it when the samples are the current policy's
(`verl.trainer.advantage.compute_advantages`), so the update need not run a pass to measure it"""

ROW_BUDGET_KEY = "max_new_tokens"
"""optional ``[rows]`` tensor in a prompt batch: each row's own max_new_tokens (at most the sampling's); the fast
engine stops each row at it, the others are cut to it afterwards (`tokens_through_batch`)"""


class StaleWeightsError(RuntimeError):
    """A generate asked for weights of one policy version while the engine holds another."""


@dataclass(frozen=True)
class TokenRequest:
    """One sample to generate, token in: the prompt's ids (no padding) and how to sample.

    ``weights_version``: the policy version the caller expects the engine to hold (None: no check). An
    engine with its own copy of the weights (vllm) refuses a request for another version.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    weights_version: int | None = None
    seed: int | None = None
    """this sample's own random seed (None: the engine's stream); vllm honours it"""


@dataclass(frozen=True)
class TokenResponse:
    """One generated sample, token out: ``response_ids`` up to and including the stop token (if any),
    ``log_probs`` of each (None from an engine that does not return them), ``finish_reason`` "stop" (a
    stop token) or "length" (max_new_tokens reached)."""

    request_id: str
    response_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str


def requests_from_batch(
    prompts: DataProto, sampling: SamplingParams, weights_version: int | None = None, seed: int | None = None
) -> list[TokenRequest]:
    """One request per row of a left-padded prompt batch, the padding dropped; ids are ``<call>-<row>``, unique
    across calls (two batches may be in flight on one server). ``seed``: row r samples with seed + r."""
    ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].bool().cpu()
    call = uuid.uuid4().hex[:12]
    return [
        TokenRequest(
            f"{call}-{row}",
            ids[row][mask[row]].tolist(),
            sampling,
            weights_version,
            None if seed is None else seed + row,
        )
        for row in range(len(prompts))
    ]


def batch_from_responses(
    prompts: DataProto,
    responses: list[TokenResponse],
    eos_token_ids: list[int],
    pad_token_id: int,
    sampling: SamplingParams,
) -> DataProto:
    """The batch layout of `assemble_rollout_output` from one response per prompt row (in row order), with
    ``rollout_log_probs`` when the responses carry them."""
    width = sampling.max_new_tokens
    ids = torch.full((len(responses), width), pad_token_id, dtype=prompts.batch["input_ids"].dtype)
    log_probs = torch.zeros(len(responses), width, dtype=torch.float32)
    lengths = torch.tensor([min(len(response.response_ids), width) for response in responses])
    for row, response in enumerate(responses):
        n = int(lengths[row])
        ids[row, :n] = torch.tensor(response.response_ids[:n], dtype=ids.dtype)
        if response.log_probs is not None:
            log_probs[row, :n] = torch.tensor(response.log_probs[:n], dtype=torch.float32)
    device = prompts.batch["input_ids"].device  # built on the CPU, returned beside the prompts
    ids, log_probs, lengths = ids.to(device), log_probs.to(device), lengths.to(device)
    output = assemble_rollout_output(
        prompts, ids, sampling.stop_tokens(eos_token_ids), pad_token_id, width, lengths
    )
    if all(response.log_probs is not None for response in responses):
        output.batch["rollout_log_probs"] = log_probs * output.batch["response_mask"]
    return output


def response_mask_from_ids(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row, 0 after it."""
    is_eos = torch.isin(
        responses, torch.tensor(eos_token_ids, dtype=responses.dtype, device=responses.device)
    )
    # The number of EOS tokens strictly before position t; a token is valid while that is 0.
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def assemble_rollout_output(
    prompts: DataProto,
    responses: torch.Tensor,
    eos_token_ids: list[int],
    pad_token_id: int,
    response_length: int,
    lengths: torch.Tensor | None = None,
) -> DataProto:
    """Pad responses to ``response_length`` and build the full-sequence tensors the actor needs. A response
    ends at its first EOS, and (when ``lengths`` gives each row's generated length) after that many tokens."""
    batch_size = responses.shape[0]
    if responses.shape[1] < response_length:
        pad = responses.new_full((batch_size, response_length - responses.shape[1]), pad_token_id)
        responses = torch.cat([responses, pad], dim=1)
    responses = responses[:, :response_length]
    response_mask = response_mask_from_ids(responses, eos_token_ids)
    if lengths is not None:
        within = torch.arange(response_length, device=lengths.device)[None, :] < lengths[:, None]
        response_mask = response_mask * within.long()
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_token_id))

    prompt_ids = prompts.batch["input_ids"]
    prompt_mask = prompts.batch["attention_mask"]
    attention_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
    positions = position_ids(attention_mask)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": positions,
        }
    )


def with_prompt_fields(output: DataProto, prompts: DataProto) -> DataProto:
    """``output`` with the prompts' fields the rollout does not produce (uid, ground truth, reward baselines,
    ...) passed through: the result is the whole batch the next steps need."""
    for key, values in prompts.non_tensor_batch.items():
        output.non_tensor_batch.setdefault(key, values)
    for key, tensor in prompts.batch.items():
        output.batch.setdefault(key, tensor)
    output.meta_info = {**prompts.meta_info, **output.meta_info}
    return output


def concat_prompts(parts: Sequence[DataProto]) -> DataProto:
    """Prompt batches stacked into one, each left-padded to its own longest prompt (the collate's): the
    narrower ones get columns on the left up to the widest, attention 0 and position 0 there, and in
    ``input_ids`` a pad token the batches already use (any token under attention 0: nothing reads it)."""
    width = max(part.batch["input_ids"].shape[-1] for part in parts)
    if all(part.batch["input_ids"].shape[-1] == width for part in parts):
        return DataProto.concat(parts)
    ids = [part.batch["input_ids"][part.batch["attention_mask"] == 0] for part in parts]
    pad = next((int(found[0]) for found in ids if len(found)), 0)
    widened = []
    for part in parts:
        missing = width - part.batch["input_ids"].shape[-1]
        part = part.select()
        for key, value in (("input_ids", pad), ("attention_mask", 0), ("position_ids", 0)):
            if missing and key in part.batch.keys():
                tensor = part.batch[key]
                part.batch[key] = torch.nn.functional.pad(tensor, (missing, 0), value=value)
        widened.append(part)
    return DataProto.concat(widened)


def left_padded_batch(
    prompt_ids: list[list[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> DataProto:
    """A left-padded prompt batch (``input_ids``, ``attention_mask``, ``position_ids``) from unpadded ids, on
    ``device``."""
    width = max(len(ids) for ids in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        if ids:
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids(attention_mask),
        }
    )


def tokens_through_batch(
    generate_sequences: Callable[[DataProto, SamplingParams], DataProto],
    requests: list[TokenRequest],
    pad_token_id: int,
    eos_token_ids: list[int],
    device: torch.device | str = "cpu",
) -> list[TokenResponse]:
    """Token-in / token-out on top of a batch engine: requests that sample alike go through
    ``generate_sequences`` together (a batch on ``device``, the engine's), in the order given, up to the
    longest ``max_new_tokens`` among them; each response is cut after its first stop token and at its own
    ``max_new_tokens`` (an agent loop's turns each have their own budget)."""
    responses: dict[int, TokenResponse] = {}
    groups: dict[SamplingParams, list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(dataclasses.replace(request.sampling, max_new_tokens=0), []).append(index)
    for like, indices in groups.items():
        longest = max(requests[i].sampling.max_new_tokens for i in indices)
        sampling = dataclasses.replace(like, max_new_tokens=longest)
        batch = left_padded_batch([requests[i].prompt_ids for i in indices], pad_token_id, device)
        budgets = [requests[i].sampling.max_new_tokens for i in indices]
        if min(budgets) < longest:
            batch.batch[ROW_BUDGET_KEY] = torch.tensor(budgets, device=batch.batch["input_ids"].device)
        output = generate_sequences(batch, sampling)
        lengths = output.batch["response_mask"].sum(dim=1).tolist()
        log_probs = output.batch.get("rollout_log_probs")
        log_probs = None if log_probs is None else log_probs.cpu()
        responses_ids = output.batch["responses"].cpu()
        for row, index in enumerate(indices):
            n = min(int(lengths[row]), requests[index].sampling.max_new_tokens)
            ids = responses_ids[row, :n].tolist()
            stopped = bool(ids) and ids[-1] in sampling.stop_tokens(eos_token_ids)
            responses[index] = TokenResponse(
                requests[index].request_id,
                ids,
                None if log_probs is None else log_probs[row, :n].tolist(),
                "stop" if stopped else "length",
            )
    return [responses[index] for index in range(len(requests))]


class RolloutEngine:
    """What the engines that generate with the actor's own module share: they hold no weights of their own
    (nothing to synchronise after an update), and serve token requests through their batch call."""

    owns_weights = False
    """True for an engine with its own copy of the weights (vllm), synchronised after every update"""
    weights_version: int | None = None
    """the policy version an engine with its own weights holds (see VLLMRollout.sync_weights)"""
    returns_log_probs = False
    """whether responses come with the engine's log-probs (``rollout_log_probs``)"""
    calculate_log_probs = False
    """``rollout.calculate_log_probs``: return ``rollout_log_probs`` with each response where the engine does not
    by default (hf); the engines that always return them ignore it"""
    compute_dtype: torch.dtype | None = None
    """an engine computing with the actor's module: its autocast dtype (`verl.utils.precision`), None for
    the weights' own"""
    pad_token_id: int
    eos_token_ids: list[int]
    label = "engine"
    """what the start-up line calls it"""
    package: str | None = None
    """the module whose version the start-up line names (None: this project's own code)"""

    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        raise NotImplementedError

    @classmethod
    def describe(cls, dtype: torch.dtype, device: Any) -> str:
        """The start-up line: which engine (its package's version), computing in ``dtype`` on ``device``."""
        where = "its own copy of the weights" if cls.owns_weights else "generating with the actor's module"
        return f"{cls.label}{package_version(cls.package)}, {where} in {str(dtype).removeprefix('torch.')} on {device}"

    def generate_tokens(self, requests: list[TokenRequest]) -> list[TokenResponse]:
        """Token-in / token-out (the server mode's call): one response per request, in order."""
        model = getattr(self, "model", None)
        device = next(model.parameters()).device if model is not None else torch.device("cpu")
        return tokens_through_batch(
            self.generate_sequences, requests, self.pad_token_id, self.eos_token_ids, device
        )
