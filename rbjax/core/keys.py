"""What produced a result: content digests of files, arrays and settings, so that anything a later run reuses is
keyed on everything that made it.

A cache hit on different inputs is a wrong result that looks right. Every reusable artefact of rbjax (per-type
perplexity CSVs, sweep points, debiasing checkpoints and finished runs, evaluation results) stores a *key*: a
digest of the model files' contents, the tokenizer files, the data files, the split and the settings. A later run
reuses the artefact only when its own key is identical; otherwise it recomputes and says why
(:func:`describe_difference`).

Files are identified by content (sha256, :mod:`rbjax.core.digests`), not by path or modification time: the same
weights copied elsewhere are the same model, and weights rewritten in place are a different one.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["tree_digest", "canonical", "digest", "describe_difference"]

def tree_digest(tree) -> str:
    """sha256 of a pytree of arrays: structure, shapes, dtypes and bytes (e.g. in-memory parameters)."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree.flatten(tree)
    h = hashlib.sha256(str(treedef).encode())
    for x in leaves:
        a = np.ascontiguousarray(np.asarray(x))
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def canonical(obj: Any) -> Any:
    """``obj`` in the form a key is written and compared in: JSON types only (tuples as lists, other values by
    ``str``), keys sorted."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def digest(obj: Any) -> str:
    """sha256 of a JSON-serialisable description (keys sorted; non-JSON values by ``str``)."""
    return hashlib.sha256(json.dumps(canonical(obj), sort_keys=True).encode()).hexdigest()


def describe_difference(old: Any, new: Any, *, limit: int = 6) -> str:
    """A short human-readable account of what differs between two keys (nested dicts), for "recomputing because …"."""
    old, new = canonical(old), canonical(new)
    parts: list[str] = []

    def walk(a, b, where):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                seg = f"[{k!r}]" if "." in str(k) else (f".{k}" if where else str(k))  # file names keep their dots
                walk(a.get(k), b.get(k), f"{where}{seg}")
        elif a != b:
            short = lambda v: (v[:12] + "…") if isinstance(v, str) and len(v) == 64 else v  # noqa: E731 (digests)
            parts.append(f"{where or 'key'}: {short(a)!r} → {short(b)!r}")

    walk(old, new, "")
    if not parts:
        return "nothing"
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more
