"""Supervised fine-tuning data: chat-templated prompt + target response, loss on the response only.

Useful to warm-start a tiny model on a task before RL (from-scratch RL on random weights rarely
finds any reward). The response defaults to the row's ground truth, so any RL dataset doubles as
an SFT dataset.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

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
from verl.data.rl_dataset import log_decoded_json, render_prompt, require_chat_template, to_messages
from verl.models.plumbing import position_ids

logger = logging.getLogger(__name__)

SFT_TRUNCATION_MODES = ("error", "left", "right")


class SFTDataset(torch.utils.data.Dataset):
    """Items: ``input_ids`` = prompt + response + eos, ``loss_mask`` 1 exactly on response tokens and eos.

    ``loss_mask[t] == 1`` means token ``t`` is a training target (predicted from the logits at
    ``t - 1``); the trainer does the shift. ``bad_rows`` works as in :class:`RLDataset` (``fail`` or
    ``skip``, with the count in :attr:`num_skipped_rows`); ``files_key`` is the config key the files came
    from, named in file-level errors.
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
    ) -> None:
        if truncation not in SFT_TRUNCATION_MODES:
            raise ValueError(f"data.truncation={truncation!r} is not one of {SFT_TRUNCATION_MODES}")
        if max_length <= 0:
            raise ValueError(f"data.max_length must be positive, got {max_length}")
        eos = tokenizer.eos_token_id
        if eos is None:
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
        self.chat_template_kwargs = chat_template_kwargs
        records = read_files(self.files, key=files_key, bad_rows=self._bad_rows)
        check_columns(records, {prompt_key: "data.prompt_key", response_key: "data.response_key"}, files_key)
        if max_samples is not None and max_samples >= 0:
            records = records[:max_samples]
        self.input_ids: list[list[int]] = []
        self.loss_masks: list[list[int]] = []
        n_truncated = n_no_target = n_decoded = 0
        for path, row_idx, row in records:
            where = f"{path} row {row_idx}"
            try:
                prompt_ids, response_ids, decoded = self._parse_row(row, where)
            except DatasetError as exc:
                self._bad_rows.handle(exc)
                continue
            n_decoded += decoded
            ids = prompt_ids + response_ids
            mask = [0] * len(prompt_ids) + [1] * len(response_ids)
            if len(ids) > max_length:
                if truncation == "error":
                    raise DatasetError(
                        f"{where}: prompt + response is {len(ids)} tokens, longer than "
                        f"data.max_length={max_length}. Raise data.max_length or set data.truncation to "
                        "'left' (drops the prompt start) or 'right' (drops the response end)."
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

    def _parse_row(self, row: dict[str, Any], where: str) -> tuple[list[int], list[int], bool]:
        """Prompt ids and response ids (+ eos) of one row, and whether its prompt was decoded from JSON text;
        every problem is a DatasetError naming ``where``."""
        prompt = row.get(self.prompt_key)
        if prompt is None:
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
