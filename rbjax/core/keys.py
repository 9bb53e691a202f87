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
    """A short human-readable account of what differs between two keys (nested dicts), for "recomputing because …":
    the paths of at most ``limit`` differing fields, each ``path: old → new`` (``(+N more)`` after them).

    Only fields are shown, never a whole sub-key: a dict or a list on one side of a difference is written as its
    size (``{7 fields}``, ``[2 entries]``), a sha256 by its first 12 hex digits, any other value cut at 80
    characters. Lists of equal length are compared entry by entry (``types[0].split``); lists of dicts named by a
    common first field with distinct values (a measurement's bias types: ``bias_type``) are compared by that name,
    whatever their order and length (``types[bias_type=race].model…``, or ``types[bias_type=gender]: {7 fields} →
    absent`` for a type only one side has); other lists of different lengths by their sizes.
    """
    old, new = canonical(old), canonical(new)
    parts: list[str] = []

    def walk(a, b, where):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                seg = f"[{k!r}]" if "." in str(k) else (f".{k}" if where else str(k))  # file names keep their dots
                walk(a.get(k), b.get(k), f"{where}{seg}")
        elif isinstance(a, list) and isinstance(b, list) and a != b:
            named = _named_entries(a, b)
            if named is not None:
                field, na, nb = named
                for name in list(na) + [n for n in nb if n not in na]:
                    here = f"{where}[{field}={name}]"
                    if name in na and name in nb:
                        walk(na[name], nb[name], here)
                    else:  # an entry one side lacks: named, not shown
                        parts.append(f"{here}: {'absent' if name not in na else _brief(na[name])} → "
                                     f"{'absent' if name not in nb else _brief(nb[name])}")
            elif len(a) == len(b):
                for i, (x, y) in enumerate(zip(a, b)):
                    walk(x, y, f"{where}[{i}]")
            else:
                parts.append(f"{where or 'key'}: {_brief(a)} → {_brief(b)}")
        elif a != b:
            parts.append(f"{where or 'key'}: {_brief(a)} → {_brief(b)}")

    walk(old, new, "")
    if not parts:
        return "nothing"
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def _brief(v: Any, width: int = 80) -> str:
    """One value of a difference, short: a container by its size, a sha256 by 12 digits, anything else cut."""
    if isinstance(v, dict):
        return f"{{{len(v)} field{'s' if len(v) != 1 else ''}}}"
    if isinstance(v, list):
        return f"[{len(v)} entr{'ies' if len(v) != 1 else 'y'}]"
    if isinstance(v, str) and len(v) == 64:
        v = v[:12] + "…"  # a digest
    text = repr(v)
    return text if len(text) <= width else text[:width - 1] + "…"


def _named_entries(a: list, b: list):
    """``(field, {name: entry of a}, {name: entry of b})`` when every entry of both lists is a dict whose first
    field (keys are sorted) is the same ``field`` with a scalar value, distinct within each list; else ``None``."""
    entries = a + b
    if not entries or not all(isinstance(e, dict) and e for e in entries):
        return None
    field = next(iter(entries[0]))
    if any(next(iter(e)) != field or isinstance(e[field], (dict, list)) for e in entries):
        return None
    na, nb = ({e[field]: e for e in x} for x in (a, b))
    if len(na) != len(a) or len(nb) != len(b):
        return None
    return field, na, nb
