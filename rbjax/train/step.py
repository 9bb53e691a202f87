"""The pure training step of every training run: a train state and ``train_step(state, batch) -> (state, metrics)``.

Importable without orbax, tqdm or any I/O: this is what people unit-test, ``vmap`` over a hyper-parameter grid and
shard over a device mesh. The step knows no task: the loss comes from the run's *objective* (:class:`Objective`), a
hashable callable that the debiasing methods (:class:`rbjax.debias.objective.DebiasObjective`: LM, LMD, ADD, HD,
CDA) and the dialog fine-tuning tasks (:class:`rbjax.dialog.state_tracking.DSTObjective`,
:class:`rbjax.dialog.crg_data.CRGObjective`) each supply, and the update from the run's optimiser
(:class:`rbjax.train.optim.ClipAdam`). One compiled program per (spec, batch shape): the per-run hyper-parameters
(the objective's, named by ``objective.hparam_names`` — e.g. λ_LM and λ_D of eq. 2 — and the peak learning rate)
live in the state as arrays, so the points of a grid that share a batch plan share a program, vmapped over a
stacked state (:func:`grid_train_step`).

One update (paper §5.1)::

    for each of the update's A micro-batches:       (lax.scan; A = grad_accum, more for a carried-over update)
        total, metrics = objective(params, micro-batch, hparams)
        grad += ∇ total / grad_accum               (the reference Trainer's scaling)
    params, opt_state = optimizer.apply(params, grad, opt_state, learning_rate(step, lr, t_total))
                                                    (clip + Adam, one fused pass; skipped if grad or total is not
                                                     finite)
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rbjax.core.precision import get_policy
from rbjax.train.frozen import combine
from rbjax.train.optim import ClipAdam, learning_rate

__all__ = ["Objective", "shared_keys", "StepSpec", "TrainState", "init_state", "stack_states", "unstack_state",
           "batch_losses", "loss_and_grad", "train_step", "train_step_jit", "grid_train_step", "MeshStep",
           "step_on_mesh", "compiled_programs", "clear_programs", "micro_batch_losses", "micro_batch_grads",
           "hparams_array"]


class Objective(Protocol):
    """What a task gives the trainer: its loss on one micro-batch (hashable, so that it can be a static argument of
    the compiled step; a frozen dataclass of the task's settings is the usual form).

    ``objective(params, batch, hparams, key, spec) -> (total, metrics)``: ``params`` the trained parameters,
    ``batch`` one micro-batch (``input_ids``/``attention_mask`` ``(B, L)``, the task's per-example arrays, the
    shared arrays, and ``pack``/``unpack`` in the packed layout: :mod:`rbjax.train.lm`), ``hparams`` float32
    ``(H,)`` the run's values of ``hparam_names`` (in that order; from the state, so a grid vmaps them), ``key`` the
    dropout PRNG key (``None``: no dropout), ``spec`` the :class:`StepSpec`. ``total`` is differentiated;
    ``metrics`` maps each of ``metric_names`` to a float32 scalar (written to ``metrics.jsonl`` beside ``total``).

    Attributes:
        hparam_names: the objective's run hyper-parameters (e.g. ``("lambda_lm", "lambda_d")``; may be empty).
        metric_names: the names of ``metrics`` (e.g. ``("lm_loss", "debias_loss")``).
        shared_keys (optional): names of batch arrays shared by every micro-batch of an update (not stacked on the
            micro-batch axis), e.g. the debiasing target pairs.

    ``own_params`` (optional): top-level keys of the parameter tree that are the objective's own (e.g. DST's
    classifier ``head``): trained also when the model itself is frozen under low-rank adapters
    (:mod:`rbjax.train.frozen`).

    Method ``exchangeable(data) -> bool`` (optional): whether the loss of a micro-batch is the mean of one loss
    per example of ``data`` (the run's :class:`rbjax.train.batching.ArrayData`), so that the packed layout may deal
    an update's examples anew into its full micro-batches (:class:`rbjax.train.batching.BatchPlan`); without it,
    never.

    Method ``describe() -> dict`` (optional): the objective's static settings, for the run's key. Method
    ``logical_axes(path, shape, model_axes)`` (optional; for trained parameters that are not the model's, e.g. a
    classifier head): the logical axis names of the parameter at dict ``path`` (:mod:`rbjax.model.partition`;
    ``None`` entries are replicated), ``model_axes(path, shape)`` being the family's own rule for the model's
    parameters. Without it every trained parameter must be the model's.
    """

    hparam_names: tuple[str, ...]
    metric_names: tuple[str, ...]

    def __call__(self, params, batch: dict, hparams: jax.Array, key, spec: "StepSpec"):
        ...


def shared_keys(spec: "StepSpec") -> tuple[str, ...]:
    """The batch arrays of ``spec``'s objective that every micro-batch of an update shares."""
    return tuple(getattr(spec.objective, "shared_keys", ()))


def hparams_array(objective, values) -> jax.Array:
    """The objective's hyper-parameters ``values`` (a mapping by name) as the float32 ``(H,)`` array the state
    holds, in ``objective.hparam_names`` order.

    Raises:
        ValueError: a name missing from ``values``, or a name the objective does not take.
    """
    names = tuple(objective.hparam_names)
    unknown = sorted(set(values) - set(names))
    missing = [n for n in names if n not in values]
    if unknown or missing:
        raise ValueError(f"{type(objective).__name__} takes the hyper-parameters {list(names)}; "
                         f"got {sorted(values)}")
    return np.asarray([float(values[n]) for n in names], np.float32).reshape(len(names))


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static settings of a step (hashable; one compiled program per distinct value and batch shape).

    Attributes:
        config: the model's config (any family of :mod:`rbjax.model.registry`). objective: the task's loss
        (:class:`Objective`). optimizer: clip + Adam (:class:`rbjax.train.optim.ClipAdam`). dropout: dropout active.
        grad_accum: micro-batches per update (each micro-batch loss is scaled by ``1/grad_accum``). precision:
        ``fp32`` or ``bf16`` (bf16 activations/matmuls; parameters, optimiser and losses in fp32).
    """

    config: Any
    objective: Any
    optimizer: ClipAdam = ClipAdam()
    dropout: bool = True
    grad_accum: int = 1
    precision: str = "fp32"

    @property
    def policy(self):
        """The precision policy (:mod:`rbjax.core.precision`)."""
        return get_policy(self.precision)

    @property
    def compute_dtype(self):
        return self.policy.compute_dtype

    @property
    def nll_dtype(self):
        """The matmul dtype of the next-token NLL (:func:`rbjax.train.lm.mean_next_token_nll`): ``None`` (float32)
        under fp32."""
        return None if self.policy.is_full_precision else self.compute_dtype


@flax.struct.dataclass
class TrainState:
    """Everything that changes during a run, as arrays (a pytree; stack it on a leading axis for a grid).

    Attributes:
        params: the trained parameters (with adapters: the adapter matrices and the objective's own parameters
            only; the frozen base is an argument of the step, :mod:`rbjax.train.frozen`). opt_state: the optimiser
            state (:class:`rbjax.train.optim.OptState`).
        step: int32, updates done (the next update's learning rate is ``learning_rate(step, lr, t_total)``).
        hparams: float32 ``(H,)``, the objective's hyper-parameters (``objective.hparam_names``).
        lr: float32 peak learning rate.
        t_total: float32, schedule length in updates.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    hparams: jax.Array
    lr: jax.Array
    t_total: jax.Array


def init_state(params, spec: StepSpec, *, hparams, lr: float, t_total: int, xp=jnp) -> TrainState:
    """A fresh state for one run (step 0, a new optimiser state); ``hparams``: the objective's hyper-parameters as
    a mapping by name or as the ``(H,)`` array (:func:`hparams_array`). ``xp=numpy``: built on the host, no device
    program (the trainer places it on its mesh)."""
    h = hparams_array(spec.objective, hparams) if isinstance(hparams, dict) else xp.asarray(hparams, xp.float32)
    return TrainState(params=params, opt_state=spec.optimizer.init(params, xp), step=xp.zeros((), xp.int32),
                      hparams=xp.asarray(h, xp.float32), lr=xp.asarray(lr, xp.float32),
                      t_total=xp.asarray(t_total, xp.float32))


def stack_states(states: list[TrainState]) -> TrainState:
    """Stack states of several runs on a leading grid axis (for :func:`grid_train_step`)."""
    return jax.tree.map(lambda *x: jnp.stack(x), *states)


def unstack_state(state: TrainState, i: int) -> TrainState:
    """Point ``i`` of a stacked state."""
    return jax.tree.map(lambda x: x[i], state)


# ------------------------------------------------------------------------------------------------------ losses
def batch_losses(params, batch: dict, hparams, rng, spec: StepSpec, *, dropout: bool | None = None):
    """``(total, metrics)`` of one micro-batch (differentiable in ``params``): the objective's loss, computed under
    the precision policy's matmul context (fp32 = full fp32 matmuls on every backend, whatever the global default).

    Args:
        params: the trained params. batch: one micro-batch with the shared arrays (:class:`Objective`).
        hparams: ``(H,)`` the objective's hyper-parameters. rng: raw ``rbg`` key data (``(4,)`` uint32) or None (no
        dropout). spec: static settings. dropout: override ``spec.dropout``.
    """
    drop = spec.dropout if dropout is None else dropout
    key = jax.random.wrap_key_data(rng, impl="rbg") if drop and rng is not None else None
    with spec.policy.matmul_context():
        return spec.objective(params, batch, hparams, key, spec)


def loss_and_grad(params, batch: dict, hparams, rng, spec: StepSpec, frozen=None):
    """``((total, metrics), gradient)`` of one micro-batch's loss in ``params`` (the trained parameters; ``frozen``
    the rest, :mod:`rbjax.train.frozen`), forward and backward traced under the precision policy's matmul context:
    a custom VJP's matmuls (the LM head's, :mod:`rbjax.model.nll`) are traced when the gradient is taken, not with
    the loss, so a context around the loss alone would leave them at the global default precision."""
    fn = lambda p: batch_losses(combine(frozen, p), batch, hparams, rng, spec)  # noqa: E731
    with spec.policy.matmul_context():
        return jax.value_and_grad(fn, has_aux=True)(params)


# ------------------------------------------------------------------------------------------------------- step
def train_step(state: TrainState, batch: dict, frozen=None, *, spec: StepSpec) -> tuple[TrainState, dict]:
    """One update from the micro-batches of ``batch`` (pure; jit with ``spec`` static, see :data:`train_step_jit`).

    Args:
        state: the run's :class:`TrainState`.
        batch: the update's micro-batches stacked on a leading axis A (``input_ids`` ``(A, B, L)``, masks, the
            objective's per-example arrays, ``rng`` ``(A, 4)`` uint32 dropout keys) plus the unstacked arrays of the
            objective's ``shared_keys`` (e.g. the debiasing target pairs).
        frozen: the parameters the run does not train (:mod:`rbjax.train.frozen`: the base model under low-rank
            adapters; ``None`` or empty: ``state.params`` is the whole tree). The objective sees
            ``combine(frozen, state.params)``; only ``state.params`` is differentiated and updated.
        spec: static settings.

    Returns:
        ``(state, metrics)`` with float32 metrics: the objective's ``metric_names`` and ``total`` (means over the
        micro-batches), ``grad_norm`` (global norm of the accumulated gradient before clipping, overflow-free),
        ``lr`` (the learning rate this update used) and ``skipped`` (1.0 when the gradient or the total loss was not
        finite and the update was skipped).
    """
    keys = shared_keys(spec)
    shared = {k: batch[k] for k in keys if k in batch}
    micro = {k: v for k, v in batch.items() if k not in keys}
    scale = jnp.float32(1.0 / spec.grad_accum)
    names = tuple(spec.objective.metric_names)

    def one(mb):
        (tot, aux), g = loss_and_grad(state.params, {**mb, **shared}, state.hparams, mb["rng"], spec, frozen)
        return jax.tree.map(lambda x: x * scale, g), jnp.stack([tot] + [aux[n] for n in names])

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
    # A non-finite loss skips the update even when its gradient is finite (e.g. λ_D = NaN on a batch with no
    # debiasing term: total NaN, gradient of the LM term only): the optimiser leaves the parameters and moments
    # alone and counts the skip.
    lr = learning_rate(state.step, state.lr, state.t_total)
    params, opt_state, gnorm, skipped = spec.optimizer.apply(state.params, grads, state.opt_state, lr,
                                                             finite_loss=jnp.isfinite(m[0]))
    new = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    metrics = {n: m[i + 1] for i, n in enumerate(names)}
    metrics.update(total=m[0], grad_norm=gnorm, lr=lr, skipped=skipped)
    return new, metrics


#: :func:`train_step` compiled (``spec`` static, the state donated): one program per (spec, batch shape)
train_step_jit = jax.jit(train_step, static_argnames=("spec",), donate_argnames=("state",))


def _grid_step(state: TrainState, batch: dict, frozen=None, *, spec: StepSpec) -> tuple[TrainState, dict]:
    return jax.vmap(lambda s: train_step(s, batch, frozen, spec=spec))(state)


#: :func:`train_step` vmapped over a stacked state (leading grid axis; every point sees the same ``batch`` and the
#: same unbatched ``frozen`` parameters — one base model for the whole chunk under adapters), compiled. A point
#: whose gradient is not finite skips its update without touching the others.
grid_train_step = jax.jit(_grid_step, static_argnames=("spec",), donate_argnames=("state",))

@dataclasses.dataclass
class MeshStep:
    """The step of one (mesh, stacked, layout): the jitted function and its programs compiled ahead of time
    (:meth:`compile`), one per (spec, shapes and layouts of the state and batch) — what jit's own cache holds, but
    built before the first update (:meth:`rbjax.train.loop.Trainer.compile`)."""

    fn: Any
    programs: dict = dataclasses.field(default_factory=dict)

    @staticmethod
    def signature(state, batch, frozen=None) -> tuple:
        """What selects a program: the trees' structure, and each array's shape, dtype and sharding."""
        leaves, tree = jax.tree.flatten((state, batch, frozen))
        return tree, tuple((tuple(x.shape), str(x.dtype), getattr(x, "sharding", None)) for x in leaves)

    def compile(self, state, batch, frozen, spec: StepSpec):
        """The compiled program for ``state``, ``batch`` and the ``frozen`` parameters (arrays or
        ``jax.ShapeDtypeStruct`` with shardings; ``{}`` when the run trains everything): compiled once, then the
        same executable, called as ``program(state, batch, frozen)``."""
        key = (spec, self.signature(state, batch, frozen))
        prog = self.programs.get(key)
        if prog is None:
            prog = self.fn.lower(state, batch, frozen, spec=spec).compile()
            self.programs.setdefault(key, prog)
        return self.programs[key]


_ON_MESH: dict = {}


def step_on_mesh(mesh, stacked: bool, state_shardings=None) -> MeshStep:
    """The step for a device ``mesh``: the state stays split over ``grid`` (``stacked``: a chunk of grid points) or
    replicated (one run) — or, on a mesh with ``fsdp``/``tensor`` axes, laid out as ``state_shardings``
    (:func:`rbjax.core.mesh.tree_shardings`: parameters, gradients' updates and Adam moments split by the family's
    logical axes) — whatever layout the compiler would pick for the outputs, so every update reuses the first
    update's program. One :class:`MeshStep` per (mesh, stacked, layout), shared by every trainer on that mesh (a
    sweep's chunks reuse the programs of the first)."""
    layout = None if state_shardings is None else (jax.tree.structure(state_shardings),
                                                    tuple(jax.tree.leaves(state_shardings)))
    f = _ON_MESH.get((mesh, stacked, layout))
    if f is None:
        sh = NamedSharding(mesh, PartitionSpec("grid") if stacked else PartitionSpec())
        out = (sh, sh) if state_shardings is None else (state_shardings, sh)
        f = _ON_MESH[(mesh, stacked, layout)] = MeshStep(jax.jit(_grid_step if stacked else train_step,
                                                                 static_argnames=("spec",),
                                                                 donate_argnames=("state",), out_shardings=out))
    return f


def compiled_programs() -> int:
    """Training programs compiled so far in this process (all meshes), e.g. to check one per batch plan."""
    return (sum(f._cache_size() for f in (train_step_jit, grid_train_step))
            + sum(f.fn._cache_size() + len(f.programs) for f in _ON_MESH.values()))


def clear_programs() -> None:
    """Forget the compiled training programs of this process (with ``jax.clear_caches``: a long test session)."""
    _ON_MESH.clear()


# ------------------------------------------------------------------------------------ for tests and evaluation
@partial(jax.jit, static_argnames=("spec",))
def micro_batch_losses(params, batch: dict, hparams, spec: StepSpec):
    """``(total, metrics)`` of one micro-batch without dropout."""
    return batch_losses(params, batch, hparams, None, spec, dropout=False)


@partial(jax.jit, static_argnames=("spec",))
def micro_batch_grads(params, batch: dict, hparams, rng, spec: StepSpec):
    """Unscaled gradient of one micro-batch's total loss (with dropout when ``rng`` is given and the spec has it)."""
    return loss_and_grad(params, batch, hparams, rng, spec)[1]
