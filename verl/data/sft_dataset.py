"""Supervised fine-tuning data: chat-templated prompt + target response, loss on the response only.

Useful to warm-start a tiny model on a task before RL (from-scratch RL on random weights rarely
finds any reward). The response defaults to the row's ground truth, so any RL dataset doubles as
an SFT dataset.

A row can instead hold a whole chat (``data.messages_key``, verl's multi-turn SFT): the conversation is
rendered with the tokenizer's chat template and every assistant turn is a target
(:func:`render_conversation`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from verl.data.io import (
    MISSING,
    BadRows,
    DatasetError,
    PathLike,
    as_path_list,
    check_columns,
    get_dotted,
    read_files,
)
from verl.data.rl_dataset import (
    Messages,
    log_decoded_json,
    render_prompt,
    require_chat_template,
    to_messages,
)
from verl.models.plumbing import position_ids

logger = logging.getLogger(__name__)

SFT_TRUNCATION_MODES = ("error", "left", "right")


def _plain_value(value: Any) -> Any:
    """``value`` with numpy arrays (what parquet read through pandas gives for lists) turned into lists, at
    any depth: chat templates test for lists and mappings, not arrays."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_value(v) for v in value]
    return value


def _special_ids(tokenizer: Any) -> set[int]:
    """The ids of the tokenizer's special tokens (eos, chat-template markers such as ``<|im_end|>``)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _turn_end(tokenizer: Any, ids: list[int], start: int, special: set[int]) -> int:
    """Where an assistant turn's target ends in ``ids`` (the turn runs from ``start`` to the end): after its
    last special token (the end-of-turn token, ``<|im_end|>``) when only whitespace follows it (the
    template's separator between turns, which the model never has to produce), else at the end."""
    for k in range(len(ids) - 1, start - 1, -1):
        if ids[k] in special:
            rest = ids[k + 1 :]
            if not rest or not tokenizer.decode(rest).strip():
                return k + 1
            break
    return len(ids)


def render_conversation(
    tokenizer: Any,
    messages: Any,
    where: str,
    field: str = "messages",
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of a whole chat rendered with the chat template, and its loss mask: 1 exactly on the
    tokens of every assistant message (its content and the end-of-turn token after it), 0 on the other
    turns and on the template's role headers.

    An assistant message ``i`` is located by rendering prefixes: ``messages[:i]`` with the generation
    prompt must be a token prefix of ``messages[:i+1]``, which must be a prefix of the whole chat; the
    tokens between the first two are the target. ``messages`` is validated as a prompt is
    (:func:`~verl.data.rl_dataset.normalize_messages`: a list, a numpy array or JSON text of
    ``{role, content}`` dicts). A chat without an assistant message, a template error, or a template that
    does not render incrementally is a DatasetError naming ``where`` and ``field``.
    """
    require_chat_template(tokenizer)
    chat, _ = to_messages(_plain_value(messages), where, field)
    targets = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
    if not targets:
        roles = ", ".join(dict.fromkeys(m["role"] for m in chat))
        raise DatasetError(
            f"{where}: field {field!r} (data.messages_key) has no assistant message (roles: {roles}); every "
            "assistant turn is a training target, so this chat has nothing to train on"
        )
    kwargs = dict(chat_template_kwargs or {})

    def encode(part: Messages, generation_prompt: bool) -> list[int]:
        try:
            text = tokenizer.apply_chat_template(
                part, add_generation_prompt=generation_prompt, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja errors from odd messages or roles the template refuses
            raise DatasetError(f"{where}: chat template failed on field {field!r}: {exc}") from exc
        # The template holds every special token; the tokenizer must not add its own (see render_prompt).
        return list(tokenizer.encode(text, add_special_tokens=False))

    ids = encode(chat, False)
    mask = [0] * len(ids)
    special = _special_ids(tokenizer)
    for i in targets:
        before = encode(chat[:i], True)
        through = encode(chat[: i + 1], False)
        if through[: len(before)] != before or ids[: len(through)] != through:
            what = (
                f"messages[:{i}] with the generation prompt is not a token prefix of messages[:{i + 1}]"
                if through[: len(before)] != before
                else f"messages[:{i + 1}] is not a token prefix of the whole chat"
            )
            raise DatasetError(
                f"{where}: the chat template does not render field {field!r} incrementally ({what}), so the "
                f"tokens of assistant message {i} cannot be told apart from the rest; templates that rewrite "
                "earlier turns (e.g. drop the reasoning of past assistant turns) cannot be trained on whole "
                "chats: split the chat into one row per assistant turn, or use a template that renders "
                "turns one after another"
            )
        end = _turn_end(tokenizer, through, len(before), special)
        mask[len(before) : end] = [1] * (end - len(before))
    return ids, mask


class SFTDataset(torch.utils.data.Dataset):
    """Items: ``input_ids`` = prompt + response + eos, ``loss_mask`` 1 exactly on response tokens and eos.

    ``loss_mask[t] == 1`` means token ``t`` is a training target (predicted from the logits at
    ``t - 1``); the trainer does the shift. ``prompt_key`` and ``response_key`` may be dotted
    (``extra_info.question``) to index nested row fields. With ``messages_key`` set, each row is instead
    a whole chat in that column and every assistant turn is a target (:func:`render_conversation`);
    ``prompt_key`` / ``response_key`` are not read. ``chat_template_kwargs`` go to
    ``tokenizer.apply_chat_template`` (e.g. ``enable_thinking=False``). ``bad_rows`` works as in
    :class:`RLDataset` (``fail`` or ``skip``, with the count in :attr:`num_skipped_rows`); ``files_key``
    is the config key the files came from, named in file-level errors.
    """

    def __init__(
        self,
        files: PathLike | Iterable[PathLike],
        tokenizer: Any,
        prompt_key: str = "prompt",
        response_key: str = "reward_model.ground_truth",
        max_length: int = 128,
        truncation: str = "error",
        max_samples: int = -1,
        chat_template_kwargs: dict[str, Any] | None = None,
        bad_rows: str = "fail",
        files_key: str | None = None,
        messages_key: str | None = None,
        tools_key: str | None = "tools",
        enable_thinking_key: str | None = "enable_thinking",
    ) -> None:
        if truncation not in SFT_TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r} is not one of {SFT_TRUNCATION_MODES}")
        if max_length <= 0:
            raise ValueError(f"data.max_length must be positive, got {max_length}")
        if messages_key is None and tokenizer.eos_token_id is None:
            # A chat's end-of-turn tokens come from its template; a bare response needs eos appended.
            raise DatasetError("the tokenizer has no eos token; SFT needs one to teach the model to stop")
        self._bad_rows = BadRows(bad_rows)
        require_chat_template(tokenizer)  # a tokenizer problem, not a bad row: never skipped
        self.files = as_path_list(files, files_key)
        self.files_key = files_key
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.prompt_key = prompt_key
        self.response_key = response_key
        self.messages_key = messages_key
        self.tools_key = tools_key
        self.enable_thinking_key = enable_thinking_key
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        records = read_files(self.files, key=files_key, bad_rows=self._bad_rows)
        if messages_key is not None:
            columns = {messages_key: "data.messages_key"}
        else:
            columns = {prompt_key: "data.prompt_key", response_key: "data.response_key"}
        check_columns(records, columns, files_key)
        if max_samples is not None and max_samples >= 0:
            records = records[:max_samples]
        self.input_ids: list[list[int]] = []
        self.loss_masks: list[list[int]] = []
        n_truncated = n_no_target = n_decoded = 0
        for path, row_idx, row in records:
            where = f"{path} row {row_idx}"
            try:
                if messages_key is not None:
                    ids, mask = self._parse_chat(row, where)
                else:
                    prompt_ids, response_ids, decoded = self._parse_row(row, where)
                    n_decoded += decoded
                    ids = prompt_ids + response_ids
                    mask = [0] * len(prompt_ids) + [1] * len(response_ids)
            except DatasetError as exc:
                self._bad_rows.handle(exc)
                continue
            if len(ids) > max_length:
                if truncation == "error":
                    what, start, end = (
                        ("the chat", "the chat start", "the chat end")
                        if messages_key is not None
                        else ("prompt + response", "the prompt start", "the response end")
                    )
                    raise DatasetError(
                        f"{where}: {what} is {len(ids)} tokens, longer than "
                        f"data.max_length={max_length}. Raise data.max_length or set data.truncation to "
                        f"'left' (drops {start}) or 'right' (drops {end})."
                    )
                n_truncated += 1
                if truncation == "left":
                    ids, mask = ids[-max_length:], mask[-max_length:]
                else:
                    ids, mask = ids[:max_length], mask[:max_length]
                n_no_target += not any(mask)
            self.input_ids.append(ids)
            self.loss_masks.append(mask)
        log_decoded_json(n_decoded, len(records), prompt_key, self.files)
        if n_truncated:
            logger.warning(
                "truncated (%s) %d of %d SFT examples to data.max_length=%d%s",
                truncation,
                n_truncated,
                len(records),
                max_length,
                f"; {n_no_target} have no response tokens left and contribute no loss" if n_no_target else "",
            )
        if self.num_skipped_rows:
            logger.warning("skipped %d bad SFT rows (bad_rows=skip)", self.num_skipped_rows)
        if not self.input_ids:
            skipped = f" ({self.num_skipped_rows} skipped as bad rows)" if self.num_skipped_rows else ""
            key = f" ({files_key})" if files_key else ""
            raise DatasetError(f"empty dataset{skipped}: no rows in {', '.join(self.files)}{key}")

    @property
    def num_skipped_rows(self) -> int:
        """Malformed rows dropped under ``bad_rows=skip``."""
        return self._bad_rows.count

    def _parse_chat(self, row: dict[str, Any], where: str) -> tuple[list[int], list[int]]:
        """Token ids and loss mask of one row's chat (``messages_key``); every problem is a DatasetError
        naming ``where``."""
        key = self.messages_key
        assert key is not None
        messages = row[key] if key in row else get_dotted(row, key)
        if messages is MISSING or messages is None:
            raise DatasetError(f"{where}: missing field {key!r} (data.messages_key); row has {sorted(row)}")
        # verl's multi-turn rows may carry their tool schemas and their own enable_thinking: the template sees both
        kwargs = dict(self.chat_template_kwargs or {})
        for column, argument in ((self.tools_key, "tools"), (self.enable_thinking_key, "enable_thinking")):
            value = _plain_value(row.get(column)) if column else None
            if value is not None:
                kwargs[argument] = value
        return render_conversation(self.tokenizer, messages, where, key, kwargs)

    def _parse_row(self, row: dict[str, Any], where: str) -> tuple[list[int], list[int], bool]:
        """Prompt ids and response ids (+ eos) of one row, and whether its prompt was decoded from JSON text;
        every problem is a DatasetError naming ``where``."""
        key = self.prompt_key
        prompt = row[key] if key in row else get_dotted(row, key)  # a dotted key indexes nested fields
        if prompt is MISSING or prompt is None:
            raise DatasetError(
                f"{where}: missing field {self.prompt_key!r} (data.prompt_key); row has {sorted(row)}"
            )
        response = get_dotted(row, self.response_key)
        if response is MISSING or response is None:
            raise DatasetError(f"{where}: missing field {self.response_key!r} (data.response_key)")
        if isinstance(response, (dict, list)):
            raise DatasetError(
                f"{where}: field {self.response_key!r} must be a string or number, got {type(response).__name__}"
            )
        messages, decoded = to_messages(prompt, where, self.prompt_key)
        prompt_ids = render_prompt(self.tokenizer, messages, self.chat_template_kwargs)
        eos = self.tokenizer.eos_token_id
        response_ids = list(self.tokenizer.encode(str(response), add_special_tokens=False)) + [eos]
        return prompt_ids, response_ids, decoded

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.tensor(self.input_ids[i], dtype=torch.long),
            "loss_mask": torch.tensor(self.loss_masks[i], dtype=torch.long),
        }


def collate_sft(items: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest item: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``.

    Right padding keeps every sequence starting at position 0, the natural layout for teacher forcing.
    """
    if not items:
        raise ValueError("collate_sft got an empty batch")
    width = max(len(it["input_ids"]) for it in items)
    n = len(items)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.long)
    for i, it in enumerate(items):
        length = len(it["input_ids"])
        input_ids[i, :length] = torch.as_tensor(it["input_ids"], dtype=torch.long)
        attention_mask[i, :length] = 1
        loss_mask[i, :length] = torch.as_tensor(it["loss_mask"], dtype=torch.long)
    positions = position_ids(attention_mask)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": positions,
        "loss_mask": loss_mask,
    }
