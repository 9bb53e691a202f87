"""Compiled programs: the persistent compilation cache every command uses, and a count of what XLA compiles.

**The persistent cache.** JAX can keep every compiled program on disk, keyed by the program, its shapes, the
backend, the device kind and the jax/XLA versions (jax's own key), so a later process loads it instead of compiling
it again: the second run of the same shapes, every sweep chunk after the first and every study stage after the first
compile nothing. :func:`enable_compile_cache` turns it on for every ``rbjax`` command (:func:`rbjax.cli.main`):

* where: ``--compile-cache DIR`` (an option of ``rbjax`` itself, before the command), else ``$RBJAX_COMPILE_CACHE``,
  else ``$JAX_COMPILATION_CACHE_DIR`` (jax's own variable), else ``compile-cache/`` in rbjax's cache folder
  (:func:`rbjax.core.io.cache_dir`: ``$RBJAX_CACHE_DIR`` or ``~/.cache/rbjax``);
* ``off`` (``--compile-cache off`` or ``RBJAX_COMPILE_CACHE=off``) disables it;
* every program is kept, small ones included (a tiny model's programs compile in well under jax's default 1 s
  threshold, and they are what a test suite or a small study compiles again and again);
* an entry that cannot be read (truncated, corrupt, written by another jax version) is ignored and the program
  compiled again; jax warns, rbjax's message names the folder; it is never fatal.

docs/scale.md ("Caches") says how much space it takes and how to clear it.

**Counting compiles.** :class:`CompileCounter` listens to jax's monitoring events while it is active: the programs
built (compiled or loaded from the cache) and how many of them came from the cache, so a run can report its
compile time and a test can check that an update compiles nothing.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import jax
import jax.monitoring

from rbjax.core.io import cache_dir

__all__ = ["ENV_COMPILE_CACHE", "OFF", "compile_cache_dir", "enable_compile_cache", "CompileCounter", "abstract"]

#: the environment variable that moves (a folder) or disables (``off``) the persistent compilation cache
ENV_COMPILE_CACHE = "RBJAX_COMPILE_CACHE"
#: the words that disable it
OFF = ("off", "none", "no", "0", "false")

#: jax's monitoring events: one per program built (compiled, or read from the persistent cache), and one per cache hit
_BUILT = "/jax/core/compile/backend_compile_duration"
_HIT = "/jax/compilation_cache/cache_hits"


def compile_cache_dir(choice: str | os.PathLike | None = None) -> Path | None:
    """The folder of the persistent compilation cache (module docstring), or ``None`` when it is off."""
    for v in (choice, os.environ.get(ENV_COMPILE_CACHE), os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        if v is None or str(v).strip() == "":
            continue
        if str(v).strip().lower() in OFF:
            return None
        return Path(v).expanduser()
    return cache_dir() / "compile-cache"


def enable_compile_cache(choice: str | os.PathLike | None = None) -> Path | None:
    """Turn on jax's persistent compilation cache in :func:`compile_cache_dir` (``choice``: ``--compile-cache``);
    returns the folder, or ``None`` when it is off. Safe to call again (the folder may change between calls only
    before the first compile of the process).

    Raises:
        ValueError: the folder cannot be created (named).
    """
    folder = compile_cache_dir(choice)
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--compile-cache {folder}: cannot create the folder ({e.strerror or e}); choose another "
                         f"one, or 'off'") from None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def abstract(tree):
    """``tree`` with every array replaced by its ``jax.ShapeDtypeStruct`` — shape, dtype and placement (its
    ``sharding``; none for a host array): what ``jax.jit(f).lower(...)`` needs to compile ``f`` ahead of time for
    such arguments, without computing anything. ``ShapeDtypeStruct`` leaves are kept as they are."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


class CompileCounter:
    """Counts what XLA builds while active (a context manager; jax's monitoring events).

    Attributes:
        built: programs built — compiled, or loaded from the persistent cache.
        cache_hits: of those, loaded from the persistent cache.
        seconds: wall time spent building them (compiling or loading).
    """

    def __init__(self):
        self.built = 0
        self.cache_hits = 0
        self.seconds = 0.0
        self._t0 = None

    @property
    def compiled(self) -> int:
        """Programs XLA compiled (built and not found in the cache)."""
        return self.built - self.cache_hits

    def _on_duration(self, event: str, secs: float, **_kw) -> None:
        if event == _BUILT:
            self.built += 1
            self.seconds += secs

    def _on_event(self, event: str, **_kw) -> None:
        if event == _HIT:
            self.cache_hits += 1

    def __enter__(self) -> "CompileCounter":
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
        jax.monitoring.unregister_event_listener(self._on_event)
