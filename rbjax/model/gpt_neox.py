"""GPT-NeoX in Flax (linen): the Pythia models (HF ``model_type`` gpt_neox).

Architecture as HF ``GPTNeoXForCausalLM`` (Black et al. 2022; Biderman et al. 2023): token embedding ``embed_in``,
layers of LayerNorm → rotary multi-head attention with a fused ``query_key_value`` projection (per head
``[q | k | v]``) and LayerNorm → MLP (``dense_h_to_4h``, activation, ``dense_4h_to_h``), combined either as a
*parallel* residual ``x + attn(ln1(x)) + mlp(ln2(x))`` (``use_parallel_residual``, Pythia) or sequentially
``h = x + attn(ln1(x)); h + mlp(ln2(h))``; partial rotary embeddings on the first ``rotary_pct`` of each head
(Pythia: 0.25) with base ``rotary_emb_base``; a final LayerNorm and an untied output matrix ``embed_out``
(or tied to ``embed_in`` with ``tie_word_embeddings``).

Parameter pytree (kernels (in, out))::

    {'embed_in': {'embedding': (V, d)},
     'layers_0': {'input_layernorm': {'scale', 'bias'}, 'post_attention_layernorm': {'scale', 'bias'},
                  'attention': {'query_key_value': {'kernel': (d, 3d), 'bias'}, 'dense': {'kernel': (d, d), 'bias'}},
                  'mlp': {'dense_h_to_4h': {'kernel': (d, I), 'bias'}, 'dense_4h_to_h': {'kernel': (I, d), 'bias'}}},
     …, 'final_layer_norm': {'scale', 'bias'}, 'embed_out': {'embedding': (V, d)}}  # embed_out only when untied
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from rbjax.model import hf_config as hc
from rbjax.model.layers import (
    ACTIVATIONS,
    Dropout,
    KVCache,
    Linear,
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

#: transformers GPTNeoXConfig fields read and implemented (legacy spellings rotary_pct / rotary_emb_base included)
HANDLED = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
           "hidden_act", "attention_dropout", "hidden_dropout", "max_position_embeddings", "layer_norm_eps",
           "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings", "use_parallel_residual",
           "rope_parameters", "rope_scaling", "rope_theta", "rotary_pct", "rotary_emb_base", "partial_rotary_factor",
           "attention_bias"}
REFUSED = {"rope_parameters": "rope_type other than default, linear, llama3",
           "rope_scaling": "as rope_parameters (the transformers 4.x spelling)",
           "hidden_act": "activations outside rbjax.model.layers.ACTIVATIONS"}


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig:
    """GPT-NeoX hyper-parameters (HF ``config.json`` names; ``rope`` derived). Defaults: a tiny model, for tests."""

    vocab_size: int = 256
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    hidden_act: str = "gelu"
    max_position_embeddings: int = 128
    layer_norm_eps: float = 1e-5
    rope: hc.Rope = hc.Rope(partial_rotary_factor=0.25)
    use_parallel_residual: bool = True
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    initializer_range: float = 0.02
    bos_token_id: Any = 0
    eos_token_id: Any = 0
    pad_token_id: Any = None

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    @property
    def width(self) -> int:
        return self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_ndims(self) -> int:
        return int(self.head_dim * self.rope.partial_rotary_factor)

    @classmethod
    def from_hf(cls, d: dict, source: str) -> "GPTNeoXConfig":
        """From a ``config.json`` dict. Raises ValueError naming a malformed or unsupported field and its value."""
        hc.check_common(d, source)
        hc.warn_unknown(d, HANDLED | set(REFUSED), source, "gpt_neox")
        V = hc.get_int(d, "vocab_size", None, source)
        D = hc.get_int(d, "hidden_size", None, source)
        H = hc.get_int(d, "num_attention_heads", None, source)
        if D % H:
            raise ValueError(f"{source}: hidden_size={D} is not divisible by num_attention_heads={H}")
        P = hc.get_int(d, "max_position_embeddings", 2048, source)
        rope = hc.read_rope(d, source, max_position_embeddings=P, theta_keys=("rope_theta", "rotary_emb_base"),
                            partial_keys=("partial_rotary_factor", "rotary_pct"), default_partial=0.25)
        rot = int(D // H * rope.partial_rotary_factor)
        if rot < 2 or rot % 2:
            raise ValueError(f"{source}: rotary_pct={rope.partial_rotary_factor} gives {rot} rotary dimensions per "
                             f"head of {D // H}; need an even number >= 2")
        sp = hc.read_special_tokens(d, V, source, {"bos": 0, "eos": 2})
        return cls(vocab_size=V, hidden_size=D, num_hidden_layers=hc.get_int(d, "num_hidden_layers", None, source),
                   num_attention_heads=H, intermediate_size=hc.get_int(d, "intermediate_size", None, source),
                   hidden_act=hc.get_activation(d, "hidden_act", "gelu", source, ACTIVATIONS),
                   max_position_embeddings=P,
                   layer_norm_eps=hc.get_float(d, "layer_norm_eps", 1e-5, source, positive=True), rope=rope,
                   use_parallel_residual=hc.get_bool(d, "use_parallel_residual", True, source),
                   attention_bias=hc.get_bool(d, "attention_bias", True, source),
                   tie_word_embeddings=hc.get_bool(d, "tie_word_embeddings", False, source),
                   attention_dropout=hc.get_float(d, "attention_dropout", 0.0, source),
                   hidden_dropout=hc.get_float(d, "hidden_dropout", 0.0, source),
                   initializer_range=hc.get_float(d, "initializer_range", 0.02, source),
                   bos_token_id=sp["bos"], eos_token_id=sp["eos"], pad_token_id=sp["pad"])

    def to_hf(self) -> dict:
        """The ``config.json`` that ``transformers`` (4.x and 5.x) reads back as this model."""
        d = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": self.vocab_size,
             "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
             "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size,
             "hidden_act": self.hidden_act, "max_position_embeddings": self.max_position_embeddings,
             "layer_norm_eps": self.layer_norm_eps, "use_parallel_residual": self.use_parallel_residual,
             "attention_bias": self.attention_bias, "tie_word_embeddings": self.tie_word_embeddings,
             "attention_dropout": self.attention_dropout, "hidden_dropout": self.hidden_dropout,
             "initializer_range": self.initializer_range, "bos_token_id": hc.hf_id(self.bos_token_id),
             "eos_token_id": hc.hf_id(self.eos_token_id), "pad_token_id": hc.hf_id(self.pad_token_id),
             "rotary_pct": self.rope.partial_rotary_factor, "rotary_emb_base": self.rope.theta}
        d["rope_scaling"] = self.rope.to_hf()["rope_scaling"]  # GPT-NeoX spells the theta rotary_emb_base
        return d


class _Attention(nn.Module):
    config: GPTNeoXConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, ai, cos, sin, deterministic, kv=None, positions=None):
        c = self.config
        B, L, d = x.shape
        H, hd = c.num_attention_heads, c.head_dim
        qkv = Linear(3 * d, c.attention_bias, c.initializer_range, self.dtype, name="query_key_value")(x)
        q, k, v = jnp.split(qkv.reshape(B, L, H, 3 * hd), 3, axis=-1)  # per head [q | k | v]
        k = apply_rope(k, cos, sin)
        if positions is not None:  # the queries at ``positions`` only (the fused projection computes all anyway)
            q, cos, sin = (gather_positions(t, positions) for t in (q, cos, sin))
            ai = select_queries(ai, positions)
        q = apply_rope(q, cos, sin)
        if kv is not None:
            k, v = kv = write_cache(kv, k, v, ai.index)
        drop = None
        if c.attention_dropout and not deterministic:
            drop = lambda p: Dropout(c.attention_dropout)(p, deterministic=False)  # noqa: E731
        out = dot_product_attention(q, k, v, ai, scale=hd ** -0.5, dtype=self.dtype, dropout=drop)
        return Linear(d, c.attention_bias, c.initializer_range, self.dtype, name="dense")(out), kv


class _MLP(nn.Module):
    config: GPTNeoXConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        c = self.config
        h = Linear(c.intermediate_size, True, c.initializer_range, self.dtype, name="dense_h_to_4h")(x)
        return Linear(c.hidden_size, True, c.initializer_range, self.dtype, name="dense_4h_to_h")(
            ACTIVATIONS[c.hidden_act](h))


class _Layer(nn.Module):
    config: GPTNeoXConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, ai, cos, sin, deterministic, kv=None, positions=None):
        c = self.config
        drop = Dropout(c.hidden_dropout)
        a, kv = _Attention(c, self.dtype, name="attention")(
            nn.LayerNorm(c.layer_norm_eps, name="input_layernorm")(x), ai, cos, sin, deterministic, kv, positions)
        a = drop(a, deterministic=deterministic)
        if positions is not None:
            x = gather_positions(x, positions)
        ln2 = nn.LayerNorm(c.layer_norm_eps, name="post_attention_layernorm")
        mlp = _MLP(c, self.dtype, name="mlp")
        if c.use_parallel_residual:
            return x + a + drop(mlp(ln2(x)), deterministic=deterministic), kv
        h = x + a
        return h + drop(mlp(ln2(h)), deterministic=deterministic), kv


class GPTNeoXForCausalLM(nn.Module):
    """GPT-NeoX causal LM with the call signature and outputs of :class:`rbjax.model.gpt2.GPT2LMHeadModel`
    (see :class:`rbjax.model.llama.LlamaForCausalLM`: (B, L) or (B, L, L) masks, ``position_ids`` for RoPE,
    ``return_logits``, a :class:`rbjax.model.layers.KVCache`); hidden = the states after ``final_layer_norm``."""

    config: GPTNeoXConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, position_ids=None, deterministic: bool = True,
                 return_logits: bool = True, cache: KVCache | None = None, query_positions=None):
        c = self.config
        B, L = input_ids.shape
        check_query_positions(query_positions, cache)
        ai = attention_inputs(B, L, attention_mask, position_ids, cache)
        r = c.rope
        cos, sin = rope_cos_sin(ai.q_pos, rope_inv_freq(c.rotary_ndims, r.theta, r.type, r.factor, r.low_freq_factor,
                                                         r.high_freq_factor, r.original_max_position_embeddings))
        embed = nn.Embed(c.vocab_size, c.hidden_size, embedding_init=nn.initializers.normal(c.initializer_range),
                         name="embed_in")
        x = Dropout(c.hidden_dropout)(embed(input_ids).astype(jnp.float32), deterministic=deterministic)
        x, new_kv = decoder_layers(lambda i: _Layer(c, self.dtype, name=f"layers_{i}"), c.num_hidden_layers, x, ai,
                                   cos, sin, deterministic, cache, query_positions)
        hidden = nn.LayerNorm(c.layer_norm_eps, name="final_layer_norm")(x)
        head = output_matrix(self, embed.embedding, c.tie_word_embeddings, "embed_out", c.vocab_size, c.hidden_size,
                             c.initializer_range)
        return causal_lm_outputs(hidden, head, self.dtype, return_logits, cache, new_kv, ai, L)


def hf_keys(c: GPTNeoXConfig) -> list:
    """The HF key map of ``c``: ``(HF state-dict key, parameter path, transposed)`` for every weight
    (:mod:`rbjax.model.keymap`; the registry's :class:`rbjax.model.registry.Family` converts with it)."""
    e = [("gpt_neox.embed_in.weight", ("embed_in", "embedding"), False),
         ("gpt_neox.final_layer_norm.weight", ("final_layer_norm", "scale"), False),
         ("gpt_neox.final_layer_norm.bias", ("final_layer_norm", "bias"), False)]
    if not c.tie_word_embeddings:
        e.append(("embed_out.weight", ("embed_out", "embedding"), False))
    for i in range(c.num_hidden_layers):
        p, q = f"gpt_neox.layers.{i}.", f"layers_{i}"
        for ln in ("input_layernorm", "post_attention_layernorm"):
            e += [(f"{p}{ln}.weight", (q, ln, "scale"), False), (f"{p}{ln}.bias", (q, ln, "bias"), False)]
        for mod, sub, bias in (("attention", "query_key_value", c.attention_bias), ("attention", "dense", c.attention_bias),
                               ("mlp", "dense_h_to_4h", True), ("mlp", "dense_4h_to_h", True)):
            e.append((f"{p}{mod}.{sub}.weight", (q, mod, sub, "kernel"), True))
            if bias:
                e.append((f"{p}{mod}.{sub}.bias", (q, mod, sub, "bias"), False))
    return e


#: HF buffers that are not parameters (older checkpoints saved them)
IGNORED_HF_KEYS = re.compile(r"attention\.(bias|masked_bias|rotary_emb\.inv_freq)$")
