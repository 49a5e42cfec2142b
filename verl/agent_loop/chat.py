"""Tokens for the messages an agent loop inserts between sampled turns, rendered by the model's chat template.

Token-in / token-out: a trajectory is the prompt's ids, then every sampled turn exactly as the engine returned
it, then the ids of each inserted message (tool results, user turns), then the next sampled turn, and so on.
History is never re-tokenized (a BPE tokenizer need not give back the sampled ids for their own text, and
training on ids the model did not sample is off-policy in a way no importance ratio sees).

An insertion is rendered once: the template renders a fixed probe conversation ``[user, assistant]`` followed by
the new messages (and the next turn's generation prompt), and the insertion is everything after the probe
reply's end-of-turn token. Only that text is tokenized. (Comparing against the rendering of the probe alone
would fail for templates that render an assistant turn differently once it is no longer the last, as Qwen3's
does with its empty think block.) The sampled turn ended at its stop token (ChatML's ``<|im_end|>``, Llama 3's
``<|eot_id|>``); whatever the template writes after that token before the next message (ChatML's newline) was
never sampled, so it opens the insertion: dropping it, as verl once did, shifts every later turn off the
template the model was trained on.
"""

from __future__ import annotations

from typing import Any

_USER = "Hello"
_REPLY = "Hi there, probe 7f3a"


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
    )


class ChatRenderer:
    """Renders inserted messages with ``tokenizer``'s chat template (``tools``: the OpenAI schemas the template
    is given, as for the prompt). ``stop_token_ids``: the ids that end a sampled turn; the template must end an
    assistant message with one of them."""

    def __init__(self, tokenizer: Any, stop_token_ids: list[int], tools: list[dict] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "multi-turn rollouts render tool and user messages with the tokenizer's chat template, and "
                "this tokenizer has none (set actor_rollout_ref.model.custom_chat_template)"
            )
        self.tokenizer = tokenizer
        self.tools = tools
        self.probe = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _REPLY}]
        self.base = _render(tokenizer, self.probe, False, tools)
        after = self.base[self.base.rindex(_REPLY) + len(_REPLY) :]
        stops = {tokenizer.decode([i]): i for i in stop_token_ids}
        end = next((text for text in stops if text and after.startswith(text)), None)
        if end is None:
            raise ValueError(
                f"the chat template ends an assistant message with {after!r}, which does not start with a stop "
                f"token of the rollout ({sorted(stops)}): a sampled turn could not end where the template "
                "ends it"
            )
        self.end_of_turn = end
        self.end_of_turn_id = stops[end]
        """its id: a turn that ends with another stop token is not continued"""
        """the stop token's text that closes an assistant message in the template"""
        self.separator = after[len(end) :]
        """what the template writes after that stop token (ChatML: a newline): never sampled, inserted"""

    def insertion_text(self, messages: list[dict[str, Any]], generation_prompt: bool = True) -> str:
        """The text that follows a sampled turn (ended at its stop token) when ``messages`` come next, up to
        the next assistant turn's header (``generation_prompt``)."""
        full = _render(self.tokenizer, self.probe + list(messages), generation_prompt, self.tools)
        reply_end = full.find(_REPLY) + len(_REPLY)
        if reply_end < len(_REPLY) or not full.startswith(self.end_of_turn, reply_end):
            raise ValueError(
                "the chat template does not end the assistant message with its end-of-turn token "
                f"{self.end_of_turn!r} once more messages follow (roles {[m.get('role') for m in messages]}), "
                "so the inserted messages cannot be rendered on their own"
            )
        return full[reply_end + len(self.end_of_turn) :]

    def insertion_ids(self, messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
        """The token ids of :meth:`insertion_text`: what the agent loop appends (response_mask 0)."""
        return list(
            self.tokenizer.encode(self.insertion_text(messages, generation_prompt), add_special_tokens=False)
        )
