"""Bad input, handled: missing / unreadable / empty data files, malformed rows (fail or counted skip),
a tokenizer without a pad token, misbehaving reward functions (raise, NaN, wrong count, hang) under
``reward_model.error_policy``, non-finite gradients, and out-of-memory errors that name the knobs.

The property tests (hypothesis) feed random malformed rows and misbehaving reward functions and hold
the loader and the reward managers to one promise: a clear error naming the file/row or sample, or a
counted skip / zero, and never a bare crash.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import re
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl.config import ConfigError
from verl.config.loader import load_config
from verl.data import BadRows, DatasetError, RLDataset, SFTDataset, read_files
from verl.models.loading import ensure_pad_token, load_tokenizer
from verl.protocol import DataProto
from verl.single_controller.worker import registered_methods
from verl.workers.engine.optim import clip_and_step
from verl.workers.errors import ACTOR_UPDATE_KNOBS, explain_oom, oom_message
from verl.workers.reward import (
    REWARD_ERROR_KEY,
    BatchRewardManager,
    NaiveRewardManager,
    RewardBatchError,
    RewardFunctionError,
    TimeLimit,
    TimeLimitExhausted,
    load_reward_manager,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def good_row(i: int = 0) -> dict[str, Any]:
    return {"prompt": f"{i}+1=", "data_source": "arithmetic", "reward_model": {"ground_truth": str(i + 1)}}


# ============================================================================ data: files


def test_missing_file_names_path_and_key(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet \(data\.train_files\) does not exist"):
        RLDataset(tmp_path / "nope.parquet", tokenizer, files_key="data.train_files")


def test_no_files_names_the_key(tokenizer):
    for files in (None, []):
        with pytest.raises(DatasetError, match=r"no dataset files given; set data\.val_files"):
            RLDataset(files, tokenizer, files_key="data.val_files")


def test_unreadable_files_name_the_path(tmp_path, tokenizer, monkeypatch):
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    with pytest.raises(DatasetError, match=r"dir\.jsonl \(data\.train_files\): is not a regular file"):
        RLDataset(directory, tokenizer, files_key="data.train_files")

    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1\.jsonl.*UTF-8"):
        RLDataset(latin1, tokenizer)

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"corrupt\.parquet \(data\.train_files\): cannot read parquet"):
        RLDataset(corrupt, tokenizer, files_key="data.train_files")

    # Running as root makes chmod useless: simulate the permission error instead.
    locked = write_lines(tmp_path / "locked.jsonl", [json.dumps(good_row())])

    def deny(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", deny)
    with pytest.raises(DatasetError, match=r"locked\.jsonl: cannot read \(Permission denied\)"):
        read_files(locked)


def test_empty_dataset_names_the_file(tmp_path, tokenizer):
    empty = write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(
        DatasetError, match=r"empty dataset: no usable rows in .*empty\.jsonl \(data\.train_files\)"
    ):
        RLDataset(empty, tokenizer, files_key="data.train_files")
    all_bad = write_lines(tmp_path / "all_bad.jsonl", ["{oops", json.dumps({"question": 1})])
    with pytest.raises(DatasetError, match=r"empty dataset \(2 skipped as bad rows.*all_bad\.jsonl"):
        RLDataset(all_bad, tokenizer, bad_rows="skip")
    with pytest.raises(DatasetError, match="empty dataset"):
        SFTDataset(all_bad, tokenizer, bad_rows="skip")


# ============================================================================ data: rows


BAD_ROWS = [
    ("{not json", r"malformed JSON on line 2 \(row 1\)"),
    ("[1, 2]", r"line 2 \(row 1\) is a list"),
    (json.dumps({"question": "1+1="}), r"row 1: missing field 'prompt'"),
    (json.dumps({**good_row(), "prompt": 7}), r"row 1: field 'prompt' must be"),
    (json.dumps({**good_row(), "prompt": [{"role": "user"}]}), r"row 1: field 'prompt\[0\]\.content'"),
    (json.dumps({"prompt": "x", "reward_model": "12"}), r"row 1: field 'reward_model' must be a dict"),
    (json.dumps({"prompt": "x", "reward_model": {}}), r"row 1: missing field 'reward_model\.ground_truth'"),
    (json.dumps({"prompt": "x", "reward_model": {"ground_truth": 1}}), r"row 1: missing field 'data_source'"),
]


@pytest.mark.parametrize(("line", "pattern"), BAD_ROWS)
def test_bad_row_fail_names_file_and_row(tmp_path, tokenizer, line, pattern):
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps(good_row()), line, json.dumps(good_row(2))])
    required = ("reward_model.ground_truth", "data_source")
    with pytest.raises(DatasetError, match=r"rows\.jsonl.*" + pattern):
        RLDataset(path, tokenizer, required_fields=required)
    ds = RLDataset(path, tokenizer, required_fields=required, bad_rows="skip")
    assert len(ds) == 2 and ds.num_skipped_rows == 1
    assert re.search(pattern, ds.skipped_rows[0]) and "rows.jsonl" in ds.skipped_rows[0]
    assert [source[1] for source in ds.sources] == [0, 2]  # row indices do not shift past a skipped line


def test_skip_logs_each_row_once_and_counts(tmp_path, tokenizer, caplog):
    lines = [json.dumps(good_row(0)), "{bad", "", json.dumps({"prompt": None}), json.dumps(good_row(3))]
    path = write_lines(tmp_path / "mixed.jsonl", lines)
    with caplog.at_level(logging.WARNING, logger="verl.data"):
        ds = RLDataset(path, tokenizer, bad_rows="skip")
    assert len(ds) == 2 and ds.num_skipped_rows == 2
    row_lines = [r.getMessage() for r in caplog.records if "skipping a bad row" in r.getMessage()]
    assert len(row_lines) == 2
    assert "mixed.jsonl: malformed JSON on line 2 (row 1)" in row_lines[0]
    assert "mixed.jsonl row 2: missing field 'prompt'" in row_lines[1]  # the blank line is no row
    assert any("skipped 2 bad rows" in r.getMessage() for r in caplog.records)


def test_overlong_prompts_are_not_bad_rows(tmp_path, tokenizer):
    path = write_lines(tmp_path / "long.jsonl", [json.dumps({"prompt": "1+1=" * 50})])
    with pytest.raises(DatasetError, match=r"long\.jsonl row 0.*data\.max_prompt_length=20"):
        RLDataset(path, tokenizer, max_prompt_length=20, bad_rows="skip")


def test_bad_rows_policy_is_checked(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="data.bad_rows='ignore'"):
        BadRows("ignore")
    with pytest.raises(ValueError, match="data.bad_rows"):
        RLDataset(tmp_path / "x.jsonl", tokenizer, bad_rows="ignore")


def test_tokenizer_without_chat_template_is_not_a_bad_row(tmp_path):
    path = write_lines(tmp_path / "ok.jsonl", [json.dumps(good_row())])
    no_template = SimpleNamespace(chat_template=None, eos_token_id=2)
    for dataset in (RLDataset, SFTDataset):
        with pytest.raises(DatasetError, match="the tokenizer has no chat template"):
            dataset(path, no_template, bad_rows="skip")


def test_sft_dataset_skips_bad_rows(tmp_path, tokenizer):
    path = write_lines(tmp_path / "sft.jsonl", [json.dumps(good_row()), json.dumps({"prompt": "x"}), "{"])
    with pytest.raises(DatasetError, match="line 3"):
        SFTDataset(path, tokenizer)
    ds = SFTDataset(path, tokenizer, bad_rows="skip")
    assert len(ds) == 1 and ds.num_skipped_rows == 2


# ---------------------------------------------------------------------------- property: malformed rows

_MALFORMED_LINES = ["{oops", "[1, 2]", '"just a string"', "42", "null", '{"prompt": ', "{}}"]
_ROLES = st.sampled_from(["user", "system", "assistant", "tool"])
_TEXT = st.text(max_size=12)
_JUNK = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), _TEXT, st.lists(st.integers())
)
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": _ROLES, "content": _TEXT}),
    st.fixed_dictionaries({"role": _ROLES, "content": _JUNK}),
    st.fixed_dictionaries({"content": _TEXT}),
    _JUNK,
)
_PROMPT = st.one_of(_TEXT, st.lists(_MESSAGE, max_size=3), _JUNK)
_REWARD_MODEL = st.one_of(
    st.fixed_dictionaries({"ground_truth": st.one_of(_TEXT, st.integers())}), _JUNK, st.just({})
)
_ROW = st.dictionaries(
    st.sampled_from(["prompt", "data_source", "reward_model", "extra_info"]),
    st.one_of(_PROMPT, _REWARD_MODEL),
    max_size=4,
)
_LINE = st.one_of(
    _ROW.map(lambda row: ("row", row)),
    st.sampled_from(_MALFORMED_LINES).map(lambda text: ("raw", text)),
    st.just(("blank", "")),
)


def _is_message(msg: Any) -> bool:
    return isinstance(msg, dict) and all(isinstance(msg.get(k), str) for k in ("role", "content"))


def _row_problem(row: dict[str, Any]) -> bool:
    """The oracle: does RLDataset (required: reward_model.ground_truth) have to refuse this row?"""
    prompt = row.get("prompt")
    if prompt is None:
        return True
    gt_parent = row.get("reward_model")
    if not isinstance(gt_parent, dict) or gt_parent.get("ground_truth") is None:
        return True
    if isinstance(prompt, str):
        return False
    return not (isinstance(prompt, list) and prompt and all(_is_message(m) for m in prompt))


def _expected_bad_rows(lines: list[tuple[str, Any]]) -> tuple[list[int], list[int]]:
    """Row indices that fail to parse, and rows that parse but are refused."""
    unparsable, refused, index = [], [], 0
    for kind, value in lines:
        if kind == "blank":
            continue
        if kind == "raw":
            unparsable.append(index)
        elif _row_problem(value):
            refused.append(index)
        index += 1
    return unparsable, refused


@FAST
@given(lines=st.lists(_LINE, max_size=8), policy=st.sampled_from(["fail", "skip"]))
def test_property_malformed_rows_error_or_counted_skip(tokenizer, lines, policy):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prop.jsonl"
        write_lines(path, [value if kind != "row" else json.dumps(value) for kind, value in lines])
        unparsable, refused = _expected_bad_rows(lines)
        n_rows = sum(kind != "blank" for kind, _ in lines)
        try:
            ds = RLDataset(
                path,
                tokenizer,
                max_prompt_length=4096,
                bad_rows=policy,
                required_fields=("reward_model.ground_truth",),
                files_key="data.train_files",
            )
        except DatasetError as error:
            message = str(error)
            assert "prop.jsonl" in message
            if policy == "fail" and (unparsable or refused):
                first = (unparsable or refused)[0]
                assert re.search(rf"row {first}\b", message), message
            else:  # every row was bad (or there were none) and skip left nothing
                assert "empty dataset" in message and len(unparsable) + len(refused) == n_rows
            return
        assert policy == "skip" or not (unparsable or refused)
        assert len(ds) + ds.num_skipped_rows == n_rows
        skipped = sorted(int(re.search(r"row (\d+)", m).group(1)) for m in ds.skipped_rows)
        assert skipped == sorted(unparsable + refused)
        assert all("prop.jsonl" in m for m in ds.skipped_rows)


# ============================================================================ tokenizer


class _FakeTokenizer:
    def __init__(self, eos: str | None) -> None:
        self.eos_token, self.eos_token_id = eos, (2 if eos else None)
        self.pad_token = None

    @property
    def pad_token_id(self):
        return None if self.pad_token is None else 2


def test_tokenizer_without_pad_token_gets_eos(tmp_path, tiny_model_dir, caplog):
    tok = load_tokenizer(tiny_model_dir)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="verl.models"):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == loaded.eos_token and loaded.pad_token_id == loaded.eos_token_id
    assert any("no pad token" in r.getMessage() for r in caplog.records)


def test_tokenizer_without_pad_or_eos_fails_clearly():
    fake = _FakeTokenizer(eos="</s>")
    ensure_pad_token(fake, "m")
    assert fake.pad_token == "</s>"
    with pytest.raises(ValueError, match=r"/models/x: the tokenizer has neither a pad nor an eos token"):
        ensure_pad_token(_FakeTokenizer(eos=None), "/models/x")


# ============================================================================ reward managers

_DIGITS = "0123456789"


class DigitTokenizer:
    """id 0 is padding; id k > 0 is the digit k - 1."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(_DIGITS[i - 1] for i in ids if i != 0)


def make_batch(n: int, width: int = 3) -> DataProto:
    """n samples whose response decodes to the sample's index, so a scorer can look up its behaviour."""
    responses = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i in range(n):
        ids = [_DIGITS.index(c) + 1 for c in str(i)]
        responses[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["src"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": f"g{i}"} for i in range(n)], dtype=object),
        },
    )


def by_index(behaviours: list[Any]):
    """A per-sample scorer that returns (or raises) ``behaviours[index]``."""

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        value = behaviours[int(solution_str)]
        if isinstance(value, BaseException):
            raise value
        return value

    return compute_score


def test_raising_scorer_fail_and_zero(caplog):
    behaviours = [1.0, ZeroDivisionError("boom"), 0.5]
    with pytest.raises(RewardFunctionError, match=r"raised ZeroDivisionError: boom for sample 1.*'g1'"):
        NaiveRewardManager(DigitTokenizer(), compute_score=by_index(behaviours))(make_batch(3))
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index(behaviours), error_policy="zero")
    with caplog.at_level(logging.WARNING, logger="verl.workers.reward"):
        out = manager(make_batch(3), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.5]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True, False]
    messages = [r.getMessage() for r in caplog.records]
    assert any("sample 1" in m and "boom" in m and "error_policy=zero" in m for m in messages)
    assert any("1 of 3 samples scored 0" in m for m in messages)


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, None, "0.5", [1.0], {"acc": 1}, {"score": math.nan}, torch.ones(2)]
)
def test_unusable_scores_follow_the_policy(bad):
    with pytest.raises(RewardFunctionError, match="sample 1"):
        NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0, bad]))(make_batch(2))
    out = NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0, bad]), error_policy="zero")(
        make_batch(2), return_dict=True
    )
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True]


@pytest.fixture
def release():
    """An event hanging scorers wait on; set at teardown so abandoned threads end with the test."""
    event = threading.Event()
    yield event
    event.set()


def test_hanging_scorer_times_out(release):
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "1":
            release.wait(10)
        return 1.0

    manager = NaiveRewardManager(DigitTokenizer(), compute_score=compute_score, timeout_s=0.1)
    with pytest.raises(
        RewardFunctionError, match=r"did not return within reward_model\.timeout_s=0\.1 s for sample 1"
    ):
        manager(make_batch(3))
    zeroing = NaiveRewardManager(
        DigitTokenizer(), compute_score=compute_score, timeout_s=0.1, error_policy="zero"
    )
    start = time.perf_counter()
    out = zeroing(make_batch(3), return_dict=True)
    assert time.perf_counter() - start < 2.0
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [False, True, False]
    assert zeroing.time_limit.abandoned == 1


def test_time_limit_passes_results_and_errors_and_stops_after_too_many_hangs(release):
    limit = TimeLimit(0.05, max_abandoned=2)
    assert limit(lambda: 3) == 3
    with pytest.raises(KeyError, match="k"):
        limit(lambda: {}["k"])
    for _ in range(2):
        with pytest.raises(TimeoutError):
            limit(lambda: release.wait(10))
    with pytest.raises(TimeLimitExhausted, match="2 reward calls are still running"):
        limit(lambda: 1)
    # Exhaustion is not one sample's fault: error_policy=zero does not hide it.
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index([1.0]), error_policy="zero")
    manager.time_limit = limit
    with pytest.raises(TimeLimitExhausted):
        manager(make_batch(1))
    with pytest.raises(ValueError, match="timeout_s"):
        TimeLimit(0)


def test_reward_errors_and_managers_pickle():
    error = RewardFunctionError("raised X", data_source="s", index=3, ground_truth="g", response="r")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.index == 3
    assert str(pickle.loads(pickle.dumps(RewardBatchError("bad count")))) == "bad count"
    manager = NaiveRewardManager(DigitTokenizer(), timeout_s=1.0, error_policy="zero")
    manager.time_limit(lambda: 1)  # the helper thread exists now; it must not be pickled
    clone = pickle.loads(pickle.dumps(manager))
    assert clone.time_limit.timeout_s == 1.0 and clone.error_policy == "zero"


def test_error_policy_is_checked():
    with pytest.raises(ValueError, match="reward_model.error_policy='skip'"):
        NaiveRewardManager(DigitTokenizer(), error_policy="skip")


# ---------------------------------------------------------------------------- batched reward functions


def batched(behaviour):
    def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos):
        return behaviour(len(solution_strs))

    return compute_score_batch


def test_batched_wrong_count_names_function_and_counts():
    for policy in ("fail", "zero"):
        manager = BatchRewardManager(
            DigitTokenizer(), compute_score=batched(lambda n: [1.0] * (n - 1)), error_policy=policy
        )
        with pytest.raises(
            RewardBatchError,
            match=r"compute_score_batch \(.*test_bad_input\.py\) returned 2 scores for a batch of 3",
        ):
            manager(make_batch(3))
    with pytest.raises(RewardBatchError, match="returned float, expected a list of 2 scores"):
        BatchRewardManager(DigitTokenizer(), compute_score=batched(lambda n: 1.0))(make_batch(2))


def test_batched_raise_and_nan_follow_the_policy():
    def boom(n):
        raise RuntimeError("judge down")

    with pytest.raises(
        RewardBatchError, match="compute_score_batch.*raised RuntimeError: judge down on a batch of 2"
    ):
        BatchRewardManager(DigitTokenizer(), compute_score=batched(boom))(make_batch(2))
    out = BatchRewardManager(DigitTokenizer(), compute_score=batched(boom), error_policy="zero")(
        make_batch(2), return_dict=True
    )
    assert out["reward_extra_info"][REWARD_ERROR_KEY] == [True, True]
    nan = batched(lambda n: np.array([1.0, np.nan, 0.5]))
    with pytest.raises(RewardFunctionError, match="non-finite score nan for sample 1"):
        BatchRewardManager(DigitTokenizer(), compute_score=nan)(make_batch(3))
    out = BatchRewardManager(DigitTokenizer(), compute_score=nan, error_policy="zero")(
        make_batch(3), return_dict=True
    )
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.5]
    with pytest.raises(ValueError, match="reward_manager=batch needs a batched scoring function"):
        BatchRewardManager(DigitTokenizer())


def test_batched_hang_times_out(release):
    manager = BatchRewardManager(
        DigitTokenizer(),
        compute_score=batched(lambda n: release.wait(10)),
        timeout_s=0.1,
        error_policy="zero",
    )
    assert manager(make_batch(2), return_dict=True)["reward_extra_info"][REWARD_ERROR_KEY] == [True, True]


def test_load_reward_manager_reads_the_policy(tmp_path):
    scorer = tmp_path / "score.py"
    scorer.write_text(
        "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n    return [1.0] * len(solution_strs)\n"
    )
    for name in ("naive", "dapo", "batch"):
        overrides = [
            "data.max_response_length=8",
            f"reward_model.reward_manager={name}",
            "reward_model.error_policy=zero",
            "reward_model.timeout_s=2.5",
        ]
        if name == "batch":
            overrides.append(f"custom_reward_function.path={scorer}")
        manager = load_reward_manager(load_config(overrides=overrides, check=False), DigitTokenizer())
        assert manager.error_policy == "zero" and manager.time_limit.timeout_s == 2.5
    default = load_reward_manager(load_config(check=False), DigitTokenizer())
    assert default.error_policy == "fail" and default.time_limit is None


def test_config_keys_are_validated():
    cfg = load_config(
        None, ["data.bad_rows=skip", "reward_model.error_policy=zero", "reward_model.timeout_s=5"]
    )
    assert cfg.data.bad_rows == "skip" and cfg.reward_model.timeout_s == 5.0
    for override, key in (
        ("data.bad_rows=ignore", "data.bad_rows"),
        ("reward_model.error_policy=skip", "reward_model.error_policy"),
        ("reward_model.timeout_s=0", "reward_model.timeout_s"),
    ):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(None, [override])


# ---------------------------------------------------------------------------- property: misbehaving scorers

_GOOD_SCORES = st.one_of(
    st.floats(-10, 10),
    st.integers(-5, 5),
    st.booleans(),
    st.floats(-1, 1).map(lambda x: {"score": x, "acc": x > 0}),
    st.floats(-1, 1).map(np.float32),
    st.floats(-1, 1).map(torch.tensor),
)
_BAD_SCORES = st.one_of(
    st.sampled_from(
        [math.nan, math.inf, -math.inf, None, "1.0", [1.0], (), {"acc": True}, {"score": math.inf}]
    ),
    st.sampled_from([ValueError, KeyError, ZeroDivisionError, TypeError, AssertionError, RuntimeError]).map(
        lambda cls: cls("scorer bug")
    ),
    st.just(torch.zeros(3)),
)
_BEHAVIOURS = st.lists(
    st.one_of(_GOOD_SCORES.map(lambda v: (True, v)), _BAD_SCORES.map(lambda v: (False, v))),
    min_size=1,
    max_size=10,
)


def _expected_score(value: Any) -> float:
    value = value["score"] if isinstance(value, dict) else value
    return float(value.item() if isinstance(value, torch.Tensor) else value)


@FAST
@given(behaviours=_BEHAVIOURS, policy=st.sampled_from(["fail", "zero"]))
def test_property_misbehaving_scorer_error_or_counted_zero(behaviours, policy):
    values = [v for _, v in behaviours]
    bad = [i for i, (ok, _) in enumerate(behaviours) if not ok]
    manager = NaiveRewardManager(DigitTokenizer(), compute_score=by_index(values), error_policy=policy)
    try:
        out = manager(make_batch(len(values)), return_dict=True)
    except RewardFunctionError as error:
        assert policy == "fail" and bad, "raised although every score was usable or the policy is zero"
        assert f"for sample {bad[0]} " in str(error) and f"'g{bad[0]}'" in str(error)
        return
    assert policy == "zero" or not bad
    totals = out["reward_tensor"].sum(-1)
    assert torch.isfinite(totals).all()
    for i, (ok, value) in enumerate(behaviours):
        assert totals[i].item() == pytest.approx(_expected_score(value) if ok else 0.0, abs=1e-6)
    if policy == "zero":
        assert [i for i, flag in enumerate(out["reward_extra_info"][REWARD_ERROR_KEY]) if flag] == bad


@FAST
@given(
    behaviours=_BEHAVIOURS,
    count_delta=st.sampled_from([0, 0, 0, -1, 1, 3]),
    raises=st.booleans(),
    policy=st.sampled_from(["fail", "zero"]),
)
def test_property_misbehaving_batched_scorer(behaviours, count_delta, raises, policy):
    values = [v for _, v in behaviours]
    n = len(values)

    def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
        assert len(solution_strs) == n
        if raises:
            raise OSError("sandbox unreachable")
        return (values + [0.0] * max(count_delta, 0))[: n + count_delta]

    manager = BatchRewardManager(DigitTokenizer(), compute_score=compute_score, error_policy=policy)
    bad = [i for i, (ok, _) in enumerate(behaviours) if not ok]
    try:
        out = manager(make_batch(n), return_dict=True)
    except RewardBatchError as error:
        assert "compute_score" in str(error) and f"batch of {n}" in str(error)
        assert (raises and policy == "fail") or (not raises and count_delta != 0)
        return
    except RewardFunctionError as error:
        assert policy == "fail" and not raises and count_delta == 0 and bad
        assert f"for sample {bad[0]} " in str(error)
        return
    assert policy == "zero" or (not raises and count_delta == 0 and not bad)
    assert count_delta == 0 or raises
    flags = out["reward_extra_info"].get(REWARD_ERROR_KEY, [False] * n)
    assert [i for i, flag in enumerate(flags) if flag] == (list(range(n)) if raises else bad)
    assert torch.isfinite(out["reward_tensor"]).all()


# ============================================================================ non-finite gradients


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_non_finite_gradient_skips_the_step(poison):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(1, 3)).sum() * poison
    loss.backward()
    grad_norm, stepped = clip_and_step(model, optimizer, grad_clip=1.0)
    assert not stepped and not math.isfinite(grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    model(torch.ones(1, 3)).sum().backward()  # the next finite step is taken
    assert clip_and_step(model, optimizer, grad_clip=1.0)[1]


# ============================================================================ out of memory


class _Worker:
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "actor": {"ppo_micro_batch_size_per_gpu": 8},
                "model": {"enable_gradient_checkpointing": False},
            },
            "data": {"max_response_length": 512},
        }
    )

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @explain_oom(*ACTOR_UPDATE_KNOBS)
    def update_actor(self, data: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore"), MemoryError()]
)
def test_oom_names_the_knobs(error):
    with pytest.raises(type(error)) as info:
        _Worker(error).update_actor(None)
    message = str(info.value)
    assert message.startswith("_Worker.update_actor ran out of memory. To fit: ")
    assert "lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now 8)" in message
    assert "set actor_rollout_ref.model.enable_gradient_checkpointing=true" in message
    assert "lower data.max_response_length (now 512)" in message
    assert "\n" not in message  # the one line a WorkerError keeps
    assert info.value.__cause__ is error


def test_oom_other_errors_pass_through_and_knobs_already_set_are_left_out():
    with pytest.raises(ValueError, match="^plain$"):
        _Worker(ValueError("plain")).update_actor(None)
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"enable_gradient_checkpointing": True}}})
    message = oom_message("w", MemoryError(), ACTOR_UPDATE_KNOBS, config)
    assert "gradient_checkpointing" not in message  # already on
    # Settings the config does not hold are named without a value.
    assert (
        "To fit: lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu; lower "
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu; lower actor_rollout_ref.model.log_prob_chunk_size; "
        "lower data.max_response_length." in message
    )


def test_role_methods_keep_their_dispatch_and_explain_oom():
    from verl.workers.roles import ActorRolloutRefWorker, CriticWorker

    methods = {**registered_methods(ActorRolloutRefWorker), **registered_methods(CriticWorker)}
    for name in (
        "generate_sequences",
        "compute_log_prob",
        "compute_ref_log_prob",
        "update_actor",
        "compute_values",
        "update_critic",
    ):
        assert name in methods
        owner = ActorRolloutRefWorker if hasattr(ActorRolloutRefWorker, name) else CriticWorker
        assert getattr(owner, name).__code__.co_filename.endswith("errors.py"), name
