"""The pair benchmarks' data (rbjax/data/pairs.py): CrowS-Pairs fetched from the pinned commit and checked against its
sha256 (local copy, environment variable, download cache), read as upstream ``metric.py`` reads it; the pair-file
format (CSV / JSONL) with its errors; a RedditBias split written in it; ``rbjax pairs``."""
import csv
import json
import shutil

import pytest

from rbjax.cli import main
from rbjax.data.pairs import (CROWS_PAIRS_NOTES, PAIR_COLUMNS, crows_pairs_manifest, crows_pairs_path,
                              load_crows_pairs, read_crows_pairs_layout, read_pair_file, redditbias_as_pairs,
                              write_pair_file)
from rbjax.data.redditbias import load_pairs


def _upstream_rows(crows_dir):
    with open(crows_dir / "crows_pairs_anonymized.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_crows_pairs_is_read_as_upstream_metric_reads_it(crows_dir):
    m = crows_pairs_manifest()
    pf = load_crows_pairs(crows_dir)
    rows = _upstream_rows(crows_dir)
    assert len(pf) == len(rows) == m["n_pairs"] == 1508
    assert pf.category_names() == m["bias_types"] and len(m["bias_types"]) == 9
    assert {c: pf.categories.count(c) for c in pf.category_names()} == \
        {c: sum(r["bias_type"] == c for r in rows) for c in m["bias_types"]}
    n_anti = 0
    for i, r in enumerate(rows):
        assert pf.ids[i] == r[""]
        # upstream read_data: stereo -> (sent_more, sent_less); antistereo -> (sent_less, sent_more)
        if r["stereo_antistereo"] == "stereo":
            assert (pf.sentence_1[i], pf.sentence_2[i], pf.stereotypical[i]) == (r["sent_more"], r["sent_less"], 1)
        else:
            n_anti += 1
            assert (pf.sentence_1[i], pf.sentence_2[i], pf.stereotypical[i]) == (r["sent_less"], r["sent_more"], 2)
    assert n_anti == 218
    # sent_more is the stereotype-consistent sentence in both directions (as metric.py and lm-eval score it)
    assert pf.stereotypical_sentences() == [r["sent_more"] for r in rows]
    assert pf.other_sentences() == [r["sent_less"] for r in rows]
    g = pf.category("gender")
    assert len(g) == 262 and g.biased == [r["sent_more"] for r in rows if r["bias_type"] == "gender"]
    assert g.locate(0).endswith(f"row {g.rows[0]} (pair id '{g.ids[0]}')")
    assert "CC BY-SA 4.0" in pf.notes[0] and "Blodgett et al. (2021" in pf.notes[1]
    assert pf.notes == CROWS_PAIRS_NOTES
    assert pf.select("religion, age,religion") == ["religion", "age"]
    with pytest.raises(ValueError, match=r"no category 'queerness'; its categories are race-color"):
        pf.select("queerness")


def test_crows_pairs_download_is_verified_and_cached(crows_dir, tmp_path, monkeypatch):
    m = crows_pairs_manifest()
    mirror = tmp_path / "mirror"
    (mirror / "data").mkdir(parents=True)
    shutil.copy(crows_dir / "crows_pairs_anonymized.csv", mirror / m["file"])
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RBJAX_CROWS_PAIRS_URL", mirror.as_uri())  # the real download path, served from a file URL
    monkeypatch.delenv("RBJAX_CROWS_PAIRS_DIR", raising=False)
    cached = tmp_path / "cache" / "crows-pairs" / m["commit"] / m["file"]
    with pytest.raises(FileNotFoundError, match="downloading is disabled"):
        crows_pairs_path(download=False)
    assert crows_pairs_path() == cached
    assert cached.read_bytes() == (crows_dir / "crows_pairs_anonymized.csv").read_bytes()
    assert len(load_crows_pairs()) == 1508
    cached.write_text("garbage")  # a damaged cache entry is fetched again
    assert len(load_crows_pairs()) == 1508
    cached.unlink()
    bad = mirror / m["file"]
    bad.write_bytes(bad.read_bytes().replace(b"black", b"BLACK", 1))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        crows_pairs_path()
    assert not cached.exists()  # nothing unverified reaches the cache
    monkeypatch.setenv("RBJAX_CROWS_PAIRS_URL", (tmp_path / "nowhere").as_uri())
    with pytest.raises(RuntimeError, match="--data-dir with --benchmark crows-pairs"):
        crows_pairs_path()


def test_a_local_copy_must_be_the_pinned_file(crows_dir, tmp_path, monkeypatch):
    # the upstream layout (data/...) and a folder holding the file itself are both found; the env variable too
    up = tmp_path / "upstream"
    (up / "data").mkdir(parents=True)
    shutil.copy(crows_dir / "crows_pairs_anonymized.csv", up / "data" / "crows_pairs_anonymized.csv")
    assert crows_pairs_path(up) == up / "data" / "crows_pairs_anonymized.csv"
    monkeypatch.setenv("RBJAX_CROWS_PAIRS_DIR", str(crows_dir))
    assert crows_pairs_path() == crows_dir / "crows_pairs_anonymized.csv"
    edited = tmp_path / "edited"
    edited.mkdir()
    text = (crows_dir / "crows_pairs_anonymized.csv").read_text(encoding="utf-8")
    (edited / "crows_pairs_anonymized.csv").write_text(text.replace("black", "Black", 1), encoding="utf-8")
    with pytest.raises(ValueError, match=r"not the CrowS-Pairs file of nyu-mll/crows-pairs@8aaac11 .*rbjax pairs "
                                         r"--crows-pairs-csv"):
        crows_pairs_path(edited)
    with pytest.raises(FileNotFoundError, match="no crows_pairs_anonymized.csv"):
        crows_pairs_path(tmp_path)
    # the same copy converts without a checksum, row for row
    pf = read_crows_pairs_layout(edited / "crows_pairs_anonymized.csv")
    assert len(pf) == 1508 and pf.benchmark == "pairs:crows_pairs_anonymized.csv"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_pair_file_round_trip(crows_dir, tmp_path, suffix):
    pf = load_crows_pairs(crows_dir)
    path = write_pair_file(pf, tmp_path / f"pairs{suffix}")
    back = read_pair_file(path)
    for f in ("ids", "categories", "sentence_1", "sentence_2", "stereotypical"):
        assert getattr(back, f) == getattr(pf, f), f
    assert back.benchmark == f"pairs:pairs{suffix}" and back.row_word == ("row" if suffix == ".csv" else "line")
    if suffix == ".csv":
        assert path.read_text(encoding="utf-8").splitlines()[0] == ",".join(PAIR_COLUMNS)
    else:  # one pair per line, the file's fields in the format's order
        assert list(json.loads(path.read_text(encoding="utf-8").splitlines()[0])) == list(PAIR_COLUMNS)


def _csv(path, rows, header=PAIR_COLUMNS):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_pair_file_errors_name_the_file_row_and_field(tmp_path):
    ok = ["p1", "gender", "She is a nurse.", "He is a nurse.", "1"]
    cases = [
        (_csv(tmp_path / "a.csv", [ok], header=PAIR_COLUMNS[:4]), r"a\.csv: missing column\(s\) \['stereotypical'\]"),
        (_csv(tmp_path / "b.csv", [ok, ok]), r"b\.csv row 2: id 'p1' already used on row 1"),
        (_csv(tmp_path / "c.csv", [ok[:4] + ["3"]]), r"c\.csv row 1: stereotypical must be 1 or 2 .* got '3'"),
        (_csv(tmp_path / "d.csv", [["p1", "gender", " ", "x", "1"]]), r"d\.csv row 1: empty sentence_1"),
        (_csv(tmp_path / "e.csv", [["p1", "a/b", "x", "y", "2"]]), r"e\.csv row 1: category 'a/b' must be letters"),
        (_csv(tmp_path / "f.csv", []), r"f\.csv: no pairs"),
    ]
    for path, msg in cases:
        with pytest.raises(ValueError, match=msg):
            read_pair_file(path)
    j = tmp_path / "g.jsonl"
    j.write_text(json.dumps(dict(zip(PAIR_COLUMNS, ["p1", "gender", "x", "y", 2]))) + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"g\.jsonl line 3: not valid JSON"):
        read_pair_file(j)
    j.write_text(json.dumps({"id": "p1", "category": "g", "sentence_1": "x", "sentence_2": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"g\.jsonl line 1: missing field\(s\) \['stereotypical'\]"):
        read_pair_file(j)
    j.write_text(json.dumps(dict(zip(PAIR_COLUMNS, ["p1", "g", "x", "y", True]))) + "\n")
    with pytest.raises(ValueError, match=r"g\.jsonl line 1: stereotypical must be 1 or 2"):
        read_pair_file(j)
    (tmp_path / "h.tsv").write_text("x")
    with pytest.raises(ValueError, match=r"h\.tsv: a pair file is \.csv or \.jsonl"):
        read_pair_file(tmp_path / "h.tsv")
    with pytest.raises(FileNotFoundError, match="pair file not found"):
        read_pair_file(tmp_path / "nope.csv")
    pf = read_pair_file(_csv(tmp_path / "i.csv", [ok, ["p2", "gender", "A", "B", "2"]]))
    g = pf.category("gender")  # the stereotype-consistent sentence takes the biased phrase's place
    assert (g.biased, g.counterfactual, g.stereotypical) == (["She is a nurse.", "B"], ["He is a nurse.", "A"], [1, 2])
    with pytest.raises(ValueError, match="no pair of category 'age'"):
        pf.category("age")


def test_a_redditbias_split_in_the_pair_format(redditbias_dir, tmp_path):
    pf = redditbias_as_pairs("religion1", "valid+test", redditbias_dir)
    valid, test = load_pairs("religion1", "valid", redditbias_dir), load_pairs("religion1", "test", redditbias_dir)
    assert list(pf.sentence_1) == valid.biased + test.biased
    assert list(pf.sentence_2) == valid.counterfactual + test.counterfactual
    assert set(pf.stereotypical) == {1} and pf.category_names() == ["religion1"]
    assert pf.ids[0] == "religion1-valid-1" and pf.ids[len(valid)] == "religion1-test-1"
    back = read_pair_file(write_pair_file(pf, tmp_path / "rb.csv"))
    assert back.category("religion1").biased == valid.biased + test.biased


def test_rbjax_pairs_command(redditbias_dir, crows_dir, tmp_path, capsys):
    out = tmp_path / "rb.jsonl"
    assert main(["pairs", "--bias", "race,gender", "--split", "valid", "--data-dir", str(redditbias_dir),
                 "--out", str(out)]) == 0
    pf = read_pair_file(out)
    assert pf.category_names() == ["race", "gender"]
    assert list(pf.category("race").biased) == load_pairs("race", "valid", redditbias_dir).biased
    argv = ["pairs", "--bias", "race,gender", "--split", "valid", "--data-dir", str(redditbias_dir), "--out", str(out)]
    assert main(argv) == 0  # a rerun replaces its own file
    assert main(["pairs", "--bias", "race", "--data-dir", str(redditbias_dir), "--out", str(out)]) == 1  # other inputs
    assert "written from other inputs" in capsys.readouterr().err and read_pair_file(out).category_names() == \
        ["race", "gender"]
    foreign = tmp_path / "mine.csv"
    foreign.write_text("a user's file\n")
    assert main(["pairs", "--benchmark", "crows-pairs", "--data-dir", str(crows_dir), "--out", str(foreign)]) == 1
    assert "--overwrite" in capsys.readouterr().err and foreign.read_text() == "a user's file\n"
    assert main(["pairs", "--benchmark", "crows-pairs", "--data-dir", str(crows_dir), "--out", str(foreign),
                 "--overwrite"]) == 0
    assert "Blodgett" in capsys.readouterr().out
    assert read_pair_file(foreign).stereotypical == load_crows_pairs(crows_dir).stereotypical
    conv = tmp_path / "conv.csv"
    assert main(["pairs", "--crows-pairs-csv", str(crows_dir / "crows_pairs_anonymized.csv"), "--out",
                 str(conv)]) == 0
    assert read_pair_file(conv).sentence_1 == load_crows_pairs(crows_dir).sentence_1
    assert main(["pairs", "--benchmark", "crows-pairs", "--bias", "race", "--out", str(conv)]) == 1
