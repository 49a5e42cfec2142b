"""What the agent loops did in a batch, from the per-sample fields verl.agent_loop.runner leaves in it."""

from __future__ import annotations

import numpy as np

from verl.protocol import DataProto


def agent_metrics(batch: DataProto) -> dict[str, float]:
    """``num_turns/{mean,max,min}`` and ``tool_call_counts/{mean,max,min}`` (verl's names) per sample,
    ``agent/tool_errors/mean`` (failed or unreadable calls per sample), ``agent/tool_timeouts/mean`` (calls cut
    at ``multi_turn.tool_call_timeout_s`` per sample, also counted as errors),
    ``timing_s/agent_loop/tool_calls/mean`` (wall-clock seconds per tool call, in verl's timing namespace) and
    ``agent/masked_token_ratio`` (the share of response tokens that were inserted, not sampled). Empty for a
    batch no agent loop made."""
    fields = batch.non_tensor_batch
    if "__num_turns__" not in fields:
        return {}
    metrics: dict[str, float] = {}
    for name, key in (("num_turns", "__num_turns__"), ("tool_call_counts", "__tool_calls__")):
        values = np.asarray(fields[key], dtype=np.float64)
        metrics.update(
            {f"{name}/mean": values.mean(), f"{name}/max": values.max(), f"{name}/min": values.min()}
        )
    calls = float(np.sum(np.asarray(fields["__tool_calls__"], dtype=np.float64)))
    metrics["agent/tool_errors/mean"] = float(
        np.mean(np.asarray(fields["__tool_errors__"], dtype=np.float64))
    )
    metrics["agent/tool_timeouts/mean"] = float(
        np.mean(np.asarray(fields.get("__tool_timeouts__", [0.0]), dtype=np.float64))
    )
    latency = float(np.sum(np.asarray(fields["__tool_latency_s__"], dtype=np.float64)))
    metrics["timing_s/agent_loop/tool_calls/mean"] = latency / calls if calls else 0.0
    width = batch.batch["responses"].shape[1]
    attended = batch.batch["attention_mask"][:, -width:].sum().item()
    sampled = batch.batch["response_mask"].sum().item()
    metrics["agent/masked_token_ratio"] = (attended - sampled) / attended if attended else 0.0
    return {key: float(value) for key, value in metrics.items()}
