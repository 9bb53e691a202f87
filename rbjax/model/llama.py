"""The Llama architecture in Flax (linen): Llama 2/3/3.x, Mistral and Qwen2/2.5 (HF ``model_type`` llama, mistral,
qwen2).

Architecture as HF ``LlamaForCausalLM`` (Touvron et al. 2023): token embedding, pre-RMSNorm decoder layers of
rotary grouped-query self-attention (``num_key_value_heads`` ≤ ``num_attention_heads``, ``head_dim`` free) and a
SwiGLU MLP (``down(act(gate(x)) · up(x))``), a final RMSNorm and an LM head that is tied to the embedding or its
own ``lm_head`` matrix. The variants differ only in config:

* Llama: ``attention_bias`` (q/k/v/o biases), ``mlp_bias``, ``rope_scaling`` of type ``llama3`` (Llama 3.1+) or
  ``linear``;
* Mistral: ``sliding_window`` on every layer (implemented: a query sees the last ``sliding_window`` positions);
* Qwen2/2.5: biases on q/k/v (not o), usually tied embeddings in the small models, and sliding-window attention on
  the layers that ``layer_types`` (or ``use_sliding_window`` + ``max_window_layers``) marks.

Parameter pytree (names after the HF keys ``model.embed_tokens.weight`` …; kernels (in, out))::

    {'embed_tokens': {'embedding': (V, d)},
     'layers_0': {'input_layernorm': {'scale': (d,)},
                  'self_attn': {'q_proj': {'kernel': (d, H·hd), 'bias'?}, 'k_proj': {'kernel': (d, KV·hd), 'bias'?},
                                'v_proj': {…}, 'o_proj': {'kernel': (H·hd, d), 'bias'?}},
                  'post_attention_layernorm': {'scale'},
                  'mlp': {'gate_proj': {'kernel': (d, I)}, 'up_proj': {…}, 'down_proj': {'kernel': (I, d)}}},
     …, 'norm': {'scale': (d,)}, 'lm_head': {'embedding': (V, d)}  # only when untied

Precision as :mod:`rbjax.model.gpt2`: ``dtype`` is the matmul input dtype, f32 accumulation, f32 norms, rotary
angles, softmax and residual stream.
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

MODEL_TYPES = ("llama", "mistral", "qwen2")

#: transformers config fields read and implemented, per model_type (legacy spellings included)
_BASE = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "bos_token_id",
         "eos_token_id", "pad_token_id", "tie_word_embeddings", "rope_parameters", "rope_scaling", "rope_theta",
         "attention_dropout", "head_dim"}
HANDLED = {
    "llama": _BASE | {"attention_bias", "mlp_bias"},
    "mistral": _BASE | {"sliding_window"},
    "qwen2": _BASE | {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"},
}
#: fields refused by name for the values given (the others of these fields are handled)
REFUSED = {
    "rope_parameters": "rope_type other than default, linear, llama3 (dynamic, yarn, longrope, …); per-layer dicts",
    "rope_scaling": "as rope_parameters (the transformers 4.x spelling)",
    "hidden_act": "activations outside rbjax.model.layers.ACTIVATIONS",
    "layer_types": "entries other than full_attention / sliding_attention",
    "num_key_value_heads": "not a divisor of num_attention_heads",
    "use_mrope": "true (Qwen2-VL multimodal RoPE)",
}
_DEFAULT_SPECIAL = {"llama": {"bos": 1, "eos": 2}, "mistral": {"bos": 1, "eos": 2}, "qwen2": {}}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of the Llama family (field names follow the HF ``config.json``; ``rope`` and the per-layer
    ``layer_windows`` are derived). Defaults: a tiny model, for tests."""

    model_type: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    hidden_act: str = "silu"
    max_position_embeddings: int = 128
    rms_norm_eps: float = 1e-6
    rope: hc.Rope = hc.Rope()
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    layer_windows: tuple = ()  # per layer: sliding window (positions) or None; () = no window anywhere
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    bos_token_id: Any = None
    eos_token_id: Any = None
    pad_token_id: Any = None
    # as read, for the export (Mistral / Qwen2 spell the windows their own way)
    sliding_window: int | None = None
    use_sliding_window: bool = False
    max_window_layers: int | None = None

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
    def from_hf(cls, d: dict, source: str) -> "LlamaConfig":
        """From a ``config.json`` dict (transformers 4.x or 5.x spelling).

        Raises:
            ValueError: a malformed field, or a field value rbjax does not implement, named with its value.
        """
        mt = d.get("model_type", "llama")
        if mt not in MODEL_TYPES:
            raise ValueError(f"{source}: model_type {mt!r} is not one of the Llama family's {MODEL_TYPES}")
        hc.check_common(d, source)
        hc.warn_unknown(d, HANDLED[mt] | set(REFUSED), source, "llama")
        if d.get("use_mrope"):
            raise hc.refuse(source, "use_mrope", d["use_mrope"], "multimodal RoPE (Qwen2-VL) is not implemented")
        V = hc.get_int(d, "vocab_size", None, source)
        D = hc.get_int(d, "hidden_size", None, source)
        I = hc.get_int(d, "intermediate_size", None, source)
        N = hc.get_int(d, "num_hidden_layers", None, source)
        H = hc.get_int(d, "num_attention_heads", None, source)
        KV = d.get("num_key_value_heads")
        KV = H if KV is None else hc.get_int(d, "num_key_value_heads", None, source)
        if H % KV:
            raise hc.refuse(source, "num_key_value_heads", KV, f"must divide num_attention_heads={H}")
        hd = d.get("head_dim")
        if hd is None:
            if D % H:
                raise ValueError(f"{source}: hidden_size={D} is not divisible by num_attention_heads={H}")
            hd = D // H
        hd = hc.get_int({"head_dim": hd}, "head_dim", None, source)
        if hd % 2:
            raise ValueError(f"{source}: config field head_dim must be even for rotary embeddings, got {hd}")
        P = hc.get_int(d, "max_position_embeddings", 2048, source)
        act = hc.get_activation(d, "hidden_act", "silu", source, ACTIVATIONS)
        eps = hc.get_float(d, "rms_norm_eps", 1e-6, source, positive=True)
        rope = hc.read_rope(d, source, max_position_embeddings=P)
        if rope.partial_rotary_factor != 1.0:
            raise hc.refuse(source, "partial_rotary_factor", rope.partial_rotary_factor,
                            "partial rotary is a GPT-NeoX feature; the Llama family rotates the whole head")
        drop = hc.get_float(d, "attention_dropout", 0.0, source)
        if mt == "llama":
            bias = hc.get_bool(d, "attention_bias", False, source)
            qkv_bias, o_bias = bias, bias
            mlp_bias = hc.get_bool(d, "mlp_bias", False, source)
        elif mt == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        else:
            qkv_bias, o_bias, mlp_bias = False, False, False
        window = None
        use_sw, mwl = False, None
        windows: tuple = ()
        if mt == "mistral":
            window = hc.get_int(d, "sliding_window", None, source, allow_none=True)
            windows = (window,) * N if window is not None else ()
        elif mt == "qwen2":
            use_sw = hc.get_bool(d, "use_sliding_window", False, source)
            window = hc.get_int(d, "sliding_window", None, source, allow_none=True)
            mwl = hc.get_int(d, "max_window_layers", N, source, minimum=0, allow_none=True)
            types = d.get("layer_types")
            if types is None:  # transformers 5 Qwen2Config.__post_init__
                active = window if use_sw else None
                types = ["sliding_attention" if active is not None and i >= (mwl if mwl is not None else N)
                         else "full_attention" for i in range(N)]
            if not (isinstance(types, list) and len(types) == N):
                raise ValueError(f"{source}: config field layer_types must list {N} layer types, got {types!r}")
            for t in types:
                if t not in ("full_attention", "sliding_attention"):
                    raise hc.refuse(source, "layer_types", t, "supported layer types: full_attention, sliding_attention")
            active = window if use_sw else None  # transformers: sliding_window is dropped without use_sliding_window
            windows = tuple(active if t == "sliding_attention" else None for t in types)
            if all(w is None for w in windows):
                windows = ()
        tied = hc.get_bool(d, "tie_word_embeddings", False, source)
        sp = hc.read_special_tokens(d, V, source, _DEFAULT_SPECIAL[mt])
        return cls(model_type=mt, vocab_size=V, hidden_size=D, intermediate_size=I, num_hidden_layers=N,
                   num_attention_heads=H, num_key_value_heads=KV, head_dim=hd, hidden_act=act,
                   max_position_embeddings=P, rms_norm_eps=eps, rope=rope, qkv_bias=qkv_bias, o_bias=o_bias,
                   mlp_bias=mlp_bias, tie_word_embeddings=tied, layer_windows=windows, attention_dropout=drop,
                   initializer_range=hc.get_float(d, "initializer_range", 0.02, source),
                   bos_token_id=sp["bos"], eos_token_id=sp["eos"], pad_token_id=sp["pad"], sliding_window=window,
                   use_sliding_window=use_sw, max_window_layers=mwl)

    def to_hf(self) -> dict:
        """The ``config.json`` that ``transformers`` (4.x and 5.x) reads back as this model."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
        d = {"model_type": self.model_type, "architectures": [arch[self.model_type]],
             "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
             "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
             "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
             "head_dim": self.head_dim, "hidden_act": self.hidden_act,
             "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
             "tie_word_embeddings": self.tie_word_embeddings, "attention_dropout": self.attention_dropout,
             "initializer_range": self.initializer_range, "bos_token_id": hc.hf_id(self.bos_token_id),
             "eos_token_id": hc.hf_id(self.eos_token_id), "pad_token_id": hc.hf_id(self.pad_token_id)}
        d.update(self.rope.to_hf())
        if self.model_type == "llama":
            if self.qkv_bias != self.o_bias:
                raise ValueError("a Llama config.json has one attention_bias for q/k/v/o; this model has "
                                 f"qkv_bias={self.qkv_bias}, o_bias={self.o_bias}")
            d.update(attention_bias=self.qkv_bias, mlp_bias=self.mlp_bias)
        elif self.model_type == "mistral":
            d["sliding_window"] = self.sliding_window
        else:
            d.update(use_sliding_window=self.use_sliding_window, sliding_window=self.sliding_window,
                     max_window_layers=self.max_window_layers,
                     layer_types=["sliding_attention" if self.window(i) is not None else "full_attention"
                                  for i in range(self.num_hidden_layers)])
        return d


class _Attention(nn.Module):
    config: LlamaConfig
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
        std = c.initializer_range
        q = Linear(c.num_attention_heads * c.head_dim, c.qkv_bias, std, self.dtype, name="q_proj")(xq)
        k = Linear(c.num_key_value_heads * c.head_dim, c.qkv_bias, std, self.dtype, name="k_proj")(x)
        v = Linear(c.num_key_value_heads * c.head_dim, c.qkv_bias, std, self.dtype, name="v_proj")(x)
        q = apply_rope(q.reshape(B, xq.shape[1], c.num_attention_heads, c.head_dim), cq, sq)
        k = apply_rope(k.reshape(B, L, c.num_key_value_heads, c.head_dim), cos, sin)
        v = v.reshape(B, L, c.num_key_value_heads, c.head_dim)
        if kv is not None:
            k, v = kv = write_cache(kv, k, v, ai.index)
        drop = None
        if c.attention_dropout and not deterministic:
            drop = lambda p: Dropout(c.attention_dropout)(p, deterministic=False)  # noqa: E731
        out = dot_product_attention(q, k, v, ai, scale=c.head_dim ** -0.5, dtype=self.dtype,
                                    window=c.window(self.layer), dropout=drop)
        return Linear(c.hidden_size, c.o_bias, std, self.dtype, name="o_proj")(out), kv


class _MLP(nn.Module):
    config: LlamaConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        c = self.config
        std = c.initializer_range
        g = Linear(c.intermediate_size, c.mlp_bias, std, self.dtype, name="gate_proj")(x)
        u = Linear(c.intermediate_size, c.mlp_bias, std, self.dtype, name="up_proj")(x)
        return Linear(c.hidden_size, c.mlp_bias, std, self.dtype, name="down_proj")(ACTIVATIONS[c.hidden_act](g) * u)


class _Layer(nn.Module):
    config: LlamaConfig
    layer: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, ai, cos, sin, deterministic, kv=None, positions=None):
        eps = self.config.rms_norm_eps
        a, kv = _Attention(self.config, self.layer, self.dtype, name="self_attn")(
            RMSNorm(eps, name="input_layernorm")(x), ai, cos, sin, deterministic, kv, positions)
        x = (x if positions is None else gather_positions(x, positions)) + a
        x = x + _MLP(self.config, self.dtype, name="mlp")(RMSNorm(eps, name="post_attention_layernorm")(x))
        return x, kv


class LlamaForCausalLM(nn.Module):
    """Llama / Mistral / Qwen2 causal LM, with the call signature and outputs of
    :class:`rbjax.model.gpt2.GPT2LMHeadModel`:

    ``__call__(input_ids, attention_mask=None, position_ids=None, deterministic=True, return_logits=True,
    cache=None, query_positions=None)`` → ``(logits | None, hidden)``, or ``(logits | None, hidden, new_cache)``
    with a :class:`rbjax.model.layers.KVCache` (``Family.init_cache``); ``query_positions`` (B, Q) returns the
    states at those positions only, the last layer computing its outputs there alone (GPT-2's docstring).
    ``attention_mask`` is (B, L) 0/1 or a (B, L, L) query × key mask with explicit ``position_ids`` (packed rows:
    RoPE takes the positions, so a phrase restarting at 0 inside a row is computed as if alone). logits (B, L, V)
    float32; hidden (B, L, d) float32 after the final RMSNorm — the states the LM head (``Family.lm_head``)
    multiplies.
    """

    config: LlamaConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, position_ids=None, deterministic: bool = True,
                 return_logits: bool = True, cache: KVCache | None = None, query_positions=None):
        c = self.config
        B, L = input_ids.shape
        check_query_positions(query_positions, cache)
        ai = attention_inputs(B, L, attention_mask, position_ids, cache)
        cos, sin = rope_cos_sin(ai.q_pos, rope_inv_freq(c.head_dim, c.rope.theta, c.rope.type, c.rope.factor,
                                                         c.rope.low_freq_factor, c.rope.high_freq_factor,
                                                         c.rope.original_max_position_embeddings))
        embed = nn.Embed(c.vocab_size, c.hidden_size, embedding_init=nn.initializers.normal(c.initializer_range),
                         name="embed_tokens")
        x = embed(input_ids).astype(jnp.float32)
        x, new_kv = decoder_layers(lambda i: _Layer(c, i, self.dtype, name=f"layers_{i}"), c.num_hidden_layers, x, ai,
                                   cos, sin, deterministic, cache, query_positions)
        hidden = RMSNorm(c.rms_norm_eps, name="norm")(x)
        head = output_matrix(self, embed.embedding, c.tie_word_embeddings, "lm_head", c.vocab_size, c.hidden_size,
                             c.initializer_range)
        return causal_lm_outputs(hidden, head, self.dtype, return_logits, cache, new_kv, ai, L)


def hf_keys(c: LlamaConfig) -> list:
    """The HF key map of ``c``: ``(HF state-dict key, parameter path, transposed)`` for every weight
    (:mod:`rbjax.model.keymap`; the registry's :class:`rbjax.model.registry.Family` converts with it)."""
    e = [("model.embed_tokens.weight", ("embed_tokens", "embedding"), False),
         ("model.norm.weight", ("norm", "scale"), False)]
    if not c.tie_word_embeddings:
        e.append(("lm_head.weight", ("lm_head", "embedding"), False))
    for i in range(c.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"layers_{i}"
        e += [(p + "input_layernorm.weight", (q, "input_layernorm", "scale"), False),
              (p + "post_attention_layernorm.weight", (q, "post_attention_layernorm", "scale"), False)]
        for name, bias in (("q_proj", c.qkv_bias), ("k_proj", c.qkv_bias), ("v_proj", c.qkv_bias),
                           ("o_proj", c.o_bias)):
            e.append((f"{p}self_attn.{name}.weight", (q, "self_attn", name, "kernel"), True))
            if bias:
                e.append((f"{p}self_attn.{name}.bias", (q, "self_attn", name, "bias"), False))
        for name in ("gate_proj", "up_proj", "down_proj"):
            e.append((f"{p}mlp.{name}.weight", (q, "mlp", name, "kernel"), True))
            if c.mlp_bias:
                e.append((f"{p}mlp.{name}.bias", (q, "mlp", name, "bias"), False))
    return e
