"""What a rollout did besides sampling, per batch: the engine's weight syncs and the server's traffic.

The host (:mod:`verl.workers.rollout.host`) counts them between two batches and puts them in the batch's
``meta_info``; :func:`rollout_metrics` turns them into the step's metrics, so a run shows that its inference
engine took new weights (and what that cost) and that its server answered.
"""

from __future__ import annotations

from verl.protocol import DataProto

SYNC_SECONDS, SYNC_BYTES = "rollout_weight_sync_s", "rollout_weight_sync_bytes"
SYNC_BUCKETS = "rollout_weight_sync_buckets"
SERVER_REQUESTS, SERVER_CALLS = "rollout_server_requests", "rollout_server_engine_calls"


def rollout_metrics(batch: DataProto) -> dict[str, float]:
    """``timing_s/weight_sync``, ``perf/weight_sync_mb`` and ``perf/weight_sync_buckets`` (an engine with its own
    weights, or the separate rollout role's copy of the actor's: the syncs before this batch, buckets of
    ``rollout.checkpoint_engine.update_weights_bucket_megabytes``; in verl's timing and perf namespaces, as they depend on the machine and, after a resume,
    on the process: a new engine takes the whole weights again), ``rollout/server_requests`` and
    ``rollout/server_engine_calls`` (rollout.mode=async and agent loops: requests answered, and the engine calls
    they were batched into)."""
    meta, metrics = batch.meta_info, {}
    if SYNC_SECONDS in meta:
        metrics["timing_s/weight_sync"] = float(meta[SYNC_SECONDS])
        metrics["perf/weight_sync_mb"] = float(meta[SYNC_BYTES]) / 2**20
        metrics["perf/weight_sync_buckets"] = float(meta.get(SYNC_BUCKETS, 0))
    if SERVER_REQUESTS in meta:
        metrics["rollout/server_requests"] = float(meta[SERVER_REQUESTS])
        metrics["rollout/server_engine_calls"] = float(meta[SERVER_CALLS])
    return metrics
