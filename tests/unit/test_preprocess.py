"""``python -m verl.data.preprocess {gsm8k,math}``: rows checked by hand against verl's format, the input
layouts (file, directory, hub snapshot), the errors, the no-overwrite rule, and a round trip through
RLDataset and the reward manager.

Every input is a tiny file written here; nothing is downloaded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _scoring import score_with_manager

from verl.data import DatasetError, RLDataset
from verl.data.preprocess import main, preprocess
from verl.errors import InputError
from verl.utils.reward_score import default_compute_score

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]

NATALIA_Q = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
NATALIA_A = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
GSM8K_ROWS = [
    {"question": NATALIA_Q, "answer": NATALIA_A},
    {"question": "A farm has 1,000 hens and 80 more. How many?", "answer": "1000+80=1080\n#### 1,080"},
    {"question": "What is 3 - 8?", "answer": "3-8=-5\n#### -5"},
]

MATH_ROWS = [
    {
        "problem": "What is $1 \\div 2$?",
        "level": "Level 1",
        "solution": "Dividing, we get $\\boxed{\\frac{1}{2}}$.",
        "type": "Prealgebra",
    },
    {
        "problem": "Compute $\\{1,2\\} \\cup \\{3\\}$.",
        "level": "Level 2",
        "solution": "First $\\boxed{2}$ is wrong; the union is $\\boxed{\\{1,2,3\\}}$.",
        "type": "Algebra",
    },
]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def run(*argv: Any) -> int:
    return main([str(arg) for arg in argv])


def expected_gsm8k(split: str) -> list[dict[str, Any]]:
    """verl's gsm8k.py output for GSM8K_ROWS, written out by hand."""
    truths = ["72", "1080", "-5"]
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{raw['question']} {GSM8K_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i, "answer": raw["answer"], "question": raw["question"]},
        }
        for i, (raw, truth) in enumerate(zip(GSM8K_ROWS, truths, strict=True))
    ]


# ============================================================================ gsm8k rows


def test_gsm8k_parquet_rows_exact(tmp_path, capsys):
    src = write_parquet(tmp_path / "raw" / "train.parquet", GSM8K_ROWS)
    assert run("gsm8k", "--local_dataset_path", src, "--local_save_dir", tmp_path / "out") == 0

    out = tmp_path / "out" / "train.parquet"
    assert pq.read_schema(out).names == VERL_COLUMNS
    rows = read(out)
    assert rows == expected_gsm8k("train")
    # spelled out once, so a change to the instruction text cannot hide inside the helper
    assert rows[0]["prompt"][0]["content"] == (
        NATALIA_Q + ' Let\'s think step by step and output the final answer after "####".'
    )
    assert rows[0]["reward_model"]["ground_truth"] == "72"
    assert not (tmp_path / "out" / "test.parquet").exists()
    printed = capsys.readouterr().out
    assert f"wrote 3 train rows to {out.absolute()}" in printed
    assert "data.train_files=" in printed


def test_gsm8k_jsonl_input_gives_the_same_rows(tmp_path):
    src = write_jsonl(tmp_path / "gsm8k_test.jsonl", GSM8K_ROWS)  # split read from the name
    written = preprocess("gsm8k", src, tmp_path / "out")
    assert [(w.split, w.rows) for w in written] == [("test", 3)]
    assert read(tmp_path / "out" / "test.parquet") == expected_gsm8k("test")


def test_hub_snapshot_layout(tmp_path):
    """openai/gsm8k as downloaded: main/ and socratic/ configs, splits in (possibly several) shards."""
    hub = tmp_path / "gsm8k"
    write_parquet(hub / "main" / "train-00000-of-00002.parquet", GSM8K_ROWS[:2])
    write_parquet(hub / "main" / "train-00001-of-00002.parquet", GSM8K_ROWS[2:])
    write_parquet(hub / "main" / "test-00000-of-00001.parquet", GSM8K_ROWS[:1])
    write_parquet(hub / "socratic" / "train-00000-of-00001.parquet", [{"nope": 1}])  # never read
    (hub / "README.md").write_text("---\nconfigs: []\n---\n")

    assert run("gsm8k", "--local_dataset_path", hub, "--local_save_dir", tmp_path / "out") == 0
    assert read(tmp_path / "out" / "train.parquet") == expected_gsm8k("train")  # index runs across shards
    assert read(tmp_path / "out" / "test.parquet") == expected_gsm8k("test")[:1]


def test_directory_of_split_files(tmp_path):
    write_jsonl(tmp_path / "raw" / "train.jsonl", GSM8K_ROWS)
    write_jsonl(tmp_path / "raw" / "test.jsonl", GSM8K_ROWS[1:])
    written = preprocess("gsm8k", tmp_path / "raw", tmp_path / "out")
    assert {w.split: w.rows for w in written} == {"train": 3, "test": 2}
    test_rows = read(tmp_path / "out" / "test.parquet")
    assert [r["extra_info"]["index"] for r in test_rows] == [0, 1]
    assert [r["reward_model"]["ground_truth"] for r in test_rows] == ["1080", "-5"]


def test_other_columns_are_kept_like_verl(tmp_path):
    """verl's datasets.map keeps every column its function did not pop."""
    rows = [{**GSM8K_ROWS[0], "source_id": 7}]
    preprocess("gsm8k", write_jsonl(tmp_path / "train.jsonl", rows), tmp_path / "out")
    row = read(tmp_path / "out" / "train.parquet")[0]
    assert list(row) == ["source_id", *VERL_COLUMNS]
    assert row["source_id"] == 7


def test_module_entry_point(tmp_path):
    src = write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    done = subprocess.run(
        [sys.executable, "-m", "verl.data.preprocess", "gsm8k", "--local_dataset_path", str(src)]
        + ["--local_save_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 3 train rows" in done.stdout
    assert read(tmp_path / "out" / "train.parquet") == expected_gsm8k("train")


# ============================================================================ math rows


def test_math_rows_exact(tmp_path):
    src = write_parquet(tmp_path / "hub" / "data" / "test-00000-of-00001.parquet", MATH_ROWS)
    assert run("math", "--local_dataset_path", tmp_path / "hub", "--local_save_dir", tmp_path / "out") == 0
    out = tmp_path / "out" / "test.parquet"
    # level and type stay, before verl's columns: what verl's math_dataset.py writes
    assert pq.read_schema(out).names == ["level", "type", *VERL_COLUMNS]
    assert read(out) == [
        {
            "level": "Level 1",
            "type": "Prealgebra",
            "data_source": "DigitalLearningGmbH/MATH-lighteval",
            "prompt": [
                {
                    "role": "user",
                    "content": "What is $1 \\div 2$? Let's think step by step and output the final answer "
                    "within \\boxed{}.",
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
            "extra_info": {"split": "test", "index": 0},
        },
        {
            "level": "Level 2",
            "type": "Algebra",
            "data_source": "DigitalLearningGmbH/MATH-lighteval",
            "prompt": [{"role": "user", "content": f"{MATH_ROWS[1]['problem']} {MATH_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "\\{1,2,3\\}"},  # the LAST box
            "extra_info": {"split": "test", "index": 1},
        },
    ]
    assert src.exists()


def test_math_solution_without_box_names_the_row(tmp_path):
    rows = [MATH_ROWS[0], {**MATH_ROWS[0], "solution": "The answer is 5."}]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DatasetError, match=r"train\.jsonl row 1: column 'solution' has no \\boxed"):
        preprocess("math", src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ============================================================================ errors


def test_no_local_dataset_path_explains_what_to_give(tmp_path, capsys):
    assert run("gsm8k", "--local_save_dir", tmp_path / "out") == 3
    err = capsys.readouterr().err
    assert err.startswith("input error: the gsm8k dataset must be given as a local file")
    assert "never downloads" in err and "main/train-*.parquet" in err and "question, answer" in err
    with pytest.raises(InputError, match="problem, solution"):
        preprocess("math", None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_input_file(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    write_parquet(tmp_path / "raw" / "train.parquet", GSM8K_ROWS)
    missing = tmp_path / "raw" / "trian.parquet"
    assert run("gsm8k", "--local_dataset_path", missing, "--local_save_dir", tmp_path / "out") == 3
    err = capsys.readouterr().err
    assert f"{missing} does not exist" in err
    assert "did you mean" in err and "train.parquet" in err


def test_directory_without_split_files(tmp_path):
    write_parquet(tmp_path / "raw" / "validation.parquet", GSM8K_ROWS)
    with pytest.raises(DatasetError, match=r"no train\.\* or test\.\* dataset files .*main"):
        preprocess("gsm8k", tmp_path / "raw", tmp_path / "out")


def test_missing_column_names_file_row_and_column(tmp_path):
    rows = [GSM8K_ROWS[0], {"question": "How many?"}, GSM8K_ROWS[2]]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(
        DatasetError, match=re.escape(f"{src} row 1: missing column 'answer' (rows need the columns question")
    ):
        preprocess("gsm8k", src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_wrong_dataset_columns_in_parquet(tmp_path, capsys):
    """MATH rows given to the gsm8k command: the first row already names the problem."""
    src = write_parquet(tmp_path / "train.parquet", MATH_ROWS)
    assert run("gsm8k", "--local_dataset_path", src, "--local_save_dir", tmp_path / "out") == 3
    err = capsys.readouterr().err
    assert f"{src} row 0: missing column 'question'" in err and "'problem'" in err


def test_already_preprocessed_input_is_recognised(tmp_path):
    first = preprocess("gsm8k", write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS), tmp_path / "out")
    with pytest.raises(DatasetError, match="already in verl's format"):
        preprocess("gsm8k", first[0].path, tmp_path / "again")


def test_answer_without_final_number(tmp_path):
    src = write_jsonl(tmp_path / "train.jsonl", [{"question": "Q?", "answer": "it is 5"}])
    with pytest.raises(DatasetError, match=r"row 0: column 'answer' has no final '#### <number>'"):
        preprocess("gsm8k", src, tmp_path / "out")


def test_bad_rows_skip_keeps_the_raw_index(tmp_path, capsys):
    rows = [GSM8K_ROWS[0], {"question": "no answer"}, GSM8K_ROWS[2]]
    src = write_jsonl(tmp_path / "train.jsonl", rows)
    args = ["gsm8k", "--local_dataset_path", src, "--local_save_dir", tmp_path / "out"]
    assert run(*args, "--bad_rows", "skip") == 0
    assert [r["extra_info"]["index"] for r in read(tmp_path / "out" / "train.parquet")] == [0, 2]
    assert "wrote 2 train rows" in capsys.readouterr().out


def test_single_file_without_split_in_its_name(tmp_path):
    src = write_parquet(tmp_path / "gsm8k.parquet", GSM8K_ROWS)
    with pytest.raises(DatasetError, match="give --split train or --split test"):
        preprocess("gsm8k", src, tmp_path / "out")
    assert (
        run("gsm8k", "--local_dataset_path", src, "--local_save_dir", tmp_path / "out", "--split", "test")
        == 0
    )
    assert read(tmp_path / "out" / "test.parquet") == expected_gsm8k("test")


def test_one_split_in_two_formats_is_refused(tmp_path):
    write_parquet(tmp_path / "raw" / "train.parquet", GSM8K_ROWS)
    write_jsonl(tmp_path / "raw" / "train.jsonl", GSM8K_ROWS)
    with pytest.raises(DatasetError, match=r"train split is there as \.jsonl and \.parquet"):
        preprocess("gsm8k", tmp_path / "raw", tmp_path / "out")


# ============================================================================ never destroy data


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "a" / "train.jsonl", GSM8K_ROWS)
    second = write_jsonl(tmp_path / "b" / "train.jsonl", GSM8K_ROWS[:1])
    assert run("gsm8k", "--local_dataset_path", first, "--local_save_dir", out) == 0
    before = (out / "train.parquet").read_bytes()

    assert run("gsm8k", "--local_dataset_path", second, "--local_save_dir", out) == 3
    err = capsys.readouterr().err
    assert f"{out} already holds train.parquet; refusing to replace" in err and "--overwrite" in err
    assert (out / "train.parquet").read_bytes() == before

    assert run("gsm8k", "--local_dataset_path", second, "--local_save_dir", out, "--overwrite") == 0
    assert len(read(out / "train.parquet")) == 1


def test_an_old_test_file_also_blocks_a_train_only_run(tmp_path):
    """A new train.parquet next to another dataset's test.parquet would be a mismatched pair."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "test.parquet").write_bytes(b"old")
    with pytest.raises(InputError, match="already holds test.parquet"):
        preprocess("gsm8k", write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS), tmp_path / "out")
    preprocess("gsm8k", tmp_path / "train.jsonl", tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "test.parquet").read_bytes() == b"old"  # only what it writes is replaced


def test_output_never_replaces_the_input(tmp_path):
    src = write_parquet(tmp_path / "data" / "train.parquet", GSM8K_ROWS)
    before = src.read_bytes()
    with pytest.raises(InputError, match="would replace the input file"):
        preprocess("gsm8k", src, tmp_path / "data", overwrite=True)
    assert src.read_bytes() == before


def test_a_bad_test_split_writes_nothing(tmp_path):
    write_jsonl(tmp_path / "raw" / "train.jsonl", GSM8K_ROWS)
    write_jsonl(tmp_path / "raw" / "test.jsonl", [{"question": "Q?"}])
    with pytest.raises(DatasetError, match="test.jsonl row 0"):
        preprocess("gsm8k", tmp_path / "raw", tmp_path / "out")
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_save_dir_is_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        preprocess("gsm8k", write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS), tmp_path / "out")


def test_local_dir_is_a_deprecated_alias(tmp_path, capsys):
    src = write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    assert run("gsm8k", "--local_dataset_path", src, "--local_dir", tmp_path / "old") == 0
    assert "--local_dir is deprecated" in capsys.readouterr().err
    assert (tmp_path / "old" / "train.parquet").exists()
    code = run(
        "gsm8k",
        "--local_dataset_path",
        src,
        "--local_dir",
        tmp_path / "a",
        "--local_save_dir",
        tmp_path / "b",
    )
    assert code == 3
    assert "disagree" in capsys.readouterr().err


# ============================================================================ round trip


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from verl.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_gsm8k_round_trip_through_dataset_and_reward(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    (written,) = preprocess("gsm8k", src, tmp_path / "out")
    ds = RLDataset(str(written.path), tokenizer, max_prompt_length=256)
    assert len(ds) == 3
    item = ds[0]
    assert item["data_source"] == "openai/gsm8k"
    assert item["raw_prompt"] == expected_gsm8k("train")[0]["prompt"]
    truth = item["reward_model"]["ground_truth"]
    assert default_compute_score(item["data_source"], "48/2=24, 48+24=72\n#### 72", truth) == 1.0
    assert default_compute_score(item["data_source"], "#### 71", truth) == 0.0
    assert score_with_manager(ds, ["so #### 72", "#### 1,080", "#### 5"], tokenizer) == [1.0, 1.0, 0.0]


def test_math_round_trip_through_dataset_and_reward(tmp_path, tokenizer):
    src = write_parquet(tmp_path / "test.parquet", MATH_ROWS)
    (written,) = preprocess("math", src, tmp_path / "out")
    ds = RLDataset(str(written.path), tokenizer, max_prompt_length=256)
    item = ds[0]
    assert item["level"] == "Level 1"
    truth = item["reward_model"]["ground_truth"]
    assert default_compute_score(item["data_source"], "so $\\boxed{\\dfrac12}$", truth) == {
        "score": 1.0,
        "acc": 1.0,
    }
    assert default_compute_score(item["data_source"], "$\\boxed{2}$", truth)["score"] == 0.0
    responses = ["\\boxed{0.5}", "\\boxed{\\{1, 2, 3\\}}"]
    assert score_with_manager(ds, responses, tokenizer) == [1.0, 1.0]
