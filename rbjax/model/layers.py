"""Building blocks shared by the model families (the rotary ones: Llama/Mistral/Qwen2, GPT-NeoX, Gemma 2; GPT-2 shares
the activations and the attention mask).

One place for what the families compute alike: the dense layer with HF ``nn.Linear`` weights, RMSNorm (with the
Gemma ``1 + w`` variant), rotary position embeddings (RoPE, Su et al. 2021; the ``default``, ``linear`` and
``llama3`` frequency schemes of HF ``modeling_rope_utils``), grouped-query attention with optional logit
soft-capping and a sliding window, the attention mask of the three calling modes of
:class:`rbjax.model.gpt2.GPT2LMHeadModel` (a (B, L) padding mask, a (B, L, L) packed block mask with explicit
``position_ids``, a KV cache) and the KV cache itself.

Precision, as in :mod:`rbjax.model.gpt2`: ``dtype`` is the matmul input dtype; every matmul accumulates in float32
(``preferred_element_type``), and norms, softmax, rotary angles and the residual stream stay float32.

Sliding window (Mistral, Qwen2, Gemma 2): a query at position ``p`` sees a key at position ``p'`` iff
``p − p' < window`` (HF ``sliding_window_overlay``: ``kv_idx > q_idx − window``). rbjax measures the distance in
*positions* (``position_ids``), HF in slots; they agree for every row HF can express (left/right padding, one
sequence per row) and positions are the right measure for rbjax's packed rows, where a shared prefix and a second
branch lie further apart in the row than in the text.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def _gelu_new(x):
    return 0.5 * x * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (x + 0.044715 * jnp.power(x, 3.0))))


#: GPT-2's ``activation_function`` values (HF ``ACT2FN`` names; ``gelu`` is the exact erf GELU)
GPT2_ACTIVATIONS = {
    "gelu_new": _gelu_new,
    "gelu_pytorch_tanh": _gelu_new,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
}

#: HF ``ACT2FN`` names the rotary families implement (``gelu_pytorch_tanh`` = ``gelu_new``)
ACTIVATIONS = dict(GPT2_ACTIVATIONS, silu=jax.nn.silu, swish=jax.nn.silu)

NEG = float(np.finfo(np.float32).min)


#: the key of a dense layer's low-rank adapter in its parameters (:func:`lora_update`, :mod:`rbjax.model.lora`)
LORA = "lora"


def keep_mask(key, keep, shape) -> jax.Array:
    """Dropout's mask: ``True`` with probability ``keep`` (a float or a traced float32 scalar), independently per
    element of ``shape``.

    The bits come from XLA's ``RngBitGenerator`` with the ThreeFry algorithm, keyed by the key's four 32-bit words
    (the ``rbg`` keys of training, :func:`rbjax.train.batching.dropout_key`; a two-word threefry key is padded with
    zeros). JAX's own draw from an ``rbg`` key, ``jax.random.bernoulli``, uses the backend's default algorithm,
    Philox on CPU and GPU, which XLA's CPU backend computes about 5× slower (64-bit multiplies per word): the masks
    of a DST update took ≈ 14 % of it (benchmarks/RESULTS.md, "A whole debias run"); on a TPU, whose default is
    a hardware generator, ThreeFry is computed in software (not measured there). Each element compares the
    top 24 bits of its word, as a uniform number in [0, 1), with ``keep`` (JAX's uniform uses 23): the probability
    is ``keep`` within 2⁻²⁴.

    Args:
        key: a PRNG key (typed or raw ``uint32`` words). keep: the keep probability ``1 − rate``.
        shape: the mask's shape.
    Returns:
        bool ``shape``.
    """
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    words = jnp.ravel(words).astype(jnp.uint32)
    if words.shape[0] < 4:
        words = jnp.concatenate([words, jnp.zeros(4 - words.shape[0], jnp.uint32)])
    _, bits = jax.lax.rng_bit_generator(words[:4], tuple(shape), jnp.uint32,
                                        algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    uniform = (bits >> 8).astype(jnp.float32) * jnp.float32(2.0 ** -24)
    return uniform < jnp.asarray(keep, jnp.float32)


def dropout(x, key, keep):
    """Inverted dropout of ``x``: each element kept with probability ``keep`` (:func:`keep_mask`; a float or a traced
    scalar) and scaled by ``1 / keep``, the others 0. Shape and dtype of ``x``."""
    return jnp.where(keep_mask(key, keep, x.shape), x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


class Dropout(nn.Module):
    """Inverted dropout, as ``flax.linen.Dropout`` and PyTorch's ``nn.Dropout``: in training each element is zeroed
    with probability ``rate`` and the others are scaled by ``1 / (1 − rate)``; the identity when ``deterministic``
    or ``rate == 0``. The key is the module's ``dropout`` PRNG stream (:func:`dropout`)."""

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        return dropout(x, self.make_rng("dropout"), 1.0 - self.rate)


def lora_update(module: nn.Module, x, y, dtype):
    """``y`` plus the dense layer's low-rank adapter update when its parameters hold one (LoRA, Hu et al. 2021):
    ``y + scale · (dropout(x) @ A) @ B``, computed unmerged (the frozen kernel is never copied or differentiated).

    The adapter is the layer's ``{LORA: {"A": (in, r), "B": (r, out), "scale": (), ["dropout": ()]}}`` entry
    (:func:`rbjax.model.lora.add_adapters`); a layer without one returns ``y`` unchanged. ``dropout`` (the rate, a
    stored scalar: present only when > 0) applies to the adapter's input when the call has a ``dropout`` PRNG stream
    (training), as PEFT's ``lora_dropout``. Matmul inputs in ``dtype``, float32 accumulation, as every dense layer.
    """
    if not module.has_variable("params", LORA):
        return y
    a = module.get_variable("params", LORA)
    h = x
    if "dropout" in a and module.has_rng("dropout"):
        h = dropout(x.astype(jnp.float32), module.make_rng("dropout"), 1.0 - jnp.asarray(a["dropout"], jnp.float32))
    h = jnp.dot(h.astype(dtype), a["A"].astype(dtype), preferred_element_type=jnp.float32)
    d = jnp.dot(h.astype(dtype), a["B"].astype(dtype), preferred_element_type=jnp.float32)
    return y + d * jnp.asarray(a["scale"], jnp.float32)


class Linear(nn.Module):
    """``y = x @ kernel (+ bias)``, kernel stored (in, out) — HF ``nn.Linear.weight`` transposed by the key map; plus
    the layer's low-rank adapter where its parameters hold one (:func:`lora_update`).

    ``dtype`` is the matmul input dtype; the product accumulates and is returned in float32, bias added in float32.
    """

    features: int
    use_bias: bool
    init_std: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        kernel = self.param("kernel", nn.initializers.normal(self.init_std), (x.shape[-1], self.features))
        y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype), preferred_element_type=jnp.float32)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,)).astype(jnp.float32)
        return lora_update(self, x, y, self.dtype)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * (offset + scale)``, in float32 (Llama: offset 0, scale init 1; Gemma: offset 1,
    scale init 0 — HF ``Gemma2RMSNorm``)."""

    eps: float
    offset: float = 0.0

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        w = self.param("scale", init, (x.shape[-1],))
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return x * (self.offset + w.astype(jnp.float32))


# ----------------------------------------------------------------------------------------------------- rotary


def rope_inv_freq(rot_dim: int, theta: float, rope_type: str = "default", factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_position_embeddings: int = 8192) -> np.ndarray:
    """Inverse frequencies (rot_dim/2,) float32 of RoPE as HF computes them (``modeling_rope_utils``).

    ``default``: ``theta^(−2i/rot_dim)``; ``linear``: divided by ``factor``; ``llama3`` (Llama 3.1): wavelengths
    longer than ``original_max_position_embeddings / low_freq_factor`` divided by ``factor``, shorter than
    ``… / high_freq_factor`` kept, smoothly interpolated in between.
    """
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, rot_dim, 2, dtype=np.float32) / np.float32(rot_dim))))
    inv = inv.astype(np.float32)
    if rope_type == "default":
        return inv
    if rope_type == "linear":
        return (inv / np.float32(factor)).astype(np.float32)
    if rope_type == "llama3":
        low_wl = original_max_position_embeddings / low_freq_factor
        high_wl = original_max_position_embeddings / high_freq_factor
        wl = (2 * math.pi / inv).astype(np.float32)
        out = np.where(wl > low_wl, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((original_max_position_embeddings / wl - low_freq_factor) / (high_freq_factor - low_freq_factor))
        smoothed = (1 - smooth) * out / np.float32(factor) + smooth * out
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        return np.where(medium, smoothed, out).astype(np.float32)
    raise ValueError(f"unsupported rope_type {rope_type!r}")  # configs are checked at load; this is a bug guard


def rope_cos_sin(position_ids, inv_freq: np.ndarray):
    """cos, sin (B, L, rot_dim) float32 for integer ``position_ids`` (B, L) (HF ``RotaryEmbedding.forward``)."""
    freqs = position_ids.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """Rotate the first ``rot_dim`` features of each head (``rotate_half`` convention), the rest pass through.

    x (B, L, H, D) float32; cos/sin (B, L, rot_dim) with rot_dim ≤ D (GPT-NeoX: partial rotary)."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rot = xr * c + jnp.concatenate([-x2, x1], axis=-1) * s
    return jnp.concatenate([rot, xp], axis=-1) if r < x.shape[-1] else rot


# ----------------------------------------------------------------------------------------------------- attention


class KVCache(NamedTuple):
    """Key/value cache of a rotary family for incremental decoding (a pytree, as :class:`rbjax.model.gpt2.KVCache`).

    Attributes:
        keys, values: one array per layer, each (B, S, n_kv_heads, head_dim) in the compute dtype (keys after RoPE).
        mask: bool (B, S), True where the slot holds a real token.
        positions: int32 (B, S), the position id of each written slot (for the sliding window).
        index: int32 scalar, the next slot to write.
    """

    keys: tuple
    values: tuple
    mask: jax.Array
    positions: jax.Array
    index: jax.Array

    @property
    def max_length(self) -> int:
        return self.mask.shape[1]


def init_kv_cache(num_layers: int, num_kv_heads: int, head_dim: int, batch_size: int, max_length: int,
                  dtype=jnp.float32) -> KVCache:
    """An empty :class:`KVCache` of ``max_length`` slots for ``batch_size`` rows."""
    z = jnp.zeros((batch_size, max_length, num_kv_heads, head_dim), dtype)
    return KVCache(keys=tuple(z for _ in range(num_layers)), values=tuple(z for _ in range(num_layers)),
                   mask=jnp.zeros((batch_size, max_length), bool),
                   positions=jnp.zeros((batch_size, max_length), jnp.int32), index=jnp.zeros((), jnp.int32))


class AttentionInputs(NamedTuple):
    """What every layer's attention needs: ``allowed`` (B|1, 1, L, S) bool (causal ∧ mask), the query positions
    (B, L) and key positions (B, S), and for the cache the updated mask/positions and write index."""

    allowed: jax.Array
    q_pos: jax.Array
    k_pos: jax.Array
    cache_mask: Any = None
    cache_positions: Any = None
    index: Any = None


def position_ids_from_mask(attention_mask):
    """Position ids for possibly left-padded rows: the k-th real token gets position k.

    Args:
        attention_mask: (B, L) array of 0/1.
    Returns:
        int32 (B, L) array (padding positions get 0).
    """
    m = jnp.asarray(attention_mask).astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0) * m


def attention_inputs(B: int, L: int, attention_mask=None, position_ids=None, cache: KVCache | None = None
                     ) -> AttentionInputs:
    """The attention mask and positions of a call, in the three modes of ``GPT2LMHeadModel.__call__``:
    (B, L) 0/1 padding mask (positions count real tokens), (B, L, L) query × key mask (needs ``position_ids``),
    or a cache (the new block is written at ``cache.index`` and attends to every real slot up to itself).

    Raises:
        ValueError: a (B, L, L) mask without ``position_ids``, or a cache with a non-(B, L) mask.
    """
    if cache is not None:
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError("with a cache, attention_mask must be (B, L): 1 for the block's real tokens")
        m = jnp.ones((B, L), bool) if attention_mask is None else attention_mask > 0
        if position_ids is None:
            seen = cache.mask.sum(-1, dtype=jnp.int32)[:, None]
            position_ids = (seen + jnp.cumsum(m, axis=-1, dtype=jnp.int32) - 1) * m
        position_ids = position_ids.astype(jnp.int32)
        index = cache.index
        new_mask = jax.lax.dynamic_update_slice(cache.mask, m, (0, index))
        old_pos = getattr(cache, "positions", None)  # GPT-2's cache has none (no sliding window)
        new_pos = None if old_pos is None else jax.lax.dynamic_update_slice(old_pos, position_ids, (0, index))
        S = cache.max_length
        causal = jnp.arange(S)[None, :] <= index + jnp.arange(L)[:, None]
        allowed = (causal[None] & new_mask[:, None, :])[:, None]
        return AttentionInputs(allowed, position_ids, new_pos, new_mask, new_pos, index)
    causal = jnp.tril(jnp.ones((L, L), dtype=bool))
    if attention_mask is not None and attention_mask.ndim == 3:
        if position_ids is None:
            raise ValueError("a (B, L, L) attention_mask needs explicit position_ids")
        allowed = (causal[None] & (attention_mask > 0))[:, None]
    else:
        if position_ids is None:
            position_ids = (jnp.broadcast_to(jnp.arange(L), (B, L)) if attention_mask is None
                            else position_ids_from_mask(attention_mask))
        allowed = causal[None, None] if attention_mask is None else (
            causal[None, None] & (attention_mask[:, None, None, :] > 0))
    position_ids = jnp.broadcast_to(position_ids, (B, L)).astype(jnp.int32)
    return AttentionInputs(allowed, position_ids, position_ids)


def gather_positions(x, positions):
    """``x`` (B, L, ...) at ``positions`` (B, Q) int: (B, Q, ...), the rows of a call's queries
    (:func:`select_queries`)."""
    return jnp.take_along_axis(x, positions.reshape(positions.shape + (1,) * (x.ndim - 2)), axis=1)


def gather_query_rows(allowed, positions):
    """The rows of the queries at ``positions`` (B, Q) of an ``allowed`` mask (B|1, 1, L, S): (B, 1, Q, S)."""
    allowed = jnp.broadcast_to(allowed, (positions.shape[0],) + allowed.shape[1:])
    return jnp.take_along_axis(allowed, positions[:, None, :, None], axis=2)


def select_queries(ai: AttentionInputs, positions) -> AttentionInputs:
    """The attention inputs of the queries at ``positions`` (B, Q) only: ``allowed`` (B, 1, Q, S) and ``q_pos``
    (B, Q) gathered, the keys unchanged. A last layer whose outputs are read at a few positions (a classifier's
    pooled token, :func:`decoder_layers`) computes its queries, attention output and MLP there alone."""
    return ai._replace(allowed=gather_query_rows(ai.allowed, positions),
                       q_pos=jnp.take_along_axis(ai.q_pos, positions, axis=1))


def check_query_positions(query_positions, cache) -> None:
    """``query_positions`` (B, Q) is for a whole-sequence call: a decoding cache needs every position's state.

    Raises:
        ValueError: both given, or ``query_positions`` not 2-D.
    """
    if query_positions is None:
        return
    if cache is not None:
        raise ValueError("query_positions cannot be combined with a cache (decoding reads every position)")
    if query_positions.ndim != 2:
        raise ValueError(f"query_positions must be (B, Q), got shape {tuple(query_positions.shape)}")


def write_cache(kv, k, v, index):
    """Write the block's keys/values (B, L, KV, D) into the layer's cache ``kv`` at slot ``index``."""
    k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), (0, index, 0, 0))
    v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), (0, index, 0, 0))
    return k, v


def dot_product_attention(q, k, v, ai: AttentionInputs, *, scale: float, dtype, softcap: float | None = None,
                          window: int | None = None, dropout=None):
    """Grouped-query attention: q (B, L, H, D), k/v (B, S, KV, D) with H a multiple of KV (query head h reads
    key/value head ``h // (H/KV)``, HF ``repeat_kv``). Scores ``scale · q·k`` in float32, soft-capped
    ``cap·tanh(s/cap)`` when ``softcap`` (Gemma 2, before the mask), masked by ``ai.allowed`` and, with ``window``,
    by ``q_pos − k_pos < window``; float32 softmax; ``dropout`` (a callable on the probabilities) for training.

    Returns (B, L, H·D) float32.
    """
    B, L, H, D = q.shape
    KV = k.shape[2]
    G = H // KV
    qg = q.reshape(B, L, KV, G, D)
    s = jnp.einsum("blkgd,bskd->bkgls", qg.astype(dtype), k.astype(dtype), preferred_element_type=jnp.float32)
    s = soft_cap(s * jnp.float32(scale), softcap)
    allowed = ai.allowed[:, :, None]  # (B|1, 1, 1, L, S)
    if window is not None:
        near = (ai.q_pos[:, :, None] - ai.k_pos[:, None, :]) < window  # (B, L, S)
        allowed = allowed & near[:, None, None]
    s = jnp.where(allowed, s, NEG)
    p = jax.nn.softmax(s, axis=-1)
    if dropout is not None:
        p = dropout(p)
    out = jnp.einsum("bkgls,bskd->blkgd", p.astype(dtype), v.astype(dtype), preferred_element_type=jnp.float32)
    return out.reshape(B, L, H * D)


def soft_cap(x, cap: float | None):
    """``cap · tanh(x / cap)`` in float32, the identity for ``None`` (Gemma 2's attention and final-logit
    soft-capping; the chunked NLL applies the same map)."""
    return x if cap is None else jnp.tanh(x / jnp.float32(cap)) * jnp.float32(cap)


def decoder_layers(make_layer, num_layers: int, x, ai: AttentionInputs, cos, sin, deterministic: bool,
                   cache: KVCache | None, query_positions=None):
    """Run ``make_layer(i)(x, ai, cos, sin, deterministic, kv, positions)`` for ``i < num_layers`` in order (the
    rotary families' decoder stack), giving layer ``i`` its slice of ``cache``. With ``query_positions`` (B, Q) the
    last layer computes its outputs at those positions only (its keys and values at every position): ``x`` comes
    back (B, Q, d), equal to the full stack's output gathered there.

    Returns ``(x, (keys, values))``: the last layer's output and each layer's updated cache (empty without a cache).
    """
    keys, values = [], []
    for i in range(num_layers):
        kv = None if cache is None else (cache.keys[i], cache.values[i])
        x, kv = make_layer(i)(x, ai, cos, sin, deterministic, kv, query_positions if i == num_layers - 1 else None)
        if cache is not None:
            keys.append(kv[0])
            values.append(kv[1])
    return x, (keys, values)


def output_matrix(module: nn.Module, embedding, tied: bool, name: str, vocab_size: int, width: int,
                  init_std: float):
    """The (V, d) output matrix: the input ``embedding`` when ``tied``, otherwise ``module``'s own parameter
    ``{name: {"embedding": (V, d)}}`` initialised N(0, ``init_std``)."""
    if tied:
        return embedding
    init = nn.initializers.normal(init_std)
    return module.param(name, lambda k: {"embedding": init(k, (vocab_size, width))})["embedding"]


def causal_lm_outputs(hidden, head, dtype, return_logits: bool, cache: KVCache | None, new_kv, ai: AttentionInputs,
                      L: int, logit_cap: float | None = None):
    """What a rotary family's ``__call__`` returns: ``(logits | None, hidden)``, or with a ``cache``
    ``(logits | None, hidden, KVCache)`` advanced by ``L`` slots.

    Args:
        hidden: (B, L, d) float32, after the final norm. head: (V, d) output matrix. dtype: matmul input dtype
            (float32 accumulation). new_kv: ``(keys, values)`` from :func:`decoder_layers`.
        logit_cap: final-logit soft-capping (Gemma 2), applied to the returned logits.
    Returns:
        logits (B, L, V) float32 when ``return_logits``.
    """
    logits = None
    if return_logits:
        logits = soft_cap(jnp.dot(hidden.astype(dtype), head.astype(dtype).T, preferred_element_type=jnp.float32),
                          logit_cap)
    if cache is None:
        return logits, hidden
    return logits, hidden, KVCache(tuple(new_kv[0]), tuple(new_kv[1]), ai.cache_mask, ai.cache_positions, ai.index + L)


def embedding_head(params: dict, untied: str, tied: str):
    """(V, d) output matrix of a parameter tree: ``params[untied]`` when present, else the tied input embedding
    ``params[tied]``."""
    return params[untied]["embedding"] if untied in params else params[tied]["embedding"]


def config_special_tokens(config) -> dict:
    """``{"bos", "eos", "pad"}`` token ids from a family config's ``bos/eos/pad_token_id`` (``None`` where unset;
    eos may be a list, as in Llama 3)."""
    return {"bos": config.bos_token_id, "eos": config.eos_token_id, "pad": config.pad_token_id}


def normal_init_params(module: nn.Module, seed: int) -> dict:
    """``module.init`` on a (1, 2) dummy batch: random parameters for tests and tiny models."""
    return jax.jit(module.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 2), jnp.int32))["params"]
