"""Warm starts shipped with the package, so the demo starts from the same model on every CPU.

The default recipe's warm start is a short SFT of a 1M-parameter model on 200 examples. Such a run is a lottery
between memorising the examples and finding the carry algorithm, and the CPU's float kernels draw the ticket:
the same settings landed at 13.5% held-out on one CPU and at 3.8% (memorised, and RL never climbs from there) on
another (docs/learning.md). So the warm start the recipe's settings make is built once, by
``scripts/build_warm_start.py``, and shipped: ``verl/models/warm_starts/<name>/`` holds the model directory and
``pinned.json``, which names the key of the SFT artifact it stands for (:mod:`verl.utils.artifacts`).
When a run's warm start has that key, :mod:`verl.trainer.prepare` copies the shipped one instead of running
the SFT; any other setting (another seed, more examples, a bigger model) trains its own as before.
``tests/integration/test_pinned_warm_start.py`` checks that the recipe still asks for the shipped one and that
its held-out accuracy lies in its band.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

WARM_STARTS = Path(__file__).resolve().parents[1] / "models" / "warm_starts"
PINNED_FILE = "pinned.json"


def pinned_warm_starts() -> dict[str, Path]:
    """Each shipped warm start's directory, by the key of the SFT artifact it stands for."""
    found = {}
    for path in sorted(WARM_STARTS.glob(f"*/{PINNED_FILE}")):
        found[json.loads(path.read_text())["artifact_key"]] = path.parent
    return found


def pinned_record(directory: Path) -> dict[str, Any]:
    """What ``pinned.json`` says of a shipped warm start (its key, how it was built, its held-out accuracy)."""
    return json.loads((directory / PINNED_FILE).read_text())


def install_pinned(directory: Path, out: Path) -> None:
    """The shipped model directory, copied into the artifact being built at ``out``."""
    for file in directory.iterdir():
        if file.name != PINNED_FILE:
            shutil.copy2(file, out / file.name)
