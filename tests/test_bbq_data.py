"""BBQ's data (rbjax/data/bbq.py): the upstream files verified by their git blob SHA-1 (local folder, download
cache), every row checked with its file and line named, and lm-evaluation-harness's rule for the biased answers."""
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rbjax.data.bbq import (UNKNOWN_RESPONSES, answer_groups, bbq_files, bbq_manifest, git_blob_sha1, load_bbq,
                            read_bbq_file)

# rows per file, from the data's SOURCE.md (counted upstream)
ROWS = {"Age": 3680, "Disability_status": 1556, "Nationality": 3080, "Physical_appearance": 1576, "Religion": 1200,
        "Sexual_orientation": 864}


def _lm_eval_utils():
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "bbq" / "utils.py"
    spec = importlib.util.spec_from_file_location("lm_eval_bbq_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _One:
    """A one-row stand-in for a ``datasets.Dataset`` (its ``map``)."""

    def __init__(self, doc):
        self.doc = doc

    def map(self, fn):
        return fn(dict(self.doc))


def test_the_local_files_are_the_upstream_ones_and_read_as_lm_eval_reads_them(bbq_dir):
    m = bbq_manifest()
    assert len(m["files"]) == 11
    cats = load_bbq(bbq_dir)
    assert [c.name for c in cats] == sorted(ROWS)
    utils = _lm_eval_utils()
    assert tuple(utils.UNKNOWN_RESPONSES) == UNKNOWN_RESPONSES
    for c in cats:
        assert len(c) == ROWS[c.name] and c.verified
        assert c.git_sha1 == m["files"][c.path.name]
        if shutil.which("git"):
            assert subprocess.run(["git", "hash-object", str(c.path)], capture_output=True, text=True
                                  ).stdout.strip() == c.git_sha1
        rows = [json.loads(x) for x in c.path.read_text(encoding="utf-8").splitlines()]
        for i in range(0, len(rows), 7):  # every 7th row: lm-evaluation-harness's own process_docs / doc_to_choice
            doc = utils.process_docs(_One(rows[i]))
            assert c.biased[i] == tuple(k for k in range(3) if rows[i][f"ans{k}"] in doc["biased_answers"])
            choices = utils.doc_to_choice(doc)
            assert [a for k, a in enumerate(c.answers[i]) if k != c.unknown[i]] == choices[:2]
            assert c.lm_eval_unknown[i]
        assert c.prompt(0) == f"{rows[0]['context']}\n\nQ: {rows[0]['question']}\nA:"
    assert [n for n, _, _ in bbq_files(bbq_dir, "Religion, Age,Religion")] == ["Religion", "Age"]
    with pytest.raises(ValueError, match="no BBQ category 'SES'; the categories are Age, "):
        bbq_files(bbq_dir, "SES")


def test_group_normalisation_keeps_lm_evals_quirks():
    # computed by hand from lm-evaluation-harness's _process_groups_in_answers
    assert answer_groups("grandfather_old") == ["grandfather", "old"]
    assert answer_groups("German_Europe") == ["germ", "man", "europe"]  # 'man' inside a word is split off too
    assert answer_groups("woman_F") == ["f", "woman", "f"]
    assert answer_groups("F-Black_F-Black") == ["f", "black", "f", "black"]
    assert answer_groups("lowSES-African_lowSES") == ["low ses", "african", "low ses"]
    assert answer_groups("nonObese_nonObese") == ["non obese", "non obese"]


def test_the_download_is_verified_by_git_blob_sha1(bbq_dir, tmp_path, monkeypatch):
    m = bbq_manifest()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copy(bbq_dir / "Religion.jsonl", mirror / "Religion.jsonl")
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RBJAX_BBQ_URL", mirror.as_uri())
    monkeypatch.delenv("RBJAX_BBQ_DIR", raising=False)
    cached = tmp_path / "cache" / "bbq" / m["commit"] / "Religion.jsonl"
    with pytest.raises(FileNotFoundError, match="downloading is disabled"):
        bbq_files(None, "Religion", download=False)
    [(name, path, sha)] = bbq_files(None, "Religion")
    assert (name, path, sha) == ("Religion", cached, m["files"]["Religion.jsonl"])
    assert cached.read_bytes() == (bbq_dir / "Religion.jsonl").read_bytes()
    assert load_bbq(None, "Religion")[0].verified
    cached.write_text("garbage")  # a damaged cache entry is fetched again
    assert len(load_bbq(None, "Religion")[0]) == 1200
    cached.unlink()
    (mirror / "Religion.jsonl").write_bytes((bbq_dir / "Religion.jsonl").read_bytes().replace(b"Jewish", b"JEWISH", 1))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        bbq_files(None, "Religion")
    assert not cached.exists()
    with pytest.raises(RuntimeError, match="--data-dir with --benchmark bbq"):
        monkeypatch.setenv("RBJAX_BBQ_URL", (tmp_path / "nowhere").as_uri())
        bbq_files(None, "Age")


def _row(**kw):
    r = {"example_id": 0, "question_index": "1", "question_polarity": "neg", "context_condition": "ambig",
         "category": "Age",
         "answer_info": {"ans0": ["grandfather", "old"], "ans1": ["grandson", "nonOld"], "ans2": ["Unknown", "unknown"]},
         "additional_metadata": {"stereotyped_groups": ["old"]}, "context": "c", "question": "q",
         "ans0": "The grandfather", "ans1": "The grandson", "ans2": "Unknown", "label": 2}
    r.update(kw)
    return r


@pytest.mark.parametrize("bad, message", [
    ({"drop": "question"}, "line 2 \\(example_id 1\\): missing field 'question'"),
    ({"label": 3}, "line 2 \\(example_id 1\\): label 3 out of range"),
    ({"label": "2"}, "line 2 \\(example_id 1\\): field 'label' must be int"),
    ({"answer_info": {"ans0": ["a", "old"], "ans1": ["b", "nonOld"], "ans2": ["Unknown", "x"]}},
     "line 2 \\(example_id 1\\): no unknown answer"),
    ({"example_id": 0}, "line 2 \\(example_id 0\\): example_id 0 already used on line 1"),
    ({"context_condition": "amb"}, "context_condition must be 'ambig' or 'disambig'"),
    ({"answer_info": {"ans0": ["", ""], "ans1": ["b", "nonOld"], "ans2": ["Unknown", "unknown"]}},
     "line 2 \\(example_id 1\\): answer_info of ans0 is empty"),
])
def test_a_bad_row_is_refused_with_its_file_and_line(tmp_path, bad, message):
    r = _row(**{"example_id": 1, **{k: v for k, v in bad.items() if k != "drop"}})
    r.pop(bad.get("drop", "-"), None)
    p = tmp_path / "Age.jsonl"
    p.write_text(json.dumps(_row()) + "\n" + json.dumps(r) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{p}.* {message}"):
        read_bbq_file(p)


def test_a_local_folder_of_any_bbq_files(tmp_path):
    # a translated file keeps the format: read, not verified; an empty answer_info entry mentioning Latina is Latino
    rows = [_row(), _row(example_id=1, question_polarity="nonneg", context_condition="disambig", label=1,
                         answer_info={"ans0": ["", ""], "ans1": ["grandson", "nonOld"],
                                      "ans2": ["No se sabe", "unknown"]}, ans0="The Latina woman", ans2="No se sabe")]
    (tmp_path / "Edad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    [c] = load_bbq(tmp_path)
    assert (c.name, c.verified, len(c), c.git_sha1) == ("Edad", False, 2, git_blob_sha1(tmp_path / "Edad.jsonl"))
    assert c.biased == ((0,), (0, 1))  # neg: the 'old' answer; nonneg: both non-stereotyped non-unknown answers
    assert c.unknown == (2, 2) and c.lm_eval_unknown == (True, False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .jsonl file"):
        bbq_files(tmp_path / "empty")
