"""Prompt dataset for RL rollouts, and the collate function that turns prompts into a left-padded batch.

All rows are read, templated and tokenised at construction time, so a bad row or an overlong
prompt fails the run before any model is loaded, with the file and row to fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.data.io import DatasetError, PathLike, as_path_list, read_files

if TYPE_CHECKING:
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")

Messages = list[dict[str, Any]]


def normalize_messages(prompt: Any, where: str, field: str = "prompt") -> Messages:
    """Validate a prompt and return it as chat messages; a plain string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
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
        messages.append(dict(msg))
    return messages


def render_prompt(
    tokenizer: Any, messages: Messages, chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """Chat-template the messages (with the assistant generation prompt) and tokenise them.

    Rendered to text first and encoded without special tokens, because the template already holds
    every special token (BOS included); letting the tokenizer add its own would double them.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise DatasetError(
            "the tokenizer has no chat template; prompts are chat messages, so use an instruct/chat "
            "model or set tokenizer.chat_template"
        )
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
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r} is not one of {TRUNCATION_MODES}")
        if max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be positive, got {max_prompt_length}")
        self.files = as_path_list(files)
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.filter_overlong_prompts = filter_overlong_prompts
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

        records = read_files(self.files)
        if max_samples is not None and max_samples >= 0:
            records = records[:max_samples]
        self.rows: list[dict[str, Any]] = []
        self.prompt_ids: list[list[int]] = []
        self.sources: list[tuple[str, int]] = []
        n_filtered = n_truncated = 0
        for path, row_idx, row in records:
            where = f"{path} row {row_idx}"
            if prompt_key not in row or row[prompt_key] is None:
                raise DatasetError(
                    f"{where}: missing field {prompt_key!r} (data.prompt_key); row has {sorted(row)}"
                )
            messages = normalize_messages(row[prompt_key], where, prompt_key)
            try:
                ids = render_prompt(tokenizer, messages, self.chat_template_kwargs)
            except DatasetError:
                raise
            except Exception as exc:  # jinja errors from odd messages
                raise DatasetError(f"{where}: chat template failed on field {prompt_key!r}: {exc}") from exc
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
        if n_filtered:
            logger.warning(
                "filtered %d of %d prompts longer than data.max_prompt_length=%d",
                n_filtered,
                len(records),
                max_prompt_length,
            )
        if n_truncated:
            logger.warning(
                "truncated (%s) %d of %d prompts to data.max_prompt_length=%d",
                truncation,
                n_truncated,
                len(records),
                max_prompt_length,
            )
        if not self.rows:
            reason = " (all prompts were filtered as overlong)" if n_filtered else ""
            raise DatasetError(f"empty dataset{reason}: no usable rows in {', '.join(self.files)}")

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
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    keys = list(dict.fromkeys(k for it in items for k in it if k != "input_ids"))
    non_tensors = {k: _object_array([it.get(k) for it in items]) for k in keys}
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        non_tensors=non_tensors,
        meta_info={},
    )
