"""GPT-2 in Flax (linen): the model behind DialoGPT-small.

Transformers v5 ships no Flax models, so rbjax owns this module and its weight
converter (:mod:`rbjax.model.hf`). Architecture as in Radford et al. (2019) and the
HF ``GPT2LMHeadModel``: learned position embeddings, pre-LayerNorm blocks
(LayerNorm ε from the config, 1e-5 for GPT-2), GELU with the tanh approximation
(``gelu_new``), causal self-attention, a final LayerNorm ``ln_f`` and an LM head
tied to the token embedding ``wte``.

Parameter pytree (names mirror the HF checkpoint so the converter is a key map)::

    {'wte': {'embedding': (V, d)}, 'wpe': {'embedding': (P, d)},
     'h_0': {'ln_1': {'scale','bias'}, 'attn': {'c_attn': {'kernel': (d, 3d), 'bias'},
                                                 'c_proj': {'kernel': (d, d), 'bias'}},
             'ln_2': {...}, 'mlp': {'c_fc': {'kernel': (d, 4d), 'bias'},
                                   'c_proj': {'kernel': (4d, d), 'bias'}}},
     ..., 'ln_f': {'scale', 'bias'}}

Kernels are stored (in, out), exactly HF's ``Conv1D`` layout, so no transpose is ever
needed (a transposed square ``c_proj`` would be silently wrong).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

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

    @classmethod
    def from_json(cls, path: str | Path) -> "GPT2Config":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a JSON object")
        mt = d.get("model_type", "gpt2")
        if mt != "gpt2":
            raise ValueError(f"{path}: model_type is {mt!r}; rbjax supports GPT-2 checkpoints (model_type 'gpt2')")
        try:
            return cls.from_dict(d)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def to_hf_dict(self) -> dict:
        """The ``config.json`` content that ``transformers.GPT2Config`` reads."""
        d = dataclasses.asdict(self)
        d.update(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=self.n_positions,
                 tie_word_embeddings=True)
        return d


def _gelu_new(x):
    return 0.5 * x * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (x + 0.044715 * jnp.power(x, 3.0))))


_ACTIVATIONS = {
    "gelu_new": _gelu_new,
    "gelu_pytorch_tanh": _gelu_new,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
}


class _Dense(nn.Module):
    """HF ``Conv1D``: y = x @ kernel + bias, kernel stored (in, out)."""

    features: int
    init_std: float

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.normal(self.init_std), (x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        return jnp.dot(x, kernel.astype(x.dtype)) + bias.astype(x.dtype)


class _Attention(nn.Module):
    config: GPT2Config

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        cfg = self.config
        B, L, d = x.shape
        nh = cfg.n_head
        qkv = _Dense(3 * d, cfg.initializer_range, name="c_attn")(x)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, L, nh, d // nh) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.asarray(d // nh, x.dtype))
        scores = scores + bias  # (B|1, 1, L, L) additive mask: 0 or a large negative
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
        probs = nn.Dropout(cfg.attn_pdrop)(probs, deterministic=deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, L, d)
        out = _Dense(d, cfg.initializer_range / (2 * cfg.n_layer) ** 0.5, name="c_proj")(out)
        return nn.Dropout(cfg.resid_pdrop)(out, deterministic=deterministic)


class _MLP(nn.Module):
    config: GPT2Config

    @nn.compact
    def __call__(self, x, deterministic: bool):
        cfg = self.config
        h = _Dense(cfg.inner_dim, cfg.initializer_range, name="c_fc")(x)
        h = _ACTIVATIONS[cfg.activation_function](h)
        h = _Dense(x.shape[-1], cfg.initializer_range / (2 * cfg.n_layer) ** 0.5, name="c_proj")(h)
        return nn.Dropout(cfg.resid_pdrop)(h, deterministic=deterministic)


class _Block(nn.Module):
    config: GPT2Config

    @nn.compact
    def __call__(self, x, bias, deterministic: bool):
        eps = self.config.layer_norm_epsilon
        x = x + _Attention(self.config, name="attn")(nn.LayerNorm(eps, name="ln_1")(x), bias, deterministic)
        x = x + _MLP(self.config, name="mlp")(nn.LayerNorm(eps, name="ln_2")(x), deterministic)
        return x


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with a tied LM head.

    ``__call__(input_ids, attention_mask=None, position_ids=None, deterministic=True)``

    Args:
        input_ids: int array (B, L) of token ids.
        attention_mask: optional (B, L) array, 1 for real tokens and 0 for padding. Padded
            keys are never attended to; padded query positions give junk that callers mask.
        position_ids: optional int array (B, L). Default: with ``attention_mask``, the k-th real token of a
            row gets position k (:func:`position_ids_from_mask`), so a left- or right-padded row gives the same
            outputs at its real positions as the unpadded row; without a mask, ``arange(L)``.
        deterministic: disable dropout (inference). Training needs ``rngs={'dropout': key}``.
        return_logits: ``False`` skips the LM head and returns ``(None, hidden)``.

    Returns:
        ``(logits, hidden)``: logits (B, L, V) in float32 (next-token scores; position i
        predicts token i+1) and the final hidden states (B, L, d) after ``ln_f`` — the vectors
        the LM head multiplies, which the debiasing losses use (paper §4).
    """

    config: GPT2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, position_ids=None, deterministic: bool = True,
                 return_logits: bool = True):
        cfg = self.config
        B, L = input_ids.shape
        wte = nn.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=nn.initializers.normal(cfg.initializer_range),
                       name="wte")
        wpe = nn.Embed(cfg.n_positions, cfg.n_embd, embedding_init=nn.initializers.normal(0.01), name="wpe")
        if position_ids is None:
            position_ids = (jnp.broadcast_to(jnp.arange(L), (B, L)) if attention_mask is None
                            else position_ids_from_mask(attention_mask))
        x = (wte(input_ids) + wpe(position_ids)).astype(self.dtype)
        x = nn.Dropout(cfg.embd_pdrop)(x, deterministic=deterministic)
        causal = jnp.tril(jnp.ones((L, L), dtype=bool))[None, None]
        allowed = causal if attention_mask is None else causal & (attention_mask[:, None, None, :] > 0)
        bias = jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
        for i in range(cfg.n_layer):
            x = _Block(cfg, name=f"h_{i}")(x, bias, deterministic)
        hidden = nn.LayerNorm(cfg.layer_norm_epsilon, name="ln_f")(x)
        if not return_logits:  # callers that only need states (or compute the head themselves, chunked)
            return None, hidden
        logits = wte.attend(hidden.astype(self.dtype)).astype(jnp.float32)
        return logits, hidden


def position_ids_from_mask(attention_mask):
    """Position ids for possibly left-padded rows: the k-th real token gets position k.

    Args:
        attention_mask: (B, L) array of 0/1.
    Returns:
        int32 (B, L) array (padding positions get 0).
    """
    m = jnp.asarray(attention_mask).astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0) * m


def init_params(config: GPT2Config, seed: int = 0) -> Params:
    """Randomly initialised parameters (GPT-2's N(0, 0.02) scheme), for tests and benchmarks."""
    model = GPT2LMHeadModel(config)
    return model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 2), jnp.int32))["params"]
