"""The LoRA guard: after a weight sync into the separate rollout role, the adapters it holds must be the
actor's; a sync that leaves the base model's (or stale) adapters stops the run with one line."""

from __future__ import annotations

import pytest
import torch

from verl.config import load_config
from verl.workers.rollout.host import RolloutHost
from verl.workers.rollout.lora_guard import LoraSyncError, adapter_tensors

LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    from verl.workers.roles import ActorRolloutRefWorker
    from verl.workers.rollout_worker import RolloutWorker

    config = load_config("grpo", [f"actor_rollout_ref.model.path={tiny_model_dir}", *LORA])
    actor, rollout = ActorRolloutRefWorker(config, need_ref=False), RolloutWorker(config)
    rollout.set_weights(actor.get_weights(), version=0)  # the first copy: whole
    return actor, rollout


def train(actor, seed: int) -> None:
    """Stands in for an update: only the adapters change."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in actor.actor_model.named_parameters():
            if ".lora_" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.01)


def test_the_normal_sync_passes_the_guard_and_holds_the_actors_adapters(workers):
    actor, rollout = workers
    train(actor, seed=1)
    answer = actor.get_weights(trained_only=True)
    assert answer["complete"] is False and answer["adapters_digest"]
    rollout.set_weights(answer, version=1)
    mine, theirs = adapter_tensors(rollout.model), adapter_tensors(actor.actor_model)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("broken", ["no-op", "zeros"])
def test_a_sync_that_leaves_other_adapters_fails_with_one_line(workers, monkeypatch, broken):
    actor, rollout = workers
    load = RolloutHost.load_buckets

    def broken_load(self, buckets, version, complete=True):
        if broken == "no-op":
            return 0, 0
        return load(
            self, ({k: torch.zeros_like(v) for k, v in b.items()} for b in buckets), version, complete
        )

    monkeypatch.setattr(RolloutHost, "load_buckets", broken_load)
    train(actor, seed=2)
    with pytest.raises(LoraSyncError) as error:
        rollout.set_weights(actor.get_weights(trained_only=True), version=2)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("LoRA guard: after the weight sync to policy version 2 the rollout's adapters")
    assert "base model or stale adapters" in message


def test_disabled_adapters_fail_the_guard(workers):
    from verl.models.lora import adapters_disabled

    actor, rollout = workers
    with adapters_disabled(rollout.model), pytest.raises(LoraSyncError, match="LoRA layers are disabled"):
        rollout.set_weights(actor.get_weights(trained_only=True), version=3)
