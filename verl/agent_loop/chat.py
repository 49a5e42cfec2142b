"""Tokens for the messages an agent loop inserts between sampled turns, rendered by the model's chat template.

Token-in / token-out: a trajectory is the prompt's ids, then every sampled turn exactly as the engine returned
it, then the ids of each inserted message (tool results, user turns), then the next sampled turn, and so on.
History is never re-tokenized (a BPE tokenizer need not give back the sampled ids for their own text, and
training on ids the model did not sample is off-policy in a way no importance ratio sees).

An insertion is rendered once, as the difference between two renderings of a fixed probe conversation:
``[user, assistant]`` and ``[user, assistant, *messages]`` with the generation prompt. Only that difference is
tokenized. The sampled turn ended at its stop token (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``);
whatever the template writes after that token before the next message (ChatML's newline) was never sampled,
so it opens the insertion: dropping it, as verl once did, shifts every later turn off the template the model
was trained on.
"""

from __future__ import annotations

from typing import Any

_USER = "Hello"
_REPLY = "Hi there"


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
        """the stop token's text that closes an assistant message in the template"""
        self.separator = after[len(end) :]
        """what the template writes after that stop token (ChatML: a newline): never sampled, inserted"""

    def insertion_text(self, messages: list[dict[str, Any]], generation_prompt: bool = True) -> str:
        """The text that follows a sampled turn (ended at its stop token) when ``messages`` come next, up to
        the next assistant turn's header (``generation_prompt``)."""
        full = _render(self.tokenizer, self.probe + list(messages), generation_prompt, self.tools)
        if not full.startswith(self.base):
            raise ValueError(
                "the chat template renders the earlier turns differently once more messages follow, so the "
                "inserted messages cannot be rendered on their own; roles "
                f"{[m.get('role') for m in messages]}"
            )
        return self.separator + full[len(self.base) :]

    def insertion_ids(self, messages: list[dict[str, Any]], generation_prompt: bool = True) -> list[int]:
        """The token ids of :meth:`insertion_text`: what the agent loop appends (response_mask 0)."""
        return list(
            self.tokenizer.encode(self.insertion_text(messages, generation_prompt), add_special_tokens=False)
        )
