"""Debiasing fine-tuning of a GPT-2 / DialoGPT (paper §4, §5.1; docs/reference-debias.md §1, §6, §7, §9).

One run = one method (LMD, ADD, HD: LM loss + a debiasing loss; CDA: plain LM loss on the augmented set) on the
training phrases of one bias type, then export and evaluation::

    cfg = TrainConfig(method="hd", bias_type="religion1", model="microsoft/DialoGPT-small", out_dir="runs/hd")
    result = train(cfg)          # OUT/model (HF folder), OUT/lmb_valid/, OUT/results.json, OUT/metrics.jsonl

Training setup (paper §5.1 and the reference Trainer, reference-debias.md §7)
    * Data: each non-empty line of the training file is one example, tokenised on its own (GPT-2 BPE, no special
      tokens) and cut to ``block_size`` = 36 tokens; batches are right-padded to ``(batch_size, block_size)`` with an
      attention mask (no pad token is added to the vocabulary; padded positions are masked out of attention and of
      every loss). The last, smaller batch of an epoch is filled with empty rows (zero mask), which contribute
      nothing, so the result equals the reference's smaller last batch.
    * Order: a seeded permutation per epoch, ``numpy.random.default_rng([seed, epoch])``; dropout (0.1, active as in
      the reference) uses ``fold_in(fold_in(key(seed, impl="rbg"), epoch), batch)``. Both are functions of the position in
      the run only, so a resumed run sees exactly the same batches and dropout masks.
    * Optimiser: ``optax.chain(clip_by_global_norm(1.0), adam(lr_schedule, b1=0.9, b2=0.999, eps=1e-8))``, no weight
      decay, linear decay from ``learning_rate`` (5e-5) to 0 without warm-up, counted in **updates**:
      update ``u`` (1-based) uses ``lr·(1 − (u−1)/t_total)`` with ``t_total = ⌊#batches/accum⌋·epochs`` (or
      ``max_steps``), as HF's ``get_linear_schedule_with_warmup(0, t_total)``.
    * Gradient accumulation: the gradients of ``grad_accum`` micro-batches are averaged (each micro-batch loss is
      scaled by ``1/grad_accum``, as the reference Trainer does), then clipped and applied. The micro-batch step and
      the update step are two jitted functions, so accumulation does not change any compiled shape; with
      accumulation 1 a fused :func:`train_step` does the whole update in one program.
      Micro-batches left over at the end of an epoch (#batches not divisible by accum): ``leftover="drop"`` (paper
      semantics default) drops them; ``leftover="carry"`` (reference semantics default) reproduces the reference
      Trainer: they are added to the first update of the next epoch (which then sums more than ``accum``
      scaled gradients), and those of the last epoch are discarded.
    * λ_LM and λ_D are traced arguments of the jitted step, and so are the learning rate and ``t_total``: all points of
      a hyper-parameter grid that share a batch size reuse one compiled program (:mod:`rbjax.debias.sweep`).
    * Checkpoints: orbax ``CheckpointManager`` under ``OUT/checkpoints`` every ``save_every`` updates and at the end;
      a run started again with the same ``out_dir`` resumes from the last one (params, optimizer state and the
      update count; data order and dropout follow from the count), and ends with bit-identical parameters to an
      uninterrupted run. The optimizer state is restored into the structure of a fresh ``tx.init`` (namedtuples,
      not the lists/dicts an untyped restore gives).
    * Losses per micro-batch: ``lm`` = mean next-token CE over the real targets of the micro-batch; ``debias`` =
      the method's loss from :mod:`rbjax.debias.losses` on the final hidden states (after ``ln_f``) with the trigger
      arrays of :class:`rbjax.debias.triggers.TriggerBuilder`; ``total = losses.total_loss(lm, debias, λ_LM, λ_D,
      semantics)`` (eq. 2). CDA's objective is the LM loss alone.

Outputs in ``out_dir``: ``config.json`` (the config, derived sizes, data files and hashes, versions),
``metrics.jsonl`` (one line per update: step, epoch, lm_loss, debias_loss, total, lr, grad_norm, tokens,
tokens_per_s, elapsed_s), ``checkpoints/``, ``model/`` (HF folder with tokenizer files), ``lmb_valid/``
(:func:`rbjax.lmb.measure.measure_bias` on the valid split), ``results.json`` (config, versions, training
summary, LMB of the debiased type and of every evaluated type, LMP).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rbjax.debias import losses as L
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel

__all__ = [
    "METHODS", "TrainConfig", "TrainResult", "Trainer", "train", "make_optimizer", "linear_schedule",
    "update_plan", "epoch_permutation", "tokenize_lines", "lm_loss", "micro_step", "apply_update", "train_step",
    "Checkpointer", "load_training_texts",
]

#: debiasing methods (``lm``: plain LM fine-tuning on the training phrases, a control / benchmark baseline)
METHODS = ("lmd", "add", "hd", "cda", "lm")
LOSS_METHODS = ("lmd", "add", "hd")

#: fields of :class:`TrainConfig` that determine the training trajectory; a resumed run must match them
TRAJECTORY_FIELDS = (
    "method", "bias_type", "model", "train_file", "semantics", "seed", "epochs", "batch_size", "grad_accum",
    "learning_rate", "adam_b1", "adam_b2", "adam_eps", "max_grad_norm", "block_size", "lambda_lm", "lambda_d",
    "max_steps", "leftover", "dropout",
)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines one debiasing run (frozen, JSON-serialisable; stored in ``OUT/config.json``).

    Attributes:
        method: ``lmd`` (§4.1), ``add`` (§4.2), ``hd`` (§4.3), ``cda`` (§4.4) or ``lm`` (no debiasing).
        bias_type: ``religion1``, ``religion2``, ``race``, ``gender`` or ``queerness``.
        model: HF GPT-2 folder or hub id to start from (e.g. ``microsoft/DialoGPT-small``).
        out_dir: run folder.
        tokenizer: tokenizer folder / hub id (default: the model folder).
        data_dir: RedditBias folder (default: ``$RBJAX_DATA_DIR`` or the verified download cache).
        train_file: train on this text file (one phrase a line) instead of the RedditBias train set.
        semantics: ``paper`` or ``reference`` (losses, triggers, CDA swapping, λ rule, leftovers, ``<bos>`` prefix).
        seed: data order, dropout.
        epochs: passes over the training set (2, §5.1).
        batch_size, grad_accum: micro-batch size and micro-batches per update (grid {4,8,16} × {1,5,8}).
        learning_rate, adam_b1, adam_b2, adam_eps, max_grad_norm: Adam 5e-5 / 0.9 / 0.999 / 1e-8, clip 1.0.
        block_size: tokens per phrase (36).
        lambda_lm, lambda_d: weights of eq. 2 (grid {0.001, 0.01} × {10, 50, 100}); unused by ``cda``/``lm``.
        max_steps: stop after this many updates; like HF, the schedule then decays over ``max_steps``.
        leftover: ``drop`` or ``carry`` (see the module docstring); ``None``: ``drop`` for paper semantics,
            ``carry`` for reference semantics.
        dropout: dropout active during training (the reference: yes).
        save_every: checkpoint interval in updates (a checkpoint is always written at the end).
        keep_checkpoints: checkpoints kept on disk.
        export: write ``OUT/model``.
        evaluate: run LMB on the valid split after training (needs ``export``).
        eval_bias: bias types for the LMB (``all`` or a comma list; the debiased type is always included).
        lmp: compute the Reddit-6K perplexity after training.
        lmp_file: LMP reference file (default: RedditBias ``text_files/humanref6k.txt``).
        lmp_max_lines: score only the first N lines (smoke runs).
        eval_batch_size: phrases per scoring batch.
        progress: show progress bars.
    """

    method: str = "hd"
    bias_type: str = "religion1"
    model: str = "microsoft/DialoGPT-small"
    out_dir: str = "runs/debias"
    tokenizer: str | None = None
    data_dir: str | None = None
    train_file: str | None = None
    semantics: str = "paper"
    seed: int = 42
    epochs: int = 2
    batch_size: int = 8
    grad_accum: int = 1
    learning_rate: float = 5e-5
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    block_size: int = 36
    lambda_lm: float = 0.01
    lambda_d: float = 10.0
    max_steps: int | None = None
    leftover: str | None = None
    dropout: bool = True
    save_every: int = 100
    keep_checkpoints: int = 2
    export: bool = True
    evaluate: bool = True
    eval_bias: str = "all"
    lmp: bool = True
    lmp_file: str | None = None
    lmp_max_lines: int | None = None
    eval_batch_size: int = 64
    progress: bool = True

    def __post_init__(self):
        from rbjax.specs import canonical_bias_type

        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        object.__setattr__(self, "bias_type", canonical_bias_type(self.bias_type))
        if self.semantics not in L.SEMANTICS:
            raise ValueError(f"semantics must be one of {L.SEMANTICS}, got {self.semantics!r}")
        if self.leftover not in (None, "drop", "carry"):
            raise ValueError(f"leftover must be 'drop', 'carry' or None, got {self.leftover!r}")
        for name in ("epochs", "batch_size", "grad_accum", "block_size", "save_every", "keep_checkpoints",
                     "eval_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2, got {self.block_size}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lmp_max_lines is not None and self.lmp_max_lines < 1:
            raise ValueError(f"lmp_max_lines must be >= 1, got {self.lmp_max_lines}")
        if not (self.learning_rate > 0 and self.max_grad_norm > 0 and self.adam_eps >= 0):
            raise ValueError("learning_rate and max_grad_norm must be > 0, adam_eps >= 0")

    @property
    def resolved_leftover(self) -> str:
        """``drop`` or ``carry`` (the default follows the semantics)."""
        if self.leftover is not None:
            return self.leftover
        return "carry" if self.semantics == "reference" else "drop"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def trajectory(self) -> dict:
        """The fields a resumed run must share with the checkpointed one."""
        d = {k: getattr(self, k) for k in TRAJECTORY_FIELDS}
        d["leftover"] = self.resolved_leftover
        return d

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)


# ----------------------------------------------------------------------------------------------------- data
def load_training_texts(cfg: TrainConfig, data=None) -> tuple[list[str], dict]:
    """The training phrases of a run and a description of where they came from.

    * ``train_file`` set: its non-empty lines (for ``cda``, followed by their swapped copies).
    * ``cda``: :func:`rbjax.debias.cda.augmented_training_set` (phrases + our swapped copies; mode = semantics).
    * otherwise: the RedditBias training phrases (:meth:`RedditBiasData.train_file`, lower-case file for religion2);
      in paper semantics the literal ``"<bos> "`` prefix of the queerness lines is removed (an artefact of the data
      preparation), in reference semantics it is kept and tokenised as text, as the reference grid does.

    Returns:
        ``(texts, info)`` with ``info = {"files": [...], "n_lines": ..., ...}``.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing or empty data.
    """
    from rbjax.data.redditbias import RedditBiasData
    from rbjax.debias import cda

    if cfg.train_file is not None:
        p = Path(cfg.train_file)
        if not p.exists():
            raise FileNotFoundError(f"{p}: training file not found")
        texts = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln and not ln.isspace()]
        if not texts:
            raise ValueError(f"{p}: no non-empty line to train on")
        info = {"files": [str(p)], "source": "train_file"}
        if cfg.method == "cda":
            from rbjax.specs import load_spec

            texts = cda.augment(texts, load_spec(cfg.bias_type), mode=cfg.semantics)
            info["source"] = f"train_file, CDA augmented ({cfg.semantics} swapping)"
        info["n_lines"] = len(texts)
        return texts, info
    if data is None or not isinstance(data, RedditBiasData):
        data = RedditBiasData(data if data is not None else cfg.data_dir)
    rel = RedditBiasData.train_file(cfg.bias_type)
    if cfg.method == "cda":
        texts = cda.augmented_training_set(cfg.bias_type, data, mode=cfg.semantics)
        info = {"files": [str(data.path(rel))], "source": f"CDA augmented ({cfg.semantics} swapping)",
                "n_original": len(texts) // 2}
        try:
            cc = cda.cross_check(cfg.bias_type, data, cfg.semantics)
            info["released_cross_check"] = {"file": RedditBiasData.swapped_targets_train_file(cfg.bias_type),
                                            "n_identical": cc.n_identical, "n_released": cc.n_released,
                                            "agreement": cc.agreement}
        except (FileNotFoundError, RuntimeError) as e:  # the released file is only a cross-check
            info["released_cross_check"] = {"error": str(e)}
    else:
        texts = cda.read_train_phrases(cfg.bias_type, data, strip_bos=cfg.semantics == "paper")
        info = {"files": [str(data.path(rel))], "source": "RedditBias training phrases"}
    info["n_lines"] = len(texts)
    return texts, info


def tokenize_lines(texts: list[str], tokenizer, block_size: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Tokenise each line on its own (no special tokens), cut to ``block_size``, right-pad.

    Args:
        texts: (N,) phrases. tokenizer: ``encode_batch``. block_size: tokens kept per phrase. pad_id: filler id
            (never scored or attended; the reference's ``<pad>`` row is not added to the vocabulary).

    Returns:
        ``(ids, mask, stats)``: int32 ``(N', block_size)`` ids and 0/1 mask, where lines with no token are dropped
        (N' ≤ N), and ``{"n_dropped_empty", "n_truncated", "n_tokens"}``.

    Raises:
        ValueError: no line has a token.
    """
    toks = tokenizer.encode_batch(list(texts))
    keep = [t for t in toks if len(t) > 0]
    if not keep:
        raise ValueError("no training line has a token")
    ids = np.full((len(keep), block_size), pad_id, np.int32)
    mask = np.zeros((len(keep), block_size), np.int32)
    n_trunc = 0
    for r, t in enumerate(keep):
        n_trunc += len(t) > block_size
        t = t[:block_size]
        ids[r, :len(t)] = t
        mask[r, :len(t)] = 1
    return ids, mask, {"n_dropped_empty": len(toks) - len(keep), "n_truncated": int(n_trunc),
                       "n_tokens": int(mask.sum())}


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The example order of an epoch: ``numpy.random.default_rng([seed, epoch]).permutation(n)``."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)]).permutation(n)


def update_plan(n_batches: int, grad_accum: int, epochs: int, leftover: str = "drop",
                max_steps: int | None = None) -> tuple[list[list[tuple[int, int]]], int]:
    """Which micro-batches make up each update, and the schedule length.

    Args:
        n_batches: micro-batches per epoch (``ceil(N / batch_size)``).
        grad_accum: micro-batches per update.
        epochs: passes over the data.
        leftover: ``drop`` (leftover micro-batches of each epoch are skipped) or ``carry`` (reference Trainer: they
            join the first update of the next epoch; the last epoch's are discarded).
        max_steps: cap on updates; when given, ``t_total = max_steps`` and more epochs are planned if needed
            (as HF's ``max_steps``).

    Returns:
        ``(plan, t_total)``: ``plan[u]`` = list of ``(epoch, batch_index)`` of update ``u`` (0-based);
        ``t_total = ⌊n_batches/grad_accum⌋·epochs`` (or ``max_steps``).

    Raises:
        ValueError: fewer micro-batches per epoch than ``grad_accum`` (no update would happen).
    """
    per_epoch = n_batches // grad_accum
    if per_epoch == 0:
        raise ValueError(f"{n_batches} micro-batch(es) per epoch is fewer than grad_accum={grad_accum}: no update "
                         "would happen; lower --batch-size or --grad-accum")
    t_total = per_epoch * epochs if max_steps is None else int(max_steps)
    n_epochs = epochs if max_steps is None else max(epochs, -(-int(max_steps) // per_epoch))
    plan: list[list[tuple[int, int]]] = []
    carry: list[tuple[int, int]] = []
    for e in range(n_epochs):
        cur = list(carry) if leftover == "carry" else []
        k = 0
        for b in range(n_batches):
            cur.append((e, b))
            k += 1
            if k == grad_accum:
                plan.append(cur)
                cur, k = [], 0
        carry = cur
    return plan[:t_total], t_total


# ------------------------------------------------------------------------------------------------ optimizer
def linear_schedule(learning_rate, t_total) -> Callable:
    """Linear decay to 0 over ``t_total`` updates, no warm-up: ``lr(count) = lr·max(0, 1 − count/t_total)``.

    ``count`` is the number of updates already applied (optax's schedule count), so update ``u`` (1-based) uses
    ``lr·(t_total − u + 1)/t_total``. ``learning_rate`` and ``t_total`` may be traced arrays.
    """
    def schedule(count):
        frac = 1.0 - jnp.asarray(count, jnp.float32) / jnp.maximum(jnp.asarray(t_total, jnp.float32), 1.0)
        return jnp.asarray(learning_rate, jnp.float32) * jnp.clip(frac, 0.0, 1.0)

    return schedule


def make_optimizer(learning_rate=5e-5, t_total=1, *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   max_grad_norm: float = 1.0) -> optax.GradientTransformation:
    """``optax.chain(clip_by_global_norm(max_grad_norm), adam(linear_schedule(learning_rate, t_total), b1, b2, eps))``.

    No weight decay (the reference's AdamW has weight_decay 0). The state structure does not depend on
    ``learning_rate`` or ``t_total``, which may be traced: :func:`apply_update` builds the transformation inside
    ``jit`` so a grid over them compiles once. HF's AdamW adds ε to √v before folding in the bias correction, optax
    after; the difference is of order ε and negligible (reference-debias.md §7).
    """
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adam(linear_schedule(learning_rate, t_total), b1=b1, b2=b2, eps=eps),
    )


# --------------------------------------------------------------------------------------------- jitted steps
def lm_loss(logits: jax.Array, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Causal LM loss: mean next-token cross-entropy (nats) over the real targets of a batch.

    Logit ``i`` is scored against token ``i+1``; a target counts when both tokens are real (right padding).

    Args:
        logits: ``(B, L, V)`` float32. input_ids, attention_mask: ``(B, L)``.

    Returns:
        scalar; 0 when the batch has no target.
    """
    lg = logits[:, :-1]
    tgt = input_ids[:, 1:]
    m = (attention_mask[:, 1:] * attention_mask[:, :-1]).astype(jnp.float32)
    nll = jax.nn.logsumexp(lg, axis=-1) - jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def _debias_loss(method: str, semantics: str, params, hidden, batch, shared):
    targets = L.gather_targets(params["wte"]["embedding"], shared["pair_ids"], shared["pair_mask"])
    if method == "lmd":
        return L.equalising_loss(hidden, targets, batch["lmd_mask"], batch["norm"], semantics=semantics)
    if method == "add":
        return L.attribute_distance_loss(hidden, targets, batch["occ_weights"], batch["occ_mask"], semantics=semantics)
    basis, basis_mask = L.bias_subspace(targets, semantics=semantics)
    return L.neutralisation_loss(hidden, batch["occ_weights"], batch["occ_mask"], basis, basis_mask,
                                 semantics=semantics)


def batch_losses(params, batch: dict, shared: dict, lambdas, rng, *, config: GPT2Config, method: str,
                 semantics: str, dropout: bool):
    """``(total, (lm, debias))`` of one micro-batch (see :func:`micro_step`; differentiable in ``params``)."""
    model = GPT2LMHeadModel(config)
    logits, hidden = model.apply({"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"],
                                 deterministic=not dropout, rngs={"dropout": rng} if dropout else None)
    lm = lm_loss(logits, batch["input_ids"], batch["attention_mask"])
    if method not in LOSS_METHODS:
        return lm, (lm, jnp.zeros((), jnp.float32))
    deb = _debias_loss(method, semantics, params, hidden, batch, shared)
    return L.total_loss(lm, deb, lambdas[0], lambdas[1], semantics), (lm, deb)


@partial(jax.jit, static_argnames=("config", "method", "semantics", "dropout"), donate_argnames=("acc",))
def micro_step(params, acc, batch: dict, shared: dict, lambdas, scale, rng, *, config: GPT2Config, method: str,
               semantics: str, dropout: bool):
    """Gradient of one micro-batch added to the accumulator: ``acc + scale·∇total``.

    Args:
        params: GPT-2 params. acc: pytree like ``params`` (donated). batch: ``input_ids``/``attention_mask``
            ``(B, L)`` plus the method's trigger arrays (``lmd_mask`` ``(B, L, P)``, ``norm`` ``(B,)``; or
            ``occ_weights`` ``(B, N, L)``, ``occ_mask`` ``(B, N)``). shared: ``pair_ids``/``pair_mask`` ``(P, 2, W)``.
        lambdas: ``(2,)`` float32 ``[λ_LM, λ_D]`` (traced). scale: ``1/grad_accum`` (traced). rng: dropout key.
        config, method, semantics, dropout: static.

    Returns:
        ``(acc, metrics)`` with metrics ``(3,)`` = ``[lm_loss, debias_loss, total]`` of the micro-batch.
    """
    fn = partial(batch_losses, config=config, method=method, semantics=semantics, dropout=dropout)
    (tot, (lm, deb)), g = jax.value_and_grad(fn, has_aux=True)(params, batch, shared, lambdas, rng)
    acc = jax.tree.map(lambda a, b: a + scale * b, acc, g)
    return acc, jnp.stack([lm, deb, tot])


@jax.jit
def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


@partial(jax.jit, static_argnames=("b1", "b2", "eps", "max_grad_norm"),
         donate_argnames=("params", "opt_state"))
def apply_update(params, opt_state, grads, learning_rate, t_total, *, b1: float, b2: float, eps: float,
                 max_grad_norm: float):
    """One optimizer update with the accumulated gradient (clip, Adam, scheduled learning rate).

    Args:
        params, opt_state: donated. grads: the accumulated gradient. learning_rate, t_total: traced scalars (see :func:`make_optimizer`).

    Returns:
        ``(params, opt_state, grad_norm)`` (global norm before clipping).
    """
    tx = make_optimizer(learning_rate, t_total, b1=b1, b2=b2, eps=eps, max_grad_norm=max_grad_norm)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, optax.tree.norm(grads)


@partial(jax.jit, static_argnames=("config", "method", "semantics", "dropout", "b1", "b2", "eps", "max_grad_norm"),
         donate_argnames=("params", "opt_state"))
def train_step(params, opt_state, batch: dict, shared: dict, lambdas, rng, learning_rate, t_total, *,
               config: GPT2Config, method: str, semantics: str, dropout: bool, b1: float, b2: float, eps: float,
               max_grad_norm: float):
    """A whole update from one micro-batch (accumulation 1): gradient, clip, Adam, in one compiled program.

    Equivalent to ``micro_step`` (scale 1, zero accumulator) followed by :func:`apply_update`, without
    materialising the accumulator (one pass less over the parameters' memory per update).

    Returns:
        ``(params, opt_state, metrics (3,) = [lm, debias, total], grad_norm)``.
    """
    fn = partial(batch_losses, config=config, method=method, semantics=semantics, dropout=dropout)
    (tot, (lm, deb)), g = jax.value_and_grad(fn, has_aux=True)(params, batch, shared, lambdas, rng)
    tx = make_optimizer(learning_rate, t_total, b1=b1, b2=b2, eps=eps, max_grad_norm=max_grad_norm)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jnp.stack([lm, deb, tot]), optax.tree.norm(g)


def dropout_key(seed: int, epoch: int, batch_index: int) -> jax.Array:
    """Dropout key of one micro-batch: ``fold_in(fold_in(key(seed), epoch), batch_index)``.

    The key uses JAX's ``rbg`` implementation (XLA's RngBitGenerator): deterministic on a given backend, and on CPU
    it compiles the dropout masks of a GPT-2 step about twice as fast as the default threefry.
    """
    k = jax.random.key(int(seed) & 0xFFFFFFFF, impl="rbg")
    return jax.random.fold_in(jax.random.fold_in(k, int(epoch)), int(batch_index))


# ------------------------------------------------------------------------------------------------ checkpoints
class Checkpointer:
    """Orbax ``CheckpointManager`` for ``{params, opt_state}`` + JSON metadata, restored into a given structure.

    Args:
        directory: checkpoint folder (made absolute).
        keep: checkpoints kept (older ones are deleted).
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 2):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, params, opt_state, meta: dict) -> None:
        """Save at ``step`` (number of updates done); blocks until written."""
        ocp = self._ocp
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, params_like, opt_state_like) -> tuple[Any, Any, dict]:
        """Restore step ``step`` into the pytree structure (and shapes/dtypes) of ``params_like``/``opt_state_like``.

        Raises:
            ValueError: the checkpoint does not fit the given structure.
        """
        ocp = self._ocp
        target = {"params": params_like, "opt_state": opt_state_like}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            r = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises several types for a structure mismatch
            raise ValueError(f"{self.directory}/{step}: checkpoint does not match this run's model/optimizer "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        state = r["state"]
        # orbax gives back the target's structure; make sure (namedtuples, tuples) before handing it out
        if jax.tree.structure(state["opt_state"]) != jax.tree.structure(opt_state_like):
            raise ValueError(f"{self.directory}/{step}: restored optimizer state has another pytree structure")
        return state["params"], state["opt_state"], dict(r["meta"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


# ----------------------------------------------------------------------------------------------------- trainer
@dataclasses.dataclass
class TrainResult:
    """What :meth:`Trainer.run` returns.

    Attributes:
        params: final (or, after ``stop_after``, current) params on the device.
        updates_done: updates applied in total (including those before a resume).
        t_total: schedule length. finished: all ``t_total`` updates done. resumed_from: update count restored
        from a checkpoint (``None`` for a fresh start). summary: timings and last metrics.
    """

    params: Any
    updates_done: int
    t_total: int
    finished: bool
    resumed_from: int | None
    summary: dict


def _sha256_array(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _bar(total: int, initial: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="upd", disable=not enabled, file=sys.stderr,
                dynamic_ncols=True)


class Trainer:
    """A debiasing run's data, model and training loop (see the module docstring).

    Args:
        cfg: the run's :class:`TrainConfig`.
        model_config, params: the starting model (default: loaded from ``cfg.model``); params are not modified.
        tokenizer: a loaded tokenizer (default: ``cfg.tokenizer`` or the model folder).
        texts: training phrases (default: :func:`load_training_texts`).

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing model/data, bad settings.
    """

    def __init__(self, cfg: TrainConfig, *, model_config: GPT2Config | None = None, params=None, tokenizer=None,
                 texts: list[str] | None = None):
        from rbjax.model.hf import load_pretrained, resolve_model_dir
        from rbjax.model.tokenizer import load_tokenizer

        self.cfg = cfg
        if params is None:
            self.model_dir = resolve_model_dir(cfg.model)
            model_config, params = load_pretrained(self.model_dir)
        else:
            self.model_dir = None
            if model_config is None:
                raise ValueError("params given without model_config")
        self.config: GPT2Config = model_config
        self.init_params = params
        if cfg.block_size > self.config.n_positions:
            raise ValueError(f"block_size {cfg.block_size} exceeds the model's n_positions {self.config.n_positions}")
        if tokenizer is None:
            src = cfg.tokenizer if cfg.tokenizer is not None else (self.model_dir or cfg.model)
            try:
                tokenizer = load_tokenizer(src, expected_vocab_size=None)
            except FileNotFoundError:
                raise FileNotFoundError(f"{src}: no tokenizer files (vocab.json + merges.txt or tokenizer.json); "
                                        "pass --tokenizer") from None
        self.tokenizer = tokenizer
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {self.config.vocab_size}")
        self.pad_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        if texts is None:
            texts, self.data_info = load_training_texts(cfg)
        else:
            self.data_info = {"source": "given texts", "n_lines": len(texts)}
        self.ids, self.mask, tstats = tokenize_lines(texts, tokenizer, cfg.block_size, self.pad_id)
        self.data_info.update(tstats)
        self.data_info["sha256_tokens"] = _sha256_array(self.ids, self.mask)
        self.n_examples = len(self.ids)
        self.n_batches = -(-self.n_examples // cfg.batch_size)
        self.plan, self.t_total = update_plan(self.n_batches, cfg.grad_accum, cfg.epochs, cfg.resolved_leftover,
                                              cfg.max_steps)
        self._setup_triggers()
        self._perms: dict[int, np.ndarray] = {}

    # -- triggers ---------------------------------------------------------------------------------------------
    def _setup_triggers(self) -> None:
        cfg = self.cfg
        self.shared: dict[str, np.ndarray] = {}
        self.trigger_stats: dict[str, Any] = {}
        self.n_occ = 0
        if cfg.method not in LOSS_METHODS:
            self.tb = None
            return
        from rbjax.debias.triggers import TriggerBuilder, pad_occurrences
        from rbjax.specs import load_spec

        self.tb = TriggerBuilder(load_spec(cfg.bias_type), self.tokenizer, semantics=cfg.semantics,
                                 pad_id=self.pad_id)
        ids, mask = self.tb.pair_ids("lmd" if cfg.method == "lmd" else "add_hd")
        if ids.max(initial=0) >= self.config.vocab_size:
            raise ValueError(f"a target-pair token id ({int(ids.max())}) is outside the model vocabulary")
        self.shared = {"pair_ids": ids.astype(np.int32), "pair_mask": mask.astype(bool)}
        # one pass over the whole training set: trigger coverage, and the fixed occurrence-axis size
        if cfg.method == "lmd":
            t = self.tb.lmd(self.ids, self.mask)
            fired = t.mask.sum(axis=(1, 2)) > 0
            self.trigger_stats = {"sentences_triggered": int(fired.sum()), "n_sentences": self.n_examples,
                                  "triggered_positions": int((t.mask.sum(-1) > 0).sum()),
                                  "unpredicted_term_occurrences": int(t.unpredicted.sum())}
        else:
            o = self.tb.attributes(self.ids, self.mask, max_occurrences=None)
            per = o.mask.sum(1)
            self.n_occ = pad_occurrences(int(per.max(initial=0)))
            self.trigger_stats = {"sentences_triggered": int((per > 0).sum()), "n_sentences": self.n_examples,
                                  "occurrences": int(per.sum()), "max_per_sentence": int(per.max(initial=0)),
                                  "zero_vector_occurrences": int(((o.weights.sum(-1) == 0) & (o.mask > 0)).sum())}

    # -- batches ----------------------------------------------------------------------------------------------
    def epoch_rows(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            p = self._perms[epoch] = epoch_permutation(self.n_examples, self.cfg.seed, epoch)
        return p

    def batch_rows(self, epoch: int, index: int) -> np.ndarray:
        """Example indices of micro-batch ``index`` of ``epoch``."""
        B = self.cfg.batch_size
        return self.epoch_rows(epoch)[index * B:(index + 1) * B]

    def make_batch(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Host batch of examples ``rows``: ``(batch_size, block_size)`` ids/mask (empty filler rows) + triggers."""
        B, Lb = self.cfg.batch_size, self.cfg.block_size
        ids = np.full((B, Lb), self.pad_id, np.int32)
        mask = np.zeros((B, Lb), np.int32)
        ids[:len(rows)] = self.ids[rows]
        mask[:len(rows)] = self.mask[rows]
        batch = {"input_ids": ids, "attention_mask": mask}
        if self.cfg.method == "lmd":
            t = self.tb.lmd(ids, mask)
            batch.update(lmd_mask=t.mask, norm=t.norm)
        elif self.cfg.method in ("add", "hd"):
            o = self.tb.attributes(ids, mask, max_occurrences=self.n_occ)
            batch.update(occ_weights=o.weights, occ_mask=o.mask)
        return batch

    # -- steps ------------------------------------------------------------------------------------------------
    @property
    def lambdas(self) -> np.ndarray:
        return np.asarray([self.cfg.lambda_lm, self.cfg.lambda_d], np.float32)

    def step_kwargs(self) -> dict:
        c = self.cfg
        return dict(config=self.config, method=c.method, semantics=c.semantics, dropout=c.dropout)

    def _eval_fns(self):
        fns = getattr(self, "_fns", None)
        if fns is None:
            kw = self.step_kwargs()
            f_eval = partial(batch_losses, **{**kw, "dropout": False})
            f_drop = partial(batch_losses, **kw)
            fns = self._fns = {
                "losses": jax.jit(f_eval),
                "grads": jax.jit(jax.grad(lambda p, b, s, lam, r: f_eval(p, b, s, lam, r)[0])),
                "grads_dropout": jax.jit(jax.grad(lambda p, b, s, lam, r: f_drop(p, b, s, lam, r)[0])),
            }
        return fns

    def losses(self, params, batch: dict) -> dict:
        """``{lm, debias, total}`` of a host batch without dropout (for tests and evaluation)."""
        tot, (lm, deb) = self._eval_fns()["losses"](params, batch, self.shared, self.lambdas, None)
        return {"lm": float(lm), "debias": float(deb), "total": float(tot)}

    def grads(self, params, batch: dict, rng=None):
        """Gradient of one micro-batch's total loss (unscaled); with dropout (as configured) when ``rng`` is given."""
        fns = self._eval_fns()
        if rng is None or not self.cfg.dropout:
            return fns["grads"](params, batch, self.shared, self.lambdas, None)
        return fns["grads_dropout"](params, batch, self.shared, self.lambdas, rng)

    def new_opt_state(self, params):
        c = self.cfg
        return make_optimizer(c.learning_rate, self.t_total, b1=c.adam_b1, b2=c.adam_b2, eps=c.adam_eps,
                              max_grad_norm=c.max_grad_norm).init(params)

    def lr_at(self, u: int) -> float:
        """Learning rate of update ``u`` (0-based count of updates already applied)."""
        return float(self.cfg.learning_rate * max(0.0, 1.0 - u / max(self.t_total, 1)))

    def fingerprint(self) -> dict:
        return {"trajectory": self.cfg.trajectory(), "data_sha256": self.data_info["sha256_tokens"],
                "t_total": self.t_total, "n_examples": self.n_examples}

    # -- loop -------------------------------------------------------------------------------------------------
    def run(self, *, stop_after: int | None = None, callback: Callable[[dict], None] | None = None,
            checkpoints: bool = True) -> TrainResult:
        """Train (resuming from ``OUT/checkpoints`` when there is a checkpoint of the same run).

        Args:
            stop_after: stop once this many updates are done in total (a checkpoint is written), as if the run
                had been killed there; a later ``run()`` resumes.
            callback: called before every micro-batch with ``{"kind": "micro", "update", "micro_batch", "epoch",
                "batch_index", "rows", "params"}`` (``params``: the parameters the gradient is taken at) and after every update with ``{"kind": "update", "update", "params",
                "lr", "grad_norm", ...}`` (``params`` are donated to the next update: copy what you keep).
            checkpoints: use orbax checkpoints under ``OUT/checkpoints`` (off: no resume, nothing written).

        Returns:
            :class:`TrainResult`.

        Raises:
            ValueError: a checkpoint from a different run is in ``OUT/checkpoints``.
        """
        cfg = self.cfg
        out = Path(cfg.out_dir)
        params = jax.device_put(self.init_params)
        opt_state = self.new_opt_state(params)
        start, resumed = 0, None
        ckpt = Checkpointer(out / "checkpoints", cfg.keep_checkpoints) if checkpoints else None
        fp = self.fingerprint()
        if ckpt is not None and ckpt.latest_step() is not None:
            step = ckpt.latest_step()
            params, opt_state, meta = ckpt.restore(step, params, opt_state)
            if meta.get("fingerprint") != json.loads(json.dumps(fp)):
                ckpt.close()
                raise ValueError(
                    f"{ckpt.directory}: holds checkpoints of a different run (settings or data differ: "
                    f"{_diff(meta.get('fingerprint') or {}, json.loads(json.dumps(fp)))}); use another --out or "
                    "--overwrite")
            start = resumed = int(meta["update"])
        metrics_path = out / "metrics.jsonl"
        if checkpoints:
            _truncate_metrics(metrics_path, start)
        lambdas = jnp.asarray(self.lambdas)
        shared = jax.device_put(self.shared)
        scale = np.float32(1.0 / cfg.grad_accum)
        kw = self.step_kwargs()
        okw = dict(b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps, max_grad_norm=cfg.max_grad_norm)
        lr0, tt = np.float32(cfg.learning_rate), np.float32(self.t_total)
        end = self.t_total if stop_after is None else min(self.t_total, int(stop_after))
        summary: dict[str, Any] = {"first_update_s": None, "train_s": 0.0, "tokens": 0}
        t_run = time.perf_counter()
        last = None
        mf = open(metrics_path, "a", encoding="utf-8") if checkpoints else None
        bar = _bar(self.t_total, start, f"{cfg.method} {cfg.bias_type}", cfg.progress)
        try:
            win_tok, win_t = 0, time.perf_counter()
            for u in range(start, end):
                t0 = time.perf_counter()
                ms, tokens = [], 0
                lr = self.lr_at(u)
                if len(self.plan[u]) == 1:  # accumulation 1: one fused program
                    (e, b), = self.plan[u]
                    rows = self.batch_rows(e, b)
                    batch = self.make_batch(rows)
                    tokens += int(batch["attention_mask"].sum())
                    if callback is not None:
                        callback({"kind": "micro", "update": u + 1, "micro_batch": 0, "epoch": e, "batch_index": b,
                                  "rows": rows, "params": params, "metrics": None})
                    params, opt_state, m, gnorm = train_step(params, opt_state, batch, shared, lambdas,
                                                             dropout_key(cfg.seed, e, b), lr0, tt, **kw, **okw)
                    ms.append(m)
                else:
                    acc = _zeros_like(params)
                    for j, (e, b) in enumerate(self.plan[u]):
                        rows = self.batch_rows(e, b)
                        batch = self.make_batch(rows)
                        tokens += int(batch["attention_mask"].sum())
                        if callback is not None:
                            callback({"kind": "micro", "update": u + 1, "micro_batch": j, "epoch": e,
                                      "batch_index": b, "rows": rows, "params": params, "metrics": None})
                        acc, m = micro_step(params, acc, batch, shared, lambdas, scale, dropout_key(cfg.seed, e, b),
                                            **kw)
                        ms.append(m)
                    params, opt_state, gnorm = apply_update(params, opt_state, acc, lr0, tt, **okw)
                mean = np.asarray(jnp.mean(jnp.stack(ms), axis=0))  # syncs with the device
                now = time.perf_counter()
                if summary["first_update_s"] is None:
                    summary["first_update_s"] = now - t0
                win_tok += tokens
                summary["tokens"] += tokens
                tps = win_tok / max(now - win_t, 1e-9)
                win_tok, win_t = 0, now
                e_last, b_last = self.plan[u][-1]
                last = {"step": u + 1, "epoch": round(e_last + (b_last + 1) / self.n_batches, 4),
                        "lm_loss": float(mean[0]), "debias_loss": float(mean[1]), "total": float(mean[2]),
                        "lr": lr, "grad_norm": float(gnorm), "tokens": tokens, "tokens_per_s": tps,
                        "elapsed_s": now - t_run}
                if mf is not None:
                    mf.write(json.dumps(last) + "\n")
                    mf.flush()
                bar.update(1)
                bar.set_postfix(loss=f"{last['total']:.4g}", lm=f"{last['lm_loss']:.3f}",
                                deb=f"{last['debias_loss']:.3g}", tok_s=f"{tps:.0f}")
                if callback is not None:
                    callback({"kind": "update", "update": u + 1, "params": params, "lr": lr,
                              "grad_norm": float(gnorm), "metrics": last})
                done = u + 1
                if ckpt is not None and (done % cfg.save_every == 0 or done == end):
                    ckpt.save(done, params, opt_state, {"update": done, "fingerprint": fp, "metrics": last})
        finally:
            bar.close()
            if mf is not None:
                mf.close()
            if ckpt is not None:
                ckpt.close()
        summary["train_s"] = time.perf_counter() - t_run
        summary["last"] = last
        if summary["tokens"] and summary["train_s"] > 0:
            steady = summary["train_s"] - (summary["first_update_s"] or 0.0)
            n_upd = end - start
            summary["tokens_per_s"] = summary["tokens"] / summary["train_s"]
            summary["steady_tokens_per_s"] = (summary["tokens"] * (n_upd - 1) / max(n_upd, 1) / steady
                                              if n_upd > 1 and steady > 0 else None)
        return TrainResult(params=params, updates_done=max(end, start), t_total=self.t_total,
                           finished=max(end, start) >= self.t_total, resumed_from=resumed, summary=summary)


def _diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    parts = []
    for k in keys:
        if a.get(k) != b.get(k):
            if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
                parts.append(f"{k}: {_diff(a[k], b[k])}")
            else:
                parts.append(f"{k}: checkpoint {a.get(k)!r} vs now {b.get(k)!r}")
    return "; ".join(parts) or "none"


def _truncate_metrics(path: Path, upto: int) -> None:
    """Keep only the metric lines of updates ≤ ``upto`` (those after the resumed checkpoint are redone)."""
    if not path.exists():
        return
    keep = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(ln).get("step", 0) <= upto:
                keep.append(ln)
        except json.JSONDecodeError:
            break  # a line cut by a kill: drop it and everything after
    from rbjax.report.io import atomic_write_text

    atomic_write_text(path, "".join(k + "\n" for k in keep))


# ---------------------------------------------------------------------------------------------- full pipeline
def _tokenizer_folder(cfg: TrainConfig, trainer: Trainer) -> Path | None:
    from rbjax.model.hf import resolve_model_dir

    src = cfg.tokenizer if cfg.tokenizer is not None else (trainer.model_dir or cfg.model)
    try:
        folder = resolve_model_dir(src)
    except (FileNotFoundError, RuntimeError):
        return None
    return folder if _has_tokenizer(folder) else None


def _has_tokenizer(folder: Path) -> bool:
    folder = Path(folder)
    return (folder / "tokenizer.json").exists() or ((folder / "vocab.json").exists() and (folder / "merges.txt").exists())


def _lmb_summary(rec: dict) -> dict:
    keys = ("bias_type", "split", "n_pairs", "n_pairs_after_outliers", "t_value", "p_value", "significant",
            "direction", "cohens_d_paired", "mean_log_ppl_diff")
    out = {k: rec.get(k) for k in keys}
    out["reference_ttest_rel"] = {k: rec.get("reference", {}).get(k) for k in ("t_value", "p_value")}
    return out


def evaluate_run(cfg: TrainConfig, trainer: Trainer, params, model_dir: Path | None) -> dict:
    """Post-training evaluation: LMB (valid split) of the exported model and the Reddit LMP of ``params``."""
    from rbjax.data.redditbias import RedditBiasData, expand_bias_types

    res: dict[str, Any] = {}
    if cfg.evaluate:
        if model_dir is None:
            raise ValueError("LMB evaluation needs the exported model (export=True)")
        from rbjax.lmb.measure import measure_bias

        types = expand_bias_types(cfg.eval_bias)
        if cfg.bias_type not in types:
            types = [cfg.bias_type] + types
        t0 = time.perf_counter()
        recs = measure_bias(model=model_dir, bias_types=types, split="valid", data_dir=cfg.data_dir,
                            tokenizer=None if _has_tokenizer(model_dir) else cfg.tokenizer,
                            out_dir=Path(cfg.out_dir) / "lmb_valid", batch_size=cfg.eval_batch_size,
                            seed=cfg.seed, progress=cfg.progress)
        res["lmb_valid"] = {
            "debiased_type": next(_lmb_summary(r) for r in recs if r["bias_type"] == cfg.bias_type),
            "all": [_lmb_summary(r) for r in recs],
            "folder": str(Path(cfg.out_dir) / "lmb_valid"),
            "seconds": time.perf_counter() - t0,
        }
    if cfg.lmp:
        from rbjax.dialog.lmp import read_reference_lines, reddit_perplexity

        path = Path(cfg.lmp_file) if cfg.lmp_file else RedditBiasData(cfg.data_dir).reddit_reference_file()
        lines = read_reference_lines(path, cfg.lmp_max_lines)
        t0 = time.perf_counter()
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(lines), desc="LMP (Reddit 6K)", unit="line", file=sys.stderr, leave=False)
        try:
            lmp = reddit_perplexity(jax.device_get(params), trainer.config, trainer.tokenizer, lines,
                                    block_size=cfg.block_size, batch_size=cfg.eval_batch_size,
                                    progress=None if bar is None else bar.update)
        finally:
            if bar is not None:
                bar.close()
        lmp.update(file=str(path), max_lines=cfg.lmp_max_lines, seconds=time.perf_counter() - t0)
        res["lmp"] = lmp
    return res


def write_config(cfg: TrainConfig, trainer: Trainer) -> None:
    from rbjax.report.io import atomic_write_json, versions

    atomic_write_json(Path(cfg.out_dir) / "config.json", {
        "config": cfg.to_dict(), "resolved": {"leftover": cfg.resolved_leftover},
        "derived": {"n_examples": trainer.n_examples, "n_batches_per_epoch": trainer.n_batches,
                    "t_total": trainer.t_total, "micro_batches_planned": sum(len(p) for p in trainer.plan),
                    "occurrence_axis": trainer.n_occ},
        "model": {"source": cfg.model, "folder": None if trainer.model_dir is None else str(trainer.model_dir),
                  "config": dataclasses.asdict(trainer.config)},
        "tokenizer": getattr(trainer.tokenizer, "source", None),
        "data": trainer.data_info, "triggers": trainer.trigger_stats,
        "target_pairs": {k: v.tolist() for k, v in trainer.shared.items()},
        "versions": versions()})


def train(cfg: TrainConfig, *, stop_after: int | None = None, overwrite: bool = False,
          trainer: Trainer | None = None) -> dict:
    """Run a debiasing job end to end: train (resuming if possible), export, evaluate, write ``results.json``.

    Args:
        cfg: the run configuration.
        stop_after: stop after this many updates (checkpointed), without export or evaluation (simulated kill).
        overwrite: delete an existing run folder's checkpoints, metrics and results first.
        trainer: a prepared :class:`Trainer` for ``cfg`` (the sweep reuses loaded weights).

    Returns:
        the ``results.json`` content (``{"status": "stopped", ...}`` after ``stop_after``). When ``OUT/results.json``
        already holds this very configuration's finished run, it is returned as it is.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: bad inputs (messages name the file / setting).
    """
    import shutil

    from rbjax.model.hf import save_pretrained
    from rbjax.report.io import atomic_write_json, versions

    out = Path(cfg.out_dir)
    if overwrite:
        for name in ("checkpoints", "metrics.jsonl", "results.json", "model", "lmb_valid", "config.json"):
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    done = out / "results.json"
    if stop_after is None and done.exists():
        try:
            prev = json.loads(done.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            prev = {}
        ignore = ("progress", "save_every", "keep_checkpoints", "eval_batch_size")
        same = {k: v for k, v in json.loads(json.dumps(cfg.to_dict())).items() if k not in ignore}
        if prev.get("status") == "done" and {k: v for k, v in (prev.get("config") or {}).items()
                                             if k not in ignore} == same:
            return prev  # this very run is complete: nothing to redo (--overwrite starts again)
    t0 = time.perf_counter()
    trainer = trainer or Trainer(cfg)
    write_config(cfg, trainer)
    result = trainer.run(stop_after=stop_after)
    if not result.finished:
        return {"status": "stopped", "updates_done": result.updates_done, "t_total": result.t_total,
                "out_dir": str(out)}
    model_dir = None
    if cfg.export:
        tok_dir = _tokenizer_folder(cfg, trainer)
        model_dir = save_pretrained(jax.device_get(result.params), trainer.config, out / "model", tokenizer_dir=tok_dir)
    evals = evaluate_run(cfg, trainer, result.params, model_dir)
    res = {"status": "done", "method": cfg.method, "bias_type": cfg.bias_type, "semantics": cfg.semantics,
           "config": cfg.to_dict(), "model_dir": None if model_dir is None else str(model_dir),
           "training": {"updates": result.updates_done, "t_total": result.t_total,
                        "resumed_from": result.resumed_from, "n_examples": trainer.n_examples,
                        "triggers": trainer.trigger_stats, **result.summary},
           **evals, "wall_s": time.perf_counter() - t0, "versions": versions()}
    atomic_write_json(out / "results.json", res)
    return res
