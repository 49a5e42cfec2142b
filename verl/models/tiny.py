"""Tiny causal language models made locally, saved as ordinary HuggingFace directories.

Nothing here downloads anything: the tokenizer is trained with `tokenizers` on a small text
corpus, the model is a randomly initialised transformers architecture. Everything else in
verl loads the result back with `AutoTokenizer.from_pretrained` /
`AutoModelForCausalLM.from_pretrained`, the same code path a real checkpoint takes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from verl.utils.checkpoint import make_readable

logger = logging.getLogger(__name__)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# ChatML, the template of Qwen2 instruct models, without a default system prompt
# (a tiny model should not spend its context on one).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2's pre-tokenizer, exactly: transformers 5 rebuilds a Qwen2 tokenizer from the vocab and
# merges with this pipeline whatever tokenizer.json says, so any other split would silently change
# the token ids between training the tokenizer and loading it.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

ARCHITECTURES = {
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]},
}


def default_corpus() -> list[str]:
    """A small English + arithmetic corpus: enough for BPE to learn common chat-template merges."""
    words = (
        "the answer is what plus minus times equals compute solve question user assistant system "
        "let us think step by step number sum total result so"
    ).split()
    lines = [" ".join(words)]
    lines += [f"{a}+{b}={a + b}" for a in range(0, 50, 3) for b in range(0, 50, 7)]
    lines += [
        f"{IM_START}user\nWhat is {a} plus {b}?{IM_END}\n{IM_START}assistant\n"
        for a in range(5)
        for b in range(5)
    ]
    return lines


def tool_call_corpus() -> list[str]:
    """`default_corpus` plus tool-calling conversations (Hermes ``<tool_call>`` JSON, tool turns), so BPE learns
    the call's fixed parts as a few tokens (``prepare.tiny_model.corpus=tools``)."""
    lines = []
    for a, b in ((1234, 5678), (4021, 3377), (9050, 1106), (2718, 2818)):
        lines += [
            f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a}+{b}"}}}}\n</tool_call>',
            f"{IM_START}tool\n{a + b}{IM_END}\n{IM_START}assistant\n{a + b}{IM_END}\n",
        ]
    return default_corpus() + lines * 8


CORPORA = {"default": default_corpus, "tools": tool_call_corpus}
"""the tiny tokenizer's training texts, by name (``make_tiny_model(corpus=...)``)"""


def build_tiny_tokenizer(
    vocab_size: int = 384, corpus: Iterable[str] | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with Qwen2's pre-tokenizer (digits are split one by one)."""
    tok = qwen2_byte_level(
        Tokenizer(
            models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
        )
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus or default_corpus()), trainer=trainer)
    return chatml_tokenizer(tok, model_max_length=2048)


def qwen2_byte_level(tok: Tokenizer) -> Tokenizer:
    """``tok`` with Qwen2's text handling: NFC, its pre-tokenizer regex (digits split one by one), then
    byte-level symbols, decoded back from bytes."""
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def chatml_tokenizer(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """``tok`` as a transformers tokenizer with the ChatML template and its end / padding tokens."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def tiny_model_config(
    tokenizer: PreTrainedTokenizerFast,
    arch: str = "qwen2",
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 512,
    **overrides: Any,
):
    """A transformers config for a small decoder of the given architecture, sized to the tokenizer."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny-model arch {arch!r}; choose one of {sorted(ARCHITECTURES)}")
    spec = ARCHITECTURES[arch]
    return AutoConfig.for_model(
        spec["model_type"],
        architectures=spec["architectures"],
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )


def make_tiny_model(
    out_dir: str | Path, seed: int = 0, vocab_size: int = 384, corpus: str = "default", **config_kwargs: Any
) -> Path:
    """Create a tiny causal LM + tokenizer + chat template and save them as an HF directory; ``corpus`` names
    the tokenizer's training texts (`CORPORA`).

    Returns the directory. Load it with `verl.models.load_hf_model(out_dir)` or plain transformers.
    """
    out = Path(out_dir).expanduser()
    if corpus not in CORPORA:
        raise ValueError(f"unknown tiny-model corpus {corpus!r}; choose one of {sorted(CORPORA)}")
    tokenizer = build_tiny_tokenizer(vocab_size=vocab_size, corpus=CORPORA[corpus]())
    config = tiny_model_config(tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    make_readable(out)  # a shared cache: readable by its other users (safetensors writes 0600)
    n_params = sum(p.numel() for p in model.parameters())
    (out / "verl_tiny_model.json").write_text(
        json.dumps({"seed": seed, "n_params": n_params, **config_kwargs})
    )
    logger.info("tiny model (%s, %.2fM params) written to %s", config.model_type, n_params / 1e6, out)
    return out
