"""The executor layer (rbjax.core.parallel) on its own, with trivial functions."""
from __future__ import annotations

import os
import time

import pytest

from rbjax.core import parallel
from rbjax.core.parallel import TaskError, as_completed, plan_jobs, run_tasks


def square(x):
    return x * x


def slow_square(x):
    time.sleep(0.3 if x == 0 else 0.0)  # task 0 finishes last
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError(f"bad input {x}")
    return x


def die_on_two(x):
    if x == 2:
        os._exit(3)  # the worker process dies without an exception
    time.sleep(0.2)
    return x


def test_in_process_runs_in_order_and_names_the_failing_task():
    seen = []
    assert run_tasks(square, range(5), jobs=1, on_result=lambda i, r: seen.append((i, r)) or -r) == [0, -1, -4, -9, -16]
    assert seen == [(i, i * i) for i in range(5)]
    # in process, the function need not be picklable
    assert run_tasks(lambda x: x + 1, [1, 2], jobs=1) == [2, 3]
    with pytest.raises(TaskError, match=r"task 3 \(3\) failed: ValueError: bad input 3") as ei:
        run_tasks(fail_on_three, range(5), jobs=1)
    assert ei.value.index == 3 and ei.value.task == 3 and isinstance(ei.value.__cause__, ValueError)


def test_process_pool_results_in_task_order_callbacks_in_completion_order():
    order = []
    out = run_tasks(slow_square, range(4), jobs=2, on_result=lambda i, r: order.append(i) or r)
    assert out == [0, 1, 4, 9]
    assert sorted(order) == [0, 1, 2, 3] and order[-1] == 0  # the slow task 0 came back last
    assert sorted(as_completed(square, [2, 3], jobs=2)) == [(0, 4), (1, 9)]


def test_process_pool_errors_name_the_task():
    with pytest.raises(TaskError, match=r"task 3 \(3\) failed: ValueError: bad input 3") as ei:
        run_tasks(fail_on_three, range(6), jobs=2)
    assert ei.value.index == 3 and isinstance(ei.value.__cause__, ValueError)
    with pytest.raises(TaskError, match=r"worker process died .* while running (task|one of the tasks in flight:) "
                                        r"(.*, )?2 \(2\)") as ei:
        run_tasks(die_on_two, range(4), jobs=2)
    assert ei.value.index in (0, 1, 2)  # the pool cannot tell which of the tasks in flight killed its worker
    with pytest.raises(ValueError, match="top-level function"):
        run_tasks(lambda x: x, [1, 2], jobs=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown executor 'dask'"):
        run_tasks(square, [1], executor="dask")
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        run_tasks(square, [1], jobs=0)
    assert run_tasks(square, []) == []


def test_ray_missing_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(RuntimeError, match=r"needs Ray, an optional extra: pip install 'rbjax\[ray\]'"):
        run_tasks(square, [1], executor="ray")


def test_plan_jobs_memory_bound(monkeypatch):
    gib = 2**30
    monkeypatch.setattr(parallel, "available_cpus", lambda: 8)
    monkeypatch.setattr(parallel, "available_memory", lambda: 5 * gib)
    assert plan_jobs(3) == (3, None)  # never more jobs than tasks
    jobs, note = plan_jobs(20, 2 * gib)
    assert jobs == 2 and "instead of 8" in note and "5.0 GiB is available" in note
    assert plan_jobs(20, gib // 2) == (8, None)
    jobs, note = plan_jobs(20, 2 * gib, jobs=4)  # an explicit choice is kept, with a warning
    assert jobs == 4 and "2 would fit" in note
    monkeypatch.setattr(parallel, "available_memory", lambda: None)
    assert plan_jobs(20, 2 * gib) == (8, None)


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")  # ray.init: fork+exec
def test_ray_executor_on_a_local_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        order = []
        assert run_tasks(square, range(5), executor="ray", on_result=lambda i, r: order.append(i) or r) == \
            [0, 1, 4, 9, 16]
        assert sorted(order) == list(range(5))
        assert run_tasks(square, range(3), executor="ray", jobs=1) == [0, 1, 4]  # one in flight at a time
        with pytest.raises(TaskError, match=r"task 3 \(3\) failed on the Ray cluster: ValueError: bad input 3") as ei:
            run_tasks(fail_on_three, range(5), executor="ray")
        assert ei.value.index == 3
        with pytest.raises(ValueError, match=r"asks for CPU=64, which no node of the Ray cluster has \(CPU=2\)"):
            run_tasks(square, [1], executor="ray", resources={"num_cpus": 64})
        assert ray.is_initialized()  # a Ray started by the caller is left running
    finally:
        ray.shutdown()
