"""The RL trainer on the Ray backend: two data-parallel actor workers, and a reward worker that is killed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from tests.integration.test_rl_steps import parity_reward, small_config  # noqa: E402
from verl.data import iterate_batches  # noqa: E402
from verl.single_controller import LocalWorkerGroup  # noqa: E402
from verl.single_controller.ray import RayWorkerGroup  # noqa: E402
from verl.trainer.advantage import compute_advantages  # noqa: E402
from verl.trainer.metrics import WALL_CLOCK_PREFIXES  # noqa: E402
from verl.trainer.rl_trainer import RLTrainer  # noqa: E402
from verl.trainer.step import generate_groups  # noqa: E402
from verl.workers.requests import UpdateRequest  # noqa: E402
from verl.workers.roles import ActorRolloutRefWorker  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    from verl.single_controller.ray import ensure_ray

    ensure_ray()
    yield
    ray.shutdown()


def test_two_ray_actor_workers_update_like_one_local_worker(tiny_model_dir, arithmetic_files, tmp_path):
    """The same global batch: 1 in-process worker vs 2 Ray workers training with DDP over gloo."""
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one mini-batch: the same global batch either way
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.torch_threads=1",
    )
    trainer = RLTrainer(config, reward_fn=parity_reward)  # in-process: builds a real batch with advantages
    batches = iterate_batches(trainer.train_dataset, trainer.sampler, trainer._collate, num_epochs=None)
    flow, plan = trainer.controller, trainer.plan
    batch = generate_groups(flow, plan, next(batches), tag="1-0")
    scores = flow.call("reward", "compute_score", data=batch)
    old = flow.call("actor_rollout", "compute_log_prob", data=batch)
    ref = flow.call("actor_rollout", "compute_ref_log_prob", data=batch)
    adv = compute_advantages(batch.get(), scores.get(), old=old.get(), ref=ref.get(), plan=plan)["batch"]
    request = UpdateRequest(trainer.sizes)
    trainer.shutdown()

    init = dict(config=config, total_training_steps=2, need_ref=True)
    one = LocalWorkerGroup(ActorRolloutRefWorker, 1, init, name="actor_rollout")
    two = RayWorkerGroup(ActorRolloutRefWorker, 2, init, name="actor_rollout")
    try:
        assert len(set(two.pids())) == 2 and os.getpid() not in two.pids()
        metrics_one = one.update_actor(adv, request)
        metrics_two = two.update_actor(adv, request)
        weights_one = one.call_rank0("get_state")["model"]
        weights_two = [two.call_rank0("get_state")["model"]]
    finally:
        two.shutdown()
    diff = max((weights_one[k] - weights_two[0][k]).abs().max().item() for k in weights_one)
    moved = max((weights_one[k] - init_weights(tiny_model_dir)[k]).abs().max().item() for k in weights_one)
    assert moved > 1e-4, "the update did not change the weights"
    assert diff < 1e-5, f"1 vs 2 workers differ by {diff}"
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert metrics_two[key] == pytest.approx(metrics_one[key], abs=1e-5), key


def init_weights(model_dir):
    from verl.models import load_hf_model

    return load_hf_model(model_dir).state_dict()


def test_rl_run_on_ray_with_two_actor_workers(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "trainer.backend=ray",
        "trainer.n_gpus_per_node=2",
        "trainer.torch_threads=1",
        "trainer.trace=true",
        # Packed, token-budget micro-batches under DDP; rows balanced by length across the two workers.
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64",
    )
    trainer = RLTrainer(config)
    try:
        assert trainer.controller.group("actor_rollout").world_size == 2
        summary = trainer.fit()
    finally:
        trainer.shutdown()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val-core/arithmetic/acc/mean@1" in summary["val_after"]
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in records[1:])
    for r in records[1:]:
        assert (
            r["global_seqlen/balanced_max"] - r["global_seqlen/balanced_min"]
            <= r["global_seqlen/minmax_diff"]
        )
    page = (tmp_path / "trace.html").read_text()
    assert "cross-process" in page and "update_actor" in page


def test_killed_reward_worker_is_restarted_and_the_run_completes(tiny_model_dir, arithmetic_files, tmp_path):
    config = small_config(
        tiny_model_dir,
        arithmetic_files,
        tmp_path,
        "trainer.backend=ray",
        "trainer.torch_threads=1",
        "trainer.total_training_steps=6",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.on_worker_failure=restart",
    )
    trainer = RLTrainer(config)
    (victim,) = trainer.controller.group("reward").pids()

    def kill_in_the_middle() -> None:
        while trainer.global_steps < 3:
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_in_the_middle, daemon=True)
    killer.start()
    try:
        trainer.fit()
        new_pids = trainer.controller.group("reward").pids()
    finally:
        trainer.shutdown()
    killer.join(timeout=1)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0]["worker/restarts/reward"] == 0
    assert records[-1]["worker/restarts/reward"] == 1
    assert records[-1]["worker/restarts/actor_rollout"] == 0  # the other roles were not disturbed
    assert new_pids != [victim]


def test_one_step_off_on_ray_runs_the_rollout_in_a_process_of_its_own(
    tiny_model_dir, arithmetic_files, tmp_path
):
    """trainer.v1.trainer_mode=separate_async with Ray: the rollout role is another process, and the run logs
    what the same run in-process logs."""
    import json

    runs = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        config = small_config(
            tiny_model_dir,
            arithmetic_files,
            out,
            "trainer.v1.trainer_mode=separate_async",
            f"trainer.backend={backend}",
            "trainer.total_training_steps=3",
            "trainer.torch_threads=1",
        )
        trainer = RLTrainer(config, reward_fn=parity_reward)
        try:
            if backend == "ray":
                pids = trainer.controller.group("rollout").pids()
                assert os.getpid() not in pids and not set(pids) & set(
                    trainer.controller.group("actor_rollout").pids()
                )
            trainer.fit()
        finally:
            trainer.shutdown()
        drop = (*WALL_CLOCK_PREFIXES, "memory/")
        runs[backend] = [
            {k: v for k, v in json.loads(line).items() if not k.startswith(drop)}
            for line in (out / "metrics.jsonl").read_text().splitlines()
        ]
    assert runs["ray"][-1]["training/off_policy/trajectory_staleness/max"] == 1.0
    assert runs["ray"] == runs["local"]


@pytest.mark.parametrize(
    "mode",
    [
        ("trainer.v1.trainer_mode=separate_async", "async_training.staleness_threshold=0.5"),
        ("trainer.v1.trainer_mode=colocate_async",),
    ],
    ids=["separate", "colocate"],
)
def test_streaming_on_ray_equals_in_process_and_resumes_exactly(
    tiny_model_dir, arithmetic_files, tmp_path, mode
):
    """async_training.staleness_threshold > 0 with Ray (the pool in the rollout's process) and colocate_async
    (in the actor's): the run logs what it logs in-process, and a resume on Ray from a checkpoint taken
    mid-run (the pool's generations in it) logs what the uninterrupted run logged."""
    import json

    def metrics(out):
        drop = (*WALL_CLOCK_PREFIXES, "memory/")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: {k: v for k, v in r.items() if not k.startswith(drop)} for r in rows}

    def fit(out, backend, *extra):
        config = small_config(
            tiny_model_dir,
            arithmetic_files,
            out,
            *mode,
            "data.max_response_length=12",
            f"trainer.backend={backend}",
            "trainer.total_training_steps=4",
            "trainer.torch_threads=1",
            "trainer.save_freq=2",
            *extra,
        )
        trainer = RLTrainer(config, reward_fn=parity_reward)
        try:
            trainer.fit()
        finally:
            trainer.shutdown()
        return metrics(out)

    local, ray_run = fit(tmp_path / "local", "local"), fit(tmp_path / "ray", "ray")
    assert ray_run == local
    assert ray_run[4]["fully_async/pool/groups"] == 0
    resumed = fit(tmp_path / "resumed", "ray", f"trainer.resume_mode={tmp_path / 'ray' / 'global_step_2'}")
    for step in (3, 4):
        assert resumed[step] == ray_run[step], f"step {step} differs after resuming on Ray"
