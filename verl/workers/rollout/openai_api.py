"""OpenAI's completion API in terms of the rollout's token requests: a request body to token requests, the
engine's token responses to OpenAI's reply. No HTTP here (:mod:`verl.workers.rollout.http_front` serves it).

What a body may say, and what it means (vLLM's OpenAI server is the reference, as verl's reward-model server
is one):

* ``messages`` (``/v1/chat/completions``) go through the tokenizer's chat template with the generation prompt
  (``add_generation_prompt``, ``continue_final_message``, ``chat_template``, ``chat_template_kwargs`` as in
  vLLM), tokenized without special tokens (the template writes them); ``prompt`` (``/v1/completions``) is one
  text, tokenized with them, or a list of token ids;
* ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``max_tokens`` (``max_completion_tokens``), ``n``,
  ``seed``, ``ignore_eos``, ``stop`` (strings, cut from the text after generating) and
  ``skip_special_tokens``; what a body leaves out comes from :class:`SamplingDefaults` (the server's
  ``rollout`` settings, as verl hands them to vLLM as its generation config);
* ``logprobs`` (chat: ``true``; completions: ``0``): each returned token's log-prob under the sampling
  distribution softmax(logits / T), untruncated (what the engine returned with the token, verl's
  ``rollout_log_probs``), in OpenAI's layout; the stop token and the tokens past a stop string are not in the
  text and not in the list. ``top_logprobs`` (chat) / ``logprobs`` > 0 (completions) are refused: the engines
  return the sampled token's log-prob only;
* a setting that would change the reply but is not built (streaming, top log-probs, penalties, logit bias,
  tools) is refused with HTTP 400 naming it, rather than ignored; other unknown fields are ignored, as vLLM
  does.

A prompt of ``max_model_len`` tokens or more, or one whose ``max_tokens`` would run past it, is refused (400).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from verl.workers.rollout.base import SamplingParams, TokenRequest, TokenResponse
from verl.workers.rollout.token_text import decoded, token_pieces, tokens_in


class RequestError(ValueError):
    """A request body the server cannot answer: HTTP 400 with this message."""


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that does not say gets: the served model's ``rollout`` settings."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    """false: a request without a temperature is decoded greedily"""
    max_tokens: int = 2048
    max_model_len: int = 4096
    """longest prompt + reply"""


@dataclass(frozen=True)
class ParsedRequest:
    """One body, read: the prompt's ids and how to sample its ``n`` replies."""

    prompt_ids: list[int]
    sampling: SamplingParams
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    model: str | None = None
    logprobs: str | None = None
    """return each token's log-prob with the reply, in chat's layout ("chat") or completions' ("text")"""

    def token_requests(self, request_id: str) -> list[TokenRequest]:
        """One token request per reply; reply ``i`` samples with ``seed + i`` when a seed is given."""
        return [
            TokenRequest(
                f"{request_id}-{i}",
                list(self.prompt_ids),
                self.sampling,
                None,
                None if self.seed is None else self.seed + i,
            )
            for i in range(self.n)
        ]


UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "tools": (None, []),
    "response_format": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "stop_token_ids": (None, []),
}
"""settings not built here, with the values that mean "off" (any other value is refused)"""

KNOWN = {
    "messages", "prompt", "model", "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "n",
    "seed", "stop", "ignore_eos", "skip_special_tokens", "add_generation_prompt", "continue_final_message",
    "chat_template", "chat_template_kwargs", "add_special_tokens", "user", "tool_choice", "logprobs", *UNSUPPORTED,
}  # fmt: skip
"""the fields read (or refused); any other is ignored"""


def unknown_fields(body: Mapping[str, Any]) -> list[str]:
    """Fields of a body that nothing reads (the caller may log them)."""
    return sorted(key for key in body if key not in KNOWN)


def _number(body: Mapping[str, Any], key: str, default: Any, low: float, high: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise RequestError(f"{key} must be a number {bounds}; got {value!r}")
    return value


def _integer(body: Mapping[str, Any], key: str, default: Any, low: int) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise RequestError(f"{key} must be an integer >= {low}; got {value!r}")
    return int(value)


def _flag(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false; got {value!r}")
    return value


def _check_unsupported(body: Mapping[str, Any]) -> None:
    for key, off in UNSUPPORTED.items():
        value = body.get(key)
        if value is not None and not any(
            value == o and isinstance(value, bool) == isinstance(o, bool) for o in off
        ):
            raise RequestError(f"{key}={value!r} is not supported by this server")


def _stop_strings(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"stop must be a non-empty string or a list of them; got {stop!r}")
    return tuple(stops)


def parse_sampling(
    body: Mapping[str, Any], prompt_ids: list[int], defaults: SamplingDefaults
) -> ParsedRequest:
    """How to sample the replies to ``prompt_ids`` (see the module docstring)."""
    _check_unsupported(body)
    length = len(prompt_ids)
    if length == 0:
        raise RequestError("the prompt is empty")
    room = defaults.max_model_len - length
    if room < 1:
        raise RequestError(
            f"the prompt is {length} tokens; this model's maximum context length is {defaults.max_model_len} tokens"
        )
    default_temperature = defaults.temperature if defaults.do_sample else 0.0
    temperature = float(_number(body, "temperature", default_temperature, 0.0))
    top_p = float(_number(body, "top_p", defaults.top_p, 0.0, 1.0))
    if top_p == 0:
        raise RequestError("top_p must be in (0, 1]; got 0")
    top_k = _integer(body, "top_k", defaults.top_k, -1)
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _integer({"max_tokens": asked}, "max_tokens", min(defaults.max_tokens, room), 1)
    if max_tokens > room:
        raise RequestError(
            f"this model's maximum context length is {defaults.max_model_len} tokens; the request asks for "
            f"{length + max_tokens} ({length} in the prompt, {max_tokens} in the completion)"
        )
    greedy = temperature == 0.0
    sampling = SamplingParams(
        do_sample=not greedy,
        temperature=1.0 if greedy else temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_tokens,
        ignore_eos=_flag(body, "ignore_eos", False),
    )
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise RequestError(f"seed must be an integer; got {seed!r}")
    model = body.get("model")
    return ParsedRequest(
        list(prompt_ids),
        sampling,
        n=_integer(body, "n", 1, 1),
        seed=None if seed is None else int(seed),
        stop=_stop_strings(body),
        skip_special_tokens=_flag(body, "skip_special_tokens", True),
        model=model if isinstance(model, str) else None,
        logprobs=_logprobs(body),
    )


def _logprobs(body: Mapping[str, Any]) -> str | None:
    """The log-probs layout a body asks for: chat's ``logprobs: true`` or completions' ``logprobs: 0`` (a count
    of top alternatives per token, which no engine here returns beyond the sampled one); None for none."""
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    if value is True:
        return "chat"
    if isinstance(value, Integral) and value == 0:
        return "text"
    raise RequestError(
        f"logprobs={value!r} is not supported by this server: it returns each token's own log-prob (chat: "
        "logprobs=true; completions: logprobs=0), not the top alternatives"
    )


def _message_text(content: Any, index: int) -> str | None:
    """A message's content as text: a string, or a list of text parts (joined, as vLLM does)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise RequestError(f"messages[{index}].content: only text parts are supported; got {part!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts; got {content!r}")


def chat_prompt_ids(tokenizer: Any, body: Mapping[str, Any]) -> list[int]:
    """The prompt of a chat request: its messages through the chat template, tokenized."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content}")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be a mapping with a role; got {message!r}")
        chat.append({**message, "content": _message_text(message.get("content"), i)})
    template = body.get("chat_template")
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "this model's tokenizer has no chat template: post a prompt to /v1/completions instead"
        )
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise RequestError(f"chat_template_kwargs must be a mapping; got {kwargs!r}")
    add_generation_prompt = _flag(body, "add_generation_prompt", True)
    continue_final = _flag(body, "continue_final_message", False)
    if add_generation_prompt and continue_final:
        raise RequestError("add_generation_prompt and continue_final_message cannot both be true")
    try:
        text = tokenizer.apply_chat_template(
            chat,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            chat_template=template,
            **dict(kwargs),
        )
    except Exception as exc:  # the template's own errors (a role it refuses, a bad template)
        raise RequestError(f"the chat template failed on these messages: {exc}") from exc
    special = _flag(body, "add_special_tokens", False)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def completion_prompt_ids(tokenizer: Any, body: Mapping[str, Any]) -> list[int]:
    """The prompt of a completion request: one text, or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return list(
            tokenizer(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))["input_ids"]
        )
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        vocab = len(tokenizer)
        if not all(0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        return list(prompt)
    raise RequestError("prompt must be a string or a list of token ids (one prompt per request)")


@dataclass
class Reply:
    """One choice of a reply: its text and why it ended."""

    text: str
    finish_reason: str
    tokens: int = 0
    """tokens generated (the stop token included)"""
    token_logprobs: list[tuple[str, list[int] | None, float]] | None = None
    """with ``logprobs``: each token of the text (its text, its bytes or None, its log-prob)"""
    text_offsets: list[int] | None = None
    """with ``logprobs``: where each token starts in the text (characters before it)"""


def reply_text(
    tokenizer: Any, response: TokenResponse, stop_ids: Sequence[int], parsed: ParsedRequest
) -> Reply:
    """The text of one generated reply: its stop token dropped, decoded, cut before the first stop string."""
    ids = list(response.response_ids)
    finish = response.finish_reason
    if finish == "stop" and ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=parsed.skip_special_tokens)
    cuts = [text.find(s) for s in parsed.stop if s in text]
    if cuts:
        text, finish = text[: min(cuts)], "stop"
    reply = Reply(text, finish, len(response.response_ids))
    if parsed.logprobs:
        if response.log_probs is None:
            raise RequestError("logprobs: the rollout engine behind this server returns no log-probs")
        kept = ids[: tokens_in(tokenizer, ids, len(text), parsed.skip_special_tokens)]
        pieces = token_pieces(tokenizer, kept, parsed.skip_special_tokens)
        reply.token_logprobs = [
            (piece, raw, float(lp)) for (piece, raw), lp in zip(pieces, response.log_probs, strict=False)
        ]
        if parsed.logprobs == "text":  # the characters before each token: one decoding per token
            reply.text_offsets = [
                len(decoded(tokenizer, kept[:i], parsed.skip_special_tokens)) for i in range(len(kept))
            ]
    return reply


def _usage(prompt_tokens: int, replies: Sequence[Reply]) -> dict[str, int]:
    completion = sum(reply.tokens for reply in replies)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def chat_completion(model: str, prompt_tokens: int, replies: Sequence[Reply]) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` object."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": reply.text},
                "logprobs": _chat_logprobs(reply),
                "finish_reason": reply.finish_reason,
            }
            for i, reply in enumerate(replies)
        ],
        "usage": _usage(prompt_tokens, replies),
    }


def text_completion(model: str, prompt_tokens: int, replies: Sequence[Reply]) -> dict[str, Any]:
    """OpenAI's ``text_completion`` object."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "text": reply.text,
                "logprobs": _text_logprobs(reply),
                "finish_reason": reply.finish_reason,
            }
            for i, reply in enumerate(replies)
        ],
        "usage": _usage(prompt_tokens, replies),
    }


def _chat_logprobs(reply: Reply) -> dict[str, Any] | None:
    """chat.completion's ``logprobs``: a ``content`` entry per token (its text, log-prob and UTF-8 bytes)."""
    if reply.token_logprobs is None:
        return None
    return {
        "content": [
            {"token": token, "logprob": lp, "bytes": raw, "top_logprobs": []}
            for token, raw, lp in reply.token_logprobs
        ]
    }


def _text_logprobs(reply: Reply) -> dict[str, Any] | None:
    """text_completion's ``logprobs``: the tokens, their log-probs, and where each starts in the text."""
    if reply.token_logprobs is None:
        return None
    return {
        "tokens": [token for token, _, _ in reply.token_logprobs],
        "token_logprobs": [lp for _, _, lp in reply.token_logprobs],
        "top_logprobs": None,
        "text_offset": reply.text_offsets,
    }


def error_body(message: str, status: int) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    return {"error": {"message": message, "type": kind.get(status, "InternalServerError"), "code": status}}
