"""Batched, jit-compiled text generation with the KV cache of any model family: sampling (top-k / top-p) and greedy decoding.

One program per (batch size, prompt width) runs the whole decode: a prefill of the left-padded prompts writes
the KV cache (:class:`rbjax.model.gpt2.KVCache`), then a ``lax.while_loop`` feeds one token per step, the LM
head only on the newest position. Position ids follow the attention mask, so a left-padded row generates exactly
what the unpadded row would. A row stops at EOS (or at its token budget); from then on it emits padding, its
cache slots are masked, and it no longer counts. The loop ends when every row has stopped. A model may have several
end tokens (Llama-3-Instruct: ``<|end_of_text|>`` and the end-of-turn ``<|eot_id|>``): a row stops at any of them
(``eos_id`` a list; :meth:`rbjax.model.handle.ModelHandle.end_token_ids` gathers them).

Randomness is per example: example ``i`` draws step ``t`` from ``fold_in(fold_in(PRNGKey(seed), i), t)``, so
its output does not depend on which other examples share its batch, on the batch size or on the order.

Filtering follows Hugging Face ``generate`` (temperature, then top-k — every token tied with the k-th logit kept, as
``TopKLogitsWarper`` — then top-p over the renormalised top-k distribution, keeping the smallest set of most likely
tokens whose probability reaches ``top_p``). Presets
(:func:`sampling_settings`):

* ``semantics="rbjax"`` (default): top-k 50, up to 64 new tokens.
* ``semantics="reference"`` — the paper's DSTC-7 generation (the reference's ``lm_dstc7.py``, docs/dialog.md "CRG":
  ``generate(do_sample=True, top_k=50, top_p=0.95, max_length=128)``): top-k 50 and top-p 0.95, at most 128
  tokens including the prompt. The reference's prompt always fills 64 columns of the batch, so it generates
  at most 64 new tokens; rbjax applies the same 64-token cap per row, and the 128-token total per row against
  the row's real prompt length.
* greedy (``greedy=True``): the most likely token at every step.

**Self-Debias** (``self_debias=`` settings and ``prefix_ids``; docs/debiasing.md, "Self-Debias"): every prompt is
decoded K + 1 times at once — as it is, and with each of the K prefixes inserted as the scorer inserts it (after a
leading BOS when the prompt starts with ``bos_id``, else first; the prefix's ids tokenised on their own). The K + 1
variants are stacked on the batch axis (variant-major: rows ``v·B … v·B + B − 1`` are variant ``v``), each with its
own KV cache rows and left padding, its position ids following its own mask (so they continue from its own prompt
length). At every step the next-token log-softmax of each variant is combined by
:func:`rbjax.model.self_debias.rescaled_log_probs` (λ, ε of the settings) and the token is chosen from that
distribution as above (greedy: its argmax; sampling: temperature, top-k, top-p on it, then the draw), then fed to
all K + 1 rows of the example. Without Self-Debias the program is the plain one (the same tokens as before).
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rbjax.core.interrupt import poll
from rbjax.core.mesh import batch_axes, mesh_sizes, tree_shardings
from rbjax.core.padding import pad_sequences
from rbjax.core.precision import get_policy
from rbjax.model.registry import family_of_config
from rbjax.model.partition import logical_axes_for
from rbjax.model.self_debias import SelfDebiasSettings, rescaled_log_probs

__all__ = ["SamplingSettings", "sampling_settings", "filter_logits", "generate", "Generated", "SEMANTICS"]

SEMANTICS = ("rbjax", "reference")


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How tokens are chosen.

    Attributes:
        max_new_tokens: at most this many new tokens per row (EOS included).
        max_length: optional cap on prompt + new tokens per row (the row's real prompt tokens).
        top_k: keep the k most likely tokens (``None``: all).
        top_p: then keep the smallest set of most likely tokens whose probability reaches ``top_p`` (``None``: 1).
        temperature: logits are divided by it before filtering.
        greedy: take the most likely token (no sampling; ``top_k``/``top_p``/``temperature`` ignored).
    """

    max_new_tokens: int = 64
    max_length: int | None = None
    top_k: int | None = 50
    top_p: float | None = None
    temperature: float = 1.0
    greedy: bool = False

    def __post_init__(self):
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def sampling_settings(semantics: str = "rbjax", **overrides) -> SamplingSettings:
    """The preset of ``semantics`` (see the module docstring) with ``overrides`` applied."""
    if semantics == "rbjax":
        base = SamplingSettings(max_new_tokens=64, top_k=50)
    elif semantics == "reference":
        base = SamplingSettings(max_new_tokens=64, max_length=128, top_k=50, top_p=0.95)
    else:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")
    return dataclasses.replace(base, **overrides)


def _filter(logits, top_k: int, top_p, temperature):
    """(B, V) float32 logits -> (B, V): the tempered logits of the tokens kept, −inf elsewhere.

    Hugging Face's ``TopKLogitsWarper`` then ``TopPLogitsWarper``: top-k keeps every token whose logit reaches the
    k-th largest (all tokens tied at the k-th value, so possibly more than k); top-p then keeps the smallest prefix
    of the kept tokens, most likely first, whose renormalised probability reaches ``top_p`` (equal logits in order
    of token id: HF leaves that order to ``torch.sort``). ``top_p >= 1`` keeps all. O(V) per row: one
    ``lax.top_k`` and one cumulative count of the ties, no sort of the vocabulary.
    """
    lt = logits / temperature
    # descending; equal values: lower token id first. The barrier keeps XLA's CPU compiler from rewriting top-k
    # followed by the slices below into a sort of the whole vocabulary (~100x slower: 118 ms instead of 1 ms per
    # step for 16 rows of GPT-2's 50,257 logits)
    vals, idx = jax.lax.optimization_barrier(jax.lax.top_k(lt, top_k))
    kth = vals[:, -1:]
    tie = lt == kth  # (B, V) tokens tied with the k-th
    n_tie_in = jnp.sum(vals == kth, axis=-1, keepdims=True)  # of them, inside the top-k list
    n_extra = jnp.sum(tie, axis=-1, keepdims=True) - n_tie_in  # beyond it: kept by top-k as well
    e = jnp.exp(vals - vals[:, :1])
    e_tie = jnp.exp(kth - vals[:, :1])
    z = jnp.sum(e, axis=-1, keepdims=True) + n_extra * e_tie  # normaliser over every token top-k keeps
    probs = e / z
    before = jnp.cumsum(probs, axis=-1) - probs  # probability of the tokens ahead in the order
    all_p = top_p >= 1.0
    keep_top = (before < top_p) | all_p  # the most likely token is always kept
    # the extra ties follow the top-k list in the order, each with probability p_tie: keep those that start
    # before top_p is reached (j < (top_p - P(top-k list)) / p_tie; the 1e-5 keeps an exact boundary, e.g. five
    # ties of 0.2 and top_p 0.6, on the side of the strict inequality despite rounding)
    p_tie = e_tie / z
    room = (top_p - jnp.sum(probs, axis=-1, keepdims=True)) / jnp.maximum(p_tie, jnp.finfo(jnp.float32).tiny)
    n_extra_keep = jnp.where(all_p, n_extra, jnp.clip(jnp.ceil(room - 1e-5), 0, n_extra))
    tie_rank = jnp.cumsum(tie, axis=-1) - 1  # among the ties, by token id
    keep = jax.vmap(lambda k, i, v: k.at[i].set(v))(jnp.zeros(lt.shape, bool), idx, keep_top)
    keep = keep | (tie & (tie_rank >= n_tie_in) & (tie_rank < n_tie_in + n_extra_keep))
    return jnp.where(keep, lt, -jnp.inf)


def filter_logits(logits, top_k: int | None = 50, top_p: float | None = None, temperature: float = 1.0):
    """Temperature, top-k and top-p filtering as the sampler applies it (Hugging Face's warpers: every token tied
    with the k-th logit is kept), on full logits.

    Args:
        logits: (B, V) float. top_k: None = V. top_p: None = 1. temperature: > 0.
    Returns:
        float32 (B, V): the tempered logits of kept tokens, −inf elsewhere.
    Raises:
        ValueError: ``top_k < 1``, ``top_p`` outside (0, 1] or ``temperature <= 0`` (as :class:`SamplingSettings`).
    """
    SamplingSettings(top_k=top_k, top_p=top_p, temperature=temperature)  # the sampler's checks
    logits = jnp.asarray(logits, jnp.float32)
    V = logits.shape[-1]
    k = V if top_k is None else min(top_k, V)
    return _filter(logits, k, jnp.float32(1.0 if top_p is None else top_p), jnp.float32(temperature))


def _cast_kernels(params, dt):
    if dt == jnp.float32:
        return params
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x.astype(dt) if getattr(p[-1], "key", None) == "kernel" else x, params)


@partial(jax.jit, static_argnames=("config", "max_new", "top_k", "greedy", "precision", "eos_id", "pad_id", "mesh",
                                   "rescale"))
def _decode(params, prompt_ids, prompt_mask, budget, example_index, seed, top_p, temperature, *,
            config, max_new: int, top_k: int, greedy: bool, precision: str, eos_id: tuple, pad_id: int,
            mesh=None, rescale: tuple | None = None):
    """The whole generation of one batch.

    Args:
        prompt_ids, prompt_mask: int32 (B, P) left-padded; with Self-Debias (``rescale``) ((K + 1)·B, P): the K + 1
        variants of the B examples, variant-major (module docstring). budget: int32 (B,) new tokens allowed per row
        (0 = an empty row). example_index: int32 (B,) per-example PRNG stream. seed: uint32 scalar. top_p,
        temperature: float32 scalars.
        eos_id: a tuple of stop ids (static). rescale: ``None`` (plain decoding) or ``(λ, ε)`` (static): the
        Self-Debias rescaling of the variants' next-token distributions.
    Returns:
        ``(tokens (B, max_new) int32 — pad after a row stops, n_new (B,) int32 — EOS included, eos (B,) bool)``.
    """
    policy = get_policy(precision)
    with policy.matmul_context():
        return _decode_body(params, prompt_ids, prompt_mask, budget, example_index, seed, top_p, temperature,
                            config=config, max_new=max_new, top_k=top_k, greedy=greedy, dt=policy.compute_dtype,
                            eos_id=eos_id, pad_id=pad_id, mesh=mesh, rescale=rescale)


def cache_shardings(cache, mesh):
    """The layout of a KV cache on a named ``mesh``: rows over ``data`` × ``fsdp`` (as the prompts), the
    key/value heads of every ``(B, S, heads, head_dim)`` layer cache over ``tensor`` (as the k/v projections'
    columns); masks, positions and the index follow the rows / are replicated."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def one(x):
        if x.ndim == 0:
            return NamedSharding(mesh, P())
        rows = batch_axes(mesh, x.shape[0])
        spec = [rows if rows else None] + [None] * (x.ndim - 1)
        if x.ndim == 4 and mesh_sizes(mesh)["tensor"] > 1 and x.shape[2] % mesh_sizes(mesh)["tensor"] == 0:
            spec[2] = "tensor"
        return NamedSharding(mesh, P(*spec))

    return jax.tree.map(one, cache)


def _decode_body(params, prompt_ids, prompt_mask, budget, example_index, seed, top_p, temperature, *, config, max_new,
                 top_k, greedy, dt, eos_id, pad_id, mesh=None, rescale=None):
    fam = family_of_config(config)
    model = fam.module(config, dtype=dt)
    p = _cast_kernels(params, dt)
    emb = fam.lm_head(params).astype(dt)
    cap = fam.logit_softcap(config)
    R, P = prompt_ids.shape  # R = n_var · B rows: the K + 1 variants of each example with Self-Debias
    B = budget.shape[0]
    n_var = R // B
    base = jax.random.PRNGKey(seed)
    keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(example_index)

    def head(h):  # (R, d) -> (B, V) float32 (soft-capped where the family caps its logits)
        z = jnp.dot(h.astype(dt), emb.T, preferred_element_type=jnp.float32)
        z = z if cap is None else cap * jnp.tanh(z / cap)
        if rescale is None:
            return z
        # Self-Debias: the variants' log-softmaxes combined into log q of each example (a valid logit vector)
        lp = jax.nn.log_softmax(z.reshape(n_var, B, z.shape[-1]), axis=-1)
        return rescaled_log_probs(lp[0], lp[1:], rescale[0], rescale[1])

    def every_variant(x):  # (B,) -> (R,): an example's value on each of its variants' rows
        return x if n_var == 1 else jnp.tile(x, n_var)

    def pick(logits, t):
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(keys)
        return jax.vmap(jax.random.categorical)(step_keys, _filter(logits, top_k, top_p, temperature)).astype(
            jnp.int32)

    def emit(state, logits):
        t, cache, out, n_new, done, eos = state
        tok = jnp.where(done, pad_id, pick(logits, t))
        out = out.at[:, t].set(tok)
        active = ~done
        n_new = n_new + active
        hit = active & jnp.isin(tok, jnp.asarray(eos_id, jnp.int32))
        eos = eos | hit
        done = done | hit | (n_new >= budget)
        return (t + 1, cache, out, n_new, done, eos), tok, active

    cache = fam.init_cache(config, R, P + max_new, dt)
    if mesh is not None:  # the cache split like the rows and the k/v heads, never whole on one device
        cache = jax.lax.with_sharding_constraint(cache, cache_shardings(cache, mesh))
    _, hidden, cache = model.apply({"params": p}, prompt_ids, prompt_mask, cache=cache, return_logits=False)
    out = jnp.full((B, max_new), pad_id, jnp.int32)
    zero = jnp.zeros((B,), jnp.int32)
    done0 = budget <= 0
    state, tok, active = emit((jnp.int32(0), cache, out, zero, done0, jnp.zeros((B,), bool)), head(hidden[:, -1]))

    def cond(carry):
        state, _, _ = carry
        return (state[0] < max_new) & ~jnp.all(state[4])

    def body(carry):
        state, tok, active = carry
        t, cache, out, n_new, done, eos = state
        _, h, cache = model.apply({"params": p}, every_variant(tok)[:, None],
                                  every_variant(active)[:, None].astype(jnp.int32), cache=cache, return_logits=False)
        return emit((t, cache, out, n_new, done, eos), head(h[:, 0]))

    state, _, _ = jax.lax.while_loop(cond, body, (state, tok, active))
    _, _, out, n_new, _, eos = state
    return out, n_new, eos


@dataclasses.dataclass(frozen=True)
class Generated:
    """Generations in input order.

    Attributes:
        tokens: the new tokens of each example, without the final EOS.
        stopped_at_eos: bool (N,), whether the example ended with EOS (else it ran out of budget).
        settings: what produced them (sampling settings, seed, precision, batch size).
    """

    tokens: list
    stopped_at_eos: np.ndarray
    settings: dict


def generate(params, config, prompts: Sequence[Sequence[int]], *, settings: SamplingSettings | None = None,
             seed: int = 0, batch_size: int = 16, precision: str = "fp32", eos_id: int | Sequence[int] | None = None,
             pad_id: int | None = None, example_ids: Sequence[int] | None = None,
             progress: Callable[[int], None] | None = None, mesh=None,
             self_debias: SelfDebiasSettings | None = None, prefix_ids: Sequence[Sequence[int]] | None = None,
             bos_id: int | None = None) -> Generated:
    """Continue each prompt (token ids) with the model ``params`` (any family of :mod:`rbjax.model.registry`:
    its module with the KV cache ``Family.init_cache`` — grouped-query caches included — and its LM head).

    Prompts are sorted by length, cut into batches of ``batch_size`` and left-padded to a multiple of 8 tokens
    (one compiled program per padded width).

    Args:
        params: the model's params. config: its config.
        prompts: N non-empty token-id lists (e.g. a context followed by ``<|endoftext|>``).
        settings: :class:`SamplingSettings` (default: :func:`sampling_settings` ``("rbjax")``).
        seed: base seed; example ``example_ids[i]`` (default ``i``) samples from its own stream.
        batch_size: rows per compiled batch. precision: ``"fp32"`` or ``"bf16"`` compute.
        eos_id: the stop token, or several (a row stops at any; default: every eos id of the config,
            ``Family.special_tokens``; :meth:`rbjax.model.handle.ModelHandle.end_token_ids` adds
            ``generation_config.json``'s and the chat template's end-of-turn token). pad_id: emitted after a row
            stops (default: the first stop token).
        progress: called with the number of examples after each batch.
        mesh: a named mesh (:func:`rbjax.core.mesh.make_mesh`): parameters placed by the family's logical axes,
            the batch rows split over ``data`` × ``fsdp`` (``batch_size`` must divide evenly to use them) and the KV
            cache split by :func:`cache_shardings`; tokens equal the unsharded run's.
        self_debias: :class:`rbjax.model.self_debias.SelfDebiasSettings` (λ, ε; its prefix texts are recorded): every
            token is chosen from the self-debiased distribution (module docstring); ``None``: the model's own.
        prefix_ids: with ``self_debias``, the token ids of each prefix (tokenised on its own, no special tokens;
            :meth:`rbjax.model.handle.ModelHandle.self_debias_prefix_ids`).
        bos_id: with ``self_debias``, a prompt that starts with this token keeps it first and gets the prefix after
            it (:meth:`rbjax.model.handle.ModelHandle.bos_id`, as the Self-Debias scorer); ``None``: the prefix
            goes first.
    Returns:
        :class:`Generated`.
    Raises:
        ValueError: an empty prompt, a prompt longer than ``config.max_positions - 1`` (with Self-Debias: with the
        longest prefix), a token id outside the vocabulary, no eos id or an eos/pad id outside the vocabulary, bad
        settings; Self-Debias without prefixes, with an empty prefix or one outside the vocabulary, or with a
        ``mesh`` (it generates on one device).
    """
    settings = settings or sampling_settings("rbjax")
    get_policy(precision)  # an unknown name is refused before any work
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if eos_id is None:
        eos_id = family_of_config(config).special_tokens(config).get("eos")
    stop = tuple(dict.fromkeys(int(i) for i in (eos_id if isinstance(eos_id, (tuple, list)) else
                                                ([] if eos_id is None else [eos_id]))))
    if not stop:
        raise ValueError("no eos_id given and the model config names no eos token")
    pad_id = stop[0] if pad_id is None else int(pad_id)
    for what, v in [*(("eos_id", i) for i in stop), ("pad_id", pad_id)]:
        if not 0 <= v < config.vocab_size:  # else the decode loop would index past the head: NaN, then zeros
            raise ValueError(f"{what} {v} is outside the model vocabulary [0, {config.vocab_size})")
    prefixes = _check_prefixes(config, self_debias, prefix_ids, mesh)
    longest = max((len(q) for q in prefixes), default=0)
    n = len(prompts)
    ids = list(range(n)) if example_ids is None else [int(i) for i in example_ids]
    if len(ids) != n:
        raise ValueError(f"{len(ids)} example ids for {n} prompts")
    seqs = _checked_prompts(prompts, config, longest)
    max_new = settings.max_new_tokens
    budgets = _budgets(seqs, settings, config, longest)
    top_k = config.vocab_size if settings.top_k is None else min(settings.top_k, config.vocab_size)
    rows_sharding = None
    if mesh is not None:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P_

        params = jax.device_put(params, tree_shardings(params, mesh, logical_axes_for(config)))
        rows = batch_axes(mesh, batch_size)
        rows_sharding = NamedSharding(mesh, P_(rows if rows else None))
    out_tokens: list = [None] * n
    eos_flags = np.zeros(n, bool)
    order = sorted(range(n), key=lambda i: len(seqs[i]))
    for start in range(0, n, batch_size):
        rows = order[start:start + batch_size]
        pid, pm = _prompt_arrays([seqs[i] for i in rows], prefixes, bos_id, pad_id, batch_size)
        bud = np.zeros(batch_size, np.int32)
        idx = np.zeros(batch_size, np.int32)
        bud[:len(rows)] = [budgets[i] for i in rows]
        idx[:len(rows)] = [ids[i] for i in rows]
        kw = dict(config=config, max_new=max_new, top_k=top_k, greedy=settings.greedy, precision=precision,
                  eos_id=stop, pad_id=pad_id, mesh=mesh,
                  rescale=None if self_debias is None else (float(self_debias.decay_constant),
                                                            float(self_debias.epsilon)))
        if rows_sharding is not None:
            pid, pm, bud, idx = (jax.device_put(x, rows_sharding) for x in (pid, pm, bud, idx))
        args = (params, pid, pm, bud, idx, np.uint32(seed % 2**32), np.float32(settings.top_p or 1.0),
                np.float32(settings.temperature))
        toks, n_new, eos = _decode(*args, **kw)
        toks, n_new, eos = np.asarray(toks), np.asarray(n_new), np.asarray(eos)
        for r, i in enumerate(rows):
            k = int(n_new[r]) - int(eos[r])
            out_tokens[i] = [int(x) for x in toks[r, :k]]
            eos_flags[i] = bool(eos[r])
        if progress is not None:
            progress(len(rows))
        poll()  # an interrupt inside a long phase (rbjax.core.interrupt.interruptible) stops here
    rec = dataclasses.asdict(settings)
    rec.update(seed=seed, precision=precision, eos_id=stop[0] if len(stop) == 1 else list(stop), batch_size=batch_size)
    if self_debias is not None:
        rec["self_debias"] = {**self_debias.to_dict(), "prefix_tokens": [len(q) for q in prefixes],
                              "bos_id": None if bos_id is None else int(bos_id)}
    return Generated(tokens=out_tokens, stopped_at_eos=eos_flags, settings=rec)


def _checked_prompts(prompts, config, longest: int) -> list[list[int]]:
    """The prompts as lists of ints, each non-empty, within the vocabulary and, with the ``longest`` Self-Debias
    prefix, shorter than the model's positions.

    Raises:
        ValueError: the first prompt that is not (its index named).
    """
    seqs = [[int(x) for x in p] for p in prompts]
    for i, s in enumerate(seqs):
        if not s:
            raise ValueError(f"prompt {i} is empty")
        if len(s) + longest >= config.max_positions:
            raise ValueError(f"prompt {i} has {len(s)} tokens"
                             f"{f' (and the longest Self-Debias prefix {longest})' if longest else ''}; the model "
                             f"takes at most {config.max_positions} in all")
        if min(s) < 0 or max(s) >= config.vocab_size:
            raise ValueError(f"prompt {i}: a token id outside the model vocabulary [0, {config.vocab_size})")
    return seqs


def _budgets(seqs, settings: SamplingSettings, config, longest: int) -> list[int]:
    """New tokens allowed per prompt: ``max_new_tokens``, within ``max_length`` in all and within the model's
    positions (with the ``longest`` Self-Debias prefix); 0 when nothing fits."""
    out = []
    for s in seqs:
        b = settings.max_new_tokens
        if settings.max_length is not None:
            b = min(b, settings.max_length - len(s))
        out.append(max(0, min(b, config.max_positions - len(s) - longest)))
    return out


def _prompt_arrays(seqs, prefixes, bos_id, pad_id: int, batch_size: int):
    """One batch's left-padded prompt ids and mask, int32 ((1 + K)·``batch_size``, P), P the longest variant rounded
    up to 8: each example's variants (the prompt, then with each of the K Self-Debias prefixes inserted), variant-major
    (rows ``v·batch_size + r``); filler rows (after the batch's examples) hold one real pad token so that their
    attention is defined (their budget 0 emits nothing)."""
    variants = [[s] + [_with_prefix(s, q, bos_id) for q in prefixes] for s in seqs]
    n_var = 1 + len(prefixes)
    rows = [None] * (n_var * batch_size)
    for r, vs in enumerate(variants):
        for v, s in enumerate(vs):
            rows[v * batch_size + r] = s
    pid, pm = pad_sequences([[] if s is None else s for s in rows], pad_id, multiple=8, side="left")
    pm[:, -1] = 1
    return pid, pm


def _check_prefixes(config, self_debias, prefix_ids, mesh) -> list[list[int]]:
    """The Self-Debias prefixes' ids (``[]`` without Self-Debias), checked."""
    if self_debias is None:
        if prefix_ids:
            raise ValueError("prefix_ids given without self_debias settings")
        return []
    if not isinstance(self_debias, SelfDebiasSettings):
        raise TypeError(f"self_debias must be SelfDebiasSettings, got {type(self_debias).__name__}")
    if mesh is not None:
        raise ValueError("Self-Debias generation runs on one device (no mesh)")
    prefixes = [[int(t) for t in q] for q in (prefix_ids or [])]
    if not prefixes or any(not q for q in prefixes):
        raise ValueError("Self-Debias generation needs at least one prefix, each with at least one token")
    if any(not 0 <= t < config.vocab_size for q in prefixes for t in q):
        raise ValueError(f"a Self-Debias prefix token id outside the model vocabulary [0, {config.vocab_size})")
    return prefixes


def _with_prefix(seq: list[int], prefix: list[int], bos_id: int | None) -> list[int]:
    """``seq`` with ``prefix`` inserted as the Self-Debias scorer inserts it: after a leading ``bos_id``, else
    first."""
    lead = 1 if bos_id is not None and seq and seq[0] == bos_id else 0
    return seq[:lead] + prefix + seq[lead:]

