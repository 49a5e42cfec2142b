"""FSDP2 (strategy fsdp2) end to end: sharded checkpoints resume exactly (after SIGKILL, with 1 and 2 ranks),
and a checkpoint written by 2 ranks loads on 1, sharded or not. The update itself is compared with one
process in tests/integration/test_data_parallel.py."""

from __future__ import annotations

import signal

import pytest
import torch
from test_resume import REWARD_FILE, metrics_by_step, overrides, run_cli
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests._fp32 import FP32
from verl.config import load_config
from verl.trainer.checkpointing import export_hf
from verl.workers.engine.sharded_checkpoint import SHARDED_DIR

pytestmark = pytest.mark.slow

RAY_TWO_RANKS = ("trainer.backend=ray", "trainer.n_gpus_per_node=2", "trainer.torch_threads=1")


def without_validation(out):
    return {
        step: {k: v for k, v in row.items() if not k.startswith("val-")}
        for step, row in metrics_by_step(out).items()
    }


@pytest.fixture
def reward(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(REWARD_FILE)
    return path


def test_sigkill_then_resume_matches_an_uninterrupted_fsdp2_run(
    tiny_model_dir, arithmetic_files, tmp_path, reward
):
    """One rank (a one-process group): the sharded checkpoint format, killed mid-training and resumed, logs
    the same metrics bit for bit as a run that was never interrupted (which saved in the background)."""
    fsdp2 = "actor_rollout_ref.actor.strategy=fsdp2"
    expected_dir, killed_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    code, stderr = run_cli(
        overrides(tiny_model_dir, arithmetic_files, expected_dir, reward, fsdp2, "trainer.async_save=true")
    )
    assert code == 0, stderr[-3000:]
    args = overrides(tiny_model_dir, arithmetic_files, killed_dir, reward, fsdp2)
    code, _ = run_cli(args, kill_after_step=2)
    assert code == -signal.SIGKILL
    done = int((killed_dir / "latest_checkpointed_iteration.txt").read_text())
    code, stderr = run_cli(args)
    assert code == 0, stderr[-3000:]
    assert "resumed from" in stderr
    expected = metrics_by_step(expected_dir)
    resumed = metrics_by_step(killed_dir)
    assert sorted(resumed) == sorted(expected) and done < max(expected)
    for step in expected:
        assert resumed[step] == expected[step], f"step {step} differs after resuming from step {done}"
    last = max(expected)
    for run in (expected_dir, killed_dir):
        assert (run / f"global_step_{last}" / "actor" / SHARDED_DIR / ".metadata").is_file()
        assert not (run / f"global_step_{last}" / "actor" / "model.safetensors").exists()


def test_two_fsdp2_ranks_on_ray_resume_exactly_and_their_checkpoint_loads_on_one_rank(
    tiny_model_dir, arithmetic_files, tmp_path, reward
):
    """PPO with a critic (GAE) on 2 Ray workers, FSDP2 by default: a new run resumed from the step-2
    checkpoint of an uninterrupted run logs the step 3 that run logged; the same checkpoint resumes on 1
    rank, with FSDP2 and with dp alike, and its weights and optimizer state arrive whole. (Stopping and
    resuming in place is test_sigkill_then_resume_matches_an_uninterrupted_fsdp2_run's.)"""

    def run(out, steps, *extra):
        args = overrides(
            tiny_model_dir,
            arithmetic_files,
            out,
            reward,
            "algorithm.adv_estimator=gae",
            "trainer.test_freq=-1",
            f"trainer.total_training_steps={steps}",
            *FP32,  # the one-rank runs compare dp with FSDP2, which compute in bf16 and fp32 when unset
            *extra,
        )
        code, stderr = run_cli(args)
        assert code == 0, stderr[-3000:]
        return stderr

    run(tmp_path / "whole", 3, *RAY_TWO_RANKS)
    checkpoint = tmp_path / "whole" / "global_step_2"  # (trainer.save_freq=1)
    stderr = run(tmp_path / "resumed", 3, *RAY_TWO_RANKS, f"trainer.resume_mode={checkpoint}")
    assert f"resumed from {checkpoint}" in stderr
    assert without_validation(tmp_path / "resumed")[3] == without_validation(tmp_path / "whole")[3]
    for role in ("actor", "critic"):
        shards = sorted(p.name for p in (checkpoint / role / SHARDED_DIR).glob("*.distcp"))
        assert shards == ["__0_0.distcp", "__1_0.distcp"], role
        assert {p.name for p in (checkpoint / role).glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}

    # The same checkpoint on one rank: sharded (a one-process group) and replicated give the same step 3.
    one_rank = {}
    for strategy in ("fsdp2", "dp"):
        out = tmp_path / f"one-rank-{strategy}"
        stderr = run(
            out, 3, f"actor_rollout_ref.actor.strategy={strategy}", f"trainer.resume_mode={checkpoint}"
        )
        assert "changed on resume: trainer.n_gpus_per_node: 2 -> 1" in stderr
        one_rank[strategy] = metrics_by_step(out)[3]
    for key, value in one_rank["dp"].items():
        assert one_rank["fsdp2"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key

    # What a one-rank dp worker loads is what the two ranks wrote: DCP's own converter as the witness.
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(checkpoint / "actor" / SHARDED_DIR, whole)
    saved = torch.load(whole, weights_only=False)
    from verl.workers.roles import ActorRolloutRefWorker

    config = load_config(
        "grpo", [f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.actor.strategy=dp"]
    )
    worker = ActorRolloutRefWorker(config, need_ref=False)
    worker.load_checkpoint(str(checkpoint / "actor"))
    for name, value in worker.actor_model.state_dict().items():
        assert torch.equal(value, saved["model"][name]), name
    names = {id(p): n for n, p in worker.actor_model.named_parameters()}
    optimizer = worker.actor.optimizer
    assert len(optimizer.state) == len(names)
    for param, state in optimizer.state.items():
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[moment], saved["optim"]["state"][names[id(param)]][moment])
    # verl export assembles the same weights from the shards.
    exported = export_hf(checkpoint, tmp_path / "hf")
    from safetensors.torch import load_file

    for name, value in load_file(exported / "model.safetensors").items():
        assert torch.equal(value, saved["model"][name]), name
