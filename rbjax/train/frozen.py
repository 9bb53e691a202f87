"""Which parameters a run trains: a parameter tree split into its trained part and its frozen rest, and put back
together inside the step.

A run that fine-tunes everything trains the whole tree (the frozen part is empty). A run with low-rank adapters
(:mod:`rbjax.model.lora`) trains the adapter matrices — and the objective's own parameters, e.g. DST's classifier
head (``objective.own_params``, its top-level keys) — while the base model is frozen: it gets no gradient and no
optimiser state, is not part of the (vmapped, donated) train state and is held once, also for a whole grid chunk
(:func:`rbjax.train.step.grid_train_step` takes it unbatched). Both parts are nested dicts with disjoint leaves;
:func:`combine` is a dict union (no array is copied).
"""
from __future__ import annotations

from typing import Callable

from rbjax.model.lora import has_adapters, is_adapter_param

__all__ = ["split", "combine", "trainable_rule"]


def trainable_rule(params, objective) -> Callable[[tuple], bool] | None:
    """What a run trains: ``None`` (everything) for a tree without adapters; with adapters, the adapter matrices
    and the objective's own parameters (``objective.own_params``: top-level keys)."""
    if not has_adapters(params):
        return None
    own = tuple(getattr(objective, "own_params", ()))
    return lambda path: is_adapter_param(path) or (bool(path) and path[0] in own)


def split(params: dict, trainable: Callable[[tuple], bool] | None) -> tuple[dict, dict]:
    """``(trained, frozen)`` of a nested-dict tree by ``trainable(dict path)`` (``None``: all trained); empty
    sub-dicts are left out."""
    if trainable is None:
        return params, {}

    def walk(tree, path):
        t, f = {}, {}
        for k, v in tree.items():
            if isinstance(v, dict):
                a, b = walk(v, path + (k,))
                if a:
                    t[k] = a
                if b:
                    f[k] = b
            elif trainable(path + (k,)):
                t[k] = v
            else:
                f[k] = v
        return t, f

    return walk(params, ())


def combine(frozen, trained):
    """The whole tree from its frozen and trained parts (a dict union; ``frozen`` empty or ``None``: ``trained``).

    Raises:
        ValueError: a leaf present in both parts.
    """
    if not frozen:
        return trained
    out = dict(frozen)
    for k, v in trained.items():
        if k not in out:
            out[k] = v
        elif isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = combine(out[k], v)
        else:
            raise ValueError(f"parameter {k!r} is both trained and frozen")
    return out
