"""The pure training step of the debiasing runs: a train state and ``train_step(state, batch) -> (state, metrics)``.

Importable without orbax, tqdm or any I/O: this is what people unit-test, ``vmap`` over a hyper-parameter grid and
shard over a device mesh. One compiled program per *batch plan* (micro-batch size × accumulation): the per-run
hyper-parameters λ_LM, λ_D and the peak learning rate live in the state as arrays, so the 6 λ combinations of the
paper's grid at one (batch, accumulation) setting share a program, vmapped over a stacked state
(:func:`grid_train_step`).

One update (paper §5.1; reference-debias.md §1.7-§1.8, §7)::

    for each of the update's A micro-batches:       (lax.scan; A = grad_accum, more for a carried-over update)
        total = λ_LM·L_LM + λ_D·L_D  (eq. 2; losses.total_loss, the reference's λ rule under reference semantics)
        grad += ∇ total / grad_accum               (the reference Trainer's scaling)
    direction = Adam(clip_1.0(grad))                (optim.make_optimizer: skipped if grad or total is not finite)
    params -= learning_rate(step, lr, t_total) · direction

Losses of a micro-batch: ``lm`` = mean next-token cross-entropy over its real targets (the chunked next-token NLL
of :mod:`rbjax.model.nll`, shared with the LMB scorer); ``debias`` = the method's
loss from :mod:`rbjax.debias.losses` on the final hidden states (after ``ln_f``) with the batch's trigger arrays;
CDA and plain LM fine-tuning use ``lm`` alone.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rbjax.core.precision import get_policy
from rbjax.debias import losses as L
from rbjax.debias.config import LOSS_METHODS, TASKS
from rbjax.debias.optim import global_norm, learning_rate, make_optimizer
from rbjax.dialog.dst import dst_head_logits, dst_logits, dst_loss, pooled_index
from rbjax.model.layers import position_ids_from_mask
from rbjax.model.nll import nll_from_hidden
from rbjax.model.registry import family_of_config

__all__ = ["StepSpec", "TrainState", "init_state", "stack_states", "unstack_state", "lm_loss", "batch_losses",
           "train_step", "train_step_jit", "grid_train_step", "step_on_mesh", "compiled_programs",
           "micro_batch_losses", "micro_batch_grads"]

#: arrays of a batch that are shared by all micro-batches (not stacked on the micro-batch axis)
SHARED_KEYS = ("pair_ids", "pair_mask")


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static settings of a step (hashable; one compiled program per distinct value and batch shape).

    Attributes:
        config: the model's config (any family of :mod:`rbjax.model.registry`). method: ``lmd``/``add``/``hd``/``cda``/``lm``.
        semantics: ``paper``/``reference``. dropout: dropout active. grad_accum: micro-batches per update (each
        micro-batch loss is scaled by ``1/grad_accum``). b1, b2, eps, max_grad_norm: Adam and clip settings.
        precision: ``fp32`` or ``bf16`` (bf16 activations/matmuls; parameters, optimiser and losses in fp32).
    """

    config: Any
    method: str
    semantics: str = "paper"
    dropout: bool = True
    grad_accum: int = 1
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    precision: str = "fp32"

    @property
    def optimizer(self) -> optax.GradientTransformation:
        return make_optimizer(b1=self.b1, b2=self.b2, eps=self.eps, max_grad_norm=self.max_grad_norm)

    @property
    def policy(self):
        """The precision policy (:mod:`rbjax.core.precision`)."""
        return get_policy(self.precision)

    @property
    def compute_dtype(self):
        return self.policy.compute_dtype


@flax.struct.dataclass
class TrainState:
    """Everything that changes during a run, as arrays (a pytree; stack it on a leading axis for a grid).

    Attributes:
        params: GPT-2 parameters. opt_state: the optimiser state (:func:`rbjax.debias.optim.make_optimizer`).
        step: int32, updates done (the next update's learning rate is ``learning_rate(step, lr, t_total)``).
        lambdas: float32 ``(2,)``, ``[λ_LM, λ_D]`` of eq. 2. lr: float32 peak learning rate.
        t_total: float32, schedule length in updates.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    lambdas: jax.Array
    lr: jax.Array
    t_total: jax.Array


def init_state(params, spec: StepSpec, *, lambda_lm: float, lambda_d: float, lr: float, t_total: int) -> TrainState:
    """A fresh state for one run (step 0, a new optimiser state)."""
    return TrainState(params=params, opt_state=spec.optimizer.init(params), step=jnp.zeros((), jnp.int32),
                      lambdas=jnp.asarray([lambda_lm, lambda_d], jnp.float32), lr=jnp.asarray(lr, jnp.float32),
                      t_total=jnp.asarray(t_total, jnp.float32))


def stack_states(states: list[TrainState]) -> TrainState:
    """Stack states of several runs on a leading grid axis (for :func:`grid_train_step`)."""
    return jax.tree.map(lambda *x: jnp.stack(x), *states)


def unstack_state(state: TrainState, i: int) -> TrainState:
    """Point ``i`` of a stacked state."""
    return jax.tree.map(lambda x: x[i], state)


# ------------------------------------------------------------------------------------------------------ losses
def lm_loss(logits: jax.Array, input_ids: jax.Array, attention_mask: jax.Array,
            context_mask: jax.Array | None = None) -> jax.Array:
    """Causal LM loss from full logits: mean next-token cross-entropy (nats) over the real targets of a batch.

    The training step computes the same quantity from the final hidden states with the shared chunked next-token
    NLL (:func:`rbjax.model.nll.nll_from_hidden`), without materialising the ``(B, L, V)`` logits; this function is
    for callers that hold logits (and is tested equal to it and to PyTorch's ``labels=`` loss).

    Logit ``i`` is scored against token ``i+1``; a target counts when both tokens are real (right padding).

    Args:
        logits: ``(B, L, V)`` float32. input_ids, attention_mask: ``(B, L)``.
        context_mask: ``(B, L)`` real tokens that may *predict* (default: ``attention_mask``); with it,
            ``attention_mask`` marks the tokens to be *scored* (e.g. only a response after its context).

    Returns:
        scalar; 0 when the batch has no target.
    """
    lg = logits[:, :-1].astype(jnp.float32)
    tgt = input_ids[:, 1:]
    ctx = attention_mask if context_mask is None else context_mask
    m = (attention_mask[:, 1:] * ctx[:, :-1]).astype(jnp.float32)
    nll = jax.nn.logsumexp(lg, axis=-1) - jnp.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def _debias_loss(spec: StepSpec, params, hidden, batch):
    # the output embedding: the LM head (the tied wte for GPT-2, the untied head where a family has one)
    targets = L.gather_targets(family_of_config(spec.config).lm_head(params), batch["pair_ids"], batch["pair_mask"])
    if spec.method == "lmd":
        return L.equalising_loss(hidden, targets, batch["lmd_mask"], batch["norm"], semantics=spec.semantics)
    if spec.method == "add":
        return L.attribute_distance_loss(hidden, targets, batch["occ_weights"], batch["occ_mask"],
                                         semantics=spec.semantics)
    basis, basis_mask = L.bias_subspace(targets, semantics=spec.semantics)
    return L.neutralisation_loss(hidden, batch["occ_weights"], batch["occ_mask"], basis, basis_mask,
                                 semantics=spec.semantics)


def _forward(model, params, batch: dict, drop: bool, key):
    """Final hidden states of a micro-batch, in the padded layout ``(B, L, d)``, and the mean next-token NLL inputs.

    Padded layout: GPT-2 runs on the ``(B, L)`` rows as they are. Packed layout (``batch["pack"]`` ``(R, Lp)``,
    :func:`rbjax.debias.data.pack_index`): GPT-2 runs on the packed rows, each slot attending only to the earlier
    slots of its own example (block-diagonal causal mask from segment ids) at the example's own position ids, so
    every real token gets the state it gets in the padded layout; ``batch["unpack"]`` brings the states back to
    ``(B, L)`` (zeros at padding, which no loss reads).

    Returns:
        ``(hidden, rows)``: float32 ``(B, L, d)`` and ``rows = (h_rows, ids_rows, src, real)``, the states and ids of
        the rows the model ran on, ``src`` the flat padded index of each slot and ``real`` which slots hold a token.
    """
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rngs = None if not drop else {"dropout": key}
    if "pack" not in batch:
        _, hidden = model.apply({"params": params}, ids, attention_mask=mask, deterministic=not drop, rngs=rngs,
                                return_logits=False)
        hidden = hidden.astype(jnp.float32)
        B, L = ids.shape
        return hidden, (hidden, ids, jnp.arange(B * L, dtype=jnp.int32).reshape(B, L), mask > 0)
    pack, unpack = batch["pack"], batch["unpack"]
    L = ids.shape[1]
    real = pack >= 0
    src = jnp.where(real, pack, 0)
    p_ids = jnp.where(real, ids.reshape(-1)[src], 0)
    pos = jnp.where(real, position_ids_from_mask(mask).reshape(-1)[src], 0)
    seg = jnp.where(real, pack // L, -1)
    attn = seg[:, :, None] == seg[:, None, :]  # block-diagonal; the model ANDs the causal mask
    _, h_rows = model.apply({"params": params}, p_ids, attention_mask=attn, position_ids=pos,
                            deterministic=not drop, rngs=rngs, return_logits=False)
    h_rows = h_rows.astype(jnp.float32)
    d = h_rows.shape[-1]
    hidden = jnp.where((unpack >= 0)[..., None], h_rows.reshape(-1, d)[jnp.maximum(unpack, 0)], 0.0)
    return hidden, (h_rows, p_ids, src, real)


def _mean_nll(spec: StepSpec, params, rows, score_mask, context_mask):
    """Mean next-token NLL of the targets ``score_mask`` ``(B, L)`` marks, predicted from real tokens
    (``context_mask``), over the rows the model ran on (:func:`_forward`): the one next-token NLL of rbjax
    (:func:`rbjax.model.nll.nll_from_hidden`, chunked log-sum-exp over the LM head ``Family.lm_head(params)``
    with the family's logit soft-cap, never the (B, L, V) logits), shared with the LMB scorer. A slot predicts the next slot when both hold consecutive tokens of the same
    example, so the targets and their count are those of the padded layout."""

    h_rows, ids_rows, src, real = rows
    sf, cf = score_mask.reshape(-1), context_mask.reshape(-1)
    L = score_mask.shape[-1]  # consecutive slots of one example: next flat index, not the start of a padded row
    pair = real[:, 1:] & real[:, :-1] & (src[:, 1:] == src[:, :-1] + 1) & (src[:, 1:] % L != 0)
    m = (pair * sf[src[:, 1:]] * cf[src[:, :-1]]).astype(jnp.float32)
    fam = family_of_config(spec.config)
    nll = nll_from_hidden(h_rows[:, :-1], fam.lm_head(params), ids_rows[:, 1:],
                          compute_dtype=None if spec.precision == "fp32" else spec.compute_dtype,
                          softcap=fam.logit_softcap(spec.config))
    return jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)


def _task_losses(params, batch: dict, rng, spec: StepSpec, drop: bool):
    """Losses of the dialog fine-tuning tasks (``spec.method`` ``dst`` or ``crg``) that share the trainer."""
    key = jax.random.wrap_key_data(rng, impl="rbg") if drop else None
    if spec.method == "dst":  # paper §3.2: a linear classifier on the last real token's state, BCE

        if "pack" in batch:  # pooling "last" (the reference pooling attends padding and is never packed)
            hidden, _ = _forward(family_of_config(spec.config).module(spec.config), params["gpt2"], batch, drop, key)
            idx = pooled_index(batch["attention_mask"])
            logits = dst_head_logits(jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0], params["head"])
        else:
            logits = dst_logits(params["gpt2"], params["head"], batch["input_ids"], batch["attention_mask"],
                                spec.config, pooling=spec.semantics if spec.semantics == "reference" else "last",
                                dropout_rng=key)
        w = batch.get("weights")
        if w is None:  # the filler rows of a short last batch (no token) do not count
            w = (jnp.sum(batch["attention_mask"], axis=-1) > 0).astype(jnp.float32)
        loss = dst_loss(logits, batch["labels"], w)
        return loss, (loss, jnp.zeros((), jnp.float32))
    # crg (paper §3.2): the causal LM loss on the response only (context + <eos> + response + <eos>)
    model = family_of_config(spec.config).module(spec.config, dtype=spec.compute_dtype)
    _, rows = _forward(model, params, batch, drop, key)
    lm = _mean_nll(spec, params, rows, batch["attention_mask"] * batch["loss_mask"], batch["attention_mask"])
    return lm, (lm, jnp.zeros((), jnp.float32))


def batch_losses(params, batch: dict, lambdas, rng, spec: StepSpec, *, dropout: bool | None = None):
    """``(total, (lm, debias))`` of one micro-batch (differentiable in ``params``).

    Args:
        params: the model's params. batch: ``input_ids``/``attention_mask`` ``(B, L)``, the method's trigger arrays
            (``lmd_mask`` ``(B, L, P)`` and ``norm`` ``(B,)``; or ``occ_weights`` ``(B, N, L)`` and ``occ_mask``
            ``(B, N)``) and the target pairs ``pair_ids``/``pair_mask`` ``(P, 2, W)``; packed layout: also ``pack``
            ``(R, Lp)`` and ``unpack`` ``(B, L)`` (:func:`rbjax.debias.data.pack_index`), and GPT-2 then runs on the
            packed rows (:func:`_forward`) with the same losses.
        lambdas: ``(2,)`` ``[λ_LM, λ_D]``. rng: raw ``rbg`` key data (``(4,)`` uint32) or None (no dropout).
        spec: static settings. dropout: override ``spec.dropout``.
    """
    drop = spec.dropout if dropout is None else dropout
    drop = drop and rng is not None
    with spec.policy.matmul_context():  # fp32 = full fp32 matmuls on every backend, whatever the global default
        return _batch_losses(params, batch, lambdas, rng, spec, drop)


def _batch_losses(params, batch: dict, lambdas, rng, spec: StepSpec, drop: bool):
    if spec.method in TASKS:
        return _task_losses(params, batch, rng, spec, drop)
    model = family_of_config(spec.config).module(spec.config, dtype=spec.compute_dtype)
    key = jax.random.wrap_key_data(rng, impl="rbg") if drop else None
    hidden, rows = _forward(model, params, batch, drop, key)
    lm = _mean_nll(spec, params, rows, batch["attention_mask"], batch["attention_mask"])
    if spec.method not in LOSS_METHODS:
        return lm, (lm, jnp.zeros((), jnp.float32))
    deb = _debias_loss(spec, params, hidden, batch)
    return L.total_loss(lm, deb, lambdas[0], lambdas[1], spec.semantics), (lm, deb)


# ------------------------------------------------------------------------------------------------------- step
def train_step(state: TrainState, batch: dict, *, spec: StepSpec) -> tuple[TrainState, dict]:
    """One update from the micro-batches of ``batch`` (pure; jit with ``spec`` static, see :data:`train_step_jit`).

    Args:
        state: the run's :class:`TrainState`.
        batch: the update's micro-batches stacked on a leading axis A (``input_ids`` ``(A, B, L)``, masks, trigger
            arrays, ``rng`` ``(A, 4)`` uint32 dropout keys) plus the unstacked target pairs ``pair_ids``/
            ``pair_mask`` of the loss methods.
        spec: static settings.

    Returns:
        ``(state, metrics)`` with float32 metrics ``lm``, ``debias``, ``total`` (means over the micro-batches),
        ``grad_norm`` (global norm of the accumulated gradient before clipping, overflow-free), ``lr`` (the learning
        rate this update used) and ``skipped`` (1.0 when the gradient or the total loss was not finite and the
        update was skipped).
    """
    shared = {k: batch[k] for k in SHARED_KEYS if k in batch}
    micro = {k: v for k, v in batch.items() if k not in SHARED_KEYS}
    scale = jnp.float32(1.0 / spec.grad_accum)

    def one(mb):
        fn = lambda p: batch_losses(p, {**mb, **shared}, state.lambdas, mb["rng"], spec)  # noqa: E731
        (tot, (lm, deb)), g = jax.value_and_grad(fn, has_aux=True)(state.params)
        return jax.tree.map(lambda x: x * scale, g), jnp.stack([lm, deb, tot])

    n_micro = micro["input_ids"].shape[0]
    if n_micro == 1:
        grads, m = one(jax.tree.map(lambda x: x[0], micro))
    else:
        def body(acc, mb):
            g, m = one(mb)
            return jax.tree.map(jnp.add, acc, g), m

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        grads, ms = jax.lax.scan(body, zeros, micro)
        m = ms.mean(axis=0)
    gnorm = global_norm(grads)
    # A non-finite loss skips the update even when its gradient is finite (e.g. λ_D = NaN on a batch with no
    # debiasing term: total NaN, gradient of the LM term only): the optimiser sees a NaN gradient, so it leaves
    # the parameters and moments alone and counts the skip (optim.make_optimizer).
    finite_loss = jnp.isfinite(m[2])
    grads = jax.tree.map(lambda g: jnp.where(finite_loss, g, jnp.nan).astype(g.dtype), grads)
    direction, opt_state = spec.optimizer.update(grads, state.opt_state, state.params)
    lr = learning_rate(state.step, state.lr, state.t_total)
    params = jax.tree.map(lambda p, d: (p - lr * d).astype(p.dtype), state.params, direction)
    skipped = jnp.logical_not(jnp.isfinite(gnorm) & finite_loss).astype(jnp.float32)
    new = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new, {"lm": m[0], "debias": m[1], "total": m[2], "grad_norm": gnorm, "lr": lr, "skipped": skipped}


#: :func:`train_step` compiled (``spec`` static, the state donated): one program per (spec, batch shape)
train_step_jit = jax.jit(train_step, static_argnames=("spec",), donate_argnames=("state",))


def _grid_step(state: TrainState, batch: dict, *, spec: StepSpec) -> tuple[TrainState, dict]:
    return jax.vmap(lambda s: train_step(s, batch, spec=spec))(state)


#: :func:`train_step` vmapped over a stacked state (leading grid axis; every point sees the same ``batch``), compiled.
#: A point whose gradient is not finite skips its update without touching the others.
grid_train_step = jax.jit(_grid_step, static_argnames=("spec",), donate_argnames=("state",))

_ON_MESH: dict = {}


def step_on_mesh(mesh, stacked: bool, state_shardings=None):
    """The compiled step for a device ``mesh``: the state stays split over ``grid`` (``stacked``: a chunk of grid
    points) or replicated (one run) — or, on a mesh with ``fsdp``/``tensor`` axes, laid out as ``state_shardings``
    (:func:`rbjax.core.mesh.tree_shardings`: parameters, gradients' updates and Adam moments split by the family's
    logical axes) — whatever layout the compiler would pick for the outputs, so every update reuses the first
    update's program. One jitted function per (mesh, stacked, layout), shared by every trainer on that mesh."""
    from jax.sharding import NamedSharding, PartitionSpec

    layout = None if state_shardings is None else (jax.tree.structure(state_shardings),
                                                    tuple(jax.tree.leaves(state_shardings)))
    f = _ON_MESH.get((mesh, stacked, layout))
    if f is None:
        sh = NamedSharding(mesh, PartitionSpec("grid") if stacked else PartitionSpec())
        out = (sh, sh) if state_shardings is None else (state_shardings, sh)
        f = _ON_MESH[(mesh, stacked, layout)] = jax.jit(_grid_step if stacked else train_step,
                                                        static_argnames=("spec",), donate_argnames=("state",),
                                                        out_shardings=out)
    return f


def compiled_programs() -> int:
    """Training programs compiled so far in this process (all meshes), e.g. to check one per batch plan."""
    return sum(f._cache_size() for f in (train_step_jit, grid_train_step, *_ON_MESH.values()))


# ------------------------------------------------------------------------------------ for tests and evaluation
@partial(jax.jit, static_argnames=("spec",))
def micro_batch_losses(params, batch: dict, lambdas, spec: StepSpec):
    """``(total, (lm, debias))`` of one micro-batch without dropout."""
    return batch_losses(params, batch, lambdas, None, spec, dropout=False)


@partial(jax.jit, static_argnames=("spec",))
def micro_batch_grads(params, batch: dict, lambdas, rng, spec: StepSpec):
    """Unscaled gradient of one micro-batch's total loss (with dropout when ``rng`` is given and the spec has it)."""
    return jax.grad(lambda p: batch_losses(p, batch, lambdas, rng, spec)[0])(params)
