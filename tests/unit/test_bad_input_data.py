"""Bad input, handled, in the data pipeline: missing / unreadable / empty data files, malformed rows
(fail or counted skip under ``data.bad_rows``) and a tokenizer without a pad token.

The property test (hypothesis) feeds random malformed rows and holds the loader to one promise: a clear
error naming the file and row, or a counted skip, and never a bare crash.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _bad_input_helpers import FAST
from hypothesis import given
from hypothesis import strategies as st

from verl.data import BadRows, DatasetError, RLDataset, SFTDataset, read_files
from verl.models.loading import ensure_pad_token, load_tokenizer


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
    with pytest.raises(
        DatasetError, match=r"dir\.jsonl \(data\.train_files\): is a directory, not a dataset file"
    ):
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
        DatasetError, match=r"empty dataset file: no rows in .*empty\.jsonl \(data\.train_files\)"
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
