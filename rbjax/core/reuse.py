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

from rbjax.core.io import atomic_write_json, read_json, sha256_file
from rbjax.core.keys import canonical, describe_difference

__all__ = ["KeyedResult", "KeyedEntries", "why_not_reusable", "reuse_or_compute", "OutputExists", "claim_outputs",
           "record_outputs"]


class OutputExists(ValueError):
    """A command would replace files it did not write (from these inputs); nothing was written."""


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
        refuse_other: a stored result of other inputs (or one whose ``check`` fails) is not replaced silently:
            :meth:`stored` raises :class:`OutputExists` naming the difference (the rule of
            :func:`claim_outputs`; the command's ``--overwrite`` turns it off). An unreadable or
            unfinished file is still recomputed.

    After :meth:`stored`: :attr:`reason` (why the stored result cannot be reused; ``None`` when it can or there is
    no file), :attr:`other` (the file is a finished result of other inputs, or one whose ``check`` failed — not a
    damaged or unfinished one) and :attr:`record` (the stored result as written, without the ``reused`` mark, when
    it can be reused; else ``None``).
    """

    path: Path
    key: Any
    what: str = "result"
    say: Callable[[str], None] | None = None
    check: Callable[[dict], str | None] | None = None
    refuse_other: bool = False

    def __post_init__(self):
        self.path = Path(self.path)
        self.key = canonical(self.key)
        self.reason: str | None = None
        self.other = False
        self.record: dict | None = None

    def _tell(self, msg: str) -> None:
        if self.say is not None:
            self.say(msg)

    def stored(self) -> dict | None:
        """The stored result when it was made from exactly :attr:`key` (marked ``reused: True``), else ``None``;
        :attr:`reason` then says why it cannot be reused (``None`` when there is no file)."""
        self.reason, self.other, self.record = None, False, None
        if not self.path.exists():
            return None
        prev = read_json(self.path)
        self.reason, self.other = why_not_reusable(prev, self.key, self.check)
        if self.other:
            self._refuse()
        if self.reason is not None:
            self._tell(f"{self.path}: recomputing {self.what} ({self.reason})")
            return None
        self.record = prev
        self._tell(f"{self.path}: same inputs as the existing {self.what}; reusing it (nothing recomputed; delete the "
                   "file to recompute)")
        return {**prev, "reused": True}

    def _refuse(self) -> None:
        if self.refuse_other:
            raise OutputExists(f"{self.path}: holds the {self.what} result of other inputs ({self.reason}); nothing "
                               "was computed: pass --overwrite to replace it, or choose another --out")

    def save(self, body: dict) -> dict:
        """Write ``body`` with this key and ``status: "done"`` atomically; returns what was written plus
        ``reused: False``."""
        rec = {**body, "status": "done", "key": self.key}
        rec.pop("reused", None)
        atomic_write_json(self.path, rec)
        return {**rec, "reused": False}


def why_not_reusable(prev, key, check=None, *, finished: bool = False) -> tuple[str | None, bool]:
    """The one reuse rule: ``(reason, other_inputs)`` — ``reason`` is ``None`` when the stored record ``prev`` (a
    dict with ``key`` and ``status``) may stand for a result of ``key`` (canonical form), else why not;
    ``other_inputs`` when it is a finished result of other inputs (or fails ``check``), not a damaged or unfinished
    one.

    Args:
        prev: the stored record (``None`` or anything not a dict: unreadable).
        key: the key of the result wanted, in canonical form (:func:`rbjax.core.keys.canonical`).
        check: an extra test of a record with an equal key: ``None`` to reuse it, else the reason not to.
        finished: ``prev`` carries no ``status`` of its own because what holds it vouches that it is complete: the
            metadata of a committed checkpoint, a line of an append-only file of finished results, a record inside
            a finished result, a file only ever written whole (atomically). Its ``status`` is then not asked for.
    """
    if not isinstance(prev, dict):
        return "unreadable", False
    if not finished and prev.get("status") != "done":
        return f"unfinished (status {prev.get('status')!r})", False
    if prev.get("key") != key:
        return f"inputs differ: {describe_difference(prev.get('key') or {}, key)}", True
    if check is not None:
        why = check(prev)
        return why, why is not None
    return None, False


@dataclasses.dataclass
class KeyedEntries:
    """Many keyed results recorded in one JSON file: ``{"version": V, section: {name: {"key", "status", ...}}}``
    (the study's ``stages.json``, ``measure``'s per-bias-type record of its CSVs). The reuse rule is
    :class:`KeyedResult`'s (:func:`why_not_reusable`); the file is rewritten atomically after every change, so an
    interrupted run keeps what finished.

    Attributes:
        path: the JSON file. section: the key of the entries in it. version: the file's format (``None``: not
            recorded); a file of another version holds no entries, unless ``upgrade(old) -> entries`` converts it.
    """

    path: Path
    section: str
    version: int | None = None
    upgrade: Callable[[dict], dict] | None = None

    def __post_init__(self):
        self.path = Path(self.path)
        st = read_json(self.path, {})
        st = st if isinstance(st, dict) else {}
        if self.version is not None and st.get("version") != self.version:
            st = {self.section: self.upgrade(st)} if (self.upgrade is not None and st) else {}
        entries = st.get(self.section)
        self.entries: dict = dict(entries) if isinstance(entries, dict) else {}
        self.reason: str | None = None

    def stored(self, name: str, key: Any) -> dict | None:
        """The entry ``name`` when it is a finished result of exactly ``key``, else ``None`` (:attr:`reason` says
        why; ``None`` when there is no entry)."""
        prev = self.entries.get(name)
        self.reason = None if prev is None else why_not_reusable(prev, canonical(key))[0]
        return prev if prev is not None and self.reason is None else None

    def drop(self, name: str) -> None:
        """Forget ``name`` (its result is about to be recomputed: it no longer describes what is on disk)."""
        if self.entries.pop(name, None) is not None:
            self._write()

    def save(self, name: str, key: Any, body: dict | None = None) -> dict:
        """Record ``name`` as a finished result of ``key`` (with ``body``'s fields); returns the entry."""
        self.entries[name] = {**(body or {}), "key": canonical(key), "status": "done"}
        self._write()
        return self.entries[name]

    def _write(self) -> None:
        doc = {self.section: self.entries}
        if self.version is not None:
            doc = {"version": self.version, **doc}
        atomic_write_json(self.path, doc)


def reuse_or_compute(path: str | os.PathLike, key: Any, compute: Callable[[], dict], *, what: str = "result",
                     say: Callable[[str], None] | None = None,
                     check: Callable[[dict], str | None] | None = None) -> dict:
    """The stored result at ``path`` if it was made from exactly ``key``; else ``compute()``, written atomically
    with the key (:class:`KeyedResult`). ``compute`` returns the JSON-able body of the result."""
    res = KeyedResult(Path(path), key, what, say, check)
    prev = res.stored()
    return prev if prev is not None else res.save(compute())


# ---------------------------------------------------------------------------- never replace work not ours
#: hidden file in a folder rbjax writes results to: for each file it wrote there, the key of the inputs that
#: produced it and the sha256 of the content it wrote (see :func:`claim_outputs`)
OUTPUTS_FILE = ".rbjax_outputs.json"
OUTPUTS_VERSION = 1


def _outputs_manifest(folder: Path) -> dict:
    st = read_json(folder / OUTPUTS_FILE)
    if not isinstance(st, dict) or st.get("version") != OUTPUTS_VERSION or not isinstance(st.get("files"), dict):
        return {}
    return st["files"]


def claim_outputs(paths, key, *, overwrite: bool = False, flag: str = "--overwrite", where: str = "--out") -> None:
    """Refuse, before any work, to replace files this run did not write.

    The rule every rbjax command follows: an existing file among ``paths`` (the files the run is about to write)
    may only be replaced when it is rbjax's own, unchanged output of the same inputs — :func:`record_outputs`
    stored, in the folder's hidden ``.rbjax_outputs.json``, the same ``key`` and the sha256 of the content it
    wrote, and the file still has that content (a rerun, or the resume of an interrupted run). Anything else (a
    file rbjax did not write, one edited since — an annotator's filled labels —, or rbjax's output of other
    inputs — another model's run) is only replaced with ``overwrite``.

    Args:
        paths: the files the run will write (existing or not).
        key: JSON-serialisable description of the run's inputs (what makes its output what it is).
        overwrite: the user passed ``flag``: replace whatever is there.
        flag, where: the option that allows replacing and the option that chose the location (for the message).

    Raises:
        OutputExists: at least one file would be replaced (each named, with why: the files of one folder with the
            same reason are named together, the reason said once; a difference of inputs by the fields that
            differ, :func:`rbjax.core.keys.describe_difference`); nothing is written.
        ValueError: a path that must become a file is a folder.
    """
    key = canonical(key)
    conflicts: dict[Path, dict[str, list[str]]] = {}  # folder -> why -> file names (one reason said once)
    manifests: dict[Path, dict] = {}
    for p in map(Path, paths):
        if p.is_dir():
            raise ValueError(f"{p} is a folder, but this run writes a file there")
        if not p.exists() or overwrite:
            continue
        if p.parent not in manifests:
            manifests[p.parent] = _outputs_manifest(p.parent)
        entry = manifests[p.parent].get(p.name)
        if not isinstance(entry, dict):
            why = "no record that rbjax wrote it"
        elif entry.get("sha256") != sha256_file(p):
            why = "changed since rbjax wrote it"
        elif entry.get("key") != key:
            why = f"written from other inputs: {describe_difference(entry.get('key'), key)}"
        else:
            continue
        conflicts.setdefault(p.parent, {}).setdefault(why, []).append(p.name)
    if conflicts:
        n = sum(len(names) for whys in conflicts.values() for names in whys.values())

        def group(names, why):
            listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            return f"{listed} ({why})"

        shown = "; ".join(f"in {folder}: " + ", ".join(group(names, why) for why, names in whys.items())
                          for folder, whys in conflicts.items())
        raise OutputExists(
            f"will not replace {n} existing file(s) that this run did not write: {shown}. Nothing was written: "
            f"pass {flag} to replace them, or choose another {where}")


def record_outputs(paths, key) -> None:
    """Record ``paths`` (files just written) as rbjax's output of ``key`` in their folders' ``.rbjax_outputs.json``
    (the sha256 of their content now), so that a later run of the same inputs may replace them
    (:func:`claim_outputs`). A missing path is dropped from the record."""
    key = canonical(key)
    by_folder: dict[Path, list[Path]] = {}
    for p in map(Path, paths):
        by_folder.setdefault(p.parent, []).append(p)
    for folder, ps in by_folder.items():
        files = _outputs_manifest(folder)
        for p in ps:
            if p.is_file():
                files[p.name] = {"key": key, "sha256": sha256_file(p)}
            else:
                files.pop(p.name, None)
        atomic_write_json(folder / OUTPUTS_FILE, {"version": OUTPUTS_VERSION, "files": files})
