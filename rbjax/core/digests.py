"""Content digests of files: what identifies a model, tokenizer or data file in every key (:mod:`rbjax.core.keys`).

Files are identified by content (sha256), not by path or modification time: the same weights copied elsewhere are
the same model, and weights rewritten in place are a different one.

Hashing a multi-gigabyte checkpoint takes seconds, and a sweep's chunks, a study's stages and a rerun each key the
same files again. The digest of a file of :data:`CACHED_MIN_BYTES` or more is therefore kept in rbjax's cache folder
(``file-digests.json`` under :func:`rbjax.core.io.cache_dir`), as a keyed entry (:class:`rbjax.core.reuse.KeyedEntries`,
the one reuse rule) whose key is the file's identity and state: resolved path, device, inode, size, modification
and change times in nanoseconds. Any write to the file changes its change time, so a stale digest is never
returned. A file modified within :data:`RACY_SECONDS` of being hashed is not recorded (a write within the file
system's timestamp granularity could leave its times unchanged; git calls this "racily clean"), and it is hashed
again next time. An unreadable or foreign cache file is ignored and rewritten; set ``RBJAX_CACHE_DIR`` to move it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable

from rbjax.core.io import cache_dir, sha256_file
from rbjax.core.reuse import KeyedEntries

__all__ = ["file_digest", "files_key", "CACHED_MIN_BYTES", "RACY_SECONDS", "DIGESTS_FILE"]

#: files at least this large have their digest kept across processes
CACHED_MIN_BYTES = 1 << 20
#: a file modified this recently is hashed but not recorded
RACY_SECONDS = 2.0
#: the cache file, in :func:`rbjax.core.io.cache_dir`
DIGESTS_FILE = "file-digests.json"
#: entries kept (the most recently recorded)
MAX_ENTRIES = 4096


def _state(p: Path, st: os.stat_result) -> list:
    return [str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_digest(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's content; for a large file, kept across processes by its path and state (module
    docstring), so each large file is read once.

    Raises:
        OSError: the file cannot be read.
    """
    p = Path(path).resolve()
    st = p.stat()
    if st.st_size < CACHED_MIN_BYTES:
        return sha256_file(p)
    key = _state(p, st)
    try:
        store = KeyedEntries(cache_dir() / DIGESTS_FILE, "files", version=1)
    except OSError:
        store = None
    hit = store.stored(str(p), key) if store is not None else None
    if hit is not None and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    d = sha256_file(p)
    if store is not None and time.time() - st.st_mtime_ns / 1e9 > RACY_SECONDS and p.stat().st_ctime_ns == st.st_ctime_ns:
        if len(store.entries) >= MAX_ENTRIES:  # drop the oldest records (insertion order)
            for name in list(store.entries)[:len(store.entries) - MAX_ENTRIES + 1]:
                store.entries.pop(name)
        try:
            store.save(str(p), key, {"sha256": d})
        except OSError:
            pass  # a read-only cache folder: hashed again next time
    return d


def files_key(paths: Iterable[str | os.PathLike]) -> dict[str, str]:
    """``{file name: sha256}`` of the files that exist among ``paths`` (names, not full paths: content decides)."""
    out = {}
    for p in paths:
        p = Path(p)
        if p.is_file():
            out[p.name] = file_digest(p)
    return out
