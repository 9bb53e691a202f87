"""Packaged bias specifications (paper §2.1, App. A) and the reference code's lists."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rbjax.specs import BIAS_TYPES, BiasSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]

# The paper's App. A list sizes and the official code's list sizes (docs/debiasing.md §1).
N_A1 = {"religion1": 52, "religion2": 49, "race": 53, "gender": 22, "queerness": 62}
N_QUERIES = {"religion1": 22, "religion2": 26, "race": 18, "gender": 25, "queerness": 19}
N_LMD = {"religion1": 6, "religion2": 3, "queerness": 11, "gender": 21, "race": 8}
N_ROWS = {"religion1": 43, "religion2": 40, "queerness": 45, "gender": 21, "race": 53}
WIDTH = {"religion1": 3, "religion2": 2, "queerness": 4, "gender": 3, "race": 3}
INVALID_IDS = {384660, 378330, 165990, 183380}  # the code's ids with a stray trailing 0 (docs/debiasing.md §1)


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_spec_loads_and_is_consistent(name):
    s = load_spec(name)
    assert isinstance(s, BiasSpec) and s.name == name
    assert len(s.attributes_a1) == N_A1[name] == len(s.attributes_a2)
    assert len(s.queries) == N_QUERIES[name]
    for t in s.targets_t1 + s.targets_t2 + s.attributes_a1 + s.queries:
        assert t == t.lower() and t == t.strip() and '"' not in t
    for a, b in s.pairs:
        assert a == a.lower() and b == b.lower() and a != b
        assert " " not in a or name == "race"  # race: "african american(s)" -> "american(s)"
    assert len({a for a, _ in s.pairs}) == len(s.pairs), "a T1 word may have only one T2 partner"
    with pytest.raises(dataclasses_frozen_error()):
        s.name = "x"  # frozen


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_reference_lists(name):
    ref = load_spec(name).reference
    assert len(ref["lmd_pairs"]) == N_LMD[name]
    assert len(ref["attribute_rows"]) == N_ROWS[name]
    assert all(len(r) == WIDTH[name] for r in ref["attribute_rows"])
    ids = {i for r in ref["attribute_rows"] for i in r} | {i for p in ref["lmd_pairs"] + ref["add_hd_pairs"] for i in p}
    assert {i for i in ids if i >= 50257} <= INVALID_IDS
    if name == "queerness":
        assert {i for i in ids if i >= 50257} == INVALID_IDS
    if name != "religion1":
        assert ref["add_hd_pairs"] == ref["lmd_pairs"]
    else:
        assert len(ref["add_hd_pairs"]) == 7
    for r in ref["swap_rules"]:
        assert r["mode"] in {"two_way", "one_way", "one_way_if"}
    assert (name in {"gender", "queerness"}) == all(r["mode"] == "one_way" for r in ref["swap_rules"])


def test_known_reference_ids():
    assert load_spec("religion1").reference["lmd_pairs"][2] == [12711, 33826]  # Ġjew / Ġchrist
    assert load_spec("religion2").reference["lmd_pairs"] == [[2475, 666], [2543, 414], [8937, 504]]
    assert load_spec("gender").reference["lmd_pairs"][-2] == [673, 339]  # Ġshe / Ġhe
    assert load_spec("religion1").reference["attribute_rows"][0] == [25474, 0, 0]  # greed
    assert load_spec("queerness").reference["attribute_rows"][2] == [781, 4131, 726, 415]  # fl+amb+oy+ant


def test_reference_ids_decode(tokenizer_dir):
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE.from_file(str(tokenizer_dir / "vocab.json"), str(tokenizer_dir / "merges.txt")))
    assert tok.id_to_token(load_spec("race").reference["lmd_pairs"][0][0]) == "Ġblacks"
    assert [tok.id_to_token(i) for i in load_spec("gender").reference["attribute_rows"][8]] == ["Ġchild", "-", "care"]


def test_attribute_unused_markers():
    r1 = load_spec("religion1")
    assert r1.attributes_a2[r1.attributes_a1.index("violin")] is None
    assert r1.attributes_a2[r1.attributes_a1.index("beady eyes")] == "blue eyes"
    assert r1.attributes_a2[r1.attributes_a1.index("overfeed*")] == "underfeed*"  # single * is a wildcard
    assert load_spec("gender").attributes_a1[-1] == "shakespeare"


def test_aliases_and_errors(tmp_path):
    assert load_spec("orientation").name == "queerness"
    with pytest.raises(ValueError):
        load_spec("religion3")
    d = json.loads((ROOT / "rbjax" / "specs" / "race.json").read_text())
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(d))
    assert load_spec(p) == load_spec("race")


def test_generated_files_up_to_date(shared_dir):
    r = subprocess.run([sys.executable, str(ROOT / "experiments" / "make_specs.py"), "--shared", str(shared_dir),
                        "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
