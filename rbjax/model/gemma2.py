"""Gemma 2 in Flax (linen) (HF ``model_type`` gemma2).

Architecture as HF ``Gemma2ForCausalLM`` (Gemma Team 2024): the token embedding scaled by √d (the factor rounded to
the compute dtype, as HF rounds it to the weights' dtype), decoder layers with RMSNorm ``x·(1 + w)`` *before and
after* both the attention and the feed-forward block (``input_layernorm`` → attention → ``post_attention_layernorm``,
``pre_feedforward_layernorm`` → GeGLU MLP → ``post_feedforward_layernorm``), rotary grouped-query attention with
scores scaled by ``query_pre_attn_scalar^-½`` and soft-capped ``c·tanh(s/c)`` (``attn_logit_softcapping``),
local sliding-window attention on the layers ``layer_types`` marks ``sliding_attention`` (default: every other
layer, starting with the first), a final RMSNorm, the LM head tied to the embedding, and final-logit soft-capping
(``final_logit_softcapping``; the module applies it to the logits it returns, and the chunked NLL applies it through
:attr:`rbjax.model.registry.Family.logit_softcap`).

Parameter pytree: as :mod:`rbjax.model.llama` (``embed_tokens``, ``layers_i.{input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, pre_feedforward_layernorm, mlp.{gate,up,down}_proj, post_feedforward_layernorm}``,
``norm``, ``lm_head`` only when untied); norm weights are the ``w`` of ``1 + w`` (zero at init).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from rbjax.model import hf_config as hc
from rbjax.model.layers import (
    ACTIVATIONS,
    Dropout,
    KVCache,
    Linear,
    RMSNorm,
    apply_rope,
    attention_inputs,
    causal_lm_outputs,
    check_query_positions,
    decoder_layers,
    dot_product_attention,
    gather_positions,
    output_matrix,
    rope_cos_sin,
    rope_inv_freq,
    select_queries,
    write_cache,
)

#: transformers Gemma2Config fields read and implemented
HANDLED = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "hidden_activation", "hidden_act", "max_position_embeddings",
           "rms_norm_eps", "pad_token_id", "eos_token_id", "bos_token_id", "tie_word_embeddings", "rope_parameters",
           "rope_scaling", "rope_theta", "attention_bias", "attention_dropout", "query_pre_attn_scalar",
           "sliding_window", "layer_types", "final_logit_softcapping", "attn_logit_softcapping",
           "use_bidirectional_attention"}
REFUSED = {"use_bidirectional_attention": "true (bidirectional attention is not a causal LM)",
           "rope_parameters": "rope_type other than default, linear, llama3",
           "rope_scaling": "as rope_parameters (the transformers 4.x spelling)",
           "hidden_activation": "activations outside rbjax.model.layers.ACTIVATIONS",
           "layer_types": "entries other than full_attention / sliding_attention"}


@dataclasses.dataclass(frozen=True)
class Gemma2Config:
    """Gemma 2 hyper-parameters (HF ``config.json`` names; ``rope`` and ``layer_windows`` derived). Defaults: a tiny
    model, for tests."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 128
    rms_norm_eps: float = 1e-6
    rope: hc.Rope = hc.Rope()
    attention_bias: bool = False
    attention_dropout: float = 0.0
    query_pre_attn_scalar: float = 16
    sliding_window: int | None = 8
    layer_windows: tuple = (8, None)
    final_logit_softcapping: float | None = 30.0
    attn_logit_softcapping: float | None = 50.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: Any = 2
    eos_token_id: Any = 1
    pad_token_id: Any = 0

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    @property
    def width(self) -> int:
        return self.hidden_size

    def window(self, i: int) -> int | None:
        return self.layer_windows[i] if self.layer_windows else None

    @classmethod
    def from_hf(cls, d: dict, source: str) -> "Gemma2Config":
        """From a ``config.json`` dict. Raises ValueError naming a malformed or unsupported field and its value."""
        hc.check_common(d, source)
        hc.warn_unknown(d, HANDLED | set(REFUSED), source, "gemma2")
        if d.get("use_bidirectional_attention"):
            raise hc.refuse(source, "use_bidirectional_attention", d["use_bidirectional_attention"],
                            "rbjax runs causal LMs")
        V = hc.get_int(d, "vocab_size", None, source)
        D = hc.get_int(d, "hidden_size", None, source)
        N = hc.get_int(d, "num_hidden_layers", None, source)
        H = hc.get_int(d, "num_attention_heads", None, source)
        KV = hc.get_int(d, "num_key_value_heads", H, source)
        if H % KV:
            raise hc.refuse(source, "num_key_value_heads", KV, f"must divide num_attention_heads={H}")
        hd = d.get("head_dim")
        hd = D // H if hd is None else hc.get_int(d, "head_dim", None, source)
        if hd % 2:
            raise ValueError(f"{source}: config field head_dim must be even for rotary embeddings, got {hd}")
        P = hc.get_int(d, "max_position_embeddings", 8192, source)
        act_key = "hidden_activation" if d.get("hidden_activation") is not None else "hidden_act"
        act = hc.get_activation(d, act_key, "gelu_pytorch_tanh", source, ACTIVATIONS)
        rope = hc.read_rope(d, source, max_position_embeddings=P)
        if rope.partial_rotary_factor != 1.0:
            raise hc.refuse(source, "partial_rotary_factor", rope.partial_rotary_factor, "Gemma 2 rotates whole heads")
        window = hc.get_int(d, "sliding_window", 4096, source, allow_none=True)
        types = d.get("layer_types")
        if types is None:  # transformers Gemma2Config.__post_init__: sliding, full, sliding, …
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(N)]
        if not (isinstance(types, list) and len(types) == N):
            raise ValueError(f"{source}: config field layer_types must list {N} layer types, got {types!r}")
        for t in types:
            if t not in ("full_attention", "sliding_attention"):
                raise hc.refuse(source, "layer_types", t, "supported layer types: full_attention, sliding_attention")
        windows = tuple(window if t == "sliding_attention" else None for t in types)
        if all(w is None for w in windows):
            windows = ()
        sp = hc.read_special_tokens(d, V, source, {"bos": 2, "eos": 1, "pad": 0})
        return cls(vocab_size=V, hidden_size=D, intermediate_size=hc.get_int(d, "intermediate_size", None, source),
                   num_hidden_layers=N, num_attention_heads=H, num_key_value_heads=KV, head_dim=hd,
                   hidden_activation=act, max_position_embeddings=P,
                   rms_norm_eps=hc.get_float(d, "rms_norm_eps", 1e-6, source, positive=True), rope=rope,
                   attention_bias=hc.get_bool(d, "attention_bias", False, source),
                   attention_dropout=hc.get_float(d, "attention_dropout", 0.0, source),
                   query_pre_attn_scalar=hc.get_float(d, "query_pre_attn_scalar", 256, source, positive=True),
                   sliding_window=window, layer_windows=windows,
                   final_logit_softcapping=hc.get_float(d, "final_logit_softcapping", 30.0, source, allow_none=True,
                                                        positive=True),
                   attn_logit_softcapping=hc.get_float(d, "attn_logit_softcapping", 50.0, source, allow_none=True,
                                                       positive=True),
                   tie_word_embeddings=hc.get_bool(d, "tie_word_embeddings", True, source),
                   initializer_range=hc.get_float(d, "initializer_range", 0.02, source),
                   bos_token_id=sp["bos"], eos_token_id=sp["eos"], pad_token_id=sp["pad"])

    def to_hf(self) -> dict:
        """The ``config.json`` that ``transformers`` (4.x and 5.x) reads back as this model."""
        q = self.query_pre_attn_scalar
        d = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "vocab_size": self.vocab_size,
             "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
             "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
             "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
             "hidden_activation": self.hidden_activation, "max_position_embeddings": self.max_position_embeddings,
             "rms_norm_eps": self.rms_norm_eps, "attention_bias": self.attention_bias,
             "attention_dropout": self.attention_dropout, "query_pre_attn_scalar": int(q) if q == int(q) else q,
             "sliding_window": self.sliding_window,
             "layer_types": ["sliding_attention" if self.window(i) is not None else "full_attention"
                             for i in range(self.num_hidden_layers)],
             "final_logit_softcapping": self.final_logit_softcapping,
             "attn_logit_softcapping": self.attn_logit_softcapping, "tie_word_embeddings": self.tie_word_embeddings,
             "initializer_range": self.initializer_range, "bos_token_id": hc.hf_id(self.bos_token_id),
             "eos_token_id": hc.hf_id(self.eos_token_id), "pad_token_id": hc.hf_id(self.pad_token_id)}
        d.update(self.rope.to_hf())
        return d


class _Attention(nn.Module):
    config: Gemma2Config
    layer: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, ai, cos, sin, deterministic, kv=None, positions=None):
        c = self.config
        B, L, _ = x.shape
        xq, cq, sq = x, cos, sin
        if positions is not None:  # the queries at ``positions`` only (the keys and values at every position)
            xq, cq, sq = (gather_positions(t, positions) for t in (x, cos, sin))
            ai = select_queries(ai, positions)
        std, b = c.initializer_range, c.attention_bias
        q = Linear(c.num_attention_heads * c.head_dim, b, std, self.dtype, name="q_proj")(xq)
        k = Linear(c.num_key_value_heads * c.head_dim, b, std, self.dtype, name="k_proj")(x)
        v = Linear(c.num_key_value_heads * c.head_dim, b, std, self.dtype, name="v_proj")(x)
        q = apply_rope(q.reshape(B, xq.shape[1], c.num_attention_heads, c.head_dim), cq, sq)
        k = apply_rope(k.reshape(B, L, c.num_key_value_heads, c.head_dim), cos, sin)
        v = v.reshape(B, L, c.num_key_value_heads, c.head_dim)
        if kv is not None:
            k, v = kv = write_cache(kv, k, v, ai.index)
        drop = None
        if c.attention_dropout and not deterministic:
            drop = lambda p: Dropout(c.attention_dropout)(p, deterministic=False)  # noqa: E731
        out = dot_product_attention(q, k, v, ai, scale=c.query_pre_attn_scalar ** -0.5, dtype=self.dtype,
                                    softcap=c.attn_logit_softcapping, window=c.window(self.layer), dropout=drop)
        return Linear(c.hidden_size, b, std, self.dtype, name="o_proj")(out), kv


class _MLP(nn.Module):
    config: Gemma2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        c = self.config
        std = c.initializer_range
        g = Linear(c.intermediate_size, False, std, self.dtype, name="gate_proj")(x)
        u = Linear(c.intermediate_size, False, std, self.dtype, name="up_proj")(x)
        return Linear(c.hidden_size, False, std, self.dtype, name="down_proj")(ACTIVATIONS[c.hidden_activation](g) * u)


class _Layer(nn.Module):
    config: Gemma2Config
    layer: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, ai, cos, sin, deterministic, kv=None, positions=None):
        eps = self.config.rms_norm_eps
        a, kv = _Attention(self.config, self.layer, self.dtype, name="self_attn")(
            RMSNorm(eps, 1.0, name="input_layernorm")(x), ai, cos, sin, deterministic, kv, positions)
        x = x if positions is None else gather_positions(x, positions)
        x = x + RMSNorm(eps, 1.0, name="post_attention_layernorm")(a)
        h = _MLP(self.config, self.dtype, name="mlp")(RMSNorm(eps, 1.0, name="pre_feedforward_layernorm")(x))
        return x + RMSNorm(eps, 1.0, name="post_feedforward_layernorm")(h), kv


class Gemma2ForCausalLM(nn.Module):
    """Gemma 2 causal LM with the call signature and outputs of :class:`rbjax.model.gpt2.GPT2LMHeadModel`
    (see :class:`rbjax.model.llama.LlamaForCausalLM`). The returned logits are soft-capped
    (``final_logit_softcapping``) as HF returns them; ``hidden`` is the final-normed states, *before* the head and
    the cap."""

    config: Gemma2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, position_ids=None, deterministic: bool = True,
                 return_logits: bool = True, cache: KVCache | None = None, query_positions=None):
        c = self.config
        B, L = input_ids.shape
        check_query_positions(query_positions, cache)
        ai = attention_inputs(B, L, attention_mask, position_ids, cache)
        r = c.rope
        cos, sin = rope_cos_sin(ai.q_pos, rope_inv_freq(c.head_dim, r.theta, r.type, r.factor, r.low_freq_factor,
                                                         r.high_freq_factor, r.original_max_position_embeddings))
        embed = nn.Embed(c.vocab_size, c.hidden_size, embedding_init=nn.initializers.normal(c.initializer_range),
                         name="embed_tokens")
        normalizer = jnp.asarray(c.hidden_size ** 0.5, self.dtype).astype(jnp.float32)
        x = embed(input_ids).astype(jnp.float32) * normalizer
        x, new_kv = decoder_layers(lambda i: _Layer(c, i, self.dtype, name=f"layers_{i}"), c.num_hidden_layers, x, ai,
                                   cos, sin, deterministic, cache, query_positions)
        hidden = RMSNorm(c.rms_norm_eps, 1.0, name="norm")(x)
        head = output_matrix(self, embed.embedding, c.tie_word_embeddings, "lm_head", c.vocab_size, c.hidden_size,
                             c.initializer_range)
        return causal_lm_outputs(hidden, head, self.dtype, return_logits, cache, new_kv, ai, L,
                                 c.final_logit_softcapping)


def hf_keys(c: Gemma2Config) -> list:
    """The HF key map of ``c``: ``(HF state-dict key, parameter path, transposed)`` for every weight
    (:mod:`rbjax.model.keymap`; the registry's :class:`rbjax.model.registry.Family` converts with it)."""
    e = [("model.embed_tokens.weight", ("embed_tokens", "embedding"), False),
         ("model.norm.weight", ("norm", "scale"), False)]
    if not c.tie_word_embeddings:
        e.append(("lm_head.weight", ("lm_head", "embedding"), False))
    for i in range(c.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"layers_{i}"
        for ln in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm"):
            e.append((f"{p}{ln}.weight", (q, ln, "scale"), False))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            e.append((f"{p}self_attn.{name}.weight", (q, "self_attn", name, "kernel"), True))
            if c.attention_bias:
                e.append((f"{p}self_attn.{name}.bias", (q, "self_attn", name, "bias"), False))
        for name in ("gate_proj", "up_proj", "down_proj"):
            e.append((f"{p}mlp.{name}.weight", (q, "mlp", name, "kernel"), True))
    return e
