"""verl's recorded launch scripts (``tests/data/verl_scripts/*.json``) with only model, data and output paths
changed: shared by the unit tests (``--print-config``) and the quick-start run."""

from __future__ import annotations

import json
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "data" / "verl_scripts"
PPO_SCRIPTS = sorted(
    p.stem for p in SCRIPTS.glob("*.json") if "main_ppo" in json.loads(p.read_text())["module"]
)
SFT_SCRIPTS = sorted(p.stem for p in SCRIPTS.glob("*.json") if "sft" in json.loads(p.read_text())["module"])

# The only keys changed: where the model, the data and the outputs are.
PATHS = {
    "data.train_files": "{tmp}/data/train.parquet",
    "data.val_files": "{tmp}/data/test.parquet",
    "actor_rollout_ref.model.path": "{tmp}/model",
    "critic.model.path": "{tmp}/model",
    "model.path": "{tmp}/model",
    "model.partial_pretrain": "{tmp}/model",
    "trainer.default_local_dir": "{out}",
}


def script_argv(name: str, tmp: Path, out: Path | None = None) -> list[str]:
    """The script's overrides with the model and data paths under ``tmp`` and the output directory ``out``
    (default ``tmp/out``)."""
    where = {"tmp": tmp, "out": out or tmp / "out"}
    argv = []
    for arg in json.loads((SCRIPTS / f"{name}.json").read_text())["argv"]:
        prefix = arg[: len(arg) - len(arg.lstrip("+~"))]
        key = arg.lstrip("+~").split("=")[0]
        argv.append(f"{prefix}{key}={PATHS[key].format(**where)}" if key in PATHS else arg)
    return argv
