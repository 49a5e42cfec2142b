"""reasoning-gym tasks scored by reasoning-gym's own verifiers.

A row written by ``python -m verl.data.preprocess reasoning_gym --task T`` has the plain answer as
``reward_model.ground_truth`` (``"288"``, as verl's GSM8K rows do), so a reward function of one's own that
compares strings works on it. Everything the task's ``score_answer(answer, entry)`` needs is in the row's
``extra_info["reasoning_gym"]`` (:data:`TASK_KEY`), as JSON text: the task name, the task config it was
generated with, the generated entry (question, answer, metadata) and the answer format. Rows written before
carried that record as their ground truth; they still score the same. The answer is read from the response
in the row's ``answer_format`` (:data:`ANSWER_FORMATS`): the text inside its last ``<answer>...</answer>``
(``tag``, reasoning-gym's convention, the default) or its last number (``number``); a response without one
scores 0 without consulting the task.

The score is the task's own, which may be partial (many tasks give 0.01 or 0.05 to a well-formed wrong
answer); ``acc`` is 1 only for full marks, so validation's ``val-core/reasoning_gym/<task>/acc/mean@n`` is
the fraction solved.

reasoning-gym is imported on first use (it takes a second and is optional: ``pip install -e '.[tasks]'``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import lru_cache
from typing import Any

DATA_SOURCE_PREFIX = "reasoning_gym/"
"""Rows of task ``T`` have data_source ``reasoning_gym/T``; the scorer takes the task from the row's record."""

TASK_KEY = "reasoning_gym"
"""The ``extra_info`` key of a row's task record (:func:`make_task_record`)."""

INSTALL = "pip install 'reasoning-gym>=0.1.20' (or pip install -e '.[tasks]')"

TAG_INSTRUCTION = (
    "Think about the reasoning process step by step, then give the final answer in this format: "
    "<answer>answer here</answer>. Do not explain your reasoning inside the answer tags, give only the "
    "final answer."
)
"""What a ``tag`` row asks after its question; the scorer reads the last ``<answer>...</answer>``."""

_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
"""reasoning-gym's ``utils.extract_answer`` pattern (copied so extraction needs no import)."""

# JSON has no tuples, fractions or non-string keys, and tasks compare metadata with ``==`` (arc_agi's grids
# are tuples of tuples, gsm_symbolic keeps Fractions): these tags bring each back exactly.
_TUPLE = "__tuple__"
_ITEMS = "__dict_items__"
_FRACTION = "__fraction__"
_TAGS = {_TUPLE, _ITEMS, _FRACTION}


def reasoning_gym_missing_message(what: str) -> str:
    """One line for ``what`` needing reasoning-gym when it is not installed."""
    return f"{what} needs the reasoning-gym package, which is not installed: {INSTALL}"


def import_reasoning_gym(what: str) -> Any:
    """The ``reasoning_gym`` module; ImportError with the pip command when it is missing."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(reasoning_gym_missing_message(what)) from error
    return reasoning_gym


def to_json_value(value: Any, where: str = "value") -> Any:
    """``value`` as JSON-able data that :func:`from_json_value` turns back into an equal value of the same
    types (tuples, Fractions and non-string dict keys included). Any other object is a ValueError naming
    ``where`` and the path inside it: it could not be given back to the task as it was."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Fraction):
        return {_FRACTION: str(value)}
    if isinstance(value, tuple):
        return {_TUPLE: [to_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]}
    if isinstance(value, list):
        return [to_json_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and not set(value) & _TAGS:
            return {key: to_json_value(item, f"{where}.{key}") for key, item in value.items()}
        return {
            _ITEMS: [
                [to_json_value(key, where), to_json_value(item, f"{where}.{key}")]
                for key, item in value.items()
            ]
        }
    raise ValueError(f"{where} is a {type(value).__name__} ({value!r:.60}), which a row cannot store as JSON")


def from_json_value(value: Any) -> Any:
    """The inverse of :func:`to_json_value`."""
    if isinstance(value, list):
        return [from_json_value(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(from_json_value(item) for item in value[_TUPLE])
        if set(value) == {_FRACTION}:
            return Fraction(value[_FRACTION])
        if set(value) == {_ITEMS}:
            return {from_json_value(key): from_json_value(item) for key, item in value[_ITEMS]}
        return {key: from_json_value(item) for key, item in value.items()}
    return value


def answer_text(entry: dict[str, Any]) -> str:
    """The plain answer of a generated entry, a row's ``reward_model.ground_truth``: ``""`` for a task whose
    entries have no single answer (boxnet, graph_color, rubiks_cube, ...: the task's verifier accepts any
    valid one), which only this scorer can score."""
    answer = entry.get("answer")
    return "" if answer is None else str(answer)


def make_task_record(
    task: str, entry: dict[str, Any], config: dict[str, Any] | None = None, answer_format: str = "tag"
) -> str:
    """The JSON text stored as ``extra_info["reasoning_gym"]``: ``{"task", "config", "entry", "answer_format"}``."""
    payload = {
        "task": task,
        "config": to_json_value(config or {}, "config"),
        "entry": to_json_value(entry, "entry"),
        "answer_format": answer_format,
    }
    return json.dumps(payload, ensure_ascii=False)


_EXPECTED = (
    f'a reasoning-gym row carries its task as JSON text {{"task", "config", "entry", "answer_format"}} in '
    f"extra_info[{TASK_KEY!r}], written by verl.data.preprocess reasoning_gym"
)


def task_record(ground_truth: Any, extra_info: Any = None) -> str:
    """A row's task record: ``extra_info["reasoning_gym"]``, or for a row written before the record moved
    there, its ground truth (which was the record). A row with neither is a ValueError saying so."""
    if isinstance(extra_info, Mapping) and extra_info.get(TASK_KEY) is not None:
        return extra_info[TASK_KEY]
    if isinstance(ground_truth, str) and ground_truth.lstrip().startswith("{"):
        return ground_truth
    keys = sorted(extra_info) if isinstance(extra_info, Mapping) else None
    raise ValueError(
        f"{_EXPECTED}; this row has none (extra_info keys: {keys}), and its ground truth {ground_truth!r:.120} "
        "is not such a record either (as rows written before carried it)"
    )


def parse_task_record(record: Any) -> tuple[str, dict[str, Any], dict[str, Any], str]:
    """``(task, config, entry, answer_format)`` from :func:`make_task_record`'s text (``tag`` when it names no
    format); anything else is a ValueError that says what a reasoning-gym row carries."""
    if not isinstance(record, str):
        raise ValueError(f"{_EXPECTED}; got a {type(record).__name__}: {record!r:.120}")
    try:
        payload = from_json_value(json.loads(record))
    except ValueError:
        raise ValueError(f"{_EXPECTED}; got text that is not JSON: {record!r:.120}") from None
    if not isinstance(payload, dict) or not {"task", "entry"} <= set(payload):
        raise ValueError(f"{_EXPECTED}; got {record!r:.120}")
    entry = payload["entry"]
    if not isinstance(entry, dict) or "answer" not in entry or "metadata" not in entry:
        raise ValueError(f"{_EXPECTED}; its entry lacks 'answer' or 'metadata': {record!r:.120}")
    answer_format = payload.get("answer_format", "tag")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"{_EXPECTED}; its answer_format {answer_format!r} is not one of {', '.join(ANSWER_FORMATS)}"
        )
    return payload["task"], payload.get("config") or {}, entry, answer_format


def extract_answer(solution_str: str) -> str | None:
    """The text inside the response's last ``<answer>...</answer>``, stripped; None when there is none."""
    matches = _ANSWER.findall(solution_str)
    return matches[-1].strip() if matches else None


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def extract_last_number(solution_str: str) -> str | None:
    """The response's last number (``-12``, ``3.5``; ``1,234`` read as ``1234``); None when it has none."""
    matches = _NUMBER.findall(_THOUSANDS.sub("", solution_str))
    return matches[-1] if matches else None


ANSWER_FORMATS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "tag": ("{question}\n\n" + TAG_INSTRUCTION, extract_answer),
    "number": ("{question} Reply with only the final number.", extract_last_number),
}
"""``answer_format`` -> (the prompt made from a question, how the answer is read from a response).

``tag`` is reasoning-gym's convention; ``number``, for tasks whose answers are numbers, suits small models that
never learned the tags (SmolLM2-135M-Instruct writes them in 0 of 64 chain_sum answers, and a number in all)."""


@lru_cache(maxsize=256)
def _task(task: str, config_json: str) -> Any:
    """The task's dataset object (its ``score_answer`` may read the config), built once per task and config."""
    rg = import_reasoning_gym(f"scoring reasoning-gym task {task!r}")
    config = from_json_value(json.loads(config_json))
    try:
        return rg.create_dataset(task, **{**config, "size": 1, "seed": 0})
    except ValueError as error:
        raise ValueError(f"reasoning-gym cannot build task {task!r} with config {config}: {error}") from error


def score_answer(
    task: str, answer: str | None, entry: dict[str, Any], config: dict[str, Any] | None = None
) -> float:
    """reasoning-gym's ``score_answer(answer, entry)`` for ``task`` built with ``config``."""
    dataset = _task(task, json.dumps(to_json_value(config or {}), sort_keys=True))
    return float(dataset.score_answer(answer, entry))


def read_answer(solution_str: str, ground_truth: Any, extra_info: Any = None) -> str | None:
    """The answer in ``solution_str``, read in the format the row's record names (``tag`` when it names none or
    cannot be parsed: the format reward term must not fail where the correctness term reports the row)."""
    try:
        answer_format = parse_task_record(task_record(ground_truth, extra_info))[3]
    except ValueError:
        answer_format = "tag"
    return ANSWER_FORMATS[answer_format][1](solution_str)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """Score a response to a reasoning-gym row: ``{"score": the task's score, "acc": 1.0 for full marks}``. The
    task, its config and the entry come from ``extra_info["reasoning_gym"]`` (:func:`task_record`)."""
    task, config, entry, answer_format = parse_task_record(task_record(ground_truth, extra_info))
    answer = ANSWER_FORMATS[answer_format][1](solution_str)
    score = 0.0 if answer is None else score_answer(task, answer, entry, config)
    return {"score": score, "acc": 1.0 if score >= 1.0 else 0.0}
