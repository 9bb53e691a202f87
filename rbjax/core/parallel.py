"""Run one function over many independent tasks: on this machine's cores, or on a Ray cluster.

This is the project's only executor layer (retrieval over many dump files, debiasing sweeps).
It schedules nothing itself: local runs use :class:`concurrent.futures.ProcessPoolExecutor`
with the ``"spawn"`` start method (JAX is not fork-safe, and a spawned worker starts from a
clean interpreter), Ray runs use ``ray.remote(fn).options(**resources)`` and ``ray.wait``.

Contract:

* ``fn`` is a picklable **top-level** function of one argument, importable by the workers
  (a module of an installed package, or of a folder on the workers' ``sys.path``; a local
  Ray cluster and spawned processes see the driver's working folder). Tasks and results are
  pickled (local processes) or stored in Ray's object store (Ray), so they should be plain
  data: paths, settings, counters, lists of rows.
* Results come back **in completion order** (:func:`as_completed`), or in task order with a
  callback at each completion (:func:`run_tasks`). The callback runs in the calling process,
  which is where results are written, so an interrupted run loses at most the tasks in flight.
* ``jobs=1`` with the local executor runs the tasks in this process, one after another
  (nothing is pickled, nothing is started).
* A task that raises stops the run with :class:`TaskError`, which names the task (index and
  description) and chains the worker's exception; tasks not started are cancelled and the
  other workers are stopped (their tasks are lost, results already handed out are kept).
* A worker that **dies** (killed, out of memory, a crash in native code): locally the pool
  breaks and :class:`TaskError` names the task that was running and the others in flight
  (a process pool cannot tell which of its workers ran which task once one is gone). On
  Ray, the task is retried on another worker as Ray does by default (``max_retries``, 3 for
  tasks), and only a task that still fails raises :class:`TaskError` naming it.
* Ray is optional (``pip install 'rbjax[ray]'``) and imported only when ``executor="ray"``.
  With no Ray running in this process, ``ray.init(address=ray_address)`` attaches to the
  cluster at ``ray_address`` (or ``RAY_ADDRESS``), else starts a local one, and shuts it
  down at the end; a Ray already initialised by the caller is used as it is and left running.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import multiprocessing
import os
import pickle
from typing import Any, Callable, Iterable, Iterator, Sequence

from rbjax.core.config import field

#: Executors understood by :func:`as_completed` / :func:`run_tasks`.
EXECUTORS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class Executor:
    """Where a command's independent work items run (``rbjax retrieve``: one per dump file; ``rbjax sweep``: one per
    grid chunk) — the settings ``--executor``, ``--jobs``, ``--ray-address``, one help text each
    (:class:`rbjax.debias.sweep_config.SweepConfig` declares the same three with these helps). The result does not
    depend on them."""

    executor: str = field("local", "local: on this machine (retrieve: worker processes; sweep: this process, on all "
                                   "its devices); ray: one task per dump file (retrieve) or grid chunk (sweep) on a "
                                   "Ray cluster (pip install 'rbjax[ray]'; the dumps and --out at the same absolute "
                                   "path on every node)", choices=EXECUTORS)
    jobs: int | None = field(None, "work items at once. local (retrieve): worker processes (default: the cores "
                                   "available, bounded by memory: a worker needs its file's zstd window, up to 2 GiB; "
                                   "1 = this process); ray: tasks in flight (default: as many as the cluster "
                                   "schedules)", metavar="N")
    ray_address: str | None = field(None, "Ray cluster to attach to ('auto', 'ray://host:10001'; default: "
                                          "$RAY_ADDRESS, else a new local cluster)", metavar="ADDRESS")

    @staticmethod
    def help(name: str) -> str:
        """The help text of the setting ``name`` (for a settings class that declares the same setting)."""
        return Executor.__dataclass_fields__[name].metadata["help"]


class TaskError(RuntimeError):
    """A task raised an exception, or the worker running it died.

    Attributes:
        index: position of the task in the task list.
        task: the task description as given.
    The worker's exception, when there is one, is chained as ``__cause__``.
    """

    def __init__(self, index: int, task: Any, message: str):
        self.index = index
        self.task = task
        super().__init__(message)


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of memory this process could still use: ``MemAvailable`` of ``/proc/meminfo``, or less
    when a cgroup (container) limit leaves less; ``None`` where neither can be read."""
    avail = None
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    with contextlib.suppress(OSError, ValueError):  # cgroup v2
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        if limit != "max":
            used = int(open("/sys/fs/cgroup/memory.current").read().strip())
            left = max(0, int(limit) - used)
            avail = left if avail is None else min(avail, left)
    return avail


def plan_jobs(n_tasks: int, bytes_per_job: int | None = None, jobs: int | None = None) -> tuple[int, str | None]:
    """How many local worker processes to run, and a note when memory is what limits them.

    Args:
        n_tasks: tasks to run (never more jobs than tasks).
        bytes_per_job: memory one worker may need at its peak; ``None`` = no memory bound.
        jobs: the user's choice; ``None`` = the cores available, bounded by memory.

    Returns:
        ``(jobs, note)``: ``note`` says when memory lowered the default, or when an explicit
        ``jobs`` may need more memory than is available (the explicit choice is kept); else ``None``.
    """
    n_tasks = max(1, n_tasks)
    avail = available_memory() if bytes_per_job else None
    by_memory = max(1, avail // bytes_per_job) if avail is not None and bytes_per_job else None
    gib = 2**30
    if jobs is not None:
        if by_memory is not None and min(jobs, n_tasks) > by_memory:
            return jobs, (f"{min(jobs, n_tasks)} jobs may need up to {min(jobs, n_tasks) * bytes_per_job / gib:.1f} GiB "
                          f"of memory ({bytes_per_job / gib:.2f} GiB each) but {avail / gib:.1f} GiB is available; "
                          f"{by_memory} would fit")
        return jobs, None
    cpus = available_cpus()
    want = min(cpus, n_tasks)
    if by_memory is not None and by_memory < want:
        return by_memory, (f"running {by_memory} jobs instead of {want}: each needs up to {bytes_per_job / gib:.2f} GiB "
                           f"of memory and {avail / gib:.1f} GiB is available")
    return want, None


def describe_task(task: Any, limit: int = 200) -> str:
    """A short name for ``task`` in messages: its ``name`` attribute when it has one, else ``repr``."""
    name = getattr(task, "name", None)
    text = str(name) if name is not None else repr(task)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_picklable(fn: Callable) -> None:
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r} cannot be sent to worker processes: it must be a "
                         f"top-level function of an importable module ({e})") from None


def as_completed(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    *,
    executor: str = "local",
    jobs: int | None = None,
    resources: dict | Callable[[Any], dict] | None = None,
    ray_address: str | None = None,
) -> Iterator[tuple[int, Any]]:
    """Run ``fn(task)`` for every task and yield ``(index, result)`` as each one finishes.

    Close the generator (``contextlib.closing``) if you stop before the end, so that the
    workers are stopped at once; :func:`run_tasks` does this for you.

    Args:
        fn: picklable top-level function of one argument (see the module notes).
        tasks: task descriptions (picklable).
        executor: ``"local"`` (processes on this machine) or ``"ray"``.
        jobs: local: worker processes (default: :func:`available_cpus`, never more than the
            tasks); ``1`` runs in this process. Ray: the most tasks submitted at a time
            (default: all; the cluster's resources decide how many run at once).
        resources: Ray only: ``.options()`` of each task, a dict or a function of the task
            (e.g. ``{"num_cpus": 1, "memory": 2 * 2**30}``); default ``{"num_cpus": 1}``.
        ray_address: Ray only: cluster to attach to when Ray is not initialised yet
            (``"auto"``, ``"ray://host:10001"`` ...); ``None`` = ``RAY_ADDRESS`` or a new local cluster.

    Yields:
        ``(index, result)`` in completion order.

    Raises:
        ValueError: unknown executor, ``jobs < 1``, ``fn`` not picklable, or a Ray task asking
            for more of a resource than any node of the cluster has (it would wait forever).
        RuntimeError: ``executor="ray"`` without Ray installed.
        TaskError: a task raised, or its worker died (see the module notes).
    """
    tasks = list(tasks)
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if executor == "ray":
        return _ray_completed(fn, tasks, jobs, resources, ray_address)
    return _local_completed(fn, tasks, jobs)


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Iterable[Any],
    *,
    executor: str = "local",
    jobs: int | None = None,
    resources: dict | Callable[[Any], dict] | None = None,
    ray_address: str | None = None,
    on_result: Callable[[int, Any], Any] | None = None,
) -> list:
    """Run ``fn(task)`` for every task (see :func:`as_completed` for the arguments and errors).

    Args:
        on_result: called in this process as ``on_result(index, result)`` when each task
            finishes (completion order), e.g. to write its result file. An exception from it
            stops the run (the workers are stopped) and propagates.

    Returns:
        One entry per task, in task order: ``fn``'s results, or, with ``on_result``, what
        ``on_result`` returned (so large results need not be kept).
    """
    tasks = list(tasks)
    out: list = [None] * len(tasks)
    with contextlib.closing(as_completed(fn, tasks, executor=executor, jobs=jobs, resources=resources,
                                         ray_address=ray_address)) as results:
        for i, res in results:
            out[i] = on_result(i, res) if on_result is not None else res
    return out


def _local_completed(fn, tasks: list, jobs: int | None) -> Iterator[tuple[int, Any]]:
    jobs = min(jobs or available_cpus(), max(1, len(tasks)))
    if jobs == 1:
        yield from _in_process(fn, tasks)
        return
    _check_picklable(fn)
    yield from _pool_completed(fn, tasks, jobs)


def _in_process(fn, tasks: list) -> Iterator[tuple[int, Any]]:
    for i, task in enumerate(tasks):
        try:
            res = fn(task)
        except Exception as e:
            raise TaskError(i, task, f"task {i} ({describe_task(task)}) failed: {type(e).__name__}: {e}") from e
        yield i, res


def _pool_completed(fn, tasks: list, jobs: int) -> Iterator[tuple[int, Any]]:
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    finished = False
    try:
        futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        by_index = {i: f for f, i in futures.items()}
        done: set[int] = set()
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                res = fut.result()
            except cf.process.BrokenProcessPool as e:
                # hand out what finished before the break, then name the tasks that were in flight:
                # the pool runs tasks in submission order, so they are the first ones that broke
                broken = []
                for k, f in sorted(by_index.items()):
                    if k in done or not f.done() or f.cancelled():
                        continue
                    if f.exception() is None:
                        done.add(k)
                        yield k, f.result()
                    elif isinstance(f.exception(), cf.process.BrokenProcessPool):
                        broken.append(k)
                left = broken[:jobs] or [i]
                raise TaskError(left[0], tasks[left[0]], (
                    "a worker process died (killed, out of memory, or a crash in native code) while running "
                    + ("task " if len(left) == 1 else "one of the tasks in flight: ")
                    + ", ".join(f"{k} ({describe_task(tasks[k])})" for k in left)
                    + "; results handed out before are kept")) from e
            except Exception as e:
                raise TaskError(i, tasks[i], f"task {i} ({describe_task(tasks[i])}) failed: "
                                             f"{type(e).__name__}: {e}") from e
            done.add(i)
            yield i, res
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:  # an error, an interrupt, or the consumer stopped: do not wait for the tasks in flight
            pool.shutdown(wait=False, cancel_futures=True)
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                with contextlib.suppress(Exception):
                    p.terminate()
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                with contextlib.suppress(Exception):
                    p.join(5)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray executor needs Ray, an optional extra: pip install 'rbjax[ray]'") from None
    return ray


_RESOURCE_KEYS = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}


def _check_feasible(ray, opts: dict, task_name: str) -> None:
    """Refuse a request no alive node can meet (Ray would otherwise wait for it forever)."""
    wanted = {_RESOURCE_KEYS[k]: v for k, v in opts.items() if k in _RESOURCE_KEYS and v}
    wanted.update(opts.get("resources") or {})
    if not wanted:
        return
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(all(n.get(k, 0) >= v for k, v in wanted.items()) for n in nodes):
        return
    have = "; ".join(", ".join(f"{k}={n.get(k, 0):g}" for k in wanted) for n in nodes) or "no alive node"
    raise ValueError(f"task {task_name} asks for {', '.join(f'{k}={v:g}' for k, v in wanted.items())}, "
                     f"which no node of the Ray cluster has ({have})")


def _ray_completed(fn, tasks: list, jobs, resources, ray_address) -> Iterator[tuple[int, Any]]:
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        started = True
    pending: dict = {}
    try:
        remote = ray.remote(fn)
        opts_of = resources if callable(resources) else (lambda _t, r=dict(resources or {"num_cpus": 1}): r)
        checked: set = set()
        todo = list(enumerate(tasks))[::-1]
        limit = jobs or len(tasks)
        while todo or pending:
            while todo and len(pending) < limit:
                i, task = todo.pop()
                opts = dict(opts_of(task))
                sig = repr(sorted(opts.items()))
                if sig not in checked:
                    _check_feasible(ray, opts, f"{i} ({describe_task(task)})")
                    checked.add(sig)
                pending[remote.options(**opts).remote(task)] = i
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None) or e
                    raise TaskError(i, tasks[i], f"task {i} ({describe_task(tasks[i])}) failed on the Ray cluster: "
                                                 f"{type(cause).__name__}: {cause}") from cause
                except ray.exceptions.RayError as e:  # worker or node died, even after Ray's retries
                    raise TaskError(i, tasks[i], f"task {i} ({describe_task(tasks[i])}): its Ray worker or node "
                                                 f"died ({type(e).__name__}: {e}); results handed out before are kept"
                                    ) from e
                yield i, res
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
