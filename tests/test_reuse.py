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
    assert res.record == {"v": 5, "status": "done", "key": {"a": 1}} and not res.other  # as written: no reused mark
    vetoed = KeyedResult(path, {"a": 1}, "x", check=lambda prev: "its output file is gone")
    assert vetoed.stored() is None and vetoed.reason == "its output file is gone"
    assert vetoed.other and vetoed.record is None
    other = KeyedResult(path, {"a": 2}, "x")
    assert other.stored() is None and other.other and "a: 1 → 2" in other.reason and other.record is None
    path.write_text(json.dumps({"status": "running", "key": {"a": 2}}))
    assert other.stored() is None and not other.other  # unfinished: not a result of other inputs
    assert KeyedResult(tmp_path / "missing.json", {"a": 1}).stored() is None


def test_keyed_entries_follow_the_same_rule_and_read_an_older_format(tmp_path):
    """KeyedEntries (many keyed results in one file: the study's stages.json, measure's per-type record) reuse an
    entry only for exactly its key, as KeyedResult does; a dropped entry is gone from the file at once; a file of an
    older version is read through its upgrade (measure's version 2: {type: key})."""
    from rbjax.core.reuse import KeyedEntries

    path = tmp_path / "e.json"
    e = KeyedEntries(path, "stages")
    assert e.stored("a", {"k": 1}) is None and e.reason is None  # no entry
    e.save("a", {"k": (1, 2)}, {"seconds": 3.0})
    e.save("b", "digest-b")
    assert json.loads(path.read_text()) == {"stages": {"a": {"seconds": 3.0, "key": {"k": [1, 2]}, "status": "done"},
                                                       "b": {"key": "digest-b", "status": "done"}}}
    again = KeyedEntries(path, "stages")
    assert again.stored("a", {"k": [1, 2]})["seconds"] == 3.0 and again.stored("b", "digest-b") is not None
    assert again.stored("a", {"k": [1, 3]}) is None and again.reason.startswith("inputs differ: ")
    again.drop("a")
    assert set(json.loads(path.read_text())["stages"]) == {"b"}
    path.write_text(json.dumps({"stages": {"b": {"key": "digest-b", "status": "running"}}}))
    assert KeyedEntries(path, "stages").stored("b", "digest-b") is None

    old = tmp_path / "v2.json"
    old.write_text(json.dumps({"version": 2, "types": {"race": {"m": 1}}}))
    up = lambda st: {t: {"key": k, "status": "done"} for t, k in st["types"].items()}  # noqa: E731
    v3 = KeyedEntries(old, "types", 3, up)
    assert v3.stored("race", {"m": 1}) is not None and v3.stored("race", {"m": 2}) is None
    v3.save("gender", {"m": 1})
    assert json.loads(old.read_text())["version"] == 3
    assert KeyedEntries(old, "types", 4).entries == {}  # another version without an upgrade: nothing is reused


def test_measure_state_of_an_older_rbjax_is_still_reused(tmp_path):
    """A measure folder written before KeyedEntries (state version 2: {type: key}) is resumed, not rescored."""
    from rbjax.lmb.measure import STATE_FILE, measure_state

    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 2, "types": {"race": {"model": {"m": "x"}}}}))
    st = measure_state(tmp_path)
    assert st.stored("race", {"model": {"m": "x"}}) is not None and st.stored("gender", {"model": {}}) is None


def test_a_record_its_container_vouches_for_is_judged_on_its_key():
    """why_not_reusable(finished=True): a record that carries no status of its own (a committed checkpoint's metadata,
    a line of sweep.jsonl, a finished run's LMP record) is reused for exactly its key; an unreadable or foreign record
    never is, and other inputs are named."""
    from rbjax.core.keys import canonical
    from rbjax.core.reuse import why_not_reusable

    key = canonical({"model": "a", "n": (1, 2)})
    assert why_not_reusable({"key": key}, key) == ("unfinished (status None)", False)
    assert why_not_reusable({"key": {"n": [1, 2], "model": "a"}}, key, finished=True) == (None, False)
    why, other = why_not_reusable({"key": {"model": "b", "n": [1, 2]}}, key, finished=True)
    assert other and why == "inputs differ: model: 'b' → 'a'"
    assert why_not_reusable(None, key, finished=True) == ("unreadable", False)
    assert why_not_reusable([key], key, finished=True) == ("unreadable", False)
    assert why_not_reusable({"status": "done"}, key)[1]  # a finished record without a key: not of these inputs
    assert why_not_reusable({"key": key}, key, lambda r: "gone", finished=True) == ("gone", True)


def test_difference_of_keys_names_fields_not_whole_sub_keys():
    """A refusal or a recompute says which fields differ, each short (a measurement's key lists its bias
    types, and a run of other types was dumped whole, every type's inputs, kilobytes of them)."""
    from rbjax.core.keys import describe_difference

    def typ(name, model="a" * 64):
        return {"bias_type": name, "data": {f"{name}_{i}.csv": f"{i}" * 64 for i in range(2)},
                "model": {"weights.safetensors": model}, "split": "test"}

    old = {"types": [typ("religion1"), typ("race")], "model_name": "m"}
    # fewer types, the rest the same: the type only one side has is named, its inputs are not shown
    assert describe_difference(old, {"types": [typ("race")], "model_name": "m"}) == \
        "types[bias_type=religion1]: {4 fields} → absent"
    # another model and another type, in another order: the fields that differ, by type
    got = describe_difference(old, {"types": [typ("gender", "b" * 64), typ("race", "b" * 64)], "model_name": "n"})
    assert got == ("model_name: 'm' → 'n'; types[bias_type=religion1]: {4 fields} → absent; "
                   "types[bias_type=race].model['weights.safetensors']: 'aaaaaaaaaaaa…' → 'bbbbbbbbbbbb…'; "
                   "types[bias_type=gender]: absent → {4 fields}")
    # lists of equal length entry by entry, of other lengths by their sizes; long values cut
    assert describe_difference({"x": [1, 2, 3]}, {"x": [1, 5, 3]}) == "x[1]: 2 → 5"
    assert describe_difference({"x": [1, 2]}, {"x": [1, 2, 3]}) == "x: [2 entries] → [3 entries]"
    assert describe_difference({"s": "x" * 200}, {"s": "y"}) == f"s: '{'x' * 78}… → 'y'"
