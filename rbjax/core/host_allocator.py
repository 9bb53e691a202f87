"""The host allocator of an rbjax process: freed buffers kept for reuse instead of handed back to the kernel.

**Why.** XLA's CPU runtime allocates every execution's buffers (the outputs, and one block of temporaries: for a
DialoGPT-small update about 500 MB, the gradient and the activations) with ``posix_memalign`` on its worker
threads, and frees them when the execution ends. glibc serves a block that large with a fresh ``mmap`` (a worker
thread's arena cannot hold it, and blocks over 32 MB are always mapped) and ``munmap``\\ s it on ``free``, so every
update the kernel maps and zero-fills the same ~128,000 pages again. Measured on a 2-core CPU (``rbjax debias``,
LM loss, 20 updates of the DialoGPT-small shape): 2.58 M page faults and 5.0 s of system time; with the setting
below a few thousand faults, 0.1 s of system time and the updates about 15 % faster (0.88 → 0.72–0.74 s); a DST
update 4–7 % faster (``benchmarks/RESULTS.md``). PyTorch users get the same effect from jemalloc or tcmalloc.

**What.** :func:`configure_host_allocator` sets two of glibc's ``mallopt`` parameters: no mapped blocks
(``M_MMAP_MAX`` 0: a large block comes from the heap, which can grow to any size) and the heap's top kept up to
2 GiB (``M_TRIM_THRESHOLD``, an ``int``); and it turns off JAX's asynchronous dispatch on CPU
(``jax_cpu_enable_async_dispatch``), so that a one-device program runs, and allocates its buffers, on the thread
that calls it: the main thread, whose arena is the heap (a worker thread's arena cannot hold a block over 64 MB and
maps it whatever the setting). A freed block is then reused by the next execution. The numbers computed do not
change; the resident memory stays at its peak (measured: 3.17 → 3.57 GB at the end of that run), a freed top of
the heap over 2 GiB is still handed back, and a call returns when its program has run (the training loop waits for
every update's metrics anyway). Measured and not kept: one arena for every thread (``M_ARENA_MAX`` 1, which also
routes the worker threads' blocks to the heap) makes XLA's compiler threads queue on its lock: a DST run's cold
compile went from 22 s to 36 s.

It has to run before JAX's CPU client is created (the dispatch mode is fixed then):
:func:`rbjax.cli.main` calls it first thing, and a sweep's worker process (:func:`rbjax.debias.sweep.run_chunk`)
before its first JAX work. From Python, call it before the first JAX computation.

``RBJAX_HOST_ALLOCATOR=system`` leaves the allocator as it is (``reuse``, the default, applies the setting). Nothing
is changed either where the C library is not glibc (macOS, musl), when the user set glibc's malloc variables
(``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_MAX_``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_TOP_PAD_``, or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``), or when anything is preloaded
(``LD_PRELOAD``: it may be another allocator, e.g. jemalloc or tcmalloc): their choice stands.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

import jax

__all__ = ["ENV_HOST_ALLOCATOR", "MODES", "configure_host_allocator"]

#: the environment variable that chooses the host allocator's setting
ENV_HOST_ALLOCATOR = "RBJAX_HOST_ALLOCATOR"
#: its values: ``reuse`` (default) keeps freed buffers for reuse, ``system`` leaves the C library's defaults
MODES = ("reuse", "system")

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: the largest trim threshold mallopt takes (its value is a C int)
_TRIM_MAX = 2**31 - 1
_USER_VARIABLES = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                   "MALLOC_TOP_PAD_")

_applied: str | None = None


def configure_host_allocator(mode: str | None = None) -> str:
    """Keep freed host buffers for reuse (module docstring), once per process.

    Args:
        mode: ``reuse`` or ``system`` (default: ``$RBJAX_HOST_ALLOCATOR``, else ``reuse``).

    Returns:
        what was done: ``"reuse"`` (the setting is applied, now or by an earlier call), ``"system"`` (asked not
        to), ``"user"`` (glibc's malloc variables are set, or a library is preloaded), ``"unavailable"``
        (the C library is not glibc, or it refused), ``"late"`` (JAX's backends exist already: nothing changed).

    Raises:
        ValueError: a ``mode`` (or ``$RBJAX_HOST_ALLOCATOR``) other than ``reuse`` or ``system``.
    """
    global _applied
    given = mode if mode is not None else os.environ.get(ENV_HOST_ALLOCATOR, "")
    choice = given.strip().lower() or "reuse"
    if choice not in MODES:
        where = "mode" if mode is not None else f"${ENV_HOST_ALLOCATOR}"
        raise ValueError(f"{where} {given!r}: expected one of {', '.join(MODES)}")
    if choice == "system":
        return "system"
    if _applied is not None:
        return _applied
    if any(os.environ.get(v) for v in _USER_VARIABLES) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") \
            or os.environ.get("LD_PRELOAD", "").strip():
        _applied = "user"
        return _applied
    if _backends_initialized():  # its CPU client dispatches as it was created: the setting would be half-done
        return "late"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        _applied = "unavailable"
        return _applied
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        _applied = "unavailable"
        return _applied
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_MAX))):
        _applied = "unavailable"
        return _applied
    jax.config.update("jax_cpu_enable_async_dispatch", False)  # programs allocate on the calling (main) thread
    _applied = "reuse"
    return _applied


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover (a jax without it: assume not yet)
        return False
    return bool(getattr(xla_bridge, "backends_are_initialized", lambda: False)())
