"""Hostile-user inputs: every mistake in a data file, a model directory or a length is one InputError /
ConfigError naming the config key, the path and what to do, found before anything expensive, and nothing
is ever created at a path the user gave."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.config import ConfigError, load_config
from verl.data import RLDataset, SFTDataset, read_files, write_rows
from verl.data.io import DataFileNotFoundError, check_data_files, missing_path_hint
from verl.data.rl_dataset import messages_from_json_text, normalize_messages
from verl.errors import InputError
from verl.models.loading import (
    check_fits_model,
    check_model_dir,
    ensure_pad_token,
    load_hf_model,
    load_tokenizer,
    load_value_model,
    resolve_dtype,
    tokenizer_for,
)
from verl.trainer.prepare import _sft_config, check_inputs, plan_inputs
from verl.trainer.sft_trainer import check_sft_inputs

MESSAGES_TEXT = '[{"role": "user", "content": "1+1?"}]'


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def row(prompt, answer: str = "2") -> dict:
    return {"prompt": prompt, "data_source": "arithmetic", "reward_model": {"ground_truth": answer}}


def rows(n: int, start: int = 0) -> list[dict]:
    return [row(f"{i}+1=", str(i + 1)) for i in range(start, start + n)]


def model_copy(src: Path, dst: Path, names: tuple[str, ...]) -> Path:
    dst.mkdir(parents=True)
    for name in names:
        shutil.copy(src / name, dst / name)
    return dst


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# ============================================================================ 1. missing data files


def test_missing_data_file_names_key_path_and_nearest_file(tmp_path, tokenizer):
    data = tmp_path / "data"
    write_rows(data / "train.parquet", rows(3))
    write_rows(data / "test.parquet", rows(2))
    before = tree(tmp_path)

    # A typo in the file name: the nearest existing file.
    with pytest.raises(InputError, match=r"data/trian\.parquet \(data\.train_files\) does not exist; did you mean .*data/train\.parquet\?") as info:  # fmt: skip
        RLDataset(data / "trian.parquet", tokenizer, files_key="data.train_files")
    assert isinstance(info.value, FileNotFoundError) and info.value.exit_code == 3
    # A typo in a directory name: fixed too.
    with pytest.raises(InputError, match=r"did you mean .*/data/test\.parquet\?"):
        check_data_files(
            [str(data / "train.parquet"), str(tmp_path / "dta" / "test.parquet")], "data.val_files"
        )
    # Nothing alike: what the directory holds.
    with pytest.raises(InputError, match=r"nope\.parquet \(data\.val_files\) does not exist; .*data holds test\.parquet, train\.parquet"):  # fmt: skip
        read_files(data / "nope.parquet", key="data.val_files")
    # A directory that does not exist.
    with pytest.raises(DataFileNotFoundError, match=r"the directory .*/x does not exist"):
        check_data_files(tmp_path / "x" / "y" / "nope.parquet", "data.train_files")
    assert tree(tmp_path) == before  # nothing was created at (or next to) a path the user gave


def test_missing_file_hint_is_not_made_up():
    # ".parquet" in common is no resemblance: nope.parquet is not "nearly" train.parquet.
    assert "did you mean" not in missing_path_hint("/nonexistent-root-dir/nope.parquet")
    assert (
        missing_path_hint("/nonexistent-root-dir/a.parquet")
        == "; the directory /nonexistent-root-dir does not exist"
    )


def test_comma_joined_paths_suggest_a_list(tmp_path):
    a, b = write_rows(tmp_path / "a.parquet", rows(2)), write_rows(tmp_path / "b.parquet", rows(2))
    with pytest.raises(InputError, match=r"to give several files, write a list: data\.train_files=\[.*a\.parquet,.*b\.parquet\]"):  # fmt: skip
        check_data_files(f"{a},{b}", "data.train_files")


# ============================================================================ 2. malformed data files


def test_directory_instead_of_a_file_lists_its_files(tmp_path, tokenizer):
    write_rows(tmp_path / "d" / "part-0.parquet", rows(2))
    with pytest.raises(InputError, match=r"d \(data\.train_files\): is a directory, not a dataset file; give the files in it, as a list for several: data\.train_files=\[.*part-0\.parquet\]"):  # fmt: skip
        RLDataset(tmp_path / "d", tokenizer, files_key="data.train_files")
    # A directory without an extension is not called an unsupported extension.
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match=r"empty_dir \(data\.val_files\): is a directory, not a dataset file, and holds no"):  # fmt: skip
        check_data_files(tmp_path / "empty_dir", "data.val_files")


def test_unsupported_extension_names_file_and_key(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\n1+1=\n")
    with pytest.raises(InputError, match=r"train\.csv \(data\.train_files\): unsupported dataset file extension '\.csv'"):  # fmt: skip
        read_files(csv, key="data.train_files")


def test_empty_files_fail_naming_the_file(tmp_path, tokenizer):
    good = write_rows(tmp_path / "good.parquet", rows(3))
    no_rows = tmp_path / "no_rows.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), no_rows)
    # An empty file among good ones used to vanish silently.
    with pytest.raises(InputError, match=r"empty dataset file: no rows in .*no_rows\.parquet \(data\.train_files\)"):  # fmt: skip
        RLDataset([good, no_rows], tokenizer, files_key="data.train_files")
    zero_bytes = tmp_path / "zero.parquet"
    zero_bytes.write_bytes(b"")
    with pytest.raises(InputError, match=r"zero\.parquet \(data\.train_files\): cannot read parquet file"):
        RLDataset([good, zero_bytes], tokenizer, files_key="data.train_files")
    empty_jsonl = tmp_path / "empty.jsonl"
    empty_jsonl.write_text("\n\n")
    with pytest.raises(
        InputError, match=r"empty dataset file: no rows in .*empty\.jsonl \(data\.train_files\)"
    ):
        SFTDataset([good, empty_jsonl], tokenizer, files_key="data.train_files")


def test_corrupt_parquet_and_bad_json_line_name_file_and_row(tmp_path, tokenizer):
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 but not really")
    with pytest.raises(InputError, match=r"corrupt\.parquet \(data\.train_files\): cannot read parquet file"):
        RLDataset(corrupt, tokenizer, files_key="data.train_files")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row("1+1=")) + "\n{oops\n")
    with pytest.raises(InputError, match=r"bad\.jsonl: malformed JSON on line 2 \(row 1\)"):
        RLDataset(bad, tokenizer)


def test_parquet_without_the_prompt_column_fails_as_a_file(tmp_path, tokenizer):
    path = write_rows(tmp_path / "qa.parquet", [{"question": "1+1=", "answer": "2"}] * 3)
    pattern = r"qa\.parquet \(data\.train_files\): no column 'prompt' \(data\.prompt_key=prompt\); its columns are \['question', 'answer'\]: set data\.prompt_key"  # fmt: skip
    # Even under data.bad_rows=skip: a missing column is the wrong file or key, not a few bad rows.
    for policy in ("fail", "skip"):
        with pytest.raises(InputError, match=pattern):
            RLDataset(path, tokenizer, bad_rows=policy, files_key="data.train_files")
    with pytest.raises(InputError, match=r"no column 'reward_model' \(data\.response_key=reward_model\.ground_truth\)"):  # fmt: skip
        SFTDataset(path, tokenizer, prompt_key="question", files_key="data.train_files")
    assert len(SFTDataset(path, tokenizer, prompt_key="question", response_key="answer")) == 3


# ============================================================================ 3. several files


def test_several_files_read_in_order_with_their_provenance(tmp_path, tokenizer):
    a = write_rows(tmp_path / "a.parquet", rows(3))
    b = write_rows(tmp_path / "b.jsonl", rows(2, start=3))
    ds = RLDataset([str(a), str(b)], tokenizer, files_key="data.train_files")
    assert len(ds) == 5 and [s for s in ds.sources] == [
        (str(a), 0),
        (str(a), 1),
        (str(a), 2),
        (str(b), 0),
        (str(b), 1),
    ]
    config = load_config("grpo", [f"data.train_files=[{a},{b}]", f"data.val_files=[{b}]"])
    check_inputs(config)  # a list is checked file by file
    sft = SFTDataset(config.data.train_files, tokenizer, files_key="data.train_files")
    assert len(sft) == 5


def test_warm_start_on_several_files_keys_and_quotes_each(tmp_path):
    a = write_rows(tmp_path / "a.parquet", rows(3))
    b = write_rows(tmp_path / "b.parquet", rows(2, start=3))
    overrides = [f"prepare.cache_dir={tmp_path / 'cache'}"]
    both = plan_inputs(load_config("grpo", [*overrides, f"data.train_files=[{a},{b}]"])).sft_model
    only_a = plan_inputs(load_config("grpo", [*overrides, f"data.train_files=[{a}]"])).sft_model
    assert both is not None and both.key != only_a.key  # the warm start hashes every file
    odd = [str(tmp_path / "my data" / "it's: [x].parquet"), str(b)]
    sft = _sft_config(load_config(None, overrides), tmp_path / "in it", odd, tmp_path / "o u t")
    assert list(sft.data.train_files) == odd and sft.model.path == str(tmp_path / "in it")
    # A missing one of them is named, not a FileNotFoundError traceback from hashing.
    with pytest.raises(InputError, match=r"nope\.parquet \(data\.train_files\) does not exist"):
        plan_inputs(load_config("grpo", [*overrides, f"data.train_files=[{a},{tmp_path / 'nope.parquet'}]"]))
    assert not (tmp_path / "cache").exists()


def test_a_given_val_files_is_not_replaced_by_the_task(tmp_path):
    mine = write_rows(tmp_path / "mine.parquet", rows(2))
    plan = plan_inputs(load_config("grpo", [f"prepare.cache_dir={tmp_path}", f"data.val_files={mine}"]))
    updates = plan.updates()
    assert "data.train_files" in updates and "data.val_files" not in updates
    assert "data.val_files" in plan_inputs(load_config(None, [f"prepare.cache_dir={tmp_path}"])).updates()


# ============================================================================ 4. messages as JSON text


def test_prompt_holding_messages_as_json_text_is_decoded(tmp_path, tokenizer, caplog):
    path = tmp_path / "json_text.parquet"
    pq.write_table(pa.Table.from_pylist([row(MESSAGES_TEXT), row(MESSAGES_TEXT), row("3+4=", "7")]), path)
    with caplog.at_level(logging.INFO, logger="verl.data"):
        ds = RLDataset(path, tokenizer)
    assert ds[0]["raw_prompt"] == [{"role": "user", "content": "1+1?"}]
    assert ds.prompt_ids[0] == tokenizer.encode(
        tokenizer.apply_chat_template(ds[0]["raw_prompt"], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    assert ds[2]["raw_prompt"] == [{"role": "user", "content": "3+4="}]
    decoded = [r for r in caplog.records if "JSON text" in r.getMessage()]
    assert (
        len(decoded) == 1 and decoded[0].levelno == logging.INFO and "2 of 3 rows" in decoded[0].getMessage()
    )
    sft = SFTDataset(path, tokenizer)
    plain = SFTDataset(write_rows(tmp_path / "plain.jsonl", [row("1+1?")]), tokenizer)
    assert sft.input_ids[0] == plain.input_ids[0]


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        "[not json",
        "[]",
        '[{"role": "user"}]',
        '[{"a": 1}]',
        '["x"]',
        "[x] + [y]",
        '{"role": "user"}',
    ],
)
def test_text_that_is_not_a_messages_list_stays_text(text):
    assert messages_from_json_text(text) is None
    assert normalize_messages(text, "f row 0") == [{"role": "user", "content": text}]


def test_decoded_messages_are_still_validated(tmp_path, tokenizer):
    path = write_rows(tmp_path / "bad.jsonl", [row("1+1="), row('[{"role": "user", "content": 7}]')])
    with pytest.raises(InputError, match=r"bad\.jsonl row 1: field 'prompt\[0\]\.content' must be a string"):
        RLDataset(path, tokenizer)


# ============================================================================ 5. model directories


def test_model_dir_problems_name_key_path_and_what_is_missing(tmp_path, tiny_model_dir):
    key = "actor_rollout_ref.model.path"
    models = tmp_path / "models"
    good = model_copy(tiny_model_dir, models / "qwen-tiny", tuple(p.name for p in tiny_model_dir.iterdir()))
    no_tok = model_copy(tiny_model_dir, models / "no-tok", ("config.json", "model.safetensors"))
    only_tok = model_copy(tiny_model_dir, models / "only-tok", ("tokenizer.json", "tokenizer_config.json"))
    (models / "empty").mkdir()
    broken = model_copy(tiny_model_dir, models / "broken", ("tokenizer.json",))
    (broken / "config.json").write_text("{not json")
    before = tree(tmp_path)

    assert check_model_dir(good, key, need_tokenizer=True) == str(good)
    with pytest.raises(InputError, match=r"models/qwen-tiyn: the model directory does not exist; did you mean .*models/qwen-tiny\?") as info:  # fmt: skip
        check_model_dir(models / "qwen-tiyn", key)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(InputError, match=r"=.*/nowhere/model: the model directory does not exist; the directory .*/nowhere does not exist"):  # fmt: skip
        check_model_dir(tmp_path / "nowhere" / "model", key)
    with pytest.raises(InputError, match=rf"{key}=.*empty: the directory is empty: not a Hugging Face model directory"):  # fmt: skip
        check_model_dir(models / "empty", key)
    with pytest.raises(InputError, match=r"only-tok: no config\.json: not a Hugging Face model directory; it holds tokenizer\.json"):  # fmt: skip
        check_model_dir(only_tok, key)
    with pytest.raises(InputError, match=r"no config\.json: not a Hugging Face model directory; model directories under it: "):  # fmt: skip
        check_model_dir(models, key)
    with pytest.raises(InputError, match=r"no-tok: no tokenizer files \(tokenizer\.json / tokenizer_config\.json\): set actor_rollout_ref\.model\.tokenizer_path"):  # fmt: skip
        check_model_dir(
            no_tok, key, need_tokenizer=True, tokenizer_key="actor_rollout_ref.model.tokenizer_path"
        )
    with pytest.raises(
        InputError, match=r"config\.json: is a file, not a model directory; give its directory"
    ):
        check_model_dir(good / "config.json", key)
    with pytest.raises(InputError, match=r"broken: config\.json is not readable JSON"):
        check_model_dir(broken, key)
    with pytest.raises(ConfigError, match=rf"{key} is not set"):
        check_model_dir("", key)
    # A hub id goes on to from_pretrained as it is.
    assert check_model_dir("Qwen/Qwen2.5-0.5B-Instruct", key) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert tree(tmp_path) == before  # nothing was created at (or next to) a path the user gave


def test_loaders_check_the_model_dir_before_transformers(tmp_path, tiny_model_dir):
    no_tok = model_copy(tiny_model_dir, tmp_path / "no-tok", ("config.json", "model.safetensors"))
    model_cfg = SimpleNamespace(path=str(no_tok), tokenizer_path=None, trust_remote_code=False)
    # Today's failure was a tokenizer built from nothing and an unrelated error later.
    with pytest.raises(InputError, match=r"actor_rollout_ref\.model\.path=.*no-tok: no tokenizer files .*set actor_rollout_ref\.model\.tokenizer_path"):  # fmt: skip
        tokenizer_for(model_cfg)
    with pytest.raises(
        InputError, match=r"^model\.path=.*no-tok: no tokenizer files .*set model\.tokenizer_path"
    ):
        tokenizer_for(model_cfg, "model")
    # With the tokenizer elsewhere, the model directory needs no tokenizer files.
    model_cfg.tokenizer_path = str(tiny_model_dir)
    assert tokenizer_for(model_cfg).pad_token_id is not None
    model_cfg.tokenizer_path = str(no_tok)
    with pytest.raises(
        InputError, match=r"actor_rollout_ref\.model\.tokenizer_path=.*no-tok: no tokenizer files"
    ):
        tokenizer_for(model_cfg)
    with pytest.raises(InputError, match=r"critic\.model\.path=.*nope: the model directory does not exist"):
        load_value_model(tmp_path / "nope", key="critic.model.path")
    with pytest.raises(InputError, match=r"model\.path=.*: the directory is empty"):
        (tmp_path / "empty").mkdir()
        load_hf_model(tmp_path / "empty", key="model.path")
    # config.json but no weights: transformers' OSError, named.
    no_weights = model_copy(tiny_model_dir, tmp_path / "no-weights", ("config.json", "tokenizer.json"))
    with pytest.raises(InputError, match=r"model\.path=.*no-weights: cannot load the model \("):
        load_hf_model(no_weights, key="model.path")


def test_hub_id_that_cannot_be_downloaded_is_an_input_error(monkeypatch):
    import verl.models.loading as loading

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", offline)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(
        InputError, match=r"model\.tokenizer_path=org/name: neither a local directory nor downloadable"
    ):
        load_tokenizer("org/name", key="model.tokenizer_path")
    with pytest.raises(InputError, match=r"^org/tiny: neither a local directory nor downloadable"):
        load_hf_model("org/tiny")


# ============================================================================ 6. lengths vs the model


def test_sequence_longer_than_the_model_is_a_config_error(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    what = "data.max_prompt_length + data.max_response_length"
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 64}))
    check_fits_model(model, 64, what)
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length \+ data\.max_response_length = 100 tokens is longer than the model allows: max_position_embeddings = 64 in .*m/config\.json; lower data\.max_prompt_length / data\.max_response_length"):  # fmt: skip
        check_fits_model(model, 100, what)
    (model / "config.json").write_text(
        json.dumps({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    )
    check_fits_model(model, 256, what)
    (model / "config.json").write_text(json.dumps({"model_type": "mamba"}))  # no limit: nothing to check
    check_fits_model(model, 10**6, what)
    check_fits_model("org/name", 10**6, what)  # a hub id's config is not fetched for this


def test_check_inputs_refuses_lengths_the_model_cannot_hold(tiny_model_dir):
    config = load_config(
        "grpo", [f"actor_rollout_ref.model.path={tiny_model_dir}", "data.max_response_length=600"]
    )
    with pytest.raises(
        ConfigError, match=r"data\.max_prompt_length \+ data\.max_response_length = 632 tokens .* = 512"
    ):
        check_inputs(config)


# ============================================================================ 7. verl sft's own defaults


def test_sft_names_the_keys_it_needs(tmp_path, tiny_model_dir):
    train = write_rows(tmp_path / "train.parquet", rows(2))
    sft = SimpleNamespace(
        model=SimpleNamespace(path="", tokenizer_path=None, torch_dtype="float32"),
        data=SimpleNamespace(train_files=None, max_length=64),
    )
    with pytest.raises(
        ConfigError, match=r"^model\.path and data\.train_files not set: .*verl sft model\.path="
    ):
        check_sft_inputs(sft)
    sft.model.path = str(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"^data\.train_files not set"):
        check_sft_inputs(sft)
    sft.data.train_files = str(tmp_path / "trian.parquet")
    with pytest.raises(
        InputError, match=r"trian\.parquet \(data\.train_files\) does not exist; did you mean"
    ):
        check_sft_inputs(sft)
    sft.data.train_files = [str(train)]
    sft.data.max_length = 4096
    with pytest.raises(ConfigError, match=r"data\.max_length = 4096 tokens is longer than the model allows"):
        check_sft_inputs(sft)
    sft.data.max_length = 64
    check_sft_inputs(sft)


# ============================================================================ 8. tokenizer and dtype


def test_tokenizer_without_pad_or_eos_is_an_input_error():
    tok = SimpleNamespace(pad_token_id=None, eos_token=None)
    with pytest.raises(InputError, match=r"/models/x: the tokenizer has neither a pad nor an eos token"):
        ensure_pad_token(tok, "/models/x")


def test_unknown_dtype_names_its_key():
    with pytest.raises(ConfigError, match=r"critic\.model\.torch_dtype='fp8': unknown torch_dtype"):
        resolve_dtype("fp8", "critic.model.torch_dtype")


# ------------------------------------------------------------------------------ found by the misuse round
def test_a_misspelt_implementation_name_is_a_config_error_with_the_closest_name():
    from verl.algorithms import get_adv_estimator_fn

    with pytest.raises(ConfigError, match=r"'grpoo' \(registered: .*\); did you mean 'grpo'\?"):
        get_adv_estimator_fn("grpoo")


def test_names_and_the_reward_file_are_checked_before_anything_is_built(tmp_path):
    for override, message in [
        ("actor_rollout_ref.rollout.name=vlm", "unknown rollout engine"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=vanila", "did you mean 'vanilla'"),
        (f"custom_reward_function.path={tmp_path / 'nope.py'}", "custom_reward_function.path="),
    ]:
        with pytest.raises((ConfigError, InputError), match=message):
            check_inputs(load_config(None, [override]))


def test_a_logger_typo_names_the_closest_logger():
    with pytest.raises(
        ConfigError, match=r"trainer.logger must be one of .*got 'wandbb' \(did you mean 'wandb'\?\)"
    ):
        load_config(None, ["trainer.logger=[console,wandbb]"])


def test_an_unbalanced_list_override_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"malformed override 'data.train_files=\[a.parquet' for data.train_files"
    ):
        load_config(None, ["data.train_files=[a.parquet"])


@pytest.mark.parametrize("prompt", ["", "   ", [{"role": "user", "content": ""}]])
def test_a_prompt_without_text_is_a_bad_row(prompt):
    with pytest.raises(InputError, match="row 3: field 'prompt' has no text"):
        normalize_messages(prompt, "train.parquet row 3")


def test_corrupt_weights_name_the_weight_file(tiny_model_dir, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError, match=r"model.path=.*are its weight files \(model.safetensors\) whole\?"):
        load_hf_model(broken, key="actor_rollout_ref.model.path")
