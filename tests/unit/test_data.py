"""Tests for verl.data: arithmetic task, file reading, RL/SFT datasets, collation and sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from verl.data import (
    TASKS,
    DatasetError,
    EpochSampler,
    RLDataset,
    SFTDataset,
    collate_rl,
    collate_sft,
    iterate_batches,
    make_arithmetic_rows,
    read_files,
    read_rows,
    write_arithmetic_dataset,
    write_rows,
)
from verl.models.loading import load_tokenizer
from verl.models.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(make_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def arith_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    return write_arithmetic_dataset(out, max_operand=6, holdout_frac=0.3, seed=1)


def chatml(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- arithmetic task


def test_arithmetic_split_sizes_and_symmetry():
    train, test = make_arithmetic_rows(max_operand=12, holdout_frac=0.2, seed=0)
    assert len(train) + len(test) == 13**2
    assert 0 < len(test) < len(train)
    side = {}
    for split, rows in (("train", train), ("test", test)):
        for r in rows:
            side[(r["extra_info"]["a"], r["extra_info"]["b"])] = split
    assert len(side) == 13**2
    for (a, b), s in side.items():
        assert side[(b, a)] == s
    train_q = {r["extra_info"]["question"] for r in train}
    test_q = {r["extra_info"]["question"] for r in test}
    assert not train_q & test_q


def test_arithmetic_deterministic_and_seeded():
    assert make_arithmetic_rows(max_operand=8, seed=3) == make_arithmetic_rows(max_operand=8, seed=3)
    assert make_arithmetic_rows(max_operand=8, seed=3)[1] != make_arithmetic_rows(max_operand=8, seed=4)[1]
    # Growing max_operand never moves an existing pair across the split.
    small_test = {r["extra_info"]["question"] for r in make_arithmetic_rows(max_operand=5)[1]}
    big_test = {r["extra_info"]["question"] for r in make_arithmetic_rows(max_operand=9)[1]}
    assert small_test <= big_test


def test_arithmetic_row_schema():
    train, test = make_arithmetic_rows(max_operand=4, seed=0)
    row = next(r for r in train + test if (r["extra_info"]["a"], r["extra_info"]["b"]) == (3, 4))
    split = row["extra_info"]["split"]
    assert row == {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": "3+4="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {
            "split": split,
            "index": row["extra_info"]["index"],
            "a": 3,
            "b": 4,
            "answer": "7",
            "question": "3+4=",
        },
    }
    assert [r["extra_info"]["index"] for r in train] == list(range(len(train)))
    assert all(r["extra_info"]["split"] == "train" for r in train)
    assert all(r["extra_info"]["split"] == "test" for r in test)
    _, test_mul = make_arithmetic_rows(max_operand=4, op="*")
    assert all(
        r["reward_model"]["ground_truth"] == str(r["extra_info"]["a"] * r["extra_info"]["b"])
        for r in test_mul
    )


def test_write_task(tmp_path, arith_files):
    train_path, test_path = arith_files
    assert train_path.name == "train.parquet" and test_path.name == "test.parquet"
    train, test = make_arithmetic_rows(max_operand=6, holdout_frac=0.3, seed=1)
    assert read_rows(train_path) == train and read_rows(test_path) == test
    assert not [p for p in train_path.parent.iterdir() if p.name.startswith(".")]  # no temp files left

    assert "arithmetic" in TASKS


# ---------------------------------------------------------------- io


def test_parquet_and_jsonl_identical(tmp_path, arith_files, tokenizer):
    train_path, _ = arith_files
    rows = read_rows(train_path)
    jl = write_rows(tmp_path / "train.jsonl", rows)
    assert read_rows(jl) == rows
    a = RLDataset(str(train_path), tokenizer)
    b = RLDataset([jl], tokenizer)
    assert len(a) == len(b) == len(rows)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x.pop("input_ids"), y.pop("input_ids"))
        assert x == y
    # A .json file holding one JSON array also reads.
    arr = tmp_path / "rows.json"
    arr.write_text(json.dumps(rows[:3]))
    assert read_rows(arr) == rows[:3]


def test_read_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        read_rows(tmp_path / "nope.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n\n{"prompt": oops}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl.*line 3"):
        read_rows(bad)
    notobj = write_jsonl(tmp_path / "list.jsonl", [[1, 2]])
    with pytest.raises(DatasetError, match="line 1"):
        read_rows(notobj)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="corrupt.parquet"):
        read_rows(corrupt)
    other = tmp_path / "rows.csv"
    other.write_text("a,b\n")
    with pytest.raises(DatasetError, match="extension"):
        read_rows(other)


def test_read_files_provenance(tmp_path):
    p1 = write_jsonl(tmp_path / "a.jsonl", [{"x": 1}, {"x": 2}])
    p2 = write_jsonl(tmp_path / "b.jsonl", [{"x": 3}])
    assert read_files([p1, p2]) == [(str(p1), 0, {"x": 1}), (str(p1), 1, {"x": 2}), (str(p2), 0, {"x": 3})]


# ---------------------------------------------------------------- RL dataset


def test_chat_template_applied(tmp_path, tokenizer):
    p = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "prompt": [{"role": "user", "content": "12+30="}],
                "data_source": "arithmetic",
                "extra_info": {"k": 1},
            },
            {"prompt": "7+8=", "data_source": "arithmetic"},
        ],
    )
    ds = RLDataset(p, tokenizer)
    item = ds[0]
    assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
    assert tokenizer.decode(item["input_ids"]) == chatml("12+30=")
    assert item["raw_prompt"] == [{"role": "user", "content": "12+30="}]
    assert item["data_source"] == "arithmetic" and item["extra_info"] == {"k": 1} and item["index"] == 0
    assert "prompt" not in item
    # A plain string prompt is wrapped as one user message.
    assert tokenizer.decode(ds[1]["input_ids"]) == chatml("7+8=")
    assert ds[1]["raw_prompt"] == [{"role": "user", "content": "7+8="}]
    # No special tokens beyond the template: exactly one <|im_start|> per message + generation prompt.
    assert (ds[0]["input_ids"] == tokenizer.convert_tokens_to_ids("<|im_start|>")).sum() == 2


def _long_rows():
    long_q = " ".join(str(d) for d in range(10)) * 3  # digits tokenise one by one -> many tokens
    return [{"prompt": "1+1="}, {"prompt": "HEAD " + long_q + " TAIL"}]


def test_truncation_modes(tmp_path, tokenizer):
    p = write_jsonl(tmp_path / "long.jsonl", _long_rows())
    full = RLDataset(p, tokenizer, max_prompt_length=1000)
    full_ids = full[1]["input_ids"].tolist()
    limit = 20
    assert len(full_ids) > limit >= len(full[0]["input_ids"])

    with pytest.raises(DatasetError) as err:
        RLDataset(p, tokenizer, max_prompt_length=limit)
    msg = str(err.value)
    assert "long.jsonl" in msg and "row 1" in msg and str(len(full_ids)) in msg and str(limit) in msg
    assert "data.max_prompt_length" in msg and "data.truncation" in msg

    left = RLDataset(p, tokenizer, max_prompt_length=limit, truncation="left")
    assert left[1]["input_ids"].tolist() == full_ids[-limit:]
    assert tokenizer.decode(left[1]["input_ids"]).endswith("TAIL<|im_end|>\n<|im_start|>assistant\n")
    right = RLDataset(p, tokenizer, max_prompt_length=limit, truncation="right")
    assert right[1]["input_ids"].tolist() == full_ids[:limit]
    assert tokenizer.decode(right[1]["input_ids"]).startswith("<|im_start|>user\nHEAD")
    middle = RLDataset(p, tokenizer, max_prompt_length=limit, truncation="middle")
    assert middle[1]["input_ids"].tolist() == full_ids[:10] + full_ids[-10:]
    assert left[0]["input_ids"].tolist() == full[0]["input_ids"].tolist()  # short prompts untouched


def test_filter_overlong(tmp_path, tokenizer, caplog):
    p = write_jsonl(tmp_path / "long.jsonl", _long_rows())
    with caplog.at_level("WARNING"):
        ds = RLDataset(p, tokenizer, max_prompt_length=20, filter_overlong_prompts=True)
    assert len(ds) == 1 and ds[0]["raw_prompt"][0]["content"] == "1+1="
    assert "filtered 1 of 2" in caplog.text
    only_long = write_jsonl(tmp_path / "only_long.jsonl", _long_rows()[1:])
    with pytest.raises(DatasetError, match="only_long.jsonl"):
        RLDataset(only_long, tokenizer, max_prompt_length=20, filter_overlong_prompts=True)


def test_max_samples(arith_files, tokenizer):
    ds = RLDataset(arith_files[0], tokenizer, max_samples=5)
    assert len(ds) == 5


@pytest.mark.parametrize(
    ("row", "pattern"),
    [
        ({"question": "1+1="}, r"rows\.jsonl row 1: missing field 'prompt'"),
        ({"prompt": 42}, r"rows\.jsonl row 1: field 'prompt' must be"),
        ({"prompt": [{"role": "user", "content": 5}]}, r"rows\.jsonl row 1: field 'prompt\[0\]\.content'"),
        ({"prompt": ["hi"]}, r"rows\.jsonl row 1: field 'prompt\[0\]'"),
    ],
)
def test_row_errors_name_file_row_field(tmp_path, tokenizer, row, pattern):
    p = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "1+1="}, row])
    with pytest.raises(DatasetError, match=pattern):
        RLDataset(p, tokenizer)


def test_empty_dataset(tmp_path, tokenizer):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    with pytest.raises(DatasetError, match="empty.jsonl"):
        RLDataset(p, tokenizer)
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        RLDataset(tmp_path / "missing.parquet", tokenizer)


def test_collate_rl_left_padding_by_hand():
    items = [
        {
            "input_ids": torch.tensor([5, 6, 7]),
            "data_source": "a",
            "reward_model": {"ground_truth": "1"},
            "index": 0,
        },
        {
            "input_ids": torch.tensor([8]),
            "data_source": "b",
            "reward_model": {"ground_truth": "2"},
            "index": 1,
        },
    ]
    batch = collate_rl(items, pad_token_id=0)
    assert batch.batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch.non_tensor_batch["data_source"].tolist() == ["a", "b"]
    assert batch.non_tensor_batch["reward_model"][1] == {"ground_truth": "2"}
    assert batch.non_tensor_batch["index"].dtype == object

    fixed = collate_rl(items, pad_token_id=9, max_prompt_length=5)
    assert fixed.batch["input_ids"].tolist() == [[9, 9, 5, 6, 7], [9, 9, 9, 9, 8]]
    assert fixed.batch["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="max_prompt_length"):
        collate_rl(items, pad_token_id=0, max_prompt_length=2)


def test_collate_rl_from_dataset(arith_files, tokenizer):
    ds = RLDataset(arith_files[0], tokenizer)
    batch = collate_rl([ds[i] for i in range(4)], tokenizer.pad_token_id)
    assert len(batch) == 4
    # raw_prompt (a list of dicts) stays one object per row, not a 2-D array.
    assert batch.non_tensor_batch["raw_prompt"].shape == (4,)
    assert batch.non_tensor_batch["raw_prompt"][0] == ds[0]["raw_prompt"]
    mask = batch.batch["attention_mask"].bool()
    for i in range(4):
        assert batch.batch["input_ids"][i][mask[i]].tolist() == ds[i]["input_ids"].tolist()


# ---------------------------------------------------------------- sampler


def test_sampler_determinism_and_coverage():
    s1, s2 = EpochSampler(10, 3, seed=7), EpochSampler(10, 3, seed=7)
    e0 = list(s1)
    assert e0 == list(s2) and len(e0) == len(s1) == 3 and all(len(b) == 3 for b in e0)
    e1 = list(s1)
    assert e1 != e0 and s1.epoch == 2  # reshuffled each epoch
    assert EpochSampler(10, 3, seed=8).epoch_batches(0) != e0
    full = EpochSampler(10, 5, seed=7)
    for _ in range(3):
        assert sorted(i for b in full for i in b) == list(range(10))
    tail = list(EpochSampler(10, 3, drop_last=False, shuffle=False))
    assert tail == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    with pytest.raises(ValueError):
        EpochSampler(2, 3)


def test_sampler_resume_mid_epoch():
    ref = EpochSampler(20, 4, seed=3)
    expected = list(ref) + list(ref)
    s = EpochSampler(20, 4, seed=3)
    got = list(s)  # one iter() is one epoch: 5 batches
    it = iter(s)
    got += [next(it), next(it)]  # 2 batches into epoch 1
    state = s.state_dict()
    assert state == {"epoch": 1, "position": 2}
    resumed = EpochSampler(20, 4, seed=3)
    resumed.load_state_dict(state)
    assert got + list(resumed) == expected
    # A finished epoch reads as the start of the next one.
    done = EpochSampler(20, 4, seed=3)
    it = iter(done)
    for _ in range(5):
        next(it)
    assert done.state_dict() == {"epoch": 1, "position": 0}


def test_iterate_batches(arith_files, tokenizer):
    ds = RLDataset(arith_files[0], tokenizer)
    sampler = EpochSampler(len(ds), 4, seed=0)
    batches = list(iterate_batches(ds, sampler, lambda items: collate_rl(items, tokenizer.pad_token_id)))
    assert len(batches) == len(ds) // 4
    seen = [i for b in batches for i in b.non_tensor_batch["index"]]
    assert sorted(seen) == sorted(i for b in sampler.epoch_batches(0) for i in b)


# ---------------------------------------------------------------- SFT


def test_sft_loss_mask_covers_answer_and_eos(tmp_path, tokenizer):
    rows = [
        {"prompt": [{"role": "user", "content": "12+30="}], "reward_model": {"ground_truth": "42"}},
        {"prompt": "1+1=", "reward_model": {"ground_truth": 2}},
    ]
    p = write_jsonl(tmp_path / "sft.jsonl", rows)
    ds = SFTDataset(p, tokenizer)
    item = ds[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    target = tokenizer.encode("42", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert len(target) == 3  # digits one by one + eos
    assert [t for t, m in zip(ids, mask, strict=True) if m] == target
    assert mask == [0] * (len(ids) - 3) + [1, 1, 1]
    assert tokenizer.decode(ids) == chatml("12+30=") + "42<|im_end|>"
    assert (
        tokenizer.decode(
            [t for t, m in zip(ds[1]["input_ids"].tolist(), ds[1]["loss_mask"].tolist(), strict=True) if m]
        )
        == "2<|im_end|>"
    )

    batch = collate_sft([ds[0], ds[1]], pad_token_id=tokenizer.pad_token_id)
    n0, n1 = len(ds[0]["input_ids"]), len(ds[1]["input_ids"])
    assert batch["input_ids"].shape == (2, max(n0, n1))
    short = 1 if n1 < n0 else 0
    n_short = min(n0, n1)
    assert batch["attention_mask"][short].tolist() == [1] * n_short + [0] * (abs(n0 - n1))
    assert batch["input_ids"][short, n_short:].eq(tokenizer.pad_token_id).all()
    assert batch["loss_mask"][short, n_short:].eq(0).all()
    assert batch["position_ids"][short, :n_short].tolist() == list(range(n_short))


def test_sft_truncation_and_errors(tmp_path, tokenizer):
    p = write_jsonl(
        tmp_path / "sft.jsonl", [{"prompt": "1+1=", "reward_model": {"ground_truth": "123456789"}}]
    )
    full = SFTDataset(p, tokenizer, max_length=1000)[0]
    n = len(full["input_ids"])
    with pytest.raises(DatasetError, match=r"sft\.jsonl row 0.*data\.max_length"):
        SFTDataset(p, tokenizer, max_length=n - 3)
    right = SFTDataset(p, tokenizer, max_length=n - 3, truncation="right")[0]
    assert right["input_ids"].tolist() == full["input_ids"].tolist()[:-3]
    assert right["loss_mask"].tolist() == full["loss_mask"].tolist()[:-3]
    left = SFTDataset(p, tokenizer, max_length=n - 3, truncation="left")[0]
    assert left["input_ids"].tolist() == full["input_ids"].tolist()[3:]
    assert left["loss_mask"].sum() == full["loss_mask"].sum()  # the whole answer survives
    missing = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "1+1=", "reward_model": {}}])
    with pytest.raises(DatasetError, match=r"m\.jsonl row 0.*reward_model\.ground_truth"):
        SFTDataset(missing, tokenizer)
    custom = write_jsonl(tmp_path / "c.jsonl", [{"q": "hi", "out": {"text": "yo"}}])
    item = SFTDataset(custom, tokenizer, prompt_key="q", response_key="out.text")[0]
    assert tokenizer.decode(item["input_ids"][item["loss_mask"].bool()]) == "yo<|im_end|>"
