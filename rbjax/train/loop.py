"""The training loop, for any objective: one batch plan, one run or a chunk of grid points trained together.

:class:`Trainer` drives :func:`rbjax.train.step.train_step` (one run) or :func:`~rbjax.train.step.grid_train_step`
(a chunk of grid points that share a batch plan, vmapped over a stacked state) with the run's objective
(:class:`rbjax.debias.objective.DebiasObjective`, or a dialog task's) over the updates of a
:class:`~rbjax.train.batching.BatchPlan`, on a device mesh (:mod:`rbjax.core.mesh`). The loop itself only steps
and calls its hooks (:mod:`rbjax.train.hooks`; :meth:`Trainer.run_hooks` lists them, :meth:`Trainer.add_hook` adds
the user's): everything around the updates is one of them.

* **Checkpoints** (the :class:`~rbjax.train.hooks.Checkpoints` hook; orbax, :mod:`rbjax.train.checkpoint`) every ``save_every`` updates, every ``save_every_s``
  seconds, at the end, and when SIGINT/SIGTERM arrives (the update in flight is finished first; a second Ctrl-C
  aborts at once; :class:`~rbjax.train.hooks.SignalHandling`). The interrupt is then raised as :class:`rbjax.core.interrupt.Interrupted`, whose message says what was
  saved and how to resume.
* **Resume** (:class:`~rbjax.train.hooks.Checkpoints`): a run started again with the same folder restores its newest complete checkpoint and goes on (a step
  folder without orbax's commit marker or with unreadable arrays is renamed ``<step>.incomplete``, named on stderr
  and in the summary's ``incomplete_checkpoints``, and the previous step is used); data order and
  dropout follow from the update count, so the result is bit-identical to an uninterrupted run. A checkpoint is only
  used when its *key* equals this run's: the trajectory settings, the content of the starting model, tokenizer and
  training data (tokens, triggers, bias specification) and the grid points. Anything else is refused with the
  difference named.
* **Metrics** (:class:`~rbjax.train.hooks.MetricsFile`): ``metrics.jsonl``, one line per update (and per point of a chunk): step, epoch, the objective's
  metrics (``metric_names``: a debiasing run's lm_loss and debias_loss), total, lr, grad_norm, skipped, tokens,
  tokens_per_s, elapsed_s, session. Strict JSON: a non-finite value
  (the losses of a skipped update) is ``null``. ``tokens`` counts the real (non-pad) tokens of the update in either
  layout, so ``tokens_per_s`` compares packed and padded runs.
* **Layout**: ``cfg.layout`` (``packed`` by default, :class:`~rbjax.train.batching.BatchPlan`); the run's summary
  records it with the packed shapes and the real-slot fraction (:meth:`Trainer.layout_info`).
* **Non-finite gradients or losses**: an update with ``inf``/``NaN`` in its gradient or total loss is skipped and
  counted (per point); after :data:`MAX_CONSECUTIVE_SKIPS` in a row the run stops with an error naming the update
  (:class:`~rbjax.train.hooks.NonFiniteGuard`).
* **Progress**: a bar on stderr (:class:`~rbjax.train.hooks.ProgressBar`, off with ``cfg.progress``).
"""
from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from rbjax.core.compilation import CompileCounter, abstract
from rbjax.core.mesh import (is_model_parallel, padded_points, replicate, shard_batch, shard_state, shard_tree,
    to_host, tree_shardings)
from rbjax.model.handle import ModelHandle
from rbjax.model.partition import logical_axes_for
from rbjax.train.batching import BatchPlan, attention_slots, compile_slots
from rbjax.train.checkpoint import all_finite
from rbjax.train.config import TrainerConfig
from rbjax.train.frozen import combine, split, trainable_rule
from rbjax.train.hooks import (MAX_CONSECUTIVE_SKIPS, Callback, Checkpoints, Every, Hook, MetricsFile, NonFiniteGuard,
    ProgressBar, RunContext, SignalHandling, StepInfo, end_hooks)
from rbjax.train.optim import ClipAdam
from rbjax.train.step import (StepSpec, TrainState, hparams_array, init_state, micro_batch_grads, micro_batch_losses,
    shared_keys, step_on_mesh, unstack_state)

__all__ = ["Trainer", "TrainResult", "TrainPoint", "MAX_CONSECUTIVE_SKIPS", "CHECKPOINT_FORMAT"]

#: bumped when the checkpoint content or a run's trajectory changes incompatibly (older checkpoints are then not
#: resumed, and a finished run of an older format is not reused): 4 — packed micro-batches spread over several rows
#: where the attention pays for it (the dropout masks of a packed run follow its rows); 5 — dropout masks drawn with
#: ThreeFry (:func:`rbjax.model.layers.keep_mask`), and the LM head's backward in the policy's precision; 6 — the
#: DST classifier's last layer computed at the pooled tokens only (its dropout masks have other shapes)
CHECKPOINT_FORMAT = 6


@dataclasses.dataclass(frozen=True)
class TrainPoint:
    """The per-run hyper-parameters of one run, or of one point of a chunk (what a chunk's points may differ in):
    the objective's (``hparams``, by ``objective.hparam_names``, e.g. λ_LM and λ_D of eq. 2) and the peak learning
    rate."""

    hparams: dict
    learning_rate: float

    def as_dict(self) -> dict:
        return {**self.hparams, "learning_rate": self.learning_rate}


@dataclasses.dataclass
class TrainResult:
    """What :meth:`Trainer.run` returns.

    Attributes:
        state: final (or, after ``stop_after``, current) train state, stacked on a leading axis for a chunk.
        updates_done: updates applied in total (including those before a resume). t_total: schedule length.
        finished: all ``t_total`` updates done. resumed_from: update count restored from a checkpoint (``None`` for
        a fresh start). summary: timings, last metrics, skipped updates. n_points: points trained (1 for a run).
    """

    state: Any
    updates_done: int
    t_total: int
    finished: bool
    resumed_from: int | None
    summary: dict
    n_points: int = 1
    frozen: Any = None

    @property
    def params(self):
        """The whole parameter tree of a single run (of point 0 of a chunk): the trained parameters with the frozen
        ones (:func:`rbjax.train.frozen.combine`)."""
        trained = self.state.params if self.n_points == 1 and not _stacked(self.state) else \
            unstack_state(self.state, 0).params
        return combine(self.frozen, trained)

    def point_params(self, i: int):
        """The whole parameter tree of point ``i`` of a chunk (the frozen part shared, not copied)."""
        return combine(self.frozen, unstack_state(self.state, i).params)


def _stacked(state) -> bool:
    return np.ndim(state.step) == 1


class Trainer:
    """A training run (or a chunk of grid points sharing one batch plan), handed its parts: the loop (module
    docstring). It loads nothing and parses nothing: the run's composition root opens the model, builds the mesh and
    the optimiser, and prepares the data (:func:`rbjax.debias.run.debias_trainer`,
    :func:`rbjax.dialog.tasks.common.fine_tune`, the sweep's chunks).

    Args:
        cfg: the trainer's settings (:class:`rbjax.train.config.TrainerConfig`; for a chunk the shared ones: batch
            size, accumulation, epochs, seed and leftover rule define the batch plan).
        model: the starting model, loaded (:class:`rbjax.model.handle.ModelHandle`: its config, parameters,
            tokenizer and content key; in-memory parameters through ``ModelHandle.from_params``).
        objective: the loss (:class:`rbjax.train.step.Objective`).
        optimizer: clip + Adam (:func:`rbjax.train.optim.make_optimizer`).
        data: the examples (:class:`rbjax.train.batching.ArrayData` or a task's data object with ``ids``, ``mask``,
            ``shared``, ``key``, ``n_examples``, ``rows``).
        mesh: the device mesh (:func:`rbjax.core.mesh.run_mesh`).
        points: one :class:`TrainPoint` (a single run, the unvmapped step) or a list of them (a chunk of grid
            points, vmapped over a stacked state).
        params: the parameters at the start (default: the model's; e.g. DST trains ``{"gpt2": …, "head": …}``).
            A tree with low-rank adapters (:func:`rbjax.model.lora.add_adapters`) trains only the adapters and the
            objective's own parameters; the rest is frozen, held once on the mesh and passed to the step unbatched
            (:mod:`rbjax.train.frozen`), and checkpoints hold the trained part only.
        plan: a prepared :class:`BatchPlan` of ``data`` (shared by the chunks of a sweep; default: built here).
        key_extra: what else defines the run's inputs for its checkpoint key (e.g. the bias type and training file
            of a debiasing run).
        out_dir: the run's folder (checkpoints, ``metrics.jsonl``), used when :meth:`run` is given none.

    Raises:
        ValueError: ``batch_size`` not set, a ``block_size`` beyond the model's positions, a plan of another layout.
    """

    def __init__(self, cfg: TrainerConfig, model: ModelHandle, objective, optimizer: ClipAdam, data, *, mesh,
                 points: TrainPoint | list[TrainPoint], params=None, plan: BatchPlan | None = None,
                 key_extra: dict | None = None, out_dir: str | Path | None = None):
        if cfg.batch_size is None:
            raise ValueError("TrainerConfig.batch_size is not set (the task's settings fill in its default)")
        self.cfg = cfg
        self.model = model
        self.config = model.config
        self.tokenizer = model.tokenizer
        self.init_params = model.params if params is None else params
        if cfg.block_size > self.config.max_positions:
            raise ValueError(f"block_size {cfg.block_size} exceeds the model's maximum positions {self.config.max_positions}")
        self.objective = objective
        self.optimizer = optimizer
        self.data = data
        width = self.config.hidden_size
        exchangeable = getattr(objective, "exchangeable", None)
        self.plan = plan or BatchPlan.of_run(self.data, cfg, compile_slots=compile_slots(width),
                                             attention_slots=attention_slots(width),
                                             exchangeable=exchangeable is not None and exchangeable(self.data))
        if self.plan.layout != cfg.layout:
            raise ValueError(f"the given batch plan is {self.plan.layout}, the run's layout is {cfg.layout}")
        self.stacked = isinstance(points, (list, tuple))
        self.points = list(points) if self.stacked else [points]
        for p in self.points:
            hparams_array(objective, p.hparams)  # every point names exactly the objective's hyper-parameters
        self.key_extra = dict(key_extra or {})
        self.out_dir = out_dir
        self.spec = StepSpec(config=self.config, objective=objective, optimizer=optimizer, dropout=cfg.dropout,
                             grad_accum=cfg.grad_accum, precision=cfg.precision)
        self.mesh = mesh
        self.n_padded = padded_points(len(self.points), self.mesh) if self.stacked else 1
        # parameters, gradients and Adam moments split by the family's logical axes on an fsdp/tensor mesh
        # (a task's own parameters, e.g. DST's classifier head, by the objective's rule: Objective.logical_axes)
        model_axes = logical_axes_for(self.config)
        own = getattr(objective, "logical_axes", None)
        self.logical_axes = model_axes if own is None else partial(own, model_axes=model_axes)
        # what the run trains: everything, or (low-rank adapters) the adapters and the objective's own parameters
        self.trainable = trainable_rule(self.init_params, objective)
        self._frozen = None
        self.hooks: list[Hook] = []  # added by add_hook: every run calls them

    n_examples = property(lambda self: self.data.n_examples)
    n_batches = property(lambda self: self.plan.n_batches)
    t_total = property(lambda self: self.plan.t_total)

    def batch_rows(self, epoch: int, index: int) -> np.ndarray:
        return self.plan.batch_rows(epoch, index)

    def make_batch(self, rows: np.ndarray, shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Host micro-batch of examples ``rows`` with the shared arrays (``(B, L)`` arrays + the task's per-example
        arrays; packed layout: packed in ``shape``, default its own need; ``plan.update_shape(u)`` gives update
        ``u``'s)."""
        return {**self.plan.make_batch(rows, shape), **self.data.shared}

    def device_batch(self, u: int) -> dict:
        """Update ``u``'s batch on the mesh: micro-batch rows (axis 1) split over ``data``; the shared arrays and the
        dropout keys (``rng`` ``(A, 4)``: key words, not rows) replicated."""

        return shard_batch({**self.plan.update_batch(u), **self.data.shared}, self.mesh, row_axis=1,
                           shared_keys=shared_keys(self.spec) + ("rng",))

    @property
    def hparams(self) -> np.ndarray:
        """The objective's hyper-parameters of the run (of point 0 of a chunk), as the state holds them."""
        return np.asarray(hparams_array(self.objective, self.points[0].hparams))

    def losses(self, params, batch: dict) -> dict:
        """``{total, <the objective's metrics>}`` of a host micro-batch (:meth:`make_batch`) without dropout."""
        tot, aux = micro_batch_losses(params, batch, self.hparams, self.spec)
        return {"total": float(tot), **{k: float(v) for k, v in aux.items()}}

    def grads(self, params, batch: dict, rng=None):
        """Unscaled gradient of one micro-batch's total loss (dropout as configured when ``rng`` is given)."""
        return micro_batch_grads(params, batch, self.hparams, rng, self.spec)

    def layout_info(self) -> dict:
        """The token layout of the run's micro-batches: ``layout``, the packed ``(rows, slots)`` shapes of the plan
        (one compiled program each), the share of computed token slots that hold a real token and how many
        micro-batches hold examples dealt anew within their update (:class:`BatchPlan`, ``exchangeable``)."""
        return {"layout": self.plan.layout, "packed_shapes": [list(s) for s in self.plan.shapes],
                "real_slot_fraction": round(self.plan.real_fraction(), 4), "dealt_micro_batches": self.plan.dealt()}

    # -- state ------------------------------------------------------------------------------------------------
    def key(self) -> dict:
        """Everything that determines the trajectory (a checkpoint is resumed only when this matches): the
        trainer's trajectory settings, the optimiser's, the objective's and the root's ``key_extra``, with (for a
        single run) its hyper-parameters and learning rate; the content of the model, tokenizer and data; and
        ``dealt_updates`` when the plan deals updates anew (:class:`BatchPlan`, ``exchangeable``: other
        micro-batches, other dropout masks), so that a run which deals nothing keeps its key and its results."""
        traj = {**self.cfg.trajectory(), **self.optimizer.describe(), **self._objective_settings(),
                **self.key_extra}
        if self.plan.dealt():
            traj["dealt_updates"] = True
        if not self.stacked:
            traj.update(self.points[0].as_dict())
        return {"format": CHECKPOINT_FORMAT, "trajectory": traj, "model": self.model.digest,
                "tokenizer": self.model.tokenizer_digest, "data": self.data.key, "t_total": self.t_total,
                "n_examples": self.n_examples,
                "points": [p.as_dict() for p in self.points] if self.stacked else None}

    def _objective_settings(self) -> dict:
        describe = getattr(self.objective, "describe", None)
        return dict(describe()) if describe is not None else {"objective": type(self.objective).__name__}

    @property
    def frozen(self):
        """The parameters the run does not train, on the mesh, placed once (``{}`` when it trains everything): split
        by the family's logical axes on an fsdp/tensor mesh, else replicated — one copy for a whole grid chunk."""
        if self._frozen is None:
            frozen = split(self.init_params, self.trainable)[1]
            if not frozen:
                self._frozen = {}
            elif is_model_parallel(self.mesh):
                self._frozen = shard_tree(frozen, self.mesh, self.logical_axes)
            else:
                self._frozen = replicate(frozen, self.mesh)
        return self._frozen

    def initial_state(self) -> TrainState:
        """A fresh state on the mesh (stacked on the host with numpy for a chunk: no per-leaf device programs); it
        holds the trained parameters only (:attr:`frozen` holds the rest)."""

        p0 = self.points[0]
        trained = split(self.init_params, self.trainable)[0]
        if is_model_parallel(self.mesh) and not self.stacked:
            # built on the mesh, each device holding only its slices (no full copy of the moments on one device)
            params = shard_tree(trained, self.mesh, self.logical_axes)
            make = lambda p: init_state(p, self.spec, hparams=p0.hparams, lr=p0.learning_rate,  # noqa: E731
                                        t_total=self.t_total)
            return jax.jit(make, out_shardings=self.state_shardings(jax.eval_shape(make, params)))(params)
        host = jax.tree.map(np.asarray, jax.device_get(trained))  # built with numpy: no device program
        one = init_state(host, self.spec, hparams=p0.hparams, lr=p0.learning_rate, t_total=self.t_total, xp=np)
        if not self.stacked:
            return shard_state(one, self.mesh, False, self.logical_axes)
        pts = self.points + [self.points[-1]] * (self.n_padded - len(self.points))
        M = len(pts)
        state = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (M,) + np.shape(x)), one)
        state = state.replace(hparams=np.stack([np.asarray(hparams_array(self.objective, p.hparams)) for p in pts]),
                              lr=np.asarray([p.learning_rate for p in pts], np.float32))
        return shard_state(state, self.mesh, True, self.logical_axes)

    def state_shardings(self, state):
        """The layout of a (stacked) state on this trainer's mesh (``None`` on a grid × data mesh: the step keeps
        today's replicated / ``grid``-split layout)."""
        if not is_model_parallel(self.mesh):
            return None
        return tree_shardings(state, self.mesh, self.logical_axes, self.stacked)

    # -- compilation ------------------------------------------------------------------------------------------
    def _signature(self, u: int) -> tuple:
        """What selects update ``u``'s program: its micro-batch count and packed shape (the other arrays' shapes
        follow from the data)."""
        return len(self.plan.plan[u]), self.plan.update_shape(u)

    def compile(self, state, start: int = 0, end: int | None = None, after=()) -> tuple[dict, dict]:
        """Compile, before the first update, the program of every update in ``[start, end)`` (one per micro-batch
        count and packed shape), several at once on a thread pool (XLA compiles outside Python's lock); a program
        already compiled in this process (an earlier chunk of a sweep) or in the persistent compilation cache
        (:mod:`rbjax.core.compilation`) is not compiled again.

        Args:
            after: what runs after training, compiled in the same pool (e.g. the evaluation's scoring programs,
                :func:`rbjax.debias.run.evaluation_programs`): callables given the abstract parameters the run
                ends with (``jax.ShapeDtypeStruct`` leaves, placed as the result's) that compile their programs
                ahead of time (``jax.jit(...).lower(...).compile()``: a later call of the same shapes compiles
                nothing) and return how many.

        Returns:
            ``(programs, record)``: ``{signature: compiled step}`` and ``{"seconds", "programs", "compiled",
            "cache_hits", "after_training"}`` (wall seconds of the whole compilation; training programs needed;
            programs compiled by XLA now; loaded from the persistent cache; programs of ``after``).
        """
        end = self.t_total if end is None else end
        first: dict[tuple, int] = {}
        for u in range(start, end):
            first.setdefault(self._signature(u), u)
        mesh_step = step_on_mesh(self.mesh, self.stacked, self.state_shardings(state))
        a_state, a_frozen = abstract(state), abstract(self.frozen)
        jobs = {sig: abstract(self.device_batch(u)) for sig, u in first.items()}
        a_final = combine(a_frozen, a_state.params)  # what TrainResult.params will be (shapes and placement)
        t0 = time.perf_counter()
        with CompileCounter() as counter:
            if len(jobs) + len(after) > 1:
                with ThreadPoolExecutor(max_workers=min(len(jobs) + len(after), os.cpu_count() or 1)) as pool:
                    futures = {sig: pool.submit(mesh_step.compile, a_state, b, a_frozen, self.spec)
                               for sig, b in jobs.items()}
                    later = [pool.submit(job, a_final) for job in after]
                    programs = {sig: f.result() for sig, f in futures.items()}
                    n_after = sum(f.result() for f in later)
            else:
                programs = {sig: mesh_step.compile(a_state, b, a_frozen, self.spec) for sig, b in jobs.items()}
                n_after = sum(job(a_final) for job in after)
            # the checkpoint's finiteness check, so that a save inside the loop compiles nothing either. Every
            # process runs it: over parameters split across hosts it is a collective, and a program that one
            # process runs alone waits for the others until the collective's deadline.
            all_finite(state.params)
        return programs, {"seconds": round(time.perf_counter() - t0, 3), "programs": len(programs),
                          "compiled": counter.compiled, "cache_hits": counter.cache_hits, "after_training": n_after}

    # -- hooks ------------------------------------------------------------------------------------------------
    def add_hook(self, hook: Hook | Callable[[StepInfo], Any], *, every: int = 1) -> Hook:
        """Add a hook to every later :meth:`run` of this trainer (levanter's ``trainer.add_hook(fn, every=n)``).

        Args:
            hook: a :class:`rbjax.train.hooks.Hook`, or a function of a :class:`~rbjax.train.hooks.StepInfo` (the
                update's number, metric records, state and parameters; ``info.stop(reason)`` ends the run after
                this update, with a checkpoint).
            every: a function is called after every ``every``-th update (a ``Hook`` decides itself).

        Returns:
            the hook added (a function wrapped in :class:`rbjax.train.hooks.Every`).

        Raises:
            TypeError: ``hook`` is neither. ValueError: ``every`` < 1, or given with a ``Hook``.
        """
        hook = _as_hook(hook, every)
        self.hooks.append(hook)
        return hook

    def run_hooks(self, out: Path | None, *, checkpoints: bool = True, callback=None, hooks=()) -> list[Hook]:
        """The hooks of one :meth:`run`, in the order each update calls them: the metrics line
        (:class:`~rbjax.train.hooks.MetricsFile`, with checkpoints), the progress bar, ``callback``
        (:class:`~rbjax.train.hooks.Callback`), the trainer's own hooks (:meth:`add_hook`) and the run's ``hooks``,
        the non-finite guard, the signal check (:class:`~rbjax.train.hooks.SignalHandling`) and the checkpoint
        policy (:class:`~rbjax.train.hooks.Checkpoints`, last: it saves what a hook before it stopped)."""
        cfg = self.cfg
        built: list[Hook] = [MetricsFile(out / "metrics.jsonl")] if checkpoints else []
        built.append(ProgressBar(cfg.progress))
        if callback is not None:
            built.append(Callback(callback))
        built += [*self.hooks, *(_as_hook(h) for h in hooks), NonFiniteGuard(MAX_CONSECUTIVE_SKIPS),
                  SignalHandling()]
        if checkpoints:
            built.append(Checkpoints(out / "checkpoints", cfg.keep_checkpoints, cfg.save_every, cfg.save_every_s))
        return built

    # -- loop -------------------------------------------------------------------------------------------------
    def run(self, out_dir: str | Path | None = None, *, stop_after: int | None = None,
            callback: Callable[[dict], None] | None = None, checkpoints: bool = True,
            description: str = "training", after=(), hooks=()) -> TrainResult:
        """Train (resuming from ``OUT/checkpoints`` when there is a checkpoint of the same run).

        The loop steps and calls its hooks (:meth:`run_hooks`, :mod:`rbjax.train.hooks`): resume and the
        checkpoint policy, ``metrics.jsonl``, the progress bar, signals, the non-finite guard, ``callback`` and the
        user's hooks. It stops after ``stop_after`` updates, or after an update in which a hook asked it to
        (``run.request_stop``/``info.stop``: a checkpoint is written, the summary's ``stopped_by`` says why).

        Args:
            stop_after: stop once this many updates are done in total (a checkpoint is written), as if the run
                had been killed there; a later ``run()`` resumes.
            callback: called before every micro-batch with ``{"kind": "micro", "update", "micro_batch", "epoch",
                "batch_index", "rows", "params"}`` (``params``: the parameters the gradient is taken at) and after
                every update with ``{"kind": "update", "update", "params", "lr", "grad_norm", "metrics"}``.
            checkpoints: use orbax checkpoints under ``OUT/checkpoints`` (off: no resume, nothing written).
            out_dir: the run's folder: checkpoints and metrics (default: the trainer's ``out_dir``; none with
                ``checkpoints`` off: nothing is written).
            after: the programs of what follows training, compiled before the first update with the training
                programs (:meth:`compile`).
            hooks: this run's own hooks (:class:`rbjax.train.hooks.Hook`, or functions of a
                :class:`~rbjax.train.hooks.StepInfo` called after every update), after those of :meth:`add_hook`.

        Returns:
            :class:`TrainResult`.

        Raises:
            ValueError: a checkpoint from a different run is in ``OUT/checkpoints``.
            rbjax.core.interrupt.Interrupted: SIGINT/SIGTERM (after saving a checkpoint).
            RuntimeError: too many consecutive non-finite updates.
        """
        out_dir = self.out_dir if out_dir is None else out_dir
        if out_dir is None and checkpoints:
            raise ValueError("Trainer.run: out_dir is needed for checkpoints and metrics")
        out = Path(out_dir) if out_dir is not None else None
        hooks = self.run_hooks(out, checkpoints=checkpoints, callback=callback, hooks=hooks)
        end = self.t_total if stop_after is None else min(self.t_total, int(stop_after))
        summary: dict[str, Any] = {"first_update_s": None, "train_s": 0.0, "tokens": 0,
                                   "skipped_updates": [0] * len(self.points), "incomplete_checkpoints": [],
                                   **self.layout_info()}
        # session: tags this session's metric lines (a resumed run has several sessions)
        run = RunContext(self, out, description, start=0, end=end, state=self.initial_state(), summary=summary,
                         session=round(time.time(), 3))
        summary["session"] = run.session
        error = None
        try:
            for h in hooks:
                h.restore(run)  # resume: the state and the update count of the newest complete checkpoint
            run.done = run.start
            # every program of the updates to come, compiled before the first one (no update compiles)
            programs, summary["compile"] = self.compile(run.state, run.start, end, after)
            run.t_run = time.perf_counter()
            for h in hooks:
                h.on_start(run)
            for u in range(run.start, end):
                t0 = time.perf_counter()
                for h in hooks:
                    h.before_update(run, u + 1)
                run.state, m = programs[self._signature(u)](run.state, self.device_batch(u), self.frozen)
                info = self._step_info(run, u, to_host(m), t0)  # to_host syncs (across hosts: gathers every point)
                for h in hooks:
                    h.on_update(run, info)
                if run.stop_reason is not None:
                    break
        except BaseException as e:
            error = e
            raise
        finally:
            end_hooks(hooks, run, error)
        return self._result(run)

    def _step_info(self, run: RunContext, u: int, m: dict, t0: float) -> StepInfo:
        """Update ``u``'s metric records (``metrics.jsonl``'s fields, one per point) from the step's host metrics
        ``m``, counted into the summary (tokens, skipped updates, the first update's seconds) and the run (``done``,
        ``last``)."""
        now = time.perf_counter()
        summary, tokens, n_pts = run.summary, self.plan.tokens(u), len(self.points)
        if summary["first_update_s"] is None:
            summary["first_update_s"] = now - t0
        summary["tokens"] += tokens
        e_last, b_last = self.plan.plan[u][-1]
        epoch = round(e_last + (b_last + 1) / self.n_batches, 4)
        names = tuple(self.objective.metric_names)
        records = []
        for i in range(n_pts):
            v = {k: float(m[k][i] if self.stacked else m[k]) for k in (*names, "total", "lr", "grad_norm", "skipped")}
            rec = {"step": u + 1, "epoch": epoch, **{k: v[k] for k in names}, "total": v["total"], "lr": v["lr"],
                   "grad_norm": v["grad_norm"], "skipped": bool(v["skipped"]), "tokens": tokens,
                   "tokens_per_s": tokens * n_pts / max(now - t0, 1e-9), "elapsed_s": now - run.t_run,
                   "session": run.session}
            if u == run.start:  # the session's compilation, before its first update (not in tokens_per_s)
                rec["compile_s"] = summary["compile"]["seconds"]
            if self.stacked:
                rec = {"point": i, **rec}
            if rec["skipped"]:
                summary["skipped_updates"][i] += 1
            records.append(rec)
        run.done, run.last = u + 1, records
        return StepInfo(update=u + 1, epoch=epoch, records=records, state=run.state, duration_s=now - t0, run=run)

    def _result(self, run: RunContext) -> TrainResult:
        """The :class:`TrainResult` of a finished session: the summary's timings (``train_s``, ``tokens_per_s``, the
        steady rate without the first update), its ``last`` records and the state without a chunk's padding."""
        summary, n_pts, last = run.summary, len(self.points), run.last
        summary["train_s"] = time.perf_counter() - run.t_run
        summary["last"] = last[0] if (last and not self.stacked) else (last or None)
        if run.stop_reason is not None:
            summary["stopped_by"] = run.stop_reason
        n_upd = run.done - run.start
        if summary["tokens"] and summary["train_s"] > 0:
            steady = summary["train_s"] - (summary["first_update_s"] or 0.0)
            summary["tokens_per_s"] = summary["tokens"] * n_pts / summary["train_s"]
            summary["steady_tokens_per_s"] = (summary["tokens"] * n_pts * (n_upd - 1) / max(n_upd, 1) / steady
                                              if n_upd > 1 and steady > 0 else None)
        state = run.state
        if self.stacked and self.n_padded > n_pts:  # drop the padding points (on the host)
            state = jax.tree.map(lambda x: x[:n_pts], to_host(state))
        return TrainResult(state=state, updates_done=run.done, t_total=self.t_total,
                           finished=run.done >= self.t_total, resumed_from=run.resumed_from, summary=summary,
                           n_points=n_pts if self.stacked else 1, frozen=self.frozen)


def _as_hook(hook, every: int = 1) -> Hook:
    """A :class:`Hook` as it is; a function of a :class:`StepInfo` as :class:`Every` (``every``)."""
    if isinstance(hook, Hook):
        if every != 1:
            raise ValueError(f"every={every} is for a function; a Hook ({type(hook).__name__}) decides itself")
        return hook
    if not callable(hook):
        raise TypeError(f"a hook is a rbjax.train.hooks.Hook or a function of a StepInfo, got {type(hook).__name__}")
    return Every(hook, every)
