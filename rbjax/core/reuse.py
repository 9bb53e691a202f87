"""One reuse mechanism: "is there a result for exactly this key? else compute, write atomically, record the key".

A cache hit on different inputs is a wrong result that looks right, so every reusable result of rbjax is a JSON file
that carries the *key* of what produced it (content digests of model, tokenizer and data files plus the settings,
:mod:`rbjax.core.keys`) and a ``status``. :class:`KeyedResult` is the one place that decides reuse:

* the file is missing → compute;
* the file is unreadable, unfinished (``status`` not ``"done"``) or was made from other inputs → compute, and say
  why (:func:`rbjax.core.keys.describe_difference`) — a result is never relabelled with a new key;
* otherwise the stored result is returned (``reused: True``) and nothing is computed.

Keys are compared in canonical form (:func:`rbjax.core.keys.canonical`: JSON types, sorted keys), the form in which
they are written, so a tuple in a fresh key equals the list read back from the file.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from rbjax.core.io import atomic_write_json, read_json
from rbjax.core.keys import canonical, describe_difference

__all__ = ["KeyedResult", "reuse_or_compute"]


@dataclasses.dataclass
class KeyedResult:
    """A result file keyed on its inputs.

    Attributes:
        path: the JSON file.
        key: what produces the result (any JSON-able nesting; compared canonically).
        what: a short name for messages (``"dst"``, ``"stage seed42/baseline"``).
        say: where the reuse/recompute messages go (default: none).
        check: an optional extra test of a stored result with an equal key: returns ``None`` to reuse it or the
            reason to recompute (e.g. a file the result points to is gone).
    """

    path: Path
    key: Any
    what: str = "result"
    say: Callable[[str], None] | None = None
    check: Callable[[dict], str | None] | None = None

    def __post_init__(self):
        self.path = Path(self.path)
        self.key = canonical(self.key)
        self.reason: str | None = None

    def _tell(self, msg: str) -> None:
        if self.say is not None:
            self.say(msg)

    def stored(self) -> dict | None:
        """The stored result when it was made from exactly :attr:`key` (marked ``reused: True``), else ``None``;
        :attr:`reason` then says why it cannot be reused (``None`` when there is no file)."""
        self.reason = None
        if not self.path.exists():
            return None
        prev = read_json(self.path)
        if not isinstance(prev, dict):
            self.reason = "unreadable"
        elif prev.get("status") != "done":
            self.reason = f"unfinished (status {prev.get('status')!r})"
        elif prev.get("key") != self.key:
            self.reason = f"inputs differ: {describe_difference(prev.get('key') or {}, self.key)}"
        elif self.check is not None:
            self.reason = self.check(prev)
        if self.reason is not None:
            self._tell(f"{self.path}: recomputing {self.what} ({self.reason})")
            return None
        self._tell(f"{self.path}: same inputs as the existing {self.what}; reusing it (nothing recomputed; delete the "
                   "file to recompute)")
        return {**prev, "reused": True}

    def save(self, body: dict) -> dict:
        """Write ``body`` with this key and ``status: "done"`` atomically; returns what was written plus
        ``reused: False``."""
        rec = {**body, "status": "done", "key": self.key}
        rec.pop("reused", None)
        atomic_write_json(self.path, rec)
        return {**rec, "reused": False}


def reuse_or_compute(path: str | os.PathLike, key: Any, compute: Callable[[], dict], *, what: str = "result",
                     say: Callable[[str], None] | None = None,
                     check: Callable[[dict], str | None] | None = None) -> dict:
    """The stored result at ``path`` if it was made from exactly ``key``; else ``compute()``, written atomically
    with the key (:class:`KeyedResult`). ``compute`` returns the JSON-able body of the result."""
    res = KeyedResult(Path(path), key, what, say, check)
    prev = res.stored()
    return prev if prev is not None else res.save(compute())
