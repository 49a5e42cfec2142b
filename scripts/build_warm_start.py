"""Build the default recipe's warm start and ship it: ``verl/models/warm_starts/grpo-arithmetic/``.

    python scripts/build_warm_start.py                 # the recipe's own SFT settings
    python scripts/build_warm_start.py prepare.seed=3  # any override of the recipe's warm start

The SFT runs in a fresh ``$VERL_HOME`` with the recipe's settings (one thread). Which side of the lottery it lands
on depends on the CPU's float kernels (docs/learning.md), so a rebuild elsewhere may give another model: the
shipped file, not the script, is what every run starts from, and ``pinned.json`` records the machine. The script
then measures the warm start's held-out greedy accuracy with ``verl run trainer.val_only=true`` (which now takes the
shipped copy) and writes ``pinned.json``: the SFT artifact's key (what a run must ask for to get this model),
its settings, the accuracy, the kernels and the command. ``verl run`` uses the shipped copy whenever its warm
start has that key (verl.trainer.pinned_warm_start); tests/integration/test_pinned_warm_start.py checks the
key and the accuracy band.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "grpo-arithmetic"
METRIC = "val-core/arithmetic/acc/mean@1"
MODEL_FILES = (".safetensors", ".json", ".jinja")


def machine() -> str:
    """The CPU model and its widest vector extensions (what decides the float kernels)."""
    from verl.utils.cpu import read_cpuinfo

    info = read_cpuinfo()
    wide = sorted(f for f in info.flags if f.startswith(("avx", "amx")))
    return f"{platform.machine()} {info.model}; {' '.join(wide)}"


def main(overrides: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from verl.config import load_config
    from verl.trainer.pinned_warm_start import PINNED_FILE, WARM_STARTS
    from verl.trainer.prepare import plan_inputs, prepare_inputs

    target = WARM_STARTS / NAME
    with tempfile.TemporaryDirectory(prefix="verl-warm-start-") as home:
        os.environ["VERL_HOME"] = home
        shutil.rmtree(target, ignore_errors=True)  # (else the build below would take the shipped copy)
        config = load_config(None, overrides)
        plan = plan_inputs(config)
        prepare_inputs(config)
        target.mkdir(parents=True)
        for file in plan.sft_model.path.iterdir():
            if (
                file.suffix in MODEL_FILES and file.name != "artifact.json"
            ):  # the model directory, not the SFT run's log, lock or manifest
                shutil.copy2(file, target / file.name)
        record = {
            "artifact_key": plan.sft_model.key,
            "settings": plan.sft_model.settings,
            "machine": machine(),
            "command": " ".join(["python", "scripts/build_warm_start.py", *overrides]),
        }
        (target / PINNED_FILE).write_text(json.dumps({**record, "summary": "measuring"}, indent=2) + "\n")
        run_dir = Path(home) / "val"
        subprocess.run(
            [sys.executable, "-m", "verl.cli", "run", *overrides, "trainer.val_only=true",
             "trainer.logger=[jsonl]", f"trainer.default_local_dir={run_dir}"],
            check=True, env=os.environ,
        )  # fmt: skip
        accuracy = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])[METRIC]
    record.update(held_out_accuracy=accuracy, summary=f"held-out greedy accuracy {100 * accuracy:.1f}%")
    (target / PINNED_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{target}: {record['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
