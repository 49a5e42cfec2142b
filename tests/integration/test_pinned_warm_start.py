"""The default recipe starts from the shipped warm start (verl.trainer.pinned_warm_start), whatever the CPU: the
recipe still asks for it, a fresh cache installs it instead of running the SFT, and its held-out greedy
accuracy lies in the band recorded when it was built (float kernels differ between CPUs by a few answers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl.config import load_config
from verl.trainer.pinned_warm_start import pinned_record, pinned_warm_starts
from verl.trainer.prepare import plan_inputs

pytestmark = pytest.mark.slow

BAND = 0.03
"""held-out accuracy may differ from the recorded one by this much (about 60 of the ~2,000 problems)"""


def test_the_default_recipe_asks_for_the_shipped_warm_start():
    key = plan_inputs(load_config(None, [])).sft_model.key
    assert key in pinned_warm_starts(), (
        f"the default recipe's warm start (key {key}) is not the shipped one "
        f"({', '.join(pinned_warm_starts()) or 'none'}): run python scripts/build_warm_start.py"
    )


def test_a_fresh_cache_installs_it_and_it_lands_in_its_band(tmp_path):
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "verl.cli", "run", "trainer.val_only=true", "trainer.logger=[jsonl]",
         f"trainer.default_local_dir={run}"],
        capture_output=True, text=True, env=dict(os.environ, VERL_HOME=str(tmp_path / "home")), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[prepare] warm start: the shipped one" in result.stdout + result.stderr
    assert "sft step" not in result.stdout + result.stderr  # no SFT ran
    (directory,) = pinned_warm_starts().values()
    expected = pinned_record(directory)["held_out_accuracy"]
    accuracy = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])[
        "val-core/arithmetic/acc/mean@1"
    ]
    assert abs(accuracy - expected) <= BAND, (accuracy, expected)
