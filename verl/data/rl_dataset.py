"""Prompt dataset for RL rollouts, and the collate function that turns prompts into a left-padded batch.

All rows are read, templated and tokenised at construction time, so a bad row or an overlong
prompt fails the run before any model is loaded, with the file and row to fix (or, with
``data.bad_rows=skip``, is logged, dropped and counted in :attr:`RLDataset.num_skipped_rows`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.data.io import (
    BadRows,
    DatasetError,
    PathLike,
    as_path_list,
    check_columns,
    check_required,
    read_files,
)
from verl.models.plumbing import position_ids

if TYPE_CHECKING:
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")

Messages = list[dict[str, Any]]

CHAT_ROLES = ("system", "user", "assistant", "tool")
"""the roles of a chat row (verl's and the OpenAI chat format's); a chat template may know more (Llama 3's
``ipython``, ``developer``): :func:`chat_roles` adds the ones it names"""

_ROLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
"""what a role can look like at all: a plain word (no whitespace, no ``<|...|>`` control token, no newline)"""
_TEMPLATE_ROLE = re.compile(r"""role['"]?\]?\s*==\s*['"]([A-Za-z][A-Za-z0-9_-]{0,31})['"]""")
_TEMPLATE_ROLE_LIST = re.compile(r"""role['"]?\]?\s+in\s+[\[(]([^\])]*)[\])]""")


def messages_from_json_text(text: str) -> Messages | None:
    """The chat messages a string holds as JSON text (``'[{"role": "user", "content": "1+1?"}]'``, what
    a messages column becomes when a pipeline writes it with ``json.dumps``), or None for any other text.

    Only a JSON list of objects that each have ``role`` and ``content`` counts: other text that starts
    with ``[`` is a prompt like any other.
    """
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    ):
        return value
    return None


def to_messages(
    prompt: Any, where: str, field: str = "prompt", roles: Collection[str] = CHAT_ROLES
) -> tuple[Messages, bool]:
    """:func:`normalize_messages`, and whether the prompt was chat messages held as JSON text (decoded)."""
    if isinstance(prompt, str):
        decoded = messages_from_json_text(prompt)
        if decoded is None:
            return [{"role": "user", "content": prompt}], False
        return normalize_messages(decoded, where, field, roles), True
    return normalize_messages(prompt, where, field, roles), False


def check_role(role: str, roles: Collection[str], what: str) -> None:
    """A role is one of ``roles``, written exactly: a role the template does not know renders a turn the model
    never saw, and a role such as ``"user<|im_end|>\\n<|im_start|>system"`` forges turns of its own."""
    if role in roles:
        return
    if not role.strip():
        raise DatasetError(f"{what} is empty; a message needs a role ({', '.join(roles)})")
    if not _ROLE_NAME.fullmatch(role):
        raise DatasetError(
            f"{what} is {_quote(role)}, not a role name (a role is one word such as user; control tokens, "
            "spaces and newlines in a role would forge chat turns)"
        )
    raise DatasetError(f"{what} is {_quote(role)}, not one of the chat roles {', '.join(roles)}")


def chat_roles(tokenizer: Any) -> tuple[str, ...]:
    """:data:`CHAT_ROLES` and the roles the tokenizer's chat template names (``message.role == 'ipython'``,
    ``message['role'] in ['developer', ...]``): the roles a chat row may use with this tokenizer."""
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template]
    named: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            continue
        named += _TEMPLATE_ROLE.findall(text)
        for group in _TEMPLATE_ROLE_LIST.findall(text):
            named += re.findall(r"""['"]([A-Za-z][A-Za-z0-9_-]{0,31})['"]""", group)
    return tuple(dict.fromkeys([*CHAT_ROLES, *named]))


def turn_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special tokens that mark chat turns: those its chat template writes around a probe
    conversation (ChatML's ``<|im_start|>`` / ``<|im_end|>``, Llama 3's headers and ``<|eot_id|>``), and its
    end-of-sequence token. In a message's text the tokenizer reads them as the special tokens themselves, so
    a message holding one forges a turn boundary. Special tokens the template does not write (a pad token,
    an image placeholder) are not turn boundaries and may appear in text."""
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", []) or []}
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            specials.add(str(token.content))
    specials.discard("")
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    try:
        rendered = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    except Exception:  # a template that refuses a system turn: the boundaries of a user/assistant pair
        try:
            rendered = tokenizer.apply_chat_template(probe[1:], tokenize=False, add_generation_prompt=False)
        except Exception:
            rendered = ""
    eos = getattr(tokenizer, "eos_token", None)
    found = {t for t in specials if t in str(rendered)} | ({str(eos)} if eos else set())
    return tuple(sorted(found, key=lambda t: (-len(t), t)))


def check_turn_tokens(messages: Messages, tokens: Sequence[str], where: str, field: str = "prompt") -> None:
    """No message's content holds one of ``tokens`` (:func:`turn_tokens`): it would forge a turn boundary
    (a user message ending its own turn and opening a system one). Refused, not escaped: the row says
    something else than its author can have meant, and changing it silently would hide that."""
    for j, msg in enumerate(messages):
        content = msg["content"]
        found = [(content.find(token), token) for token in tokens if token in content]
        if found:
            token = min(found)[1]  # the first in the text
            raise DatasetError(
                f"{where}: field '{field}[{j}].content' ({msg['role']}) holds {token!r}, a special token "
                "that marks chat turns for this tokenizer: it would forge a turn boundary; remove it from "
                "the text"
            )


def _quote(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def log_decoded_json(n_decoded: int, n_rows: int, field: str, files: Sequence[str]) -> None:
    """One INFO line for a dataset whose prompt column held chat messages as JSON text."""
    if n_decoded:
        logger.info(
            "the %r column (data.prompt_key) held chat messages as JSON text in %d of %d rows of %s; "
            "decoded them as messages",
            field,
            n_decoded,
            n_rows,
            ", ".join(files),
        )


def normalize_messages(
    prompt: Any, where: str, field: str = "prompt", roles: Collection[str] = CHAT_ROLES
) -> Messages:
    """Validate a prompt and return it as chat messages; a plain string becomes one user message, and a
    string holding a JSON list of ``{role, content}`` messages is decoded (:func:`messages_from_json_text`).
    Each role must be one of ``roles`` (:func:`check_role`)."""
    if isinstance(prompt, str):
        decoded = messages_from_json_text(prompt)
        prompt = [{"role": "user", "content": prompt}] if decoded is None else decoded
    if isinstance(prompt, np.ndarray):  # parquet read through pandas/datasets yields arrays
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DatasetError(
            f"{where}: field {field!r} must be a string or a non-empty list of "
            f"{{'role', 'content'}} messages, got {type(prompt).__name__}"
        )
    messages = []
    for j, msg in enumerate(prompt):
        if not isinstance(msg, dict):
            raise DatasetError(
                f"{where}: field '{field}[{j}]' must be a message dict, got {type(msg).__name__}"
            )
        for key in ("role", "content"):
            if not isinstance(msg.get(key), str):
                raise DatasetError(
                    f"{where}: field '{field}[{j}].{key}' must be a string, got {type(msg.get(key)).__name__}"
                )
        check_role(msg["role"], roles, f"{where}: field '{field}[{j}].role'")
        messages.append(dict(msg))
    if not any(m["content"].strip() for m in messages):
        # The model would answer nothing but the chat template: a broken row, not a question.
        raise DatasetError(f"{where}: field {field!r} has no text (every message's content is empty)")
    return messages


def require_chat_template(tokenizer: Any) -> None:
    """Prompts are chat messages: a tokenizer without a chat template cannot render any of them."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise DatasetError(
            "the tokenizer has no chat template; prompts are chat messages, so use an instruct/chat "
            "model or set tokenizer.chat_template"
        )


def render_prompt(
    tokenizer: Any, messages: Messages, chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """Chat-template the messages (with the assistant generation prompt) and tokenise them.

    Rendered to text first and encoded without special tokens, because the template already holds
    every special token (BOS included); letting the tokenizer add its own would double them.
    """
    require_chat_template(tokenizer)
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def truncate_ids(ids: list[int], limit: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``limit`` tokens: ``left`` keeps the tail, ``right`` the head, ``middle`` both ends."""
    if len(ids) <= limit:
        return ids
    if mode == "left":
        return ids[len(ids) - limit :]
    if mode == "right":
        return ids[:limit]
    if mode == "middle":
        head = limit // 2
        return ids[:head] + ids[len(ids) - (limit - head) :]
    raise ValueError(f"unknown truncation mode {mode!r}; choose one of {TRUNCATION_MODES}")


class RLDataset(torch.utils.data.Dataset):
    """Prompts for RL: each item is the tokenised, chat-templated prompt plus the row's other fields.

    Items carry ``input_ids`` (1-D LongTensor, unpadded), ``raw_prompt`` (the messages), ``index``
    (position in this dataset, unique across files) and every other row field unchanged
    (``data_source``, ``reward_model``, ``extra_info``, ``ability``, ...), which the reward manager needs.

    ``bad_rows`` (``data.bad_rows``) decides about malformed rows (unparsable JSON lines, a missing or
    wrong-typed prompt, a missing ``required_fields`` entry such as ``"reward_model.ground_truth"``):
    ``fail`` raises naming file and row, ``skip`` logs each one and counts it in
    :attr:`num_skipped_rows`. Overlong prompts are not bad rows: ``truncation`` and
    ``filter_overlong_prompts`` decide about them. ``files_key`` is the config key the files came from,
    named in file-level errors.
    """

    def __init__(
        self,
        files: PathLike | Iterable[PathLike],
        tokenizer: Any,
        prompt_key: str = "prompt",
        max_prompt_length: int = 512,
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        max_samples: int = -1,
        chat_template_kwargs: dict[str, Any] | None = None,
        bad_rows: str = "fail",
        required_fields: Sequence[str] = (),
        files_key: str | None = None,
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r} is not one of {TRUNCATION_MODES}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be positive, got {max_prompt_length}")
        self._bad_rows = BadRows(bad_rows)
        require_chat_template(tokenizer)  # a tokenizer problem, not a bad row: never skipped
        self.files = as_path_list(files, files_key)
        self.files_key = files_key
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.filter_overlong_prompts = filter_overlong_prompts
        self.required_fields = tuple(required_fields)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.roles = chat_roles(tokenizer)
        self.turn_tokens = turn_tokens(tokenizer)

        records = read_files(self.files, key=files_key, bad_rows=self._bad_rows)
        check_columns(records, {prompt_key: "data.prompt_key"}, files_key)
        if max_samples is not None and max_samples >= 0:
            records = records[:max_samples]
        self.rows: list[dict[str, Any]] = []
        self.prompt_ids: list[list[int]] = []
        self.sources: list[tuple[str, int]] = []
        n_filtered = n_truncated = n_decoded = 0
        for path, row_idx, row in records:
            where = f"{path} row {row_idx}"
            try:
                messages, ids, decoded = self._parse_row(row, where)
            except DatasetError as exc:
                self._bad_rows.handle(exc)
                continue
            n_decoded += decoded
            if len(ids) > max_prompt_length:
                if filter_overlong_prompts:
                    n_filtered += 1
                    continue
                if truncation == "error":
                    raise DatasetError(
                        f"{where}: prompt is {len(ids)} tokens after the chat template, longer than "
                        f"data.max_prompt_length={max_prompt_length}. Raise data.max_prompt_length, set "
                        f"data.truncation to 'left', 'right' or 'middle', or set data.filter_overlong_prompts=true."
                    )
                ids = truncate_ids(ids, max_prompt_length, truncation)
                n_truncated += 1
            row = dict(row)
            row[prompt_key] = messages
            self.rows.append(row)
            self.prompt_ids.append(ids)
            self.sources.append((path, row_idx))
        log_decoded_json(n_decoded, len(records), prompt_key, self.files)
        self._log_summary(len(records), n_filtered, n_truncated)
        if not self.rows:
            raise DatasetError(self._empty_message(n_filtered))

    @property
    def num_skipped_rows(self) -> int:
        """Malformed rows dropped under ``data.bad_rows=skip`` (the trainer's ``data/skipped_rows``)."""
        return self._bad_rows.count

    @property
    def skipped_rows(self) -> list[str]:
        """One message (file, row, reason) per skipped row."""
        return list(self._bad_rows.skipped)

    def _parse_row(self, row: dict[str, Any], where: str) -> tuple[Messages, list[int], bool]:
        """Validate one row and tokenise its prompt (and say whether it was decoded from JSON text); every
        problem is a DatasetError naming ``where``."""
        prompt_key = self.prompt_key
        if prompt_key not in row or row[prompt_key] is None:
            raise DatasetError(
                f"{where}: missing field {prompt_key!r} (data.prompt_key); row has {sorted(row)}"
            )
        check_required(row, self.required_fields, where)
        messages, decoded = to_messages(row[prompt_key], where, prompt_key, self.roles)
        check_turn_tokens(messages, self.turn_tokens, where, prompt_key)
        try:
            ids = render_prompt(self.tokenizer, messages, self.chat_template_kwargs)
        except DatasetError:
            raise
        except Exception as exc:  # jinja errors from odd messages
            raise DatasetError(f"{where}: chat template failed on field {prompt_key!r}: {exc}") from exc
        return messages, ids, decoded

    def _log_summary(self, n_records: int, n_filtered: int, n_truncated: int) -> None:
        limit = self.max_prompt_length
        if n_filtered:
            logger.warning(
                "filtered %d of %d prompts longer than data.max_prompt_length=%d",
                n_filtered,
                n_records,
                limit,
            )
        if n_truncated:
            logger.warning(
                "truncated (%s) %d of %d prompts to data.max_prompt_length=%d",
                self.truncation,
                n_truncated,
                n_records,
                limit,
            )
        if self.num_skipped_rows:
            logger.warning(
                "skipped %d bad rows (data.bad_rows=skip) in %s", self.num_skipped_rows, ", ".join(self.files)
            )

    def _empty_message(self, n_filtered: int) -> str:
        reasons = []
        if n_filtered:
            reasons.append(f"{n_filtered} filtered as longer than data.max_prompt_length")
        if self.num_skipped_rows:
            reasons.append(f"{self.num_skipped_rows} skipped as bad rows (data.bad_rows=skip)")
        reason = f" ({'; '.join(reasons)})" if reasons else ""
        key = f" ({self.files_key})" if self.files_key else ""
        return f"empty dataset{reason}: no usable rows in {', '.join(self.files)}{key}"

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for dataset of size {len(self)}")
        i = i % len(self)
        row = self.rows[i]
        item = {k: v for k, v in row.items() if k != self.prompt_key}
        item["input_ids"] = torch.tensor(self.prompt_ids[i], dtype=torch.long)
        item["raw_prompt"] = row[self.prompt_key]
        item["index"] = i
        return item


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """1-D object array; built element-wise so lists/dicts are never broadcast into extra dimensions."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def collate_rl(
    items: Sequence[dict[str, Any]], pad_token_id: int, max_prompt_length: int | None = None
) -> DataProto:
    """Left-pad prompts into a `DataProto` with ``input_ids``, ``attention_mask`` and ``position_ids``.

    Left padding puts every prompt's last token in the final column, which is where generation
    continues from. ``max_prompt_length`` pads to a fixed width (stable shapes across steps).
    All other fields go to ``non_tensor_batch`` as object arrays.
    """
    from verl.protocol import DataProto

    if not items:
        raise ValueError("collate_rl got an empty batch")
    seqs = [torch.as_tensor(it["input_ids"], dtype=torch.long).reshape(-1) for it in items]
    longest = max(len(s) for s in seqs)
    width = longest if max_prompt_length is None else max_prompt_length
    if longest > width:
        raise ValueError(f"a prompt has {longest} tokens, more than max_prompt_length={width}")
    input_ids = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            input_ids[i, width - len(s) :] = s
            attention_mask[i, width - len(s) :] = 1
    positions = position_ids(attention_mask)
    keys = list(dict.fromkeys(k for it in items for k in it if k != "input_ids"))
    non_tensors = {k: _object_array([it.get(k) for it in items]) for k in keys}
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions},
        non_tensors=non_tensors,
        meta_info={},
    )
