"""``logging.INFO`` shows the data flow of a step once: which role sends what to whom, sizes, devices, and
(Ray) how long the data took to move.

Seed 001's debugging tip is ``logging.basicConfig(level=logging.INFO)``. Each distinct step of the DAG
(``actor_rollout.generate_sequences [gen]``, ``reward.compute_score [reward]``, ...) is logged the first
time it runs, with where its inputs come from, their shapes, dtypes, devices and bytes, where it runs
(in the driver's process, or which Ray worker processes the inputs cross into), what it returned, and its
seconds: with Ray, those in the workers and those spent moving the data between processes.
Later runs of the same step are not logged again, so a long run's log stays readable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from verl.single_controller.trace import estimate_nbytes
from verl.utils.units import fmt_bytes

logger = logging.getLogger("verl.dataflow")


def _tensor(value: Any) -> str:
    dtype = str(value.dtype).removeprefix("torch.")
    shape = "x".join(str(d) for d in value.shape)
    device = getattr(value, "device", None)
    where = f" on {device}" if device is not None else ""
    return f"{dtype}[{shape}]{where}"


def describe_value(value: Any) -> str:
    """A short description: a DataProto's rows and columns, a tensor's dtype, shape and device, bytes."""
    if hasattr(value, "batch") and hasattr(value, "non_tensor_batch"):
        columns = [f"{k} {_tensor(v)}" for k, v in value.batch.items()]
        columns += [f"{k} object[{len(v)}]" for k, v in value.non_tensor_batch.items()]
        return f"DataProto({len(value)} rows: {', '.join(columns)}; {fmt_bytes(estimate_nbytes(value))})"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{_tensor(value)} ({fmt_bytes(estimate_nbytes(value))})"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {describe_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} of {len(value)} ({fmt_bytes(estimate_nbytes(value))})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class DataFlowLog:
    """Logs each distinct step of the DAG once, at INFO, when that logger is enabled."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def wanted(self, label: str) -> bool:
        return logger.isEnabledFor(logging.INFO) and label not in self.seen

    def log(
        self,
        label: str,
        inputs: Mapping[str, Any],
        sources: Mapping[str, str],
        where: str,
        result: Any,
        s: float,
        worker_s: float | None = None,
    ) -> None:
        """``sources``: for each input, the step it comes from (or "driver" for a value the driver gave);
        ``worker_s``: of the ``s`` seconds, those the worker processes ran it (None: in the driver's process)."""
        self.seen.add(label)
        if worker_s is None:
            timing = f"{s:.3f} s"
        else:  # the rest pickled the inputs and the result and moved them between processes (and waited)
            timing = f"{s:.3f} s: {worker_s:.3f} s in the workers, {max(s - worker_s, 0.0):.3f} s moving data"
        lines = [f"data flow: {label} runs in {where} ({timing})"]
        for name, value in inputs.items():
            lines.append(f"  <- {name} from {sources.get(name, 'driver')}: {describe_value(value)}")
        lines.append(f"  -> {describe_value(result)}")
        logger.info("\n".join(lines))
