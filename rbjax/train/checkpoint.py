"""Orbax checkpoints of a train state (one run, or a stacked grid chunk) with JSON metadata.

A checkpoint holds the whole :class:`rbjax.train.step.TrainState` (parameters, optimiser state, update count,
per-run hyper-parameters) and a metadata record (the run's key, the update count, the last metrics). It is restored
into the pytree structure of a fresh state (namedtuples, not the lists/dicts an untyped restore gives), and it is
never written with non-finite parameters.

A step folder can be incomplete although its name says otherwise: a copy or a write interrupted on a file system
without atomic renames leaves it without orbax's commit marker (``commit_success.txt``, or the commit time in
``_CHECKPOINT_METADATA``) or without its array data. :meth:`Checkpointer.problem` tells such a folder from its files,
:meth:`Checkpointer.set_aside` renames it out of the way (kept, as ``<step>.incomplete``), and the trainer resumes
from the newest complete step (:meth:`rbjax.train.loop.Trainer.run`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Checkpointer", "NonFiniteParameters", "all_finite"]


class NonFiniteParameters(RuntimeError):
    """The parameters hold inf or NaN: nothing is saved (the message names the update)."""


@jax.jit
def all_finite(tree) -> jax.Array:
    """True when no leaf holds inf or NaN (one program per tree structure)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _state_dict(state) -> dict:
    scalars = {"step": state.step, "lr": state.lr, "t_total": state.t_total}
    if np.size(state.hparams):  # orbax saves no empty array (an objective without hyper-parameters: CDA, DST)
        scalars["hparams"] = state.hparams
    return {"params": state.params, "opt_state": state.opt_state, "scalars": scalars}


class Checkpointer:
    """Orbax ``CheckpointManager`` for train states + JSON metadata.

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

    def steps(self) -> list[int]:
        """The step folders present, newest first."""
        return sorted(self.manager.all_steps(), reverse=True)

    def problem(self, step: int) -> str | None:
        """Why step folder ``step`` is incomplete, judged from its files without reading arrays (None: it looks
        complete): no commit marker, or no ``state``/``meta`` item."""
        d = self.directory / str(step)
        committed = (d / "commit_success.txt").is_file()
        if not committed and (d / "_CHECKPOINT_METADATA").is_file():
            try:
                committed = bool(json.loads((d / "_CHECKPOINT_METADATA").read_text()).get("commit_timestamp_nsecs"))
            except (OSError, ValueError):
                committed = False
        if not committed:
            return "no commit marker (commit_success.txt or a commit time in _CHECKPOINT_METADATA): its write or " \
                   "copy was interrupted"
        missing = [item for item in ("state", "meta") if not (d / item).is_dir()]
        if missing:
            return f"no {' or '.join(missing)} item in it"
        return None

    def set_aside(self, step: int) -> Path:
        """Rename step folder ``step`` to ``<step>.incomplete`` (a number suffix if taken), so that it is neither
        resumed from nor in the way of a new checkpoint of that step; returns the new path."""
        src = self.directory / str(step)
        dst = self.directory / f"{step}.incomplete"
        n = 1
        while dst.exists():
            n += 1
            dst = self.directory / f"{step}.incomplete{n}"
        src.rename(dst)
        reload = getattr(self.manager, "reload", None)
        if reload is not None:
            reload()
        return dst

    def save(self, step: int, state, meta: dict) -> None:
        """Save ``state`` at ``step`` (number of updates done); blocks until written.

        Raises:
            NonFiniteParameters: a parameter is inf or NaN (nothing is written).
        """
        if not bool(all_finite(state.params)):
            raise NonFiniteParameters(f"update {step}: the parameters hold inf or NaN; no checkpoint was written")
        ocp = self._ocp
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_state_dict(state)), meta=ocp.args.JsonSave(meta)), force=True)
        self.manager.wait_until_finished()

    def restore_meta(self, step: int) -> dict:
        """The metadata of checkpoint ``step`` only (cheap: no arrays are read)."""
        ocp = self._ocp
        r = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(r["meta"])

    def restore(self, step: int, like) -> tuple[Any, dict]:
        """Restore checkpoint ``step`` into the structure (and shapes/dtypes/shardings) of the state ``like``.

        Raises:
            ValueError: the checkpoint does not fit the given structure.
        """
        ocp = self._ocp
        target = _state_dict(like)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            r = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises several types for a structure mismatch
            raise ValueError(f"{self.directory}/{step}: checkpoint does not match this run's model/optimizer "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
        d = r["state"]
        if jax.tree.structure(d["opt_state"]) != jax.tree.structure(like.opt_state):
            raise ValueError(f"{self.directory}/{step}: restored optimizer state has another pytree structure")
        s = d["scalars"]
        state = like.replace(params=d["params"], opt_state=d["opt_state"], step=s["step"], hparams=s.get("hparams", like.hparams),
                             lr=s["lr"], t_total=s["t_total"])
        return state, dict(r["meta"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
