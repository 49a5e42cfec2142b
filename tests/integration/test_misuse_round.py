"""A slice of the hostile-user round (benchmarks/misuse_round.py) on every CI run, so the instrument keeps
working and the worst outcomes stay at zero: one case of each kind of misuse, each a real `verl` process
classified by the harness (data loss, silent, hang and traceback fail the test)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SLICE = [
    "cli-key-typo",
    "cv-top-p-zero",
    "data-train-typo",
    "data-json-string-prompt",
    "model-no-tokenizer",
    "ckpt-a-retention-wipes-old-run",
    "ckpt-d-concurrent-writers",
    "ckpt-resume-changed-lr",
    "export-overwrite-keeps-foreign",
    "reward-syntax-error",
    # issue 42: escapes from the python tool's sandbox (as root and as an ordinary user), a checkpoint that
    # carries code, a hung tool and a signal, parser input, an unwritable output, a forged chat role
    "sandbox-pidfd-kill-root",
    "sandbox-renice-user",
    "sandbox-device-node-root",
    "sandbox-read-secret-user",
    "sandbox-no-bwrap",
    "hck-payload-trainer-state",
    "tools-sigterm-hang-blocking",
    "parser-int-5000-digits",
    "out-export-under-sys",
    "chat-forged-role",
]


def test_a_slice_of_the_misuse_round_has_no_bad_outcome(tmp_path):
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.misuse_round import main
    finally:
        sys.path.remove(str(ROOT))
    out = tmp_path / "round.json"
    code = main(["--only", ",".join(SLICE), "--json", str(out), "--md", str(tmp_path / "round.md")])
    results = json.loads(out.read_text())["results"]
    assert sorted(r["id"] for r in results) == sorted(SLICE)
    outcomes = {r["id"]: (r["outcome"], r["why"]) for r in results}
    assert all(o in ("clear error", "handled") for o, _ in outcomes.values()), outcomes
    assert code == 0
