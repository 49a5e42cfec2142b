"""The decoders behind the fast rollout engine (``fast.py``): a prefill, then one-token steps over an
active batch that can shrink.

``_HFDecoder`` runs any HF causal LM's own forward with a ``DynamicCache``. ``_LeanDecoder`` is a flat
sequence of torch ops over a Llama-style decoder's own parameters (Llama, Qwen2): a KV cache preallocated
per call and written in place, fused q/k/v and gate/up projections, one attention mask for the whole
loop, in HF's op order (float32 RMSNorm, rotate-half RoPE, HF's GQA handling); its logits agree with HF's
forward to float32 rounding (oneDNN's matmuls, ``lean_weights.py``), and greedy output equals HF's
``generate`` in the tested configurations.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from verl.models.kv_cache import cache_keyword, common_prefix, distinct_rows, forward_prompts, new_cache
from verl.models.lora import has_adapters
from verl.models.plumbing import position_ids
from verl.workers.rollout.lean_weights import LeanWeights

# Rope variants whose frequencies depend on the sequence length cannot use a precomputed table.
_LENGTH_DEPENDENT_ROPE = {"dynamic", "longrope"}
_LEAN_MODEL_TYPES = {"llama", "qwen2"}


# ----------------------------------------------------------------------------------------------
# Decoders: prefill + one-token steps over an active batch that can shrink
# ----------------------------------------------------------------------------------------------


class _Decoder:
    """Decoding state of one ``generate_sequences`` chunk: a prefill, then one step per token.

    ``step`` takes the tokens of the active rows and returns their next logits; ``keep_rows``
    shrinks the active batch (indices into it). A new decoder is made per chunk, so the KV cache
    is freed when the chunk is done.
    """

    def __init__(self, model: torch.nn.Module, weights: LeanWeights | None = None) -> None:
        self.model = model
        self.cache_kwarg, self.prefill_kwargs = _forward_kwargs(model)

    @staticmethod
    def prepare(model: torch.nn.Module) -> LeanWeights | None:
        """What every chunk of one ``generate_sequences`` call shares (None: nothing)."""
        return None

    def _prefill_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """HF forward over the prompts: (last-position logits, the filled DynamicCache, position ids, the
        cache's attention mask).

        Each distinct prompt is run once (GRPO repeats every prompt rollout.n times) and its cache
        rows copied to the rows that share it: the same numbers, 1/n of the prefill. The tokens every
        distinct prompt starts with run once (`verl.models.kv_cache.forward_prompts`), so the cache's columns
        are that prefix, then each prompt's rest (the mask returned says which are real).
        """
        distinct, inverse = distinct_rows(torch.cat([input_ids, attention_mask], dim=1))
        cache = new_cache(self.model.config)
        positions = position_ids(attention_mask)
        prompts = input_ids[distinct], attention_mask[distinct]
        prefix = common_prefix(*prompts)
        out = forward_prompts(
            self.model,
            *prompts,
            positions[distinct],
            cache,
            prefix,
            **self.prefill_kwargs,
            **{self.cache_kwarg: cache},
        )
        cache.reorder_cache(inverse)  # the cache rows follow the distinct prompts' (sorted) order
        return out.logits[inverse, -1], cache, positions, prefix.cache_mask()[inverse]


class _HFDecoder(_Decoder):
    """Any HF causal LM: its own forward with a DynamicCache and a growing 2D attention mask."""

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        logits, self.cache, position_ids, self.mask = self._prefill_forward(input_ids, attention_mask)
        self.next_position = position_ids[:, -1:] + 1
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        out = self.model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.mask,
            position_ids=self.next_position,
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.next_position = self.next_position + 1
        return out.logits[:, -1]

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.next_position = self.next_position[rows]


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def _adapters_mergeable(model: torch.nn.Module) -> bool:
    """Whether every adapted module is a plain LoRA linear on one of the lean step's projections."""
    for name, module in model.named_modules():
        if (
            hasattr(module, "modules_to_save")
            or hasattr(module, "lora_embedding_A")
            and module.lora_embedding_A
        ):
            return False
        if not hasattr(module, "lora_A") or not module.lora_A:
            continue
        if name.rsplit(".", 1)[-1] not in _PROJECTIONS or not hasattr(module, "get_delta_weight"):
            return False
        if any(getattr(module, "use_dora", {}).values()) or any(getattr(module, "lora_bias", {}).values()):
            return False
        if not isinstance(module.get_base_layer(), torch.nn.Linear):
            return False
    return True


def lean_decoder_supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain Llama-style decoder the lean step reproduces exactly.

    With LoRA adapters (`verl.models.lora`) only when each one sits on a projection the lean step reads and
    merges into a plain weight (``lean_weights.projection``): no DoRA, no LoRA bias, no adapted embedding,
    no module peft trains whole (``modules_to_save``); the model's own forward applies the others.
    """
    if has_adapters(model) and not _adapters_mergeable(model):
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in _LEAN_MODEL_TYPES:
        return False
    if getattr(config, "hidden_act", "silu") != "silu":
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return False
    if getattr(config, "pretraining_tp", 1) != 1:
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in _LENGTH_DEPENDENT_ROPE:
        return False
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    return inner is not None and all(hasattr(inner, n) for n in needed) and hasattr(model, "lm_head")


class _LeanDecoder(_Decoder):
    """Llama / Qwen2 decode steps written out with torch ops over the module's own parameters.

    The prefill runs the prompts through the same ops (``lean_prefill``; False: the HF forward, its cache
    copied in); the KV cache is one
    preallocated tensor per layer, written in place at each step; the attention mask for the whole
    loop is one additive tensor (0 / -inf, what SDPA makes of a boolean mask at every call), sliced per
    step. The op order mirrors the HF modules (RMSNorm in float32, rotate-half RoPE, SDPA with the same
    GQA handling); with ``LeanWeights.matmul_override = "torch"`` (F.linear) and
    ``decode_attention = "sdpa"`` the logits are bit-identical to HF's; by default the matmuls are oneDNN's
    and the logits agree to float32 rounding.
    """

    def __init__(self, model: torch.nn.Module, weights: LeanWeights | None = None) -> None:
        super().__init__(model)
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.scale = self.head_dim**-0.5
        self.weights = weights if weights is not None else LeanWeights.gather(model)

    @staticmethod
    def prepare(model: torch.nn.Module) -> LeanWeights:
        """The weights every chunk of one ``generate_sequences`` call reads (gathered, fused, packed once)."""
        return LeanWeights.gather(model)

    decode_attention = "matmul"
    """how a step attends: ``"matmul"`` (the cache in float32 whatever the compute dtype; q·Kᵀ, softmax and ·V
    as two float32 batched matmuls, as the actor's update attends short sequences, `verl_sdpa`) or ``"sdpa"``
    (the cache in the compute dtype, torch's fused kernel: HF's choice, bit-identical logits). With one query
    per row the fused kernel's tiling does not pay. float32, 1M model, batch 64, 2 threads, 32 tokens: 16.4k vs
    13.4k tokens/s (benchmarks/rollout_speed.py --rl --decoders). Under bf16 autocast, 2-core AVX-512 / bf16
    EPYC: SmolLM2's 9 / 3 heads over 90 keys 0.45 against 0.72 ms per layer at batch 64; the 1M model's
    generation 18.3k against 13.1k tokens/s; the 4M bench step's 0.149 against 0.156 s (one process, steps
    alternating). A float32 cache takes twice the memory of a bf16 one; the rollout's log-probs are as close
    to the actor's either way (4M model, bf16: mean gap 0.0012 against 0.0013)."""

    lean_prefill = True
    """run the prompts through the lean ops too (False: the model's HF forward, its DynamicCache copied in):
    the HF forward costs ~3x the arithmetic on these small models (1M model, 8 prompts x 14 tokens:
    6.5 vs ~2 ms)"""

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        batch = input_ids.shape[0]
        positions = position_ids(attention_mask)
        self.next_position = positions[:, -1] + 1
        self._rope_table(int(self.next_position.max()) + max_new_tokens)
        if self.lean_prefill:
            logits, layer_kv, rows, cache_mask = self._prefill_lean(input_ids, attention_mask, positions)
        else:
            logits, cache, _, cache_mask = self._prefill_forward(input_ids, attention_mask)
            layer_kv = (_cache_layer(cache, i) for i in range(len(self.weights.layers)))
            rows = None
        # The cache's columns: the prefix all prompts share, then each prompt's rest (`_prefill_lean`).
        prompt_len = cache_mask.shape[1]
        total = prompt_len + max_new_tokens
        self.keys, self.values = [], []
        for k, v in layer_kv:
            # Under autocast v is bf16 while RoPE made k float32 (as in HF, whose attention then casts k to
            # bf16 at every use): for SDPA k is kept in v's dtype, the same numbers without a cast of the cache
            # per step; the matmuls attend in float32 (`decode_attention`).
            dtype = v.dtype if self.decode_attention == "sdpa" else torch.float32
            k, v = k.to(dtype), v.to(dtype)
            vbuf = v.new_empty(batch, self.num_kv_heads, total, self.head_dim, dtype=dtype)
            kbuf = torch.empty_like(vbuf)
            if rows is None:
                kbuf[:, :, :prompt_len] = k
                vbuf[:, :, :prompt_len] = v
            else:  # each row's distinct prompt, gathered straight into the buffer
                torch.index_select(k, 0, rows, out=kbuf[:, :, :prompt_len])
                torch.index_select(v, 0, rows, out=vbuf[:, :, :prompt_len])
            self.keys.append(kbuf)
            self.values.append(vbuf)
        padding = ~cache_mask.bool()
        if padding.any():
            # Columns past the prompt are written before they are read: no mask needed there.
            self.bias = kbuf.new_zeros(batch, total)
            self.bias[:, :prompt_len].masked_fill_(padding, float("-inf"))
        else:
            self.bias = None
        self.length = prompt_len
        return logits

    def _prefill_lean(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
        """The prompts' forward in the step's ops, each distinct prompt computed once (GRPO repeats every
        prompt rollout.n times) and the tokens they all start with once (`verl.models.kv_cache.common_prefix`):
        (every row's last-position logits, each layer's (keys, values) of the distinct prompts, the distinct
        prompt of each row, the attention mask of those keys for every row).
        """
        w = self.weights
        distinct, inverse = distinct_rows(torch.cat([input_ids, attention_mask], dim=1))
        ids, mask, pos = input_ids[distinct], attention_mask[distinct], positions[distinct]
        prefix = common_prefix(ids, mask)
        past = None
        if prefix.length:
            span = prefix.columns
            _, past = self._lean_layers(ids[:1, span], mask[:1, span], pos[:1, span])
        start = prefix.start
        hidden, layer_kv = self._lean_layers(ids[:, start:], prefix.suffix_mask, pos[:, start:], past)
        last = _rms_norm(hidden[:, -1], w.final_norm, w.final_eps)
        return w.lm_head(last)[inverse], layer_kv, inverse, prefix.cache_mask()[inverse]

    def _lean_layers(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pos: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Left-padded tokens through every layer: (the last hidden states ``[n, S, hidden]``, each layer's
        keys and values ``[n, kv_heads, P + S, D]``). ``past``: each layer's keys and values of a prefix all
        rows share (one row, P columns, every one attended to; None: P = 0), placed before theirs.

        The attention mask is causal over each row's real tokens; a padding position attends to itself
        only (its output is never read, but it becomes a key and value, masked out, that must be finite).
        """
        w = self.weights
        heads, kv_heads, head_dim, n_rep = self.num_heads, self.num_kv_heads, self.head_dim, self.n_rep
        valid = attention_mask.bool()
        n, width = ids.shape
        shared = 0 if past is None else past[0][0].shape[2]
        rope = self.rope[pos]  # [n, S, 2, D]
        cos, sin_rot = rope[:, :, None, 0], rope[:, :, None, 1]  # [n, S, 1, D]
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=ids.device)
        allowed = (causal & valid[:, None, :]) | eye  # [n, S(query), S(key)]
        allowed = torch.cat([allowed.new_ones(n, width, shared), allowed], dim=-1)
        half = head_dim // 2
        hidden = F.embedding(ids, w.embed)  # [n, S, hidden]
        layer_kv, bias = [], None
        for i, layer in enumerate(w.layers):
            x = _rms_norm(hidden, layer.ln1, layer.ln1_eps)
            qkv = layer.qkv(x).view(n, width, heads + 2 * kv_heads, head_dim)
            qk = qkv[:, :, : heads + kv_heads]
            qk = qk * cos + qk.roll(half, dims=-1) * sin_rot
            if bias is None:
                bias = torch.zeros(allowed.shape, dtype=qk.dtype, device=ids.device)
                bias = bias.masked_fill_(~allowed, float("-inf"))[:, None]  # [n, 1, S, P + S]
            q = qk[:, :, :heads].transpose(1, 2)  # [n, heads, S, D]
            k = qk[:, :, heads:].transpose(1, 2)  # [n, kv_heads, S, D]
            v = qkv[:, :, heads + kv_heads :].transpose(1, 2)
            if past is not None:
                past_k, past_v = past[i]
                k = torch.cat([past_k.expand(n, -1, -1, -1), k], dim=2)
                v = torch.cat([past_v.expand(n, -1, -1, -1), v], dim=2)
            layer_kv.append((k, v))
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=n_rep > 1)
            hidden = hidden + layer.o(attn.transpose(1, 2).reshape(n, width, heads * head_dim))
            x = _rms_norm(hidden, layer.ln2, layer.ln2_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        return hidden, layer_kv

    def _rope_table(self, max_pos: int) -> None:
        """cos and sign-folded sin for every position this call reaches, from the model's rotary module.

        HF rotates with ``x * cos + rotate_half(x) * sin``, rotate_half(x) = cat(-x2, x1). Folding the
        minus sign into the table gives ``x * cos + roll(x, D/2) * sin_rot``: bit-identical, fewer ops.
        """
        embed = self.weights.embed
        cos, sin = self.model.model.rotary_emb(embed, torch.arange(max_pos, device=embed.device)[None])
        cos, sin = cos[0], sin[0]
        half = self.head_dim // 2
        sin_rot = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.rope = torch.stack((cos, sin_rot), dim=1)  # [max_pos, 2, D]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the columns written so far are copied; the rest of the new buffers is written later."""
        t = self.length
        self.keys = [_select_rows(k, rows, t) for k in self.keys]
        self.values = [_select_rows(v, rows, t) for v in self.values]
        if self.bias is not None:
            self.bias = self.bias[rows]
            if not bool(self.bias.isinf().any()):
                self.bias = None
        self.next_position = self.next_position[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        w = self.weights
        batch = tokens.shape[0]
        t = self.length
        self.length += 1
        heads, kv_heads, head_dim, n_rep = self.num_heads, self.num_kv_heads, self.head_dim, self.n_rep
        rope = self.rope[self.next_position]  # [B, 2, D]
        cos, sin_rot = rope[:, :1], rope[:, 1:]
        self.next_position += 1
        mask = None if self.bias is None else self.bias[:, None, None, : t + 1]
        half = head_dim // 2
        hidden = F.embedding(tokens, w.embed)  # [B, hidden]
        for i, layer in enumerate(w.layers):
            x = _rms_norm(hidden, layer.ln1, layer.ln1_eps)
            qkv = layer.qkv(x).view(batch, heads + 2 * kv_heads, head_dim)
            qk = qkv[:, : heads + kv_heads]
            qk = qk * cos + qk.roll(half, dims=-1) * sin_rot
            self.keys[i][:, :, t] = qk[:, heads:]
            self.values[i][:, :, t] = qkv[:, heads + kv_heads :]
            keys, values = self.keys[i][:, :, : t + 1], self.values[i][:, :, : t + 1]
            # A kv head's n_rep query heads act as n_rep queries of it (HF's pack_gqa).
            q = qk[:, :heads].view(batch, kv_heads, n_rep, head_dim)
            if self.decode_attention == "matmul":
                # grouped_matmul_attention's arithmetic (the update's, verl_sdpa), written out: the call's mask
                # clamp and reshapes per layer cost 4-9% of a 4M model's generation (bit-identical outputs)
                with torch.autocast(tokens.device.type, enabled=False):  # float32, as the cache
                    # [B, kv_heads, n_rep, t+1]
                    scores = torch.matmul(q.float() * self.scale, keys.transpose(-1, -2))
                    if mask is not None:
                        scores = scores + mask
                    attn = torch.matmul(scores.softmax(dim=-1), values).to(qkv.dtype)
            elif mask is None:
                # What HF's sdpa integration does without a mask: GQA inside SDPA.
                q = q.reshape(batch, heads, 1, head_dim).to(keys.dtype)
                attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=n_rep > 1)
            else:
                attn = F.scaled_dot_product_attention(q.to(keys.dtype), keys, values, attn_mask=mask)
            hidden = hidden + layer.o(attn.reshape(batch, heads * head_dim))
            x = _rms_norm(hidden, layer.ln2, layer.ln2_eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        hidden = _rms_norm(hidden, w.final_norm, w.final_eps)
        return w.lm_head(hidden)


def _select_rows(buffer: torch.Tensor, rows: torch.Tensor, written: int) -> torch.Tensor:
    """``buffer[rows]`` where only the first ``written`` columns (dim 2) hold data."""
    out = buffer.new_empty((len(rows), *buffer.shape[1:]))
    torch.index_select(buffer[:, :, :written], 0, rows, out=out[:, :, :written])
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's Llama/Qwen2 RMSNorm (float32 statistics, weight applied in the input dtype).

    For float32 ``F.rms_norm`` is one op and bit-identical to HF's five; other dtypes use HF's ops.
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _cache_layer(cache, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one layer of a DynamicCache, across transformers versions."""
    if hasattr(cache, "layers"):
        return cache.layers[layer_idx].keys, cache.layers[layer_idx].values
    return cache.key_cache[layer_idx], cache.value_cache[layer_idx]


def _forward_kwargs(model: torch.nn.Module) -> tuple[str, dict]:
    """The cache keyword and the prefill extras the model's forward takes, across transformers versions.

    transformers 5 renamed ``past_key_values`` to ``cache``; ``logits_to_keep=1`` (older:
    ``num_logits_to_keep``) makes the prefill compute the last position's logits only.
    """
    params = inspect.signature(model.forward).parameters
    cache_kwarg = cache_keyword(model)
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return cache_kwarg, {name: 1}
    return cache_kwarg, {}
