"""``verl run`` / ``verl sft`` with a user's mistake in a data file, a model directory or a length: exit 3
(input) or 2 (config) with one line on stderr naming the key and the path, before any data or model is
built or loaded, and nothing created at the path the user gave."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from verl.cli import main
from verl.data import write_rows

FAST = ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false"]

# A model and warm start small enough to build in seconds.
SMALL = [
    "prepare.tiny_model.hidden_size=32",
    "prepare.tiny_model.num_hidden_layers=1",
    "prepare.tiny_model.intermediate_size=64",
    "prepare.sft.total_training_steps=3",
]


def rows(n: int, start: int = 0) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"{i}+1="}],
            "data_source": "arithmetic",
            "reward_model": {"ground_truth": str(i + 1)},
        }
        for i in range(start, start + n)
    ]


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    return code, err


def error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(("input error:", "config error:"))]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


def run_args(tmp_path: Path, cache: Path, *overrides: str) -> list[str]:
    return [
        "run",
        "--config",
        "grpo",  # the demo's tiny model and settings, with the user's data or model
        *FAST,
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"prepare.cache_dir={cache}",
        *overrides,
    ]


def test_run_missing_train_file_fails_before_building(tmp_path, cache, capsys):
    typo = tmp_path / "x" / "nope.parquet"
    code, err = run(capsys, *run_args(tmp_path, cache, f"data.train_files={typo}"))
    assert code == 3
    line = error_line(err)
    assert line == f"input error: dataset file {typo} (data.train_files) does not exist; the directory {typo.parent} does not exist"  # fmt: skip
    assert not typo.parent.exists() and not cache.exists()  # nothing made there, nothing built


def test_run_missing_val_file_names_the_nearest_file(tmp_path, cache, capsys):
    data = tmp_path / "data"
    train = write_rows(data / "train.parquet", rows(4))
    write_rows(data / "test.parquet", rows(2))
    model = tmp_path / "model"  # given, so nothing would be built but the check
    code, err = run(
        capsys,
        *run_args(tmp_path, cache, f"data.train_files={train}", f"data.val_files={data / 'tset.parquet'}",
                  f"actor_rollout_ref.model.path={model}"),
    )  # fmt: skip
    assert code == 3
    assert "(data.val_files) does not exist; did you mean " + str(data / "test.parquet") in error_line(err)
    assert not (data / "tset.parquet").exists() and not model.exists() and not cache.exists()


def test_run_model_path_typo_and_model_without_tokenizer(tmp_path, cache, capsys, tiny_model_dir):
    models = tmp_path / "models"
    shutil.copytree(tiny_model_dir, models / "tiny")
    typo = models / "tiyn"
    code, err = run(capsys, *run_args(tmp_path, cache, f"actor_rollout_ref.model.path={typo}"))
    assert code == 3
    assert f"actor_rollout_ref.model.path={typo}: the model directory does not exist; did you mean {models / 'tiny'}?" in error_line(err)  # fmt: skip
    assert not typo.exists() and not cache.exists()

    no_tok = models / "no-tok"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, no_tok / name)
    code, err = run(capsys, *run_args(tmp_path, cache, f"actor_rollout_ref.model.path={no_tok}"))
    assert code == 3
    assert error_line(err) == (
        f"input error: actor_rollout_ref.model.path={no_tok}: no tokenizer files (tokenizer.json / "
        "tokenizer_config.json): set actor_rollout_ref.model.tokenizer_path to a directory that holds one"
    )
    assert not cache.exists()


def test_run_lengths_longer_than_the_model(tmp_path, cache, capsys, tiny_model_dir):
    code, err = run(
        capsys,
        *run_args(tmp_path, cache, f"actor_rollout_ref.model.path={tiny_model_dir}", "data.max_prompt_length=500",
                  "data.max_response_length=100"),
    )  # fmt: skip
    assert code == 2
    assert "config error: data.max_prompt_length + data.max_response_length = 600 tokens is longer than the model allows: max_position_embeddings = 512" in error_line(err)  # fmt: skip
    assert not cache.exists()


def test_sft_missing_keys_and_missing_file(tmp_path, capsys, tiny_model_dir):
    code, err = run(capsys, "sft")
    assert code == 2 and "model.path" in error_line(err) and "data.train_files" in error_line(err)
    code, err = run(capsys, "sft", f"model.path={tiny_model_dir}", "trainer.total_training_steps=1")
    assert code == 2 and "data.train_files is required" in error_line(err)
    typo = tmp_path / "trian.parquet"
    write_rows(tmp_path / "train.parquet", rows(2))
    out = tmp_path / "out"
    code, err = run(
        capsys,
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.train_files={typo}",
        f"trainer.default_local_dir={out}",
    )
    assert code == 3
    assert f"(data.train_files) does not exist; did you mean {tmp_path / 'train.parquet'}?" in error_line(err)
    assert not typo.exists() and not out.exists()


@pytest.mark.slow
def test_run_with_two_train_files_and_the_warm_start(tmp_path, cache, capsys):
    a = write_rows(tmp_path / "a.parquet", rows(24))
    b = write_rows(tmp_path / "b.parquet", rows(24, start=24))
    val = write_rows(tmp_path / "val.jsonl", rows(8, start=60))
    args = run_args(tmp_path, cache, f"data.train_files=[{a},{b}]", f"data.val_files=[{val},{a}]",
                    "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", *SMALL)  # fmt: skip
    # 48 rows cannot fill the warm start's batch of 64: said with the key to set, not a ValueError traceback.
    code, err = run(capsys, *args)
    assert code == 2
    assert error_line(err).startswith(
        "config error: the SFT warm start of the tiny model (verl sft; set its keys as prepare.sft.<key>, e.g. "
        "prepare.sft.train_batch_size): data.train_batch_size=64 is more than the 48 usable rows"
    )
    code, err = run(capsys, *args, "prepare.sft.train_batch_size=8")
    assert code == 0, err
    # The warm start trained on the user's two files, and wrote only under the cache.
    built = sorted(p.name.rsplit("-", 1)[0] for p in (cache / "artifacts").iterdir() if p.is_dir())
    assert built == ["tiny-model", "tiny-model-sft"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.parquet",
        "b.parquet",
        "cache",
        "run",
        "val.jsonl",
    ]
