"""Several hosts as one JAX program: ``jax.distributed.initialize()`` on request (docs/scale.md).

Every host runs the same ``rbjax`` command; after :func:`initialize` ``jax.devices()`` lists the devices of all of
them, and the sweep's mesh (:mod:`rbjax.core.mesh`) spans them: a chunk's grid points are split over every host's
devices, host arrays are gathered with ``process_allgather`` (:func:`rbjax.core.mesh.to_host`), and one process (index 0)
appends the result and metric lines. Files are written under ``--out``, which must be the same shared folder on
every host.

Requested by ``rbjax sweep --distributed`` (the sweep calls :func:`initialize` once its options are checked), or by
``RBJAX_DISTRIBUTED=1`` for any command (:func:`rbjax.cli.main` calls it before the command runs). JAX finds the coordinator, process count and process id by itself on Cloud TPU, under Slurm and under
Open MPI (``mpirun``); elsewhere set

* ``JAX_COORDINATOR_ADDRESS=host:port`` (process 0's address and a free port; read by JAX),
* ``JAX_NUM_PROCESSES=N`` and ``JAX_PROCESS_ID=i`` (0 … N−1; read here and passed on),
* optionally ``JAX_LOCAL_DEVICE_IDS=0,1`` (read by JAX: the devices this process drives).
"""
from __future__ import annotations

import os

__all__ = ["ENV_FLAG", "requested", "initialize"]

#: environment variable that requests :func:`initialize` for any command
ENV_FLAG = "RBJAX_DISTRIBUTED"


def requested(flag: bool = False) -> bool:
    """True when ``flag`` (``--distributed``) is set or ``$RBJAX_DISTRIBUTED`` is a true value (not ``""``/``0``)."""
    return bool(flag) or os.environ.get(ENV_FLAG, "").strip().lower() not in ("", "0", "false", "no")


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or not v.strip():
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {v!r}") from None


def initialize() -> dict:
    """Join the multi-process JAX job (once per process; must come before any JAX computation).

    Returns:
        ``{"process_index", "process_count", "devices", "local_devices"}``.

    Raises:
        ValueError: a malformed environment variable, or JAX cannot find the coordinator, the process count or this
        process's id (the message says which variables to set).
        RuntimeError: JAX already ran a computation in this process.
    """
    import jax

    if jax.distributed.is_initialized():  # already joined (e.g. RBJAX_DISTRIBUTED=1 and --distributed)
        return _describe()
    kw = {k: v for k, v in (("num_processes", _env_int("JAX_NUM_PROCESSES")),
                            ("process_id", _env_int("JAX_PROCESS_ID"))) if v is not None}
    try:
        jax.distributed.initialize(**kw)
    except ValueError as e:
        raise ValueError(f"jax.distributed.initialize(): {e}. Outside Cloud TPU, Slurm and Open MPI set "
                         "JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES and JAX_PROCESS_ID on every host "
                         "(see docs/scale.md)") from None
    return _describe()


def _describe() -> dict:
    import jax

    return {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "devices": jax.device_count(), "local_devices": jax.local_device_count()}
