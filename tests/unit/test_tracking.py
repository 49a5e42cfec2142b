"""Every tracker's own files hold what was logged (read back with each tracker's reader), progress off a
terminal is a few lines, and every sink is closed once however the run ends."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests._wandb_records import history
from verl import Controller, Role
from verl.protocol import DataProto
from verl.trainer.generations import (
    decode_samples,
    dump_generations,
    generation_records,
    table_rows,
)
from verl.trainer.run_dir import RunDirError, check_dump_dir
from verl.utils import tracking as tracking_module
from verl.utils.tracking import ProgressLines, Tracking

VAL_KEY = "val-core/arithmetic/acc/mean@1"


@pytest.fixture
def offline_env(tmp_path, monkeypatch):
    """No wandb credentials, no tracker environment variables: every sink writes into the run directory."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "TENSORBOARD_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc with a wandb login
    monkeypatch.setenv("WANDB_SILENT", "true")


def log_three_steps(run: Path, loggers: list[str]) -> None:
    with Tracking(
        loggers, run, total_steps=3, project_name="proj", experiment_name="exp", config={"a": {"b": 1}}
    ) as t:
        for step in (1, 2, 3):
            t.log({"actor/pg_loss": 0.5 * step, VAL_KEY: step / 10}, step)
        t.log_table("val/generations", ["step", "input", "output", "score"], [[3, "1+1=", "2", 1.0]], 3)


def test_jsonl_and_file_write_metrics_jsonl(tmp_path):
    for name in ("jsonl", "file"):  # file is verl's name for the same sink
        run = tmp_path / name
        log_three_steps(run, [name])
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2, 3]
        assert lines[-1][VAL_KEY] == pytest.approx(0.3)


def test_tensorboard_scalars_and_generations_text(tmp_path, offline_env):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_three_steps(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars(VAL_KEY)] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    (text,) = events.Tensors("val/generations/text_summary")
    assert text.step == 3 and "| 3 | 1+1= | 2 | 1.0 |" in text.tensor_proto.string_val[0].decode()


def test_wandb_offline_history_and_table(tmp_path, offline_env):
    log_three_steps(tmp_path, ["wandb"])
    rows = history(tmp_path)
    values = [(row["_step"], row[VAL_KEY]) for row in rows if VAL_KEY in row]
    assert values == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
    table = next(row for row in rows if "val/generations/path" in row)
    (run_files,) = tmp_path.glob("wandb/offline-run-*/files")
    assert json.loads((run_files / table["val/generations/path"]).read_text())["data"] == [
        [3, "1+1=", "2", 1.0]
    ]


def test_mlflow_store_in_the_run_directory(tmp_path, offline_env):
    import mlflow

    log_three_steps(tmp_path, ["mlflow"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert run.data.params["a.b"] == "1"
    history_ = client.get_metric_history(run.info.run_id, "val-core/arithmetic/acc/mean_at_1")  # '@' refused
    assert [(m.step, round(m.value, 6)) for m in history_] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    (artifact,) = (tmp_path / "mlflow-artifacts").rglob("step_3.json")
    assert json.loads(artifact.read_text())["data"] == [[3, "1+1=", "2", 1.0]]


def test_a_failed_run_is_marked_failed_and_every_sink_still_closes(tmp_path, offline_env, monkeypatch):
    import mlflow

    closed = []
    original = tracking_module.JsonlTracker.close

    def failing_close(self, failed=False):
        original(self, failed)
        closed.append("jsonl")
        raise OSError("disk gone")

    monkeypatch.setattr(tracking_module.JsonlTracker, "close", failing_close)
    with pytest.raises(RuntimeError, match="boom"):
        with Tracking(["jsonl", "mlflow"], tmp_path, 2, project_name="proj", experiment_name="exp") as t:
            t.log({"x": 1.0}, 1)
            raise RuntimeError("boom")
    t.close()  # a second close does nothing
    assert closed == ["jsonl"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("proj").experiment_id])
    assert run.info.status == "FAILED"  # closed although the jsonl sink raised first


def test_unknown_logger_names_the_choices(tmp_path):
    with pytest.raises(
        ValueError, match="swanlab.*choose console, jsonl, file, csv, tensorboard, wandb, mlflow"
    ):
        Tracking(["console", "swanlab"], tmp_path, 1)


def test_progress_off_a_terminal_is_a_line_per_interval(monkeypatch):
    clock = iter(range(0, 10_000, 2))  # each call 2 s later
    monkeypatch.setattr(tracking_module.time, "monotonic", lambda: float(next(clock)))
    out = io.StringIO()
    monkeypatch.setattr(tracking_module.sys, "stderr", out)
    progress = ProgressLines(total=100, initial=0, desc="train", interval_s=30.0)
    for step in range(1, 101):
        progress.update(step, {"score": 0.5}, validated=step == 50)
    lines = out.getvalue().splitlines()
    # the first step, then every 15 steps (30 s at 2 s per step), the validation at step 50, the last step
    assert [line.split()[2] for line in lines] == [
        "1/100", "16/100", "31/100", "46/100", "50/100", "65/100", "80/100", "95/100", "100/100"
    ]  # fmt: skip
    assert "\r" not in out.getvalue()
    assert lines[-1].startswith("train step 100/100 (100%) score=0.5 [2.00 s/step, eta 0m00s]")


def test_console_uses_lines_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking_module.sys, "stderr", io.StringIO())
    with Tracking(["console"], tmp_path, 5) as t:
        assert isinstance(t.progress, ProgressLines)


# ------------------------------------------------------------------------------------------ generations files
class Letters:
    """A tokenizer stand-in: id i is the letter chr(97 + i); 0 is padding."""

    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(96 + i) for i in ids if i)


def test_decode_samples_reads_valid_prompt_tokens_and_the_response():
    prompts = torch.tensor([[0, 0, 1, 2], [3, 4, 5, 6]])  # left-padded
    responses = torch.tensor([[7, 8, 0], [9, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    attention = torch.cat([(prompts != 0).long(), response_mask], dim=1)
    batch = DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": attention,
        }
    )
    assert decode_samples(batch, Letters()) == (["ab", "cdef"], ["gh", "i"])


def test_generation_records_in_verls_layout_and_dump(tmp_path):
    records = generation_records(
        7, ["p1", "p2"], ["r1", "r2"], ["4", {"answer": 2}], [1.0, np.float32(0.0)],
        {"acc": np.array([True, False]), "pred": ["4", None], "short": [1]},
    )  # fmt: skip
    assert records[1] == {"input": "p2", "output": "r2", "gts": {"answer": 2}, "score": 0.0, "step": 7,
                          "acc": False, "pred": None}  # fmt: skip
    path = dump_generations(tmp_path / "val", 7, records)
    assert path == tmp_path / "val" / "7.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == records
    assert not list((tmp_path / "val").glob(".*tmp"))


def test_table_rows_are_the_same_samples_every_step():
    def records(step):
        return generation_records(step, [f"q{i}" for i in range(20)], ["a"] * 20, [None] * 20, [0.0] * 20)

    first, later = table_rows(records(10), 5), table_rows(records(20), 5)
    assert len(first) == 5 and [r[1] for r in first] == [r[1] for r in later]
    assert {r[0] for r in later} == {20}
    assert [r[1] for r in first] != [f"q{i}" for i in range(5)]  # a fixed shuffle, not the first five


def test_a_named_dump_directory_with_another_runs_files_is_refused(tmp_path):
    check_dump_dir("trainer.validation_data_dir", str(tmp_path / "new"), resuming=False)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "10.jsonl").write_text("{}\n")
    with pytest.raises(
        RunDirError, match=r"trainer.validation_data_dir=.*old already holds generation files"
    ):
        check_dump_dir("trainer.validation_data_dir", str(tmp_path / "old"), resuming=False)
    check_dump_dir("trainer.validation_data_dir", str(tmp_path / "old"), resuming=True)  # its own steps


# ------------------------------------------------------------------------------------------------ data flow
class Doubler:
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})


def test_info_logging_shows_each_steps_data_flow_once(caplog):
    controller = Controller()
    controller.register_role(Role(name="actor", worker_class=Doubler))
    data = DataProto.from_dict({"x": torch.zeros(4, 3, dtype=torch.float32)})
    with caplog.at_level(logging.INFO, logger="verl.dataflow"):
        for _ in range(3):
            first = controller.step(
                role="actor", method="double", inputs={"data": data}, outputs=["out"], name="a"
            )
            controller.step(
                role="actor", method="double", inputs={"data": first["out"]}, outputs=["out"], name="b"
            )
            controller.wait_all()
    messages = [r.getMessage() for r in caplog.records if r.name == "verl.dataflow"]
    assert len(messages) == 2  # one per distinct step, not per call
    assert messages[0].startswith("data flow: actor.double [a] runs in the driver's process")
    assert "<- data from driver: DataProto(4 rows: x float32[4x3] on cpu; 48 B)" in messages[0]
    assert "<- data from actor.double [a]: DataProto(4 rows" in messages[1]


def test_secrets_are_redacted_for_trackers_and_reports():
    from verl.utils.trackers import redact, redact_yaml

    config = {"tool": {"api_key": "sk-1", "max_tokens": 3, "tokenizer": "t"}, "env": [{"HF_TOKEN": "hf-2"}]}
    assert redact(config) == {
        "tool": {"api_key": "***", "max_tokens": 3, "tokenizer": "t"},
        "env": [{"HF_TOKEN": "***"}],
    }
    text = "tool:\n  api_key: sk-1\n  max_tokens: 3\n  password: null\n"
    assert redact_yaml(text) == "tool:\n  api_key: '***'\n  max_tokens: 3\n  password: null\n"


def test_mlflow_names_keep_only_the_characters_it_takes():
    from verl.utils.trackers import mlflow_key

    assert mlflow_key("val-core/openai/gsm8k/acc/mean@1") == "val-core/openai/gsm8k/acc/mean_at_1"
    assert mlflow_key("reward_extra/format(strict)/mean") == "reward_extra/format_strict_/mean"
