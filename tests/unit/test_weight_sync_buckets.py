"""The weight sync's buckets (``actor_rollout_ref.rollout.checkpoint_engine``): bucket boundaries, the actor's
weights reaching the separate rollout role bit for bit one bucket at a time, and the sync's metrics."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from verl.config import load_config
from verl.protocol import DataProto
from verl.workers.rollout.stats import rollout_metrics
from verl.workers.rollout.weight_sync import (
    SyncSettings,
    bucketed_stream,
    buckets,
    pack_buckets,
    receive_buckets,
    sync_settings,
)

MIB = 1 << 20


def test_buckets_keep_order_and_names_and_hold_at_most_the_limit():
    sizes = [10, 10, 30, 5, 5, 20, 1]  # float32 elements: 40, 40, 120, 20, 20, 80, 4 bytes
    tensors = [(f"w{i}", torch.zeros(n)) for i, n in enumerate(sizes)]
    groups = list(buckets(tensors, limit=80))
    assert [[name for name, _ in b] for b in groups] == [["w0", "w1"], ["w2"], ["w3", "w4"], ["w5"], ["w6"]]
    for bucket in groups:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= 80 or len(bucket) == 1  # the 120-byte tensor goes alone
    assert [name for bucket in groups for name, _ in bucket] == [name for name, _ in tensors]


def test_a_bucketed_stream_is_the_same_stream_counted():
    tensors = [(f"w{i}", torch.full((n,), float(i))) for i, n in enumerate([3, 300, 7, 7])]
    counts = [0, 0]
    out = list(bucketed_stream(iter(tensors), 64, counts))
    assert [n for n, _ in out] == [n for n, _ in tensors]
    assert all(a is b for (_, a), (_, b) in zip(out, tensors, strict=True))
    assert counts == [3, 4 * (3 + 300 + 7 + 7)]  # [w0], [w1] alone, [w2, w3]


def test_packed_buckets_come_back_bit_for_bit_in_order():
    gen = torch.Generator().manual_seed(0)
    state = {
        "a": torch.randn(300, 100, generator=gen),  # 120,000 bytes: alone
        "b": torch.randn(10, generator=gen).to(torch.bfloat16),
        "c": torch.randint(0, 9, (4, 4), generator=gen),
        "d": torch.randn(3, 3, generator=gen).double(),
        "e": torch.tensor(float("nan")),
    }
    packed = pack_buckets(state.items(), limit=64 * 1024)
    assert len(packed) == 2
    got = [bucket for bucket in receive_buckets(packed)]
    assert [list(b) for b in got] == [["a"], ["b", "c", "d", "e"]]
    merged = {k: v for b in got for k, v in b.items()}
    for name, tensor in state.items():
        assert merged[name].dtype == tensor.dtype and merged[name].shape == tensor.shape
        assert torch.equal(merged[name].view(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_settings_are_read_from_the_config_or_verls_defaults():
    config = load_config(
        "grpo", ["actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=3"]
    )
    assert sync_settings(config) == SyncSettings("naive", 3 * MIB)
    assert sync_settings(config.actor_rollout_ref.rollout) == SyncSettings("naive", 3 * MIB)
    assert sync_settings(OmegaConf.create({"actor_rollout_ref": {"rollout": {}}})) == SyncSettings(
        "naive", 2048 * MIB
    )
    assert sync_settings(None) == SyncSettings()


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    from verl.workers.roles import ActorRolloutRefWorker
    from verl.workers.rollout_worker import RolloutWorker

    config = load_config(
        "grpo",
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        ],
    )
    return ActorRolloutRefWorker(config, need_ref=False), RolloutWorker(config)


def test_the_rollout_role_receives_the_actors_weights_bit_for_bit_in_buckets(workers, monkeypatch):
    import verl.workers.roles as roles

    actor, rollout = workers
    assert sync_settings(actor.config).bucket_bytes == MIB
    limit = 64 * 1024  # (the config's least is 1 MiB; the tiny model is 0.5 MiB)
    monkeypatch.setattr(roles, "sync_settings", lambda config: SyncSettings(bucket_bytes=limit))
    with torch.no_grad():  # the actor's weights differ from the rollout's initial ones
        for param in actor.actor_model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    answer = actor.get_weights()
    state = actor.actor_model.state_dict()
    assert answer["complete"] is True and answer["names"] == list(state)
    sizes = []
    for bucket in answer["buckets"]:
        size = sum(buffer.numel() * buffer.element_size() for buffer in bucket["buffers"].values())
        assert size <= limit or len(bucket["names"]) == 1, bucket["names"]
        sizes.append(size)
    assert len(sizes) > 1  # the tiny model takes more than one bucket
    assert [n for bucket in answer["buckets"] for n in bucket["names"]] == list(state)

    rollout.set_weights([answer], version=7)
    held = rollout.model.state_dict()
    assert rollout.host.version == 7
    assert all(torch.equal(held[name], tensor) for name, tensor in state.items())

    stats = rollout.host._stats()
    metrics = rollout_metrics(DataProto(meta_info=stats))
    assert metrics["perf/weight_sync_buckets"] == len(sizes)
    assert metrics["perf/weight_sync_mb"] == pytest.approx(sum(sizes) / MIB)
    assert 0 < metrics["timing_s/weight_sync"] < 30
    assert "perf/weight_sync_mb" not in rollout_metrics(
        DataProto(meta_info=rollout.host._stats())
    )  # counted once
