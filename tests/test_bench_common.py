"""benchmarks/_common.py: the load monitor every benchmark script uses to void a ratio taken beside another job.

The arithmetic is checked on injected readings (hand-computed figures); the own process tree on real child
processes (a waited-for child and a live one are our work, not foreign load); a busy process outside our tree on
the real clocks. Nothing here asserts that the machine is quiet: the suite runs beside other jobs."""
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load_common():
    spec = importlib.util.spec_from_file_location("rbjax_bench_common", BENCH / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


common = _load_common()
Reading = common.Reading


class FakeClocks:
    """Readings handed out in order: what ``psutil`` and ``time`` would have said."""

    def __init__(self, *readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def _monitor(*readings, threshold=0.10, stream=None):
    return common.LoadMonitor(threshold, read=FakeClocks(*readings), loadavg=lambda: [1.0, 2.0, 3.0],
                              stream=stream)


def test_foreign_cpu_is_machine_busy_minus_own_tree(capsys):
    # section "torch": 10 s wall, the machine busy 20 CPU-s, our tree 9 CPU-s -> 11 CPU-s foreign = 1.1 cores: void
    # section "rbjax": 10 s wall, busy 10, ours 9.5 -> 0.5 CPU-s = 0.05 cores: under 0.10, kept
    mon = _monitor(Reading(0.0, 100.0, 10.0), Reading(10.0, 120.0, 19.0),
                   Reading(10.0, 120.0, 19.0), Reading(20.0, 130.0, 28.5))
    with mon.section("torch"):
        pass
    with mon.section("rbjax"):
        pass
    t, r = mon.sections
    assert (t.wall_s, t.foreign_cpu_s, t.foreign_cores, t.void) == (10.0, 11.0, 1.1, True)
    assert (r.wall_s, r.foreign_cpu_s, r.void) == (10.0, 0.5, False) and r.foreign_cores == pytest.approx(0.05)
    assert "section 'torch': foreign CPU 1.10 cores" in capsys.readouterr().err  # said when the section ends
    assert mon.void and [s.name for s in mon.void_sections()] == ["torch"]

    # a ratio of both sides is void; one timed only in the quiet section is kept
    res = mon.finish({"ratios": {"stale": 1}}, {"rbjax_over_torch": 1.5, "rbjax_over_rbjax": 1.1},
                     depends={"rbjax_over_rbjax": ["rbjax"]})
    assert res["ratios"] == {"rbjax_over_rbjax": 1.1} and res["void_ratios"] == {"rbjax_over_torch": 1.5}
    load = res["load"]
    assert load["void"] and load["threshold_cores"] == 0.10 and load["load_average_start"] == [1.0, 2.0, 3.0]
    assert [(s["name"], s["foreign_cores"], s["void"]) for s in load["sections"]] == [("torch", 1.1, True),
                                                                                     ("rbjax", 0.05, False)]
    assert "torch" in load["reason"] and "1.10 cores" in load["reason"]
    err = capsys.readouterr().err
    assert "VOID: section 'torch': foreign CPU 1.10 cores" in err and "rbjax_over_torch" in err

    assert mon.ratio_text(1.5) == "VOID 1.50× (foreign CPU 1.10 cores in section 'torch')"
    assert mon.ratio_text(1.1, sections=["rbjax"]) == "1.10×"


def test_either_side_voids_and_a_quiet_run_keeps_its_ratios(capsys):
    # the first side quiet, the second loaded: 0.3 CPU-s foreign over 2 s = 0.15 cores > 0.10
    mon = _monitor(Reading(0, 0, 0), Reading(2, 4, 4), Reading(2, 4, 4), Reading(4, 8.3, 8))
    for side in ("rbjax", "torch"):
        with mon.section(side):
            pass
    res = mon.finish({}, {"rbjax_over_torch": 2.0})
    assert res["ratios"] == {} and res["void_ratios"] == {"rbjax_over_torch": 2.0}
    assert [s.void for s in mon.sections] == [False, True]
    assert "VOID: section 'torch'" in capsys.readouterr().err

    # both sides quiet (foreign 0.1 CPU-s over 2 s = 0.05 cores, and own time above busy reads as 0)
    mon = _monitor(Reading(0, 0, 0), Reading(2, 4.1, 4), Reading(2, 4.1, 4), Reading(4, 8, 8.2))
    for side in ("rbjax", "torch"):
        with mon.section(side):
            pass
    res = mon.finish({}, {"rbjax_over_torch": 2.0})
    assert res["ratios"] == {"rbjax_over_torch": 2.0} and "void_ratios" not in res and not res["load"]["void"]
    assert res["load"]["reason"] is None and mon.ratio_text(2.0) == "2.00×"
    assert "VOID" not in capsys.readouterr().err


def test_threshold_from_the_environment(monkeypatch):
    monkeypatch.setenv(common.THRESHOLD_ENV, "0.5")
    mon = common.LoadMonitor(read=FakeClocks(Reading(0, 0, 0), Reading(1, 0.4, 0)), loadavg=lambda: None)
    assert mon.threshold == 0.5
    with mon.section("x"):  # 0.4 cores: void at the default 0.10, not at 0.5
        pass
    assert not mon.void
    monkeypatch.setenv(common.THRESHOLD_ENV, "lots")
    with pytest.raises(ValueError, match=common.THRESHOLD_ENV):
        common.LoadMonitor()
    monkeypatch.delenv(common.THRESHOLD_ENV)
    assert common.LoadMonitor().threshold == common.DEFAULT_THRESHOLD == 0.10


def test_busy_seconds_leaves_out_idle_iowait_and_guest_time():
    from collections import namedtuple

    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    # guest (3) and guest_nice (1) are already inside user and nice; steal (2) is contention: busy
    assert common.busy_seconds(T(10, 2, 5, 100, 7, 1, 1, 2, 3, 1)) == 10 + 2 + 5 + 1 + 1 + 2


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\nprint(time.process_time())"


def test_own_tree_counts_waited_and_live_children():
    before = common.own_tree_seconds()
    p = subprocess.run([sys.executable, "-c", BUSY.format(s=0.4)], capture_output=True, text=True, check=True)
    child_cpu = float(p.stdout)  # the child's own user + system time, at least 0.4 s
    waited = common.own_tree_seconds() - before
    assert waited >= child_cpu - 0.05  # its CPU is ours (children_user/children_system), in clock ticks

    # a live child, not waited for yet: read through children(recursive=True)
    live = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.4) + "\nimport sys\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        live_cpu = float(live.stdout.readline())
        before_wait = common.own_tree_seconds()
        assert before_wait - before >= child_cpu + live_cpu - 0.1
    finally:
        live.stdin.close()
        live.wait()


def test_busy_process_outside_our_tree_is_foreign_and_voids_the_section(capsys):
    # a busy loop started by an intermediate process that exits at once: re-parented, not in our tree
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time\\nt = time.time()\\n"
            "while time.time() - t < 10: pass'], start_new_session=True, stdin=subprocess.DEVNULL,\n"
            "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)")
    pid = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    try:
        import psutil

        foreign = psutil.Process(pid)
        assert pid not in [c.pid for c in psutil.Process().children(recursive=True)]
        time.sleep(0.3)  # started
        mon = common.LoadMonitor(0.05)
        c0 = foreign.cpu_times()
        own0 = common.own_tree_seconds()
        with mon.section("beside a busy loop"):
            time.sleep(1.5)
        c1 = foreign.cpu_times()
        busy_loop = (c1.user + c1.system) - (c0.user + c0.system)
        (sec,) = mon.sections
        assert busy_loop > 0.1 and common.own_tree_seconds() - own0 < busy_loop / 2
        # foreign CPU = every other process's work, the busy loop's included (clock ticks: a little slack)
        assert sec.foreign_cpu_s >= busy_loop - 0.05
        assert sec.void and mon.ratio_text(1.2).startswith("VOID 1.20×")
        res = mon.finish({}, {"r": 1.2})
        assert res["void_ratios"] == {"r": 1.2} and res["ratios"] == {}
    finally:
        os.kill(pid, signal.SIGKILL)
    assert "VOID: section 'beside a busy loop'" in capsys.readouterr().err


def test_every_benchmark_script_uses_the_monitor():
    """A new script in benchmarks/ cannot skip the monitor: each makes one, times sections and finishes with it."""
    scripts = sorted(p for p in BENCH.glob("*.py") if p.name != "_common.py")
    assert len(scripts) >= 18 and {"on_device.py", "bench_scoring.py"} <= {p.name for p in scripts}
    missing = [f"{p.name}: {what}" for p in scripts for what, pat in
               (("imports LoadMonitor from _common", r"from (benchmarks\.)?_common import [^\n]*LoadMonitor"),
                ("makes a LoadMonitor", r"LoadMonitor\("),
                ("times a section", r"\.section\(|interleaved\(mon, "),  # _common.interleaved opens one
                ("finishes with the monitor", r"\.finish\("))
               if not re.search(pat, p.read_text(encoding="utf-8"))]
    assert not missing, "benchmark scripts without the load monitor:\n" + "\n".join(missing)


def test_no_benchmark_script_imports_another():
    """Shared setup lives in _common.py: a script that imports another bench_ script runs its module-level setup."""
    importing = [p.name for p in BENCH.glob("*.py")
                 if re.search(r"^\s*(from|import) (benchmarks\.)?bench_", p.read_text(encoding="utf-8"), re.M)]
    assert not importing, importing


def test_interleaved_rounds_call_each_once_per_round_in_one_section():
    """interleaved: every call once per round, in order, all rounds inside one section of the monitor."""
    mon = common.LoadMonitor(0.1, read=FakeClocks(Reading(0.0, 0.0, 0.0), Reading(10.0, 5.0, 5.0)),
                             loadavg=lambda: None)
    order, seen = [], []
    calls = {"a": lambda: order.append("a") or 1.0, "b": lambda: order.append("b") or 2.0}
    times = common.interleaved(mon, "rounds", 3, calls, after_round=lambda k, t: seen.append((k, len(t["b"]))))
    assert order == ["a", "b"] * 3 and times == {"a": [1.0] * 3, "b": [2.0] * 3}
    assert seen == [(0, 1), (1, 2), (2, 3)] and [s.name for s in mon.sections] == ["rounds"]
    assert common.medians({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}
