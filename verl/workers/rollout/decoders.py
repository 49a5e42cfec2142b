"""The decoders behind the fast rollout engine (``fast.py``): a prefill, then one-token steps over an
active batch that can shrink.

``_HFDecoder`` runs any HF causal LM's own forward with a ``DynamicCache``. ``_LeanDecoder`` is a flat
sequence of torch ops over a Llama-style decoder's own parameters (Llama, Qwen2): a KV cache preallocated
per call and written in place, fused q/k/v and gate/up projections, one attention mask for the whole
loop, in HF's op order (float32 RMSNorm, rotate-half RoPE, SDPA with HF's GQA handling), so its logits are
bit-identical to HF's forward in the tested configurations.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl.models.kv_cache import cache_keyword, distinct_rows, new_cache
from verl.models.lora import has_adapters
from verl.models.plumbing import position_ids

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

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache_kwarg, self.prefill_kwargs = _forward_kwargs(model)

    def _prefill_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """HF forward over the prompts: (last-position logits, the filled DynamicCache, position ids).

        Each distinct prompt is run once (GRPO repeats every prompt rollout.n times) and its cache
        rows copied to the rows that share it: the same numbers, 1/n of the prefill.
        """
        distinct, inverse = distinct_rows(torch.cat([input_ids, attention_mask], dim=1))
        cache = new_cache(self.model.config)
        positions = position_ids(attention_mask)
        out = self.model(
            input_ids=input_ids[distinct],
            attention_mask=attention_mask[distinct],
            position_ids=positions[distinct],
            use_cache=True,
            **self.prefill_kwargs,
            **{self.cache_kwarg: cache},
        )
        cache.reorder_cache(inverse)  # the cache rows follow the distinct prompts' (sorted) order
        return out.logits[inverse, -1], cache, positions


class _HFDecoder(_Decoder):
    """Any HF causal LM: its own forward with a DynamicCache and a growing 2D attention mask."""

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        logits, self.cache, position_ids = self._prefill_forward(input_ids, attention_mask)
        self.mask = attention_mask
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


Projection = list[tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclass
class _LayerWeights:
    """One decoder layer's parameters. ``qkv`` and ``gate_up`` are projections whose outputs are
    concatenated: one fused (weight, bias) pair, or the module's own separate ones."""

    ln1: torch.Tensor
    ln1_eps: float
    qkv: Projection
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    ln2: torch.Tensor
    ln2_eps: float
    gate_up: Projection
    down_w: torch.Tensor
    down_b: torch.Tensor | None


def _projection(linears: list[torch.nn.Linear], fuse: bool) -> Projection:
    """The linears as they are, or as one concatenated (weight, bias): a copy, made per call so it
    never goes stale."""
    if not fuse:
        return [(lin.weight, lin.bias) for lin in linears]
    weight = torch.cat([lin.weight for lin in linears])
    if all(lin.bias is None for lin in linears):
        return [(weight, None)]
    biases = [lin.weight.new_zeros(lin.out_features) if lin.bias is None else lin.bias for lin in linears]
    return [(weight, torch.cat(biases))]


def _project(x: torch.Tensor, projection: Projection) -> torch.Tensor:
    if len(projection) == 1:
        return F.linear(x, *projection[0])
    return torch.cat([F.linear(x, w, b) for w, b in projection], dim=-1)


def lean_decoder_supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a plain Llama-style decoder the lean step reproduces exactly.

    Not one with LoRA adapters (`verl.models.lora`): the lean step reads each projection's base weight
    and would decode without the adapters; the model's own forward applies them.
    """
    if has_adapters(model):
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

    The HF forward does the prefill (so the cache starts exactly as HF's); the KV cache is one
    preallocated tensor per layer, written in place at each step; the attention mask for the whole
    loop is one boolean tensor, sliced per step. The op order mirrors the HF modules (RMSNorm in
    float32, rotate-half RoPE, SDPA with the same GQA handling), so the logits match HF's.
    """

    fuse_limit_bytes = 64 * 2**20  # fuse q/k/v and gate/up of models up to ~16M fp32 parameters

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self._gather_weights()

    def _gather_weights(self) -> None:
        """The current parameters, read at every chunk: the actor updates them between calls.

        Fusing q/k/v and gate/up into one matmul each saves ~20% of a step while per-op overhead
        dominates (1M-parameter model: 0.93 vs 1.14 ms per step at batch 1, equal at batch 64) but
        copies those weights, so only models whose copies fit in ``fuse_limit_bytes`` are fused.
        """
        inner = self.model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm, self.final_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.lm_head = self.model.lm_head
        fused_bytes = sum(
            lin.weight.numel() * lin.weight.element_size()
            for layer in inner.layers
            for lin in (
                layer.self_attn.q_proj,
                layer.self_attn.k_proj,
                layer.self_attn.v_proj,
                layer.mlp.gate_proj,
                layer.mlp.up_proj,
            )
        )
        fuse = fused_bytes <= self.fuse_limit_bytes
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                _LayerWeights(
                    ln1=layer.input_layernorm.weight,
                    ln1_eps=layer.input_layernorm.variance_epsilon,
                    qkv=_projection([attn.q_proj, attn.k_proj, attn.v_proj], fuse),
                    o_w=attn.o_proj.weight,
                    o_b=attn.o_proj.bias,
                    ln2=layer.post_attention_layernorm.weight,
                    ln2_eps=layer.post_attention_layernorm.variance_epsilon,
                    gate_up=_projection([mlp.gate_proj, mlp.up_proj], fuse),
                    down_w=mlp.down_proj.weight,
                    down_b=mlp.down_proj.bias,
                )
            )

    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        logits, cache, position_ids = self._prefill_forward(input_ids, attention_mask)
        batch, prompt_len = input_ids.shape
        total = prompt_len + max_new_tokens
        self.keys, self.values = [], []
        for layer_idx in range(len(self.layers)):
            k, v = _cache_layer(cache, layer_idx)
            kbuf = k.new_zeros(batch, self.num_kv_heads, total, self.head_dim)
            vbuf = torch.zeros_like(kbuf)
            kbuf[:, :, :prompt_len] = k
            vbuf[:, :, :prompt_len] = v
            self.keys.append(kbuf)
            self.values.append(vbuf)
        self.valid = torch.ones(batch, total, dtype=torch.bool, device=input_ids.device)
        self.valid[:, :prompt_len] = attention_mask.bool()
        self.no_padding = bool(self.valid.all())
        self.length = prompt_len
        self.next_position = position_ids[:, -1] + 1
        self._rope_table(int(self.next_position.max()) + max_new_tokens)
        return logits

    def _rope_table(self, max_pos: int) -> None:
        """cos and sign-folded sin for every position this call reaches, from the model's rotary module.

        HF rotates with ``x * cos + rotate_half(x) * sin``, rotate_half(x) = cat(-x2, x1). Folding the
        minus sign into the table gives ``x * cos + roll(x, D/2) * sin_rot``: bit-identical, fewer ops.
        """
        cos, sin = self.model.model.rotary_emb(
            self.embed, torch.arange(max_pos, device=self.embed.device)[None]
        )
        cos, sin = cos[0], sin[0]
        half = self.head_dim // 2
        sin_rot = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.rope = torch.stack((cos, sin_rot), dim=1)  # [max_pos, 2, D]

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.valid = self.valid[rows]
        self.no_padding = bool(self.valid.all())
        self.next_position = self.next_position[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        batch = tokens.shape[0]
        t = self.length
        self.length += 1
        heads, kv_heads, head_dim, n_rep = self.num_heads, self.num_kv_heads, self.head_dim, self.n_rep
        rope = self.rope[self.next_position]  # [B, 2, D]
        cos, sin_rot = rope[:, :1], rope[:, 1:]
        self.next_position += 1
        mask = None if self.no_padding else self.valid[:, None, None, : t + 1]
        half = head_dim // 2
        hidden = F.embedding(tokens, self.embed)  # [B, hidden]
        for i, w in enumerate(self.layers):
            x = _rms_norm(hidden, w.ln1, w.ln1_eps)
            qkv = _project(x, w.qkv).view(batch, heads + 2 * kv_heads, head_dim)
            qk = qkv[:, : heads + kv_heads]
            qk = qk * cos + qk.roll(half, dims=-1) * sin_rot
            self.keys[i][:, :, t] = qk[:, heads:]
            self.values[i][:, :, t] = qkv[:, heads + kv_heads :]
            keys, values = self.keys[i][:, :, : t + 1], self.values[i][:, :, : t + 1]
            if mask is None:
                # What HF's sdpa integration does without a mask: GQA inside SDPA.
                q = qk[:, :heads].unsqueeze(2)  # [B, heads, 1, D]
                attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=n_rep > 1)
            else:
                # ... and with one (HF's pack_gqa): a kv head's n_rep query heads act as n_rep queries.
                q = qk[:, :heads].view(batch, kv_heads, n_rep, head_dim)
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            hidden = hidden + F.linear(attn.reshape(batch, heads * head_dim), w.o_w, w.o_b)
            x = _rms_norm(hidden, w.ln2, w.ln2_eps)
            gate, up = _project(x, w.gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, w.down_w, w.down_b)
        hidden = _rms_norm(hidden, self.final_norm, self.final_eps)
        return F.linear(hidden, self.lm_head.weight, self.lm_head.bias)


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
