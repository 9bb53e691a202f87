"""GPT-2 in Flax (linen): the model behind DialoGPT-small.

Transformers v5 ships no Flax models, so rbjax owns this module and its weight
converter (:mod:`rbjax.model.hf`). Architecture as in Radford et al. (2019) and the
HF ``GPT2LMHeadModel``: learned position embeddings, pre-LayerNorm blocks
(LayerNorm ε from the config, 1e-5 for GPT-2), GELU with the tanh approximation
(``gelu_new``), causal self-attention, a final LayerNorm ``ln_f`` and an LM head
tied to the token embedding ``wte`` (an untied ``lm_head`` with ``tie_word_embeddings`` false).

Parameter pytree (names mirror the HF checkpoint so the converter is a key map)::

    {'wte': {'embedding': (V, d)}, 'wpe': {'embedding': (P, d)},
     'h_0': {'ln_1': {'scale','bias'}, 'attn': {'c_attn': {'kernel': (d, 3d), 'bias'},
                                                 'c_proj': {'kernel': (d, d), 'bias'}},
             'ln_2': {...}, 'mlp': {'c_fc': {'kernel': (d, 4d), 'bias'},
                                   'c_proj': {'kernel': (4d, d), 'bias'}}},
     ..., 'ln_f': {'scale', 'bias'}, 'lm_head': {'embedding': (V, d)}}  # lm_head only when untied

Kernels are stored (in, out), exactly HF's ``Conv1D`` layout, so no transpose is ever
needed (a transposed square ``c_proj`` would be silently wrong).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rbjax.model.layers import GPT2_ACTIVATIONS as _ACTIVATIONS
from rbjax.model.layers import (
    Dropout,
    attention_inputs,
    check_query_positions,
    gather_positions,
    gather_query_rows,
    lora_update,
    output_matrix,
    position_ids_from_mask,
)

__all__ = ["GPT2Config", "GPT2LMHeadModel", "KVCache", "init_cache", "init_params", "position_ids_from_mask"]

Params = Any


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """GPT-2 hyper-parameters (field names follow the HF ``config.json``).

    Defaults are DialoGPT-small / GPT-2 117M: 12 layers, 12 heads, width 768.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    initializer_range: float = 0.02
    bos_token_id: int = 50256
    eos_token_id: int = 50256
    pad_token_id: int | None = None
    # attention-score scaling (HF GPT2Attention): by 1/sqrt(head_dim) unless scale_attn_weights is false, and further
    # by 1/(layer index + 1) with scale_attn_by_inverse_layer_idx (Stanford CRFM's GPT-2s); reorder_and_upcast_attn
    # computes q·k from float32 inputs whatever the compute dtype (a no-op in float32)
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    # the LM head is the token embedding ``wte`` (GPT-2, DialoGPT) or, when false, a matrix of its own ``lm_head``
    # (HF ``GPT2LMHeadModel`` with an untied ``lm_head.weight``: what a model debiased by a projection exports,
    # docs/debiasing.md)
    tie_word_embeddings: bool = True

    # the names every family config answers to (callers read these, never a family's own field names)
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def width(self) -> int:
        return self.n_embd

    @property
    def num_layers(self) -> int:
        return self.n_layer

    @property
    def max_positions(self) -> int:
        return self.n_positions

    @property
    def inner_dim(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def from_dict(cls, d: dict) -> "GPT2Config":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        # older configs spell the context size n_ctx only
        if "n_positions" not in d and "n_ctx" in d:
            kw["n_positions"] = d["n_ctx"]
        ints = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "bos_token_id", "eos_token_id")
        for k, v in kw.items():
            if k in ints and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise ValueError(f"config field {k} must be a non-negative integer, got {v!r}")
            if k in ("layer_norm_epsilon", "resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range") and not (
                    isinstance(v, (int, float)) and not isinstance(v, bool)):
                raise ValueError(f"config field {k} must be a number, got {v!r}")
        for k in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                  "tie_word_embeddings"):
            if k in kw and not isinstance(kw[k], bool):
                raise ValueError(f"config field {k} must be true or false, got {kw[k]!r}")
        if kw.get("pad_token_id") is not None and not (
                isinstance(kw["pad_token_id"], int) and not isinstance(kw["pad_token_id"], bool)):
            raise ValueError(f"config field pad_token_id must be an integer or null, got {kw['pad_token_id']!r}")
        if d.get("add_cross_attention"):
            raise ValueError(f"config field add_cross_attention={d['add_cross_attention']!r} is not supported: "
                             "rbjax's GPT-2 is a decoder-only causal LM without cross-attention layers")
        if kw.get("n_inner") is not None and not (isinstance(kw["n_inner"], int) and kw["n_inner"] > 0):
            raise ValueError(f"config field n_inner must be a positive integer or null, got {kw['n_inner']!r}")
        for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if k in kw and kw[k] < 1:
                raise ValueError(f"config field {k} must be >= 1, got {kw[k]}")
        cfg = cls(**kw)
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}")
        if cfg.activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"unsupported activation_function {cfg.activation_function!r}; supported: {sorted(_ACTIVATIONS)}"
            )
        return cfg

    def to_hf_dict(self) -> dict:
        """The ``config.json`` content that ``transformers.GPT2Config`` reads."""
        d = dataclasses.asdict(self)
        d.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=self.n_positions)
        return d


class _Dense(nn.Module):
    """HF ``Conv1D``: y = x @ kernel + bias, kernel stored (in, out).

    ``dtype`` is the matmul input dtype (the compute precision); the product is accumulated and returned in
    float32 (``preferred_element_type``), and the bias is added in float32. A low-rank adapter in the layer's
    parameters is added unmerged (:func:`rbjax.model.layers.lora_update`).
    """

    features: int
    init_std: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.normal(self.init_std), (x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype), preferred_element_type=jnp.float32)
        return lora_update(self, x, y + bias.astype(jnp.float32), self.dtype)


class _Attention(nn.Module):
    config: GPT2Config
    dtype: Any = jnp.float32
    layer: int = 0

    @nn.compact
    def __call__(self, x, allowed, deterministic: bool, kv=None, index=None, positions=None):
        """x (B, T, d) float32; allowed (B|1, 1, T, S) bool; kv: optional cached ``(k, v)`` (B, S, nh, hd);
        positions: optional (B, Q), the only queries computed (the output is then (B, Q, d))."""
        cfg = self.config
        B, T, d = x.shape
        nh, hd = cfg.n_head, d // cfg.n_head
        dt = self.dtype
        qkv = _Dense(3 * d, cfg.initializer_range, dt, name="c_attn")(x)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        if positions is not None:  # the few query rows read (the fused projection computes every row's q anyway)
            q, allowed = gather_positions(q, positions), gather_query_rows(allowed, positions)
        q = q.reshape(B, q.shape[1], nh, hd)
        k, v = (t.reshape(B, T, nh, hd) for t in (k, v))
        if kv is not None:  # write the new keys/values at the cache's write index, attend over the whole cache
            k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), (0, index, 0, 0))
            kv = (k, v)
        sdt = jnp.float32 if cfg.reorder_and_upcast_attn else dt
        scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(sdt), k.astype(sdt), preferred_element_type=jnp.float32)
        if cfg.scale_attn_weights:
            scores = scores / jnp.sqrt(jnp.float32(hd))
        if cfg.scale_attn_by_inverse_layer_idx:
            scores = scores / jnp.float32(self.layer + 1)
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1)  # float32 softmax in every precision
        probs = Dropout(cfg.attn_pdrop)(probs, deterministic=deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dt), v.astype(dt),
                         preferred_element_type=jnp.float32).reshape(B, q.shape[1], d)
        out = _Dense(d, cfg.initializer_range / (2 * cfg.n_layer) ** 0.5, dt, name="c_proj")(out)
        return Dropout(cfg.resid_pdrop)(out, deterministic=deterministic), kv


class _MLP(nn.Module):
    config: GPT2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        h = _Dense(cfg.inner_dim, cfg.initializer_range, self.dtype, name="c_fc")(x)
        h = _ACTIVATIONS[cfg.activation_function](h)
        h = _Dense(x.shape[-1], cfg.initializer_range / (2 * cfg.n_layer) ** 0.5, self.dtype, name="c_proj")(h)
        return Dropout(cfg.resid_pdrop)(h, deterministic=deterministic)


class _Block(nn.Module):
    config: GPT2Config
    dtype: Any = jnp.float32
    layer: int = 0

    @nn.compact
    def __call__(self, x, allowed, deterministic: bool, kv=None, index=None, positions=None):
        eps = self.config.layer_norm_epsilon
        a, kv = _Attention(self.config, self.dtype, self.layer, name="attn")(nn.LayerNorm(eps, name="ln_1")(x), allowed,
                                                                 deterministic, kv, index, positions)
        x = (x if positions is None else gather_positions(x, positions)) + a
        x = x + _MLP(self.config, self.dtype, name="mlp")(nn.LayerNorm(eps, name="ln_2")(x), deterministic)
        return x, kv


class KVCache(NamedTuple):
    """Key/value cache of a GPT-2 for incremental decoding (a pytree: it can be carried through ``jit``,
    ``lax.while_loop`` and ``scan``).

    Slots are written left to right, one block of ``T`` slots per call; a slot is attended to when it holds a real
    token (``mask``) and lies at or before the query's own slot. Left padding, or any hole, is therefore just a
    slot with ``mask`` 0.

    Attributes:
        keys, values: one array per layer, each (B, S, n_head, head_dim), in the model's compute dtype.
        mask: bool (B, S), True where the slot holds a real token.
        index: int32 scalar, the next slot to write (the number of slots written so far).
    """

    keys: tuple
    values: tuple
    mask: jax.Array
    index: jax.Array

    @property
    def max_length(self) -> int:
        return self.mask.shape[1]


def init_cache(config: GPT2Config, batch_size: int, max_length: int, dtype=jnp.float32) -> KVCache:
    """An empty :class:`KVCache` for ``batch_size`` rows and ``max_length`` slots (≤ ``config.n_positions``
    real tokens per row; slots beyond that are allowed as long as they hold padding)."""
    hd = config.n_embd // config.n_head
    z = jnp.zeros((batch_size, max_length, config.n_head, hd), dtype)
    return KVCache(keys=tuple(z for _ in range(config.n_layer)), values=tuple(z for _ in range(config.n_layer)),
                   mask=jnp.zeros((batch_size, max_length), bool), index=jnp.zeros((), jnp.int32))


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with an LM head tied to ``wte`` (or its own ``lm_head`` when ``config.tie_word_embeddings`` is false).

    ``__call__(input_ids, attention_mask=None, position_ids=None, deterministic=True, return_logits=True,
    cache=None, query_positions=None)``

    Args:
        input_ids: int array (B, L) of token ids.
        attention_mask: optional, either (B, L) — 1 for real tokens and 0 for padding; padded keys are never
            attended to, padded query positions give junk that callers mask — or (B, L, L) bool, an explicit
            query × key mask (AND-ed with the causal mask), e.g. several sequences packed into one row or a
            shared prefix followed by branches (:mod:`rbjax.lmb.perplexity`); then ``position_ids`` is required.
        position_ids: optional int array (B, L). Default: with a (B, L) ``attention_mask``, the k-th real token of
            a row gets position k (:func:`position_ids_from_mask`), so a left- or right-padded row gives the same
            outputs at its real positions as the unpadded row; without a mask, ``arange(L)``; with a ``cache``,
            the count of real tokens already in the cache plus the count within the new block.
        deterministic: disable dropout (inference). Training needs ``rngs={'dropout': key}``.
        return_logits: ``False`` skips the LM head and returns ``(None, hidden)``.
        cache: a :class:`KVCache` (:func:`init_cache`): the new block's keys/values are written at
            ``cache.index`` and the block attends to every real slot up to itself; the call then returns
            ``(logits, hidden, new_cache)``. A (B, L) ``attention_mask`` marks the block's real tokens
            (default: all real).
        query_positions: optional int (B, Q): return the states (and logits) at these positions only, (B, Q, d).
            The last block then computes its queries, attention output and MLP at them alone (its keys and values
            at every position), so a caller that reads a few states per row (the DST classifier's pooled token)
            skips most of that block; the values equal the full call's at those positions. Not with a ``cache``.

    Returns:
        ``(logits, hidden)`` (plus the updated cache when ``cache`` is given): logits (B, L, V) in float32
        (next-token scores; position i predicts token i+1) and the final hidden states (B, L, d) after ``ln_f``,
        float32 — the vectors the LM head multiplies, which the debiasing losses use (paper §4).

    Precision: ``dtype`` is the compute dtype of the matmul inputs (``jnp.float32``, the default, or
    ``jnp.bfloat16``); every matmul accumulates in float32, and the residual stream, LayerNorms, softmax and
    logits stay float32. Parameters are float32 whatever the compute dtype.
    """

    config: GPT2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, position_ids=None, deterministic: bool = True,
                 return_logits: bool = True, cache: KVCache | None = None, query_positions=None):
        cfg = self.config
        B, L = input_ids.shape
        check_query_positions(query_positions, cache)
        wte = nn.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=nn.initializers.normal(cfg.initializer_range),
                       name="wte")
        wpe = nn.Embed(cfg.n_positions, cfg.n_embd, embedding_init=nn.initializers.normal(0.01), name="wpe")
        ai = attention_inputs(B, L, attention_mask, position_ids, cache)
        allowed, position_ids, index = ai.allowed, ai.q_pos, ai.index
        x = (wte(input_ids) + wpe(position_ids)).astype(jnp.float32)
        x = Dropout(cfg.embd_pdrop)(x, deterministic=deterministic)
        new_k, new_v = [], []
        for i in range(cfg.n_layer):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            x, kv = _Block(cfg, self.dtype, i, name=f"h_{i}")(
                x, allowed, deterministic, kv, index, query_positions if i == cfg.n_layer - 1 else None)
            if cache is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        hidden = nn.LayerNorm(cfg.layer_norm_epsilon, name="ln_f")(x)
        logits = None
        if return_logits:  # else: callers that only need states (or compute the head themselves, chunked)
            emb = output_matrix(self, wte.embedding, cfg.tie_word_embeddings, "lm_head", cfg.vocab_size, cfg.n_embd,
                                cfg.initializer_range)
            logits = jnp.dot(hidden.astype(self.dtype), emb.astype(self.dtype).T, preferred_element_type=jnp.float32)
        if cache is None:
            return logits, hidden
        new_cache = KVCache(keys=tuple(new_k), values=tuple(new_v), mask=ai.cache_mask, index=index + L)
        return logits, hidden, new_cache


def init_params(config: GPT2Config, seed: int = 0) -> Params:
    """Randomly initialised parameters (GPT-2's N(0, 0.02) scheme), for tests and benchmarks."""
    model = GPT2LMHeadModel(config)
    return jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 2), jnp.int32))["params"]
