"""Annotation round trip (rbjax.data.annotation, `rbjax annotate`), paper §2.3."""
from __future__ import annotations

import csv
from fractions import Fraction

import pytest

from rbjax.cli import main as cli_main
from rbjax.data.annotation import (
    aggregate,
    export_for_annotation,
    krippendorff_alpha,
    majority,
    parse_label,
    read_annotations,
    write_aggregated,
)
from rbjax.data.retrieval.query import CANDIDATE_COLUMNS


# ---------------------------------------------------------------- Krippendorff's alpha
def test_alpha_undefined_when_everyone_agrees_on_one_label():
    """Field failure: all labels equal -> expected disagreement 0 -> alpha undefined (not NaN, not 0.0)."""
    res = krippendorff_alpha([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    assert res.alpha is None and not res.defined
    assert "expected disagreement is 0" in res.reason
    assert "undefined" in str(res)


def test_alpha_perfect_agreement_two_values():
    res = krippendorff_alpha([[1, 0, 1], [1, 0, 1], [1, 0, 1]])
    assert res.alpha == pytest.approx(1.0)
    assert (res.n_units, res.n_values) == (3, 9)


def test_alpha_with_missing_value_by_hand():
    """Hand computation (nominal). Units (columns): (1,1,1) (0,0,0) (1,1,-) (1,0,1) (0,0,0) (1,1,0).
    Coincidences o_ck = sum_u pairs(c,k)/(m_u - 1):
      o11 = 3 + 2 + 1 + 1 = 7, o00 = 3 + 3 = 6, o10 = o01 = 1 + 1 = 2; n = 17, n1 = 9, n0 = 8.
      alpha = 1 - (n - 1) * (o10 + o01) / (n1*n0 + n0*n1) = 1 - 16*4/144 = 5/9.
    """
    res = krippendorff_alpha([[1, 0, 1, 1, 0, 1], [1, 0, 1, 0, 0, 1], [1, 0, None, 1, 0, 0]])
    assert res.alpha == pytest.approx(float(Fraction(5, 9)), abs=1e-12)
    assert (res.n_units, res.n_values) == (6, 17)


def test_alpha_two_coders_by_hand():
    """(1,1) (1,0) (0,0) (0,0): o11 = 2, o00 = 4, o10 = o01 = 1; n = 8, n1 = 3, n0 = 5.
    alpha = 1 - 7*2/(2*3*5) = 8/15."""
    assert krippendorff_alpha([[1, 1, 0, 0], [1, 0, 0, 0]]).alpha == pytest.approx(8 / 15, abs=1e-12)


def test_alpha_undefined_without_pairable_units_and_nan_input():
    res = krippendorff_alpha([[1, None, 0], [None, 0, None]])
    assert res.alpha is None and "two or more annotators" in res.reason
    # a unit labelled once does not count: the only pairable unit has one value
    res = krippendorff_alpha([[1, 0, float("nan")], [1, None, 1]])
    assert res.alpha is None and res.n_units == 1 and "'biased' (1)" in res.reason


# ---------------------------------------------------------------- labels and majority
def test_parse_label():
    assert [parse_label(x) for x in ["biased", "Unbiased", "skip", "", None, "1", "0", "1.0", "0.0"]] == [
        1, 0, None, None, None, 1, 0, 1, 0]
    with pytest.raises(ValueError, match=r"f.csv row 3 column phrase_label: unknown label 'biased\?'"):
        parse_label("biased?", where="f.csv row 3 column phrase_label")
    assert parse_label("re-state", unknown="skip") is None


def test_majority_and_ties():
    assert majority([1, 1, 0]) == (1, False, (2, 1, 0))
    assert majority([0, None, 0]) == (0, False, (0, 2, 1))
    assert majority([1, 0, None]) == (None, True, (1, 1, 1))
    assert majority([None, None]) == (None, False, (0, 0, 2))


# ---------------------------------------------------------------- round trip
def _candidates(tmp_path, n=6):
    p = tmp_path / "candidates.csv"
    with open(p, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CANDIDATE_COLUMNS)
        for i in range(n):
            row = {c: "" for c in CANDIDATE_COLUMNS}
            row.update(id=f"c{i}", bias_type="zorbness", comment=f"comment {i}, with a comma", phrase=f"phrase {i}",
                       target="zorbs", attribute="lazy", attribute_in_window="True")
            w.writerow([row[c] for c in CANDIDATE_COLUMNS])
    return p


def _fill(path, comment_labels, phrase_labels):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        header, rows = r.fieldnames, list(r)
    for row, c, p in zip(rows, comment_labels, phrase_labels):
        row["comment_label"], row["phrase_label"] = c, p
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerows(rows)


def test_export_import_roundtrip(tmp_path):
    cand = _candidates(tmp_path)
    paths = export_for_annotation(cand, tmp_path / "ann", ["ann", "bob", "cat"])
    assert (tmp_path / "ann" / "GUIDELINES.txt").read_text().startswith("RedditBias annotation guidelines")
    B, U, S = "biased", "unbiased", "skip"
    _fill(paths["ann"], [B, U, B, B, U, B], [B, U, B, B, U, U])
    _fill(paths["bob"], [B, U, B, U, U, B], [B, U, S, U, U, B])
    _fill(paths["cat"], [B, U, "", B, U, U], [B, U, B, B, U, ""])
    ann = read_annotations([paths["ann"], paths["bob"], paths["cat"]])
    assert ann.annotators == ["ann", "bob", "cat"]
    assert ann.items == ["1", "2", "3", "4", "5", "6"]
    alpha = ann.alpha()
    # comment level is the hand-computed 5/9 matrix
    assert alpha["comment"].alpha == pytest.approx(5 / 9, abs=1e-12)
    assert alpha["phrase"].defined
    assert ann.counts["bob"] == {"biased": 5, "unbiased": 6, "skip": 1, "empty": 0}
    agg = aggregate(ann)
    assert agg.comment == [1, 0, 1, 1, 0, 1]
    assert agg.phrase == [1, 0, 1, 1, 0, None]  # item 6: one biased, one unbiased, one empty -> tie
    assert agg.phrase_ties == ["6"] and agg.comment_ties == []
    out = write_aggregated(ann, agg, tmp_path / "annotated.csv", items=paths["items"])
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["comment"] == "comment 0, with a comma" and rows[0]["attribute_in_window"] == "True"
    assert [r["bias_phrase"] for r in rows] == ["1", "0", "1", "1", "0", ""]
    assert rows[5]["phrase_tie"] == "True" and rows[5]["phrase_votes"] == "1/1/1"
    assert rows[2]["n_annotators"] == "3"


def test_export_sample_and_overlap(tmp_path):
    cand = _candidates(tmp_path, n=20)
    paths = export_for_annotation(cand, tmp_path / "o", ["a", "b"], sample=10, seed=3, overlap=4)
    with open(paths["items"], newline="") as f:
        items = list(csv.DictReader(f))
    assert len(items) == 10
    ids_a = [r["item"] for r in csv.DictReader(open(paths["a"], newline=""))]
    ids_b = [r["item"] for r in csv.DictReader(open(paths["b"], newline=""))]
    assert len(set(ids_a) & set(ids_b)) == 4
    assert set(ids_a) | set(ids_b) == {r["item"] for r in items}
    # same seed, same draw
    again = export_for_annotation(cand, tmp_path / "o2", ["a", "b"], sample=10, seed=3, overlap=4)
    assert again["a"].read_text() == paths["a"].read_text()
    with pytest.raises(ValueError, match="--sample 99"):
        export_for_annotation(cand, tmp_path / "x", sample=99)


def test_import_errors_name_file_and_row(tmp_path):
    cand = _candidates(tmp_path, n=3)
    paths = export_for_annotation(cand, tmp_path / "e", ["a", "b"])
    _fill(paths["a"], ["biased", "maybe", "skip"], ["", "", ""])
    with pytest.raises(ValueError, match=r"a.csv row 3 column comment_label: unknown label 'maybe'"):
        read_annotations([paths["a"], paths["b"]])
    ann = read_annotations([paths["a"], paths["b"]], unknown="skip")
    assert ann.comment[0] == [1, None, None]
    # a file from another export: same item, different phrase
    other = tmp_path / "other.csv"
    text = paths["b"].read_text(encoding="utf-8").replace("phrase 1", "phrase X")
    other.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"other.csv row 3: item '2' has phrase 'phrase X'"):
        read_annotations([paths["b"], other])
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_annotations([tmp_path / "nope.csv"])


def test_released_annotated_file_reads(redditbias_dir):
    """The released religion1 annotations (latin-1, CRLF, free-text bias_sent values) read as one annotator."""
    p = redditbias_dir / "data/religion1/reddit_comments_religion1_jews_processed_phrase_annotated.csv"
    with pytest.raises(ValueError, match=r"row \d+ column bias_sent: unknown label"):
        read_annotations([p])
    ann = read_annotations([p], unknown="skip")
    assert len(ann.items) == 3554
    assert sum(1 for v in ann.phrase[0] if v == 1) == 1200
    assert ann.alpha()["phrase"].alpha is None  # one annotator: undefined, said so


def test_cli_annotate(tmp_path, capsys):
    cand = _candidates(tmp_path, n=4)
    d = tmp_path / "cli"
    assert cli_main(["annotate", "export", "--candidates", str(cand), "--out-dir", str(d),
                     "--annotators", "x", "y"]) == 0
    _fill(d / "x.csv", ["biased", "unbiased", "biased", "unbiased"], ["biased"] * 4)
    _fill(d / "y.csv", ["biased", "unbiased", "biased", "unbiased"], ["biased"] * 4)
    capsys.readouterr()
    assert cli_main(["annotate", "import", str(d / "x.csv"), str(d / "y.csv"), "--items", str(d / "items.csv"),
                     "--out", str(tmp_path / "agg.csv")]) == 0
    out = capsys.readouterr().out
    assert "Krippendorff's alpha (comment level): 1.000" in out
    assert "Krippendorff's alpha (phrase level): undefined (every label is 'biased' (1)" in out
    assert (tmp_path / "agg.csv").exists()
    assert cli_main(["annotate"]) == 2


# ---------------------------------------------------------------- import checks (fresh-user findings)
def _rewrite(path, *, drop_column=None, keep_rows=None, extra_item=None):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        header, rows = list(r.fieldnames), list(r)
    if drop_column:
        header.remove(drop_column)
        for row in rows:
            row.pop(drop_column)
    if keep_rows is not None:
        rows = [rows[i] for i in keep_rows]
    if extra_item is not None:
        rows.append(dict(rows[0], item=extra_item))
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerows(rows)
    return path


def _filled_export(tmp_path, names=("alice", "bob"), n=4, **kw):
    paths = export_for_annotation(_candidates(tmp_path, n=n), tmp_path / "exp", list(names), **kw)
    for a in names:
        with open(paths[a], newline="", encoding="utf-8") as f:
            k = sum(1 for _ in csv.DictReader(f))
        _fill(paths[a], ["biased", "unbiased"] * k, ["unbiased", "biased"] * k)
    return paths


@pytest.mark.parametrize("column", ["phrase_label", "comment_label"])
def test_missing_label_column_is_an_error(tmp_path, column):
    """Field failure: a file without phrase_label was read with every phrase label 'empty'."""
    paths = _filled_export(tmp_path)
    _rewrite(paths["bob"], drop_column=column)
    with pytest.raises(ValueError, match=rf"bob.csv: no '{column}' column \(an annotator file needs both"):
        read_annotations([paths["alice"], paths["bob"]])
    # the released layout needs both of its columns too
    released = tmp_path / "released.csv"
    released.write_text("id,phrase,bias_phrase\nc1,some phrase,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"released.csv: no 'bias_sent' column"):
        read_annotations([released])


def test_file_lacking_items_warns(tmp_path, capsys):
    paths = _filled_export(tmp_path, n=5)
    _rewrite(paths["bob"], keep_rows=[0, 2, 4])  # items 2 and 4 gone
    ann = read_annotations([paths["alice"], paths["bob"]])
    assert len(ann.warnings) == 1
    assert ann.warnings[0].startswith(f"{paths['bob']} lacks 2 of its 5 items (item 2, 4)")
    assert ann.phrase[1] == [0, None, 0, None, 0]  # missing values, not an error
    assert read_annotations([paths["alice"], paths["bob"]], items=paths["items"]).warnings == ann.warnings
    capsys.readouterr()
    assert cli_main(["annotate", "import", str(paths["alice"]), str(paths["bob"]), "--items", str(paths["items"])]) == 0
    assert f"warning: {paths['bob']} lacks 2 of its 5 items" in capsys.readouterr().err


def test_overlap_export_does_not_warn_about_items_given_to_others(tmp_path):
    paths = _filled_export(tmp_path, n=10, overlap=2)
    assert paths["assignment"].name == "assignment.json"
    ann = read_annotations([paths["alice"], paths["bob"]], items=paths["items"])
    assert ann.warnings == [] and len(ann.items) == 10
    _rewrite(paths["alice"], keep_rows=[0])  # now alice lacks some of *her* items
    (w,) = read_annotations([paths["alice"], paths["bob"]]).warnings
    assert w.startswith(f"{paths['alice']} lacks 5 of its 6 items")


def test_unknown_item_is_named_before_anything_is_computed(tmp_path, capsys):
    """Field failure: item 9999 printed the full summary first, then blamed items.csv."""
    paths = _filled_export(tmp_path)
    _rewrite(paths["bob"], extra_item="9999")
    with pytest.raises(ValueError, match=rf"bob.csv row 6: item '9999' is not in {paths['items']}"):
        read_annotations([paths["alice"], paths["bob"]], items=paths["items"])
    capsys.readouterr()
    out = tmp_path / "agg.csv"
    rc = cli_main(["annotate", "import", str(paths["alice"]), str(paths["bob"]), "--items", str(paths["items"]),
                   "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == "" and not out.exists()
    assert "bob.csv row 6: item '9999' is not in" in captured.err
    # the Python API without items up front: write_aggregated names the annotator file and row too
    ann = read_annotations([paths["alice"], paths["bob"]])
    with pytest.raises(ValueError, match=r"bob.csv row 6: item '9999' is not in"):
        write_aggregated(ann, aggregate(ann), out, items=paths["items"])
    assert not out.exists()


def test_same_file_twice_is_an_error(tmp_path, capsys):
    """Field failure: the same file twice was renamed alice_ and gave alpha = 1.000."""
    paths = _filled_export(tmp_path)
    with pytest.raises(ValueError, match=r"the same file given twice: .*alice.csv"):
        read_annotations([paths["alice"], paths["bob"], paths["alice"]])
    other_spelling = paths["alice"].parent / ".." / paths["alice"].parent.name / "alice.csv"
    with pytest.raises(ValueError, match=r"the same file given twice: "):
        read_annotations([paths["alice"], other_spelling])
    capsys.readouterr()
    assert cli_main(["annotate", "import", str(paths["alice"]), str(paths["alice"])]) == 1
    assert "the same file given twice" in capsys.readouterr().err
    # two different files with the same name keep the rename
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "alice.csv").write_bytes(paths["bob"].read_bytes())
    assert read_annotations([paths["alice"], copy / "alice.csv"]).annotators == ["alice", "alice_"]


def test_outputs_under_a_file_are_clear_errors(tmp_path, capsys):
    paths = _filled_export(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("x", encoding="utf-8")
    capsys.readouterr()
    assert cli_main(["annotate", "export", "--candidates", str(_candidates(tmp_path)), "--out-dir", str(blocker)]) == 1
    assert f"--out-dir {blocker} exists and is not a folder" in capsys.readouterr().err
    assert cli_main(["annotate", "import", str(paths["alice"]), str(paths["bob"]), "--out", str(blocker / "a.csv")]) == 1
    captured = capsys.readouterr()
    assert f"cannot write --out {blocker / 'a.csv'}: {blocker} exists and is not a folder" in captured.err
    assert captured.out == "" and "Traceback" not in captured.err
