"""A tiny GGUF file (llama.cpp's format) written from a tiny HuggingFace model directory, for tests.

The real model verl reads as GGUF (SmolLM2, ``verl model fetch smollm2``) is a 90 MB package; this writes
the same kind of file from ``verl.models.make_tiny_model``'s output in well under a second, so the GGUF
path (transformers' reader, ``verl.models.gguf.convert_gguf``, ``prepare``) is tested without it.

Layout, as llama.cpp's ``convert_hf_to_gguf.py`` writes a llama / qwen2 model and transformers reads it:

* ``general.architecture`` (``llama`` or ``qwen2``) and ``{arch}.*`` hyperparameters: the keys transformers
  maps to a config (``GGUF_CONFIG_MAPPING`` in ``transformers/integrations/ggml.py``: context length, block
  count, widths, head counts, rope base, RMS-norm epsilon, vocabulary size).
* every tensor as float32 under its GGUF name (``token_embd.weight``, ``blk.N.attn_q.weight``, ...), named
  with gguf's own ``get_tensor_name_map``, the table transformers inverts when loading. Tied embeddings
  are written once (no ``output.weight``: its absence is how transformers knows they are tied). llama's q
  and k rows are permuted as llama.cpp does (its rotary embedding pairs adjacent dimensions, transformers'
  pairs the two halves of a head); transformers' ``LlamaTensorProcessor`` reverses that on load.
* the tokenizer as ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE) with ``pre = "qwen2"`` (the split
  regex the tiny tokenizer uses), the tokens in id order, their types (the special tokens CONTROL, the
  rest NORMAL), the merges, the eos / padding ids and ``tokenizer.chat_template``.

Load the file from a folder of its own: ``AutoTokenizer.from_pretrained(folder, gguf_file=name)`` also
reads a ``tokenizer_config.json`` lying next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_ARCHES = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q / k row order: within each head, interleave the two rotary halves."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_tiny_gguf(hf_dir: Path, out_file: Path) -> None:
    """Write the llama or qwen2 model and tokenizer in ``hf_dir`` as a float32 GGUF file ``out_file``."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    config = model.config
    arch = config.model_type
    if arch not in GGUF_ARCHES:
        raise ValueError(f"write_tiny_gguf writes {sorted(GGUF_ARCHES)}, not {arch!r}")
    head_dim = config.hidden_size // config.num_attention_heads

    writer = gguf.GGUFWriter(out_file, arch)
    writer.add_name(Path(hf_dir).name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    names = gguf.get_tensor_name_map(GGUF_ARCHES[arch], config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name}")
        data = tensor.detach().float().numpy()
        if arch == "llama" and name.endswith("attn_q.weight"):
            data = llama_cpp_permute(data, config.num_attention_heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            data = llama_cpp_permute(data, config.num_key_value_heads)
        writer.add_tensor(name, np.ascontiguousarray(data))

    # The BPE model as tokenizers serializes it: tokens already in the byte-level alphabet.
    serialized = json.loads(tokenizer.backend_tokenizer.to_str())
    bpe = serialized["model"]
    tokens = sorted(bpe["vocab"], key=bpe["vocab"].get)
    assert [bpe["vocab"][token] for token in tokens] == list(range(len(tokens))), "token ids have gaps"
    special = {added["content"] for added in serialized["added_tokens"] if added["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if token in special else gguf.TokenType.NORMAL for token in tokens]
    )
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    if tokenizer.bos_token_id is not None:
        writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
