"""The host allocator setting (rbjax.core.host_allocator): an XLA program's freed output buffer is reused by its next
execution instead of being mapped and zero-filled again by the kernel — counted in page faults, in a fresh process
(the setting must come before JAX's CPU client is created)."""
import json
import os
import platform
import subprocess
import sys

import jax
import pytest

from rbjax.cli import main
from rbjax.core import host_allocator
from rbjax.core.host_allocator import ENV_HOST_ALLOCATOR, configure_host_allocator

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

CALLS = 32
PAGES = 4 * 24 * 1024 * 1024 // 4096  # of one 96 MiB output
#: a 96 MiB output per call (over glibc's largest mmap threshold, 32 MiB), CALLS calls; the page faults of the calls
_SCRIPT = r"""
import json, resource, sys
from rbjax.core.host_allocator import configure_host_allocator
mode = configure_host_allocator(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda x: x + 1.0)
x = jnp.zeros((24 * 1024 * 1024,), jnp.float32)
f(x).block_until_ready().delete()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(%d):
    f(x).block_until_ready().delete()
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"mode": mode, "faults": after - before}))
""" % CALLS


def _faults(mode: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (ENV_HOST_ALLOCATOR, "LD_PRELOAD", "GLIBC_TUNABLES")
             and not k.startswith("MALLOC_")}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=300,
                          env={**clean, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's (elsewhere configure_host_allocator changes nothing)")
def test_freed_output_buffers_are_reused_not_faulted_in_again():
    system = _faults("system")
    reuse = _faults("reuse")
    assert system["mode"] == "system" and reuse["mode"] == "reuse"
    # glibc's defaults: every call's 96 MiB output is a fresh mapping, faulted in page by page
    assert system["faults"] >= 0.9 * CALLS * PAGES, system
    # kept for reuse: a freed block serves a later call. The heap grows (new pages) only until the blocks freed by
    # posix_memalign's splits have merged into one that fits: seen after 2-4 calls, then no call faults
    assert reuse["faults"] <= 0.25 * CALLS * PAGES, reuse


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_the_users_own_malloc_variables_stand():
    user = _faults("reuse", MALLOC_ARENA_MAX="4")
    assert user["mode"] == "user"
    assert user["faults"] >= 0.9 * CALLS * PAGES, user  # rbjax changed nothing


def test_a_bad_mode_is_named(monkeypatch, capsys):
    with pytest.raises(ValueError, match="mode 'fast': expected one of reuse, system"):
        configure_host_allocator("fast")
    monkeypatch.setenv(ENV_HOST_ALLOCATOR, "fast")
    with pytest.raises(ValueError, match=r"\$RBJAX_HOST_ALLOCATOR 'fast'"):
        configure_host_allocator()
    # the command line says so and stops, before any work
    assert main(["measure", "--model", "x", "--bias", "religion1"]) == 1
    assert "$RBJAX_HOST_ALLOCATOR 'fast': expected one of reuse, system" in capsys.readouterr().err


def test_too_late_once_jax_runs(monkeypatch):
    """Once JAX's backends exist (this test runs a program first) the setting cannot be made whole: nothing is done."""
    monkeypatch.setattr(host_allocator, "_applied", None)
    monkeypatch.setattr(host_allocator.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    jax.numpy.zeros(1).block_until_ready()
    assert configure_host_allocator("reuse") == "late"


def test_system_leaves_the_allocator_alone(monkeypatch):
    monkeypatch.setattr(host_allocator, "_applied", None)
    monkeypatch.setattr(host_allocator.ctypes, "CDLL", lambda *a, **k: pytest.fail("mallopt called"))
    assert configure_host_allocator("system") == "system"
    monkeypatch.setenv(ENV_HOST_ALLOCATOR, "system")
    assert configure_host_allocator() == "system"
