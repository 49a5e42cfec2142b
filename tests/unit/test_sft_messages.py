"""SFT on whole chats (``data.messages_key``), dotted ``data.prompt_key`` and ``data.apply_chat_template_kwargs``.

The loss masks are checked by decoding the tokens they select: every assistant message's content and the
end-of-turn token after it, nothing of the system / user turns or of the template's role headers.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from verl.config import ConfigError, SFTConfig, load_config
from verl.data import DatasetError, RLDataset, SFTDataset, write_rows
from verl.data import sft_dataset as sft_module
from verl.data.sft_dataset import render_conversation
from verl.models.loading import load_tokenizer

SYSTEM = {"role": "system", "content": "You are a calculator."}
CHAT = [
    SYSTEM,
    {"role": "user", "content": "12+30="},
    {"role": "assistant", "content": "42"},
    {"role": "user", "content": "and doubled?"},
    {"role": "assistant", "content": "the answer is 84"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def targets(tokenizer, ids, mask) -> list[str]:
    """The decoded runs of consecutive target tokens, one per assistant turn."""
    runs: list[list[int]] = []
    previous = 0
    for token, m in zip(ids, mask, strict=True):
        if m and not previous:
            runs.append([])
        if m:
            runs[-1].append(token)
        previous = m
    return [tokenizer.decode(run) for run in runs]


def item_targets(tokenizer, item) -> list[str]:
    return targets(tokenizer, item["input_ids"].tolist(), item["loss_mask"].tolist())


# ------------------------------------------------------------------------------------------------ loss masks
def test_one_assistant_turn_exact_mask(tmp_path, tokenizer):
    chat = CHAT[:3]
    p = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat}])
    item = SFTDataset(p, tokenizer, messages_key="messages", max_length=1000)[0]
    ids, mask = item["input_ids"].tolist(), item["loss_mask"].tolist()
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou are a calculator.<|im_end|>")
    # Exactly the answer and its end-of-turn token: not the system / user turns, not the role header, not
    # the newline the template writes between turns.
    target = tokenizer.encode("42", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == target
    assert mask == [0] * (len(ids) - len(target) - 1) + [1] * len(target) + [0]
    assert tokenizer.decode(ids[-1:]) == "\n"
    header = tokenizer.decode(ids[: mask.index(1)])
    assert header.endswith("<|im_start|>assistant\n") and "42" not in header


def test_every_assistant_turn_is_a_target(tmp_path, tokenizer):
    p = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, {"messages": CHAT[1:]}])
    ds = SFTDataset(p, tokenizer, messages_key="messages", max_length=1000)
    for item in (ds[0], ds[1]):
        assert item_targets(tokenizer, item) == ["42<|im_end|>", "the answer is 84<|im_end|>"]
        decoded = tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])
        for text in ("calculator", "12+30", "doubled", "system", "user", "assistant"):
            assert text not in decoded


def test_a_chat_ending_with_a_user_turn_trains_the_assistant_turns_before_it(tokenizer):
    ids, mask = render_conversation(tokenizer, CHAT[:4], "x row 0")
    assert targets(tokenizer, ids, mask) == ["42<|im_end|>"]
    assert tokenizer.decode(ids).endswith("and doubled?<|im_end|>\n")


def test_numpy_array_messages(tokenizer, tmp_path, monkeypatch):
    """Parquet read through pandas / datasets gives arrays of dicts (and arrays inside them)."""
    as_array = np.empty(len(CHAT), dtype=object)
    for i, m in enumerate(CHAT):
        as_array[i] = dict(m)
    ids, mask = render_conversation(tokenizer, as_array, "x row 0")
    assert (ids, mask) == render_conversation(tokenizer, CHAT, "x row 0")

    path = write_rows(tmp_path / "chat.parquet", [{"messages": CHAT}])
    real = sft_module.read_files

    def arrays(*args, **kwargs):
        return [(p, i, {**row, "messages": as_array}) for p, i, row in real(*args, **kwargs)]

    monkeypatch.setattr(sft_module, "read_files", arrays)
    item = SFTDataset(path, tokenizer, messages_key="messages", max_length=1000)[0]
    assert item["input_ids"].tolist() == ids and item["loss_mask"].tolist() == mask


def test_messages_from_parquet_and_json_text(tmp_path, tokenizer):
    path = write_rows(tmp_path / "chat.parquet", [{"conversation": CHAT}, {"conversation": CHAT[1:3]}])
    ds = SFTDataset(path, tokenizer, messages_key="conversation", max_length=1000)
    assert item_targets(tokenizer, ds[1]) == ["42<|im_end|>"]
    text = write_jsonl(tmp_path / "text.jsonl", [{"messages": json.dumps(CHAT)}])
    assert item_targets(
        tokenizer, SFTDataset(text, tokenizer, messages_key="messages", max_length=1000)[0]
    ) == [
        "42<|im_end|>",
        "the answer is 84<|im_end|>",
    ]


# ------------------------------------------------------------------------------------------------ bad rows
def test_chat_without_assistant_turn_is_a_bad_row(tmp_path, tokenizer):
    rows = [{"messages": CHAT}, {"messages": [SYSTEM, {"role": "user", "content": "hi"}]}]
    p = write_jsonl(tmp_path / "chats.jsonl", rows)
    with pytest.raises(DatasetError, match=r"chats\.jsonl row 1: field 'messages'.*no assistant message"):
        SFTDataset(p, tokenizer, messages_key="messages", max_length=1000)
    ds = SFTDataset(p, tokenizer, messages_key="messages", max_length=1000, bad_rows="skip")
    assert len(ds) == 1 and ds.num_skipped_rows == 1
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"messages": "just a prompt"}])
    with pytest.raises(DatasetError, match=r"plain\.jsonl row 0.*no assistant message"):
        SFTDataset(plain, tokenizer, messages_key="messages")


def test_malformed_and_missing_messages(tmp_path, tokenizer):
    p = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"other": 1}, {"messages": [{"role": "user"}]}, {"messages": [{"role": "assistant", "content": 3}]}],
    )
    with pytest.raises(
        DatasetError, match=r"bad\.jsonl row 0: missing field 'messages' \(data\.messages_key\)"
    ):
        SFTDataset(p, tokenizer, messages_key="messages")
    with pytest.raises(DatasetError, match=r"empty dataset \(3 skipped as bad rows\)"):
        SFTDataset(p, tokenizer, messages_key="messages", bad_rows="skip")
    wrong_column = write_rows(tmp_path / "w.parquet", [{"prompt": "x"}])
    with pytest.raises(DatasetError, match=r"no column 'messages' \(data\.messages_key=messages\)"):
        SFTDataset(wrong_column, tokenizer, messages_key="messages")


def test_template_that_does_not_render_incrementally(tmp_path, tokenizer):
    """A template that rewrites earlier assistant turns (as reasoning templates drop past thoughts)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier answer){% else %}{{ m['content'] }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    p = write_jsonl(tmp_path / "multi.jsonl", [{"messages": CHAT[1:3]}, {"messages": CHAT}])
    with pytest.raises(
        DatasetError, match=r"multi\.jsonl row 1: the chat template does not render .*incrementally"
    ):
        SFTDataset(p, tok, messages_key="messages", max_length=1000)
    ds = SFTDataset(p, tok, messages_key="messages", max_length=1000, bad_rows="skip")
    assert len(ds) == 1 and item_targets(tok, ds[0]) == ["42<|im_end|>"]


def test_chat_truncation(tmp_path, tokenizer):
    p = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    full = SFTDataset(p, tokenizer, messages_key="messages", max_length=1000)[0]
    n = len(full["input_ids"])
    with pytest.raises(DatasetError, match=r"chat\.jsonl row 0: the chat is \d+ tokens.*data\.max_length"):
        SFTDataset(p, tokenizer, messages_key="messages", max_length=n - 5)
    left = SFTDataset(p, tokenizer, messages_key="messages", max_length=n - 5, truncation="left")[0]
    assert left["input_ids"].tolist() == full["input_ids"].tolist()[5:]
    assert item_targets(tokenizer, left)[-1] == "the answer is 84<|im_end|>"
    right = SFTDataset(p, tokenizer, messages_key="messages", max_length=n - 5, truncation="right")[0]
    assert right["loss_mask"].tolist() == full["loss_mask"].tolist()[:-5]


# ------------------------------------------------------------------------------------------------ prompt_key
def test_dotted_prompt_key(tmp_path, tokenizer):
    rows = [{"extra_info": {"question": "1+1="}, "reward_model": {"ground_truth": "2"}}]
    expected = SFTDataset(
        write_jsonl(tmp_path / "flat.jsonl", [{"prompt": "1+1=", "reward_model": {"ground_truth": "2"}}]),
        tokenizer,
    )[0]
    for path in (write_jsonl(tmp_path / "n.jsonl", rows), write_rows(tmp_path / "n.parquet", rows)):
        item = SFTDataset(path, tokenizer, prompt_key="extra_info.question")[0]
        assert item["input_ids"].tolist() == expected["input_ids"].tolist()
        assert item["loss_mask"].tolist() == expected["loss_mask"].tolist()
    missing = write_jsonl(tmp_path / "m.jsonl", [{"extra_info": {}, "reward_model": {"ground_truth": "2"}}])
    with pytest.raises(
        DatasetError, match=r"m\.jsonl row 0: missing field 'extra_info\.question' \(data\.prompt_key\)"
    ):
        SFTDataset(missing, tokenizer, prompt_key="extra_info.question")
    no_column = write_rows(
        tmp_path / "x.parquet", [{"prompt": "1+1=", "reward_model": {"ground_truth": "2"}}]
    )
    with pytest.raises(
        DatasetError, match=r"no column 'extra_info' \(data\.prompt_key=extra_info\.question\)"
    ):
        SFTDataset(no_column, tokenizer, prompt_key="extra_info.question")


# ------------------------------------------------------------------------------------------------ template kwargs
@pytest.fixture(scope="module")
def kwarg_tokenizer(tokenizer):
    """ChatML whose assistant header says whether ``enable_thinking`` was passed as false (as Qwen3's
    template opens each assistant turn with an empty think block then)."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% set off = enable_thinking is defined and not enable_thinking %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and off %}nothink {% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% if off %}nothink {% endif %}{% endif %}"
    )
    return tok


def test_chat_template_kwargs_reach_the_template(tmp_path, kwarg_tokenizer):
    tok = kwarg_tokenizer
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "reward_model": {"ground_truth": "2"}}])
    plain = tok.decode(SFTDataset(p, tok)[0]["input_ids"])
    off = tok.decode(SFTDataset(p, tok, chat_template_kwargs={"enable_thinking": False})[0]["input_ids"])
    assert "nothink" not in plain
    assert off == plain.replace("assistant\n", "assistant\nnothink ")
    ignored = SFTDataset(p, tok, chat_template_kwargs={"unused_flag": 1})[0]  # jinja ignores it
    assert tok.decode(ignored["input_ids"]) == plain

    rl = RLDataset(p, tok, chat_template_kwargs={"enable_thinking": False})[0]
    assert tok.decode(rl["input_ids"]).endswith("<|im_start|>assistant\nnothink ")

    # In a chat the generation prompt is the header of each assistant turn: not a target.
    ids, mask = render_conversation(
        tok, CHAT[1:3], "x row 0", chat_template_kwargs={"enable_thinking": False}
    )
    assert "assistant\nnothink 42" in tok.decode(ids)
    assert targets(tok, ids, mask) == ["42<|im_end|>"]


def test_a_rows_tools_and_enable_thinking_reach_the_template(tmp_path, kwarg_tokenizer):
    """verl's multi-turn rows carry their tool schemas and their own enable_thinking (data.tools_key,
    data.enable_thinking_key): the template sees them, row by row."""
    tok = copy.deepcopy(kwarg_tokenizer)
    tok.chat_template = (
        "{% if tools %}<|im_start|>system\ntools: {{ tools | length }}<|im_end|>\n{% endif %}"
        + (tok.chat_template)
    )
    rows = [
        {"messages": CHAT[1:3], "tools": [{"name": "calc"}, {"name": "web"}], "enable_thinking": False},
        {"messages": CHAT[1:3]},
    ]
    data = SFTDataset(write_jsonl(tmp_path / "c.jsonl", rows), tok, messages_key="messages")
    first, second = (tok.decode(data[i]["input_ids"]) for i in range(2))
    assert first.startswith("<|im_start|>system\ntools: 2") and "assistant\nnothink 42" in first
    assert "tools:" not in second and "nothink" not in second
    assert item_targets(tok, data[0]) == ["42<|im_end|>"]
    off = SFTDataset(write_jsonl(tmp_path / "c.jsonl", rows), tok, messages_key="messages", tools_key=None)
    assert "tools:" not in tok.decode(off[0]["input_ids"])


# ------------------------------------------------------------------------------------------------ config
def test_config_keys(tmp_path):
    cfg = load_config(
        schema=SFTConfig,
        overrides=[
            "data.messages_key=messages",
            "data.prompt_key=extra_info.question",
            "data.apply_chat_template_kwargs={enable_thinking: false}",
            "model.lora_rank=8",
            "model.target_modules=[q_proj,v_proj]",
        ],
        check=False,
    )
    assert cfg.data.messages_key == "messages"
    assert dict(cfg.data.apply_chat_template_kwargs) == {"enable_thinking": False}
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.exclude_modules) == (8, 16, None)
    defaults = load_config(schema=SFTConfig, check=False)
    assert defaults.data.messages_key is None and defaults.model.lora_rank == 0
    assert defaults.model.target_modules == "all-linear"
    rl = load_config(overrides=["data.apply_chat_template_kwargs={enable_thinking: false}"], check=False)
    assert dict(rl.data.apply_chat_template_kwargs) == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora_rank=-1", r"model\.lora_rank must be >= 0"),
        ("model.lora_alpha=0", r"model\.lora_alpha must be > 0"),
        ("model.target_modules=[]", r"model\.target_modules must be a module name"),
        ("data.messages_key=''", r"data\.messages_key must name the column"),
        (
            "data.apply_chat_template_kwargs={tokenize: true}",
            r"data\.apply_chat_template_kwargs may not set tokenize",
        ),
    ],
)
def test_sft_config_errors(override, message, tmp_path):
    base = [f"model.path={tmp_path}", f"data.train_files={tmp_path / 'x.parquet'}"]
    with pytest.raises(ConfigError, match=message) as info:
        load_config(schema=SFTConfig, overrides=[*base, override])
    assert "actor_rollout_ref" not in str(info.value)


def test_rl_chat_template_kwargs_check():
    with pytest.raises(
        ConfigError, match=r"data\.apply_chat_template_kwargs may not set add_generation_prompt"
    ):
        load_config(overrides=["data.apply_chat_template_kwargs={add_generation_prompt: false}"])
