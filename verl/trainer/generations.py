"""What the model answered: decoded samples of a step, dumped as verl's generation files and logged as tables.

verl's format (``trainer.validation_data_dir`` / ``trainer.rollout_data_dir``): one ``<step>.jsonl`` per
step, a JSON object per sample with ``input`` (the prompt), ``output`` (the whole response; in a
multi-turn rollout the tool results too), ``gts`` (the ground truth), ``score`` and ``step``, plus the
reward's extra fields. ``verl report`` shows the validation files of a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.utils.checkpoint import atomic_write_bytes
from verl.utils.trackers import jsonable
from verl.workers.reward.manager import response_mask, trajectory_mask


def decode_samples(batch: DataProto, tokenizer: Any) -> tuple[list[str], list[str]]:
    """Each sample's prompt (its valid tokens) and response (the whole trajectory), as text."""
    tensors = batch.batch
    prompts, responses = tensors["prompts"], tensors["responses"]
    prompt_mask = tensors["attention_mask"][:, : prompts.shape[-1]].bool()
    text_mask = trajectory_mask(batch, response_mask(batch))

    def text(ids: Any) -> str:
        return tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    inputs = [text(prompts[i][prompt_mask[i]]) for i in range(len(batch))]
    outputs = [text(responses[i][text_mask[i]]) for i in range(len(batch))]
    return inputs, outputs


def ground_truths(batch: DataProto) -> list[Any]:
    """``reward_model.ground_truth`` of each sample (None where a row has none)."""
    rows = batch.non_tensor_batch.get("reward_model")
    if rows is None:
        return [None] * len(batch)
    return [row.get("ground_truth") if isinstance(row, Mapping) else None for row in rows]


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as JSON values; anything else JSON cannot hold as its text."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    value = jsonable(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def generation_records(
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    gts: Sequence[Any],
    scores: Sequence[float],
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """One record per sample in verl's layout (extra fields of the right length are added per sample)."""
    extra = {k: v for k, v in (extra or {}).items() if len(v) == len(inputs)}
    return [
        {
            "input": inputs[i],
            "output": outputs[i],
            "gts": _plain(gts[i]),
            "score": _plain(float(scores[i])),
            "step": step,
            **{k: _plain(v[i]) for k, v in extra.items() if k not in ("input", "output", "gts", "score")},
        }
        for i in range(len(inputs))
    ]


def dump_generations(directory: str | Path, step: int, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``<directory>/<step>.jsonl`` (whole or not at all: a temporary file, then renamed)."""
    path = Path(directory).expanduser() / f"{step}.jsonl"
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    atomic_write_bytes(path, text.encode("utf-8"), readable=True)
    return path


def table_rows(records: Sequence[Mapping[str, Any]], n: int, seed: int = 42) -> list[list[Any]]:
    """``trainer.log_val_generations``: the same ``n`` samples at every step (as verl: sorted by prompt,
    then shuffled with a fixed seed), as rows ``[step, input, output, score]``."""
    order = sorted(range(len(records)), key=lambda i: (records[i]["input"], i))
    np.random.RandomState(seed).shuffle(order)
    return [
        [records[i]["step"], records[i]["input"], records[i]["output"], records[i]["score"]]
        for i in order[:n]
    ]


TABLE_COLUMNS = ["step", "input", "output", "score"]
