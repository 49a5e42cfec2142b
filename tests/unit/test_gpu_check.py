"""benchmarks/gpu_check.py, the prepared GPU check of the FSDP2 path, exercised on the CPU: its ``--device cpu
--tiny`` mode prints one table with every row ok (the rows that need CUDA may say ``skipped (cpu)``), a check
that raises or a worker that dies becomes a FAIL row while the others still run, and the verdicts of the
GPU-only rows read their figures right."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
ROWS = {
    "1 fsdp2 GRPO steps": ("ok",),
    "2 param+optimizer offload": ("ok", "skipped (cpu)"),
    "2b offload_policy": ("ok", "skipped (cpu)"),
    "3 checkpoint save+resume": ("ok",),
    "4 bf16 mixed precision": ("ok", "skipped (cpu)"),
}
"""every row of the table, with the statuses a passing CPU run may give it"""


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--workdir", str(tmp_path / "work")]
    command += ["--out", str(tmp_path / "out"), *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
    )


def table_rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The printed table's rows, title -> (status, figures); exactly one table."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    assert sum(line.startswith("| check ") for line in lines) == 1, stdout
    rows = {}
    for line in lines[2:]:
        title, status, figures = (cell.strip() for cell in line.strip("|").split("|", 2))
        rows[title] = (status, figures)
    return rows


@pytest.mark.slow
def test_cpu_tiny_mode_prints_one_table_with_every_row_ok(tmp_path):
    started = time.monotonic()
    proc = run_script(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert set(rows) == set(ROWS), rows
    for title, (status, figures) in rows.items():
        assert status in ROWS[title], f"{title}: {status} {figures}"
    assert "bit for bit" in rows["3 checkpoint save+resume"][1]
    assert "gathered q_proj weight bf16" in rows["4 bf16 mixed precision"][1]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [r["title"] for r in report["rows"]] == list(ROWS)
    assert report["model"]["vocab"].startswith("1024 ")
    assert (tmp_path / "out" / "gpu_check.md").read_text().count("| check ") == 1
    assert time.monotonic() - started < 120  # ~15 s on 2 idle cores


@pytest.mark.slow
def test_a_dead_worker_is_a_fail_row_and_the_other_checks_still_run(tmp_path):
    proc = run_script(tmp_path, "--checks", "bf16,offload_policy", env={"VERL_GPU_CHECK_FAULT": "bf16:exit"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = table_rows(proc.stdout)
    assert rows["4 bf16 mixed precision"] == ("FAIL", "worker exited with code 3")
    assert rows["2b offload_policy"][0] == "skipped (cpu)"


def test_a_raising_check_is_a_fail_row_with_the_exception_first_line(tmp_path, monkeypatch):
    gpu_check = load_script()
    monkeypatch.setenv(gpu_check.FAULT_ENV, "fsdp2:raise")
    (tmp_path / "results").mkdir()
    args = ["--worker", "fsdp2", "--device", "cpu", "--tiny", "--workdir", str(tmp_path)]
    assert gpu_check.main(args) == 0
    result = json.loads((tmp_path / "results" / "fsdp2.json").read_text())
    assert result["status"] == "FAIL"
    assert result["figures"] == "RuntimeError: fault injected into fsdp2"


def test_offload_verdict_wants_most_of_the_offloadable_bytes_gone():
    gpu_check = load_script()
    gib = 2**30
    base = {
        "after_step_allocated": [9 * gib, 9 * gib],
        "peak_allocated": 14 * gib,
        "step_s": 1.5,
        "resident": {
            "actor_params": {"bytes": 2 * gib, "devices": ["cuda:0"]},
            "optimizer_state": {"bytes": 4 * gib, "devices": ["cuda:0"]},
            "ref_params": {"bytes": 2 * gib, "devices": ["cuda:0"]},
        },
    }
    offloaded = {**base, "after_step_allocated": [int(1.2 * gib)], "step_s": 2.5}
    offloaded["resident"] = {k: {**v, "devices": ["cpu"]} for k, v in base["resident"].items()}
    verdict = gpu_check.offload_verdict(offloaded, base)
    assert verdict["status"] == "ok", verdict
    assert "after step 1.20 GiB vs 9.00 GiB" in verdict["figures"]
    assert "actor 2.00 GiB on cpu" in verdict["figures"]
    verdict = gpu_check.offload_verdict({**base, "after_step_allocated": [int(8.9 * gib)]}, base)
    assert verdict["status"] == "FAIL", verdict
    # and row 1's figures on a GPU
    summary = {**base, "steps": [1, 2, 3], "step_s_first": 4.0, "last_losses": {"actor/pg_loss": 0.5}}
    figures = gpu_check.describe_run(summary, type("Ctx", (), {"cuda": True})())
    assert figures.startswith("3 steps, step 1.50 s (first 4.00 s), pg_loss 0.5")
    assert "max_memory_allocated 14.00 GiB, after step 9.00 GiB" in figures


def test_compare_metrics_tells_identical_close_and_different_apart():
    gpu_check = load_script()
    a = {"step": 3, "actor/pg_loss": 0.25, "timing_s/step": 1.0, "response_length/mean": 32.0}
    assert gpu_check.compare_metrics(a, {**a, "timing_s/step": 2.0}) == (True, 0.0, [])
    identical, worst, problems = gpu_check.compare_metrics(a, {**a, "actor/pg_loss": 0.25 * (1 + 1e-6)})
    assert not identical and worst > 0 and problems == []
    identical, _, problems = gpu_check.compare_metrics(a, {**a, "actor/pg_loss": 0.3})
    assert not identical and problems and problems[0].startswith("actor/pg_loss")


def test_the_built_tokenizer_has_exactly_the_asked_size_and_decodes_every_id():
    gpu_check = load_script()
    tokenizer = gpu_check.build_tokenizer(700)
    assert len(tokenizer) == 700
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "12+34="}], add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert isinstance(tokenizer.decode(list(range(700))), str)
