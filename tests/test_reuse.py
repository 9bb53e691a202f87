"""The one reuse mechanism (rbjax/core/reuse.py): a stored result is reused only for exactly its key; anything else
is recomputed and the reason said — never relabelled."""
from __future__ import annotations

import json

from rbjax.core.reuse import KeyedResult, reuse_or_compute


def test_reuse_only_for_the_same_key(tmp_path):
    path = tmp_path / "r.json"
    calls, said = [], []

    def compute(v):
        def f():
            calls.append(v)
            return {"value": v}
        return f

    key = {"model": "abc", "settings": {"n": (1, 2)}}
    r1 = reuse_or_compute(path, key, compute(1), what="thing", say=said.append)
    assert r1["value"] == 1 and r1["reused"] is False and calls == [1]
    on_disk = json.loads(path.read_text())
    assert on_disk["status"] == "done" and on_disk["key"] == {"model": "abc", "settings": {"n": [1, 2]}}
    assert "reused" not in on_disk

    # same key (a tuple equals the list read back): reused, compute not called
    r2 = reuse_or_compute(path, {"settings": {"n": [1, 2]}, "model": "abc"}, compute(2), what="thing", say=said.append)
    assert r2["value"] == 1 and r2["reused"] is True and calls == [1]
    assert "reusing it" in said[-1]

    # a different input: recomputed, the difference named, the file rewritten under the new key
    r3 = reuse_or_compute(path, {"model": "abd", "settings": {"n": [1, 2]}}, compute(3), what="thing", say=said.append)
    assert r3["value"] == 3 and r3["reused"] is False and calls == [1, 3]
    assert "recomputing thing" in said[-1] and "model" in said[-1] and "abc" in said[-1]
    assert json.loads(path.read_text())["key"]["model"] == "abd"


def test_unfinished_unreadable_and_check(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"status": "running", "key": {"a": 1}}))
    res = KeyedResult(path, {"a": 1}, "x")
    assert res.stored() is None and "unfinished" in res.reason
    path.write_text("{not json")
    assert res.stored() is None and res.reason == "unreadable"
    res.save({"v": 5})
    assert res.stored()["v"] == 5
    vetoed = KeyedResult(path, {"a": 1}, "x", check=lambda prev: "its output file is gone")
    assert vetoed.stored() is None and vetoed.reason == "its output file is gone"
    assert KeyedResult(tmp_path / "missing.json", {"a": 1}).stored() is None
