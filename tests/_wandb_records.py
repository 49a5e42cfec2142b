"""Read back what wandb wrote offline: the history rows of a ``run-<id>.wandb`` file.

wandb 0.31 has no Python reader of its own transaction log any more, so the tests read it: a 7-byte
header (``:W&B``, magic, version), then LevelDB log records in 32 KiB blocks (checksum 4 bytes, length
2, type 1: FULL / FIRST / MIDDLE / LAST), each payload a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    out, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end
            pos += BLOCK - pos % BLOCK
            continue
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row of the one offline run under ``run_dir`` (its ``wandb/`` folder)."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
