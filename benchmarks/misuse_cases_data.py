"""Cases of the hostile-user round: the ``data``, ``model`` and ``sft`` groups (see misuse_cases.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.misuse_cases import row, rows, run, setup_files, trained, write, write_jsonl, write_parquet
from benchmarks.misuse_round import Case, Cmd, Fixtures, error, ok

Setup = Callable[[Path, Fixtures], None]

# ------------------------------------------------------------------------------------------------ data

MODEL_GIVEN = "actor_rollout_ref.model.path={model}"
"""Data cases name the cached model: with data.train_files set and no model, ``verl run`` would build a
new SFT warm start on the case's data (minutes)."""


def parquet(name: str, data: list[dict[str, Any]] | None = None) -> Setup:
    def setup(tmp: Path, fx: Fixtures) -> None:
        write_parquet(tmp / name, rows() if data is None else data)

    return setup


def jsonl(name: str, data: list[Any] | None = None, raw_lines: Sequence[str] = ()) -> Setup:
    def setup(tmp: Path, fx: Fixtures) -> None:
        write_jsonl(tmp / name, rows() if data is None else data, raw_lines)

    return setup


def both(*setups: Setup) -> Setup:
    def setup(tmp: Path, fx: Fixtures) -> None:
        for s in setups:
            s(tmp, fx)

    return setup


def _data_err(
    id: str,
    what: str,
    overrides: Sequence[str],
    mentions: Sequence[Any],
    setup: Setup | None = None,
    codes: Any = 3,
    **kw: Any,
) -> Case:
    return Case(
        f"data-{id}",
        "data",
        what,
        run(MODEL_GIVEN, *overrides),
        error(codes, mentions),
        setup=setup,
        limit_s=75,
        **kw,
    )


def _data_ok(id: str, what: str, overrides: Sequence[str], setup: Setup, env: dict | None = None) -> Case:
    cmd = Cmd(run(MODEL_GIVEN, *overrides), env=env or {})
    return Case(f"data-{id}", "data", what, cmd, ok(trained(2)), setup=setup, limit_s=90)


def _corrupt_parquet(tmp: Path, fx: Fixtures) -> None:
    write(tmp / "train.parquet", b"PAR1" + bytes(range(256)) * 8 + b"PAR1")


def _truncated_parquet(tmp: Path, fx: Fixtures) -> None:
    write_parquet(tmp / "full.parquet", rows())
    data = (tmp / "full.parquet").read_bytes()
    write(tmp / "train.parquet", data[: len(data) // 2])


def _empty_parquet(tmp: Path, fx: Fixtures) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.Table.from_pylist(rows(1)).schema
    pq.write_table(schema.empty_table(), tmp / "train.parquet")


def _json_string_prompts(tmp: Path, fx: Fixtures) -> None:
    data = rows()
    for r in data:
        r["prompt"] = json.dumps(r["prompt"])
    write_parquet(tmp / "train.parquet", data)


def _huge_prompt(tmp: Path, fx: Fixtures) -> None:
    data = rows()
    data[5]["prompt"] = [{"role": "user", "content": "1+" * 300 + "1="}]
    write_parquet(tmp / "train.parquet", data)


def _tilde(tmp: Path, fx: Fixtures) -> None:
    write_parquet(tmp / "home" / "data" / "train.parquet", rows())


def _copy_val(tmp: Path, fx: Fixtures) -> None:
    shutil.copy(fx.val, tmp / "val.parquet")


def data_cases() -> list[Case]:
    one_bad = rows()
    one_bad[3] = row(1, 2, 3, prompt=5)
    return [
        _data_err(
            "train-missing",
            "data.train_files names a file that does not exist",
            ["data.train_files=nosuch/train.parquet"],
            ["data.train_files", "nosuch/train.parquet"],
            no_create=["nosuch"],
        ),
        _data_err(
            "val-missing",
            "data.val_files names a file that does not exist",
            ["data.val_files=nosuch/val.parquet"],
            ["data.val_files", "nosuch/val.parquet"],
            no_create=["nosuch"],
        ),
        _data_err(
            "train-typo",
            "train.parquet written, trian.parquet given",
            ["data.train_files=trian.parquet"],
            ["data.train_files", "trian.parquet"],
            parquet("train.parquet"),
            no_create=["trian.parquet"],
        ),
        _data_err(
            "list-one-missing",
            "data.train_files=[a.parquet,missing.parquet]",
            ["data.train_files=[a.parquet,missing.parquet]"],
            ["missing.parquet"],
            parquet("a.parquet"),
            no_create=["missing.parquet"],
        ),
        _data_err(
            "train-files-empty-list",
            "data.train_files=[]",
            ["data.train_files=[]"],
            ["data.train_files"],
            codes=(2, 3),
        ),
        _data_err(
            "train-is-dir",
            "data.train_files=data (a directory of parquet files)",
            ["data.train_files=data"],
            ["data"],
            parquet("data/part-0.parquet"),
        ),
        _data_err(
            "dir-named-parquet",
            "data.train_files=train.parquet, a directory",
            ["data.train_files=train.parquet"],
            ["train.parquet"],
            lambda tmp, fx: (tmp / "train.parquet").mkdir(),
        ),
        _data_err(
            "zero-byte-file",
            "an empty (0-byte) train.parquet",
            ["data.train_files=train.parquet"],
            ["train.parquet"],
            setup_files(**{"train.parquet": b""}),
        ),
        _data_err(
            "parquet-no-rows",
            "a parquet file with a schema and no rows",
            ["data.train_files=train.parquet"],
            ["train.parquet"],
            _empty_parquet,
        ),
        _data_err(
            "empty-jsonl",
            "an empty train.jsonl",
            ["data.train_files=train.jsonl"],
            ["train.jsonl"],
            setup_files(**{"train.jsonl": ""}),
        ),
        _data_err(
            "csv-extension",
            "data.train_files=train.csv",
            ["data.train_files=train.csv"],
            ["train.csv"],
            setup_files(**{"train.csv": "prompt,answer\n1+1=,2\n"}),
        ),
        _data_err(
            "corrupt-parquet",
            "train.parquet of garbage bytes",
            ["data.train_files=train.parquet"],
            ["train.parquet"],
            _corrupt_parquet,
        ),
        _data_err(
            "jsonl-bad-line",
            "train.jsonl with an invalid JSON line (line 33)",
            ["data.train_files=train.jsonl"],
            ["train.jsonl", "33"],
            jsonl("train.jsonl", raw_lines=['{"data_source": "arithmetic", "prompt": [']),
        ),
        _data_err(
            "no-prompt-column",
            "rows without a prompt column",
            ["data.train_files=train.parquet"],
            ["prompt"],
            parquet("train.parquet", rows(prompt=None, question="1+1=")),
        ),
        _data_err(
            "prompt-key-typo",
            "data.prompt_key=promt",
            ["data.train_files=train.parquet", "data.prompt_key=promt"],
            ["promt"],
            parquet("train.parquet"),
            codes=(2, 3),
        ),
        _data_err(
            "prompt-int",
            "one row's prompt is the number 5",
            ["data.train_files=train.jsonl"],
            ["prompt"],
            jsonl("train.jsonl", one_bad),
        ),
        _data_err(
            "prompt-list-of-str",
            "prompt is a list of strings, not messages",
            ["data.train_files=train.jsonl"],
            ["prompt"],
            jsonl("train.jsonl", rows(prompt=["what is 1+1?"])),
        ),
        _data_err(
            "prompt-no-content",
            "messages without content",
            ["data.train_files=train.jsonl"],
            ["content"],
            jsonl("train.jsonl", rows(prompt=[{"role": "user"}])),
        ),
        _data_err(
            "prompt-empty-list",
            "prompt is []",
            ["data.train_files=train.jsonl"],
            ["prompt"],
            jsonl("train.jsonl", rows(prompt=[])),
        ),
        _data_err(
            "prompt-empty-content",
            "prompt is one user message with empty content",
            ["data.train_files=train.jsonl"],
            ["prompt"],
            jsonl("train.jsonl", rows(prompt=[{"role": "user", "content": ""}])),
        ),
        _data_err(
            "no-ground-truth",
            "reward_model without ground_truth",
            ["data.train_files=train.parquet"],
            ["ground_truth"],
            parquet("train.parquet", rows(reward_model={"style": "rule"})),
        ),
        _data_err(
            "no-data-source",
            "rows without data_source",
            ["data.train_files=train.parquet"],
            ["data_source"],
            parquet("train.parquet", rows(data_source=None)),
        ),
        _data_err(
            "unknown-data-source",
            "data_source gsm9k and no custom reward",
            ["data.train_files=train.parquet"],
            ["gsm9k"],
            parquet("train.parquet", rows(data_source="gsm9k")),
            codes=(1, 2, 3),
        ),
        _data_err(
            "prompt-too-long",
            "one prompt of ~600 tokens, max_prompt_length 32, truncation=error",
            ["data.train_files=train.parquet"],
            ["max_prompt_length"],
            _huge_prompt,
        ),
        _data_err(
            "fewer-rows-than-batch",
            "8 rows, train_batch_size 16",
            ["data.train_files=train.parquet"],
            ["train_batch_size"],
            parquet("train.parquet", rows(8)),
            codes=(2, 3),
        ),
        _data_err(
            "all-rows-skipped",
            "every row bad, data.bad_rows=skip",
            ["data.train_files=train.jsonl", "data.bad_rows=skip"],
            ["train.jsonl"],
            jsonl("train.jsonl", rows(prompt=7)),
        ),
        _data_err(
            "val-empty-file",
            "an empty val.jsonl",
            ["data.val_files=val.jsonl"],
            ["val.jsonl"],
            setup_files(**{"val.jsonl": ""}),
        ),
        _data_ok(
            "truncation-left",
            "a ~600-token prompt with data.truncation=left",
            ["data.train_files=train.parquet", "data.truncation=left"],
            _huge_prompt,
        ),
        _data_ok(
            "multi-file",
            "data.train_files=[a.parquet,b.parquet]",
            ["data.train_files=[a.parquet,b.parquet]"],
            both(parquet("a.parquet", rows(16)), parquet("b.parquet", rows(16))),
        ),
        _data_ok(
            "mixed-formats",
            "data.train_files=[a.parquet,b.jsonl]",
            ["data.train_files=[a.parquet,b.jsonl]"],
            both(parquet("a.parquet", rows(16)), jsonl("b.jsonl", rows(16))),
        ),
        _data_ok(
            "json-string-prompt",
            "prompt column holds a JSON string of the messages list",
            ["data.train_files=train.parquet"],
            _json_string_prompts,
        ),
        _data_ok("jsonl-ok", "valid train.jsonl", ["data.train_files=train.jsonl"], jsonl("train.jsonl")),
        _data_ok(
            "unicode-path",
            "train file under 'données é/训练 数据.parquet'",
            ["data.train_files=données é/训练 数据.parquet"],
            parquet("données é/训练 数据.parquet"),
        ),
        _data_ok(
            "space-path",
            "train and val files with spaces in their paths",
            ["data.train_files=my data/train set.parquet", "data.val_files=my data/val set.parquet"],
            both(parquet("my data/train set.parquet"), parquet("my data/val set.parquet")),
        ),
        _data_ok(
            "relative-dots",
            "data.train_files=./sub/../sub/train.parquet",
            ["data.train_files=./sub/../sub/train.parquet"],
            parquet("sub/train.parquet"),
        ),
        _data_ok(
            "tilde-path",
            "data.train_files=~/data/train.parquet (HOME is the case dir's home/)",
            ["data.train_files=~/data/train.parquet"],
            _tilde,
            env={"HOME": "{tmp}/home"},
        ),
    ]


# ------------------------------------------------------------------------------------------------ model

MODEL = "actor_rollout_ref.model.path"


def model_copy(name: str, drop: Sequence[str] = (), edit: Callable[[Path], None] | None = None) -> Setup:
    def setup(tmp: Path, fx: Fixtures) -> None:
        dest = fx.copy_model(tmp / name, drop)
        if edit:
            edit(dest)

    return setup


def _model(
    id: str, what: str, path: str, setup: Setup | None, mentions: Sequence[Any] = (), **kw: Any
) -> Case:
    mentions = list(mentions) or [path.strip("./")]
    return Case(
        f"model-{id}",
        "model",
        what,
        run(f"{MODEL}={path}", *kw.pop("extra", ()), config=kw.pop("config", "grpo")),
        kw.pop("expect", None) or error(kw.pop("codes", 3), mentions),
        setup=setup,
        limit_s=75,
        **kw,
    )


def model_cases() -> list[Case]:
    def garbage_config(d: Path) -> None:
        (d / "config.json").write_text("{not json")

    def unknown_arch(d: Path) -> None:
        (d / "config.json").write_text(json.dumps({"model_type": "nosucharch", "hidden_size": 8}))

    def garbage_weights(d: Path) -> None:
        (d / "model.safetensors").write_bytes(b"\x00" * 1024)

    return [
        _model(
            "missing",
            "model.path=./models/nosuch",
            "./models/nosuch",
            None,
            [MODEL, "models/nosuch"],
            no_create=["models"],
        ),
        _model(
            "missing-abs",
            "model.path=<absolute path that does not exist>",
            "{tmp}/gone/model",
            None,
            [MODEL, "gone/model"],
            no_create=["gone"],
        ),
        _model(
            "empty-dir", "model.path=an empty directory", "./model", lambda tmp, fx: (tmp / "model").mkdir()
        ),
        _model(
            "no-config",
            "model dir without config.json",
            "./model",
            model_copy("model", ["config.json"]),
            ["config.json"],
        ),
        _model(
            "no-tokenizer",
            "model dir without tokenizer files",
            "./model",
            model_copy("model", ["tokenizer.json", "tokenizer_config.json"]),
            ["tokenizer"],
        ),
        _model(
            "garbage-config",
            "config.json is not JSON",
            "./model",
            model_copy("model", edit=garbage_config),
            ["config.json"],
        ),
        _model(
            "unknown-arch",
            "config.json with model_type nosucharch",
            "./model",
            model_copy("model", edit=unknown_arch),
            ["nosucharch"],
        ),
        _model(
            "no-weights",
            "model dir without model.safetensors",
            "./model",
            model_copy("model", ["model.safetensors"]),
            ["model"],
        ),
        _model(
            "garbage-weights",
            "model.safetensors of zero bytes",
            "./model",
            model_copy("model", edit=garbage_weights),
            ["model.safetensors"],
        ),
        _model(
            "is-file",
            "model.path names a file (model.safetensors)",
            "./model/model.safetensors",
            model_copy("model"),
            ["model.safetensors"],
        ),
        _model(
            "tokenizer-path-missing",
            "model.tokenizer_path=./nosuch_tok (missing)",
            "{model}",
            None,
            ["tokenizer_path", "nosuch_tok"],
            extra=["actor_rollout_ref.model.tokenizer_path=./nosuch_tok"],
            no_create=["nosuch_tok"],
        ),
        _model(
            "critic-path-missing",
            "ppo recipe with critic.model.path=./nosuch_critic",
            "{model}",
            None,
            ["critic.model.path", "nosuch_critic"],
            no_create=["nosuch_critic"],
            extra=["critic.model.path=./nosuch_critic"],
            config="ppo",
        ),
        _model(
            "unicode-path",
            "a copy of the model under 'modèle ü/m 1'",
            "modèle ü/m 1",
            model_copy("modèle ü/m 1"),
            expect=ok(trained(2)),
        ),
    ]


# ------------------------------------------------------------------------------------------------ sft


def _sft(id: str, what: str, args: Sequence[str], expect: Any, setup: Setup | None = None, **kw: Any) -> Case:
    argv = ["verl", "sft", *args]
    return Case(f"sft-{id}", "sft", what, argv, expect, setup=setup, limit_s=kw.pop("limit_s", 75), **kw)


SFT_SHORT = ["trainer.total_training_steps=2", "trainer.default_local_dir=sft_out"]


def sft_cases() -> list[Case]:
    return [
        _sft("no-args", "verl sft with no model or data", [], error(2, ["model.path"])),
        _sft(
            "missing-data",
            "data.train_files=nosuch.parquet",
            ["model.path={model}", "data.train_files=nosuch.parquet", *SFT_SHORT],
            error(3, ["data.train_files", "nosuch.parquet"]),
            no_create=["nosuch.parquet"],
        ),
        _sft(
            "no-data",
            "model.path given, no data.train_files",
            ["model.path={model}", *SFT_SHORT],
            error((2, 3), ["data.train_files"]),
        ),
        _sft(
            "bad-model",
            "model.path=./nosuch",
            ["model.path=./nosuch", "data.train_files={train}", *SFT_SHORT],
            error(3, ["model.path", "nosuch"]),
            no_create=["nosuch"],
        ),
        _sft(
            "unknown-key",
            "optim.learning_rate=1e-3",
            ["model.path={model}", "optim.learning_rate=1e-3"],
            error(2, ["learning_rate"]),
        ),
        _sft(
            "response-key-missing",
            "data.response_key=answer, rows have no answer",
            ["model.path={model}", "data.train_files=train.parquet", "data.response_key=answer", *SFT_SHORT],
            error(3, ["answer"]),
            parquet("train.parquet"),
        ),
        _sft(
            "ok-short",
            "a 2-step SFT of the tiny model (control)",
            ["model.path={model}", "data.train_files={train}", *SFT_SHORT],
            ok(trained(2, "sft_out")),
        ),
    ]
