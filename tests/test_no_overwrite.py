"""No command replaces a file it did not write (from the same inputs) unless --overwrite is given; inputs
that contradict the command are refused before anything is written; an unwritable output location is named before
any work (rbjax.core.io: claim_outputs / record_outputs / check_output_dir)."""
from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.core import io as rio
from rbjax.core import reuse


# ------------------------------------------------------------------------------------------ the shared helper
def test_claim_outputs_allows_only_own_unchanged_output_of_the_same_inputs(tmp_path):
    f = tmp_path / "result.csv"
    reuse.claim_outputs([f], {"model": "a"})  # nothing there: fine
    f.write_text("somebody's work\n")
    with pytest.raises(reuse.OutputExists, match=rf"in {tmp_path}: result.csv \(no record that rbjax wrote it\).*--overwrite"):
        reuse.claim_outputs([f], {"model": "a"})
    reuse.claim_outputs([f], {"model": "a"}, overwrite=True)
    rio.atomic_write_text(f, "rbjax's output\n")
    reuse.record_outputs([f], {"model": "a"})
    reuse.claim_outputs([f], {"model": "a"})  # a rerun of the same inputs: its own file
    with pytest.raises(reuse.OutputExists, match=r"other inputs: model: 'a' → 'b'"):
        reuse.claim_outputs([f], {"model": "b"})
    f.write_text("rbjax's output, then edited by hand\n")
    with pytest.raises(reuse.OutputExists, match=r"changed since rbjax wrote it"):
        reuse.claim_outputs([f], {"model": "a"})
    (tmp_path / "adir").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        reuse.claim_outputs([tmp_path / "adir"], {}, overwrite=True)


def test_check_output_dir_names_an_unwritable_location(tmp_path, monkeypatch):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=rf"cannot create --out {blocker / 'sub'}: {blocker} exists and is not a folder"):
        rio.check_output_dir(blocker / "sub", "--out")
    with pytest.raises(ValueError, match=rf"cannot write --out {blocker / 'x.png'}: {blocker} exists"):
        rio.check_output_file(blocker / "x.png", "--out")
    # permission bits do not bind root, so an unwritable folder is simulated through os.access
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(rio.os, "access", lambda p, m: False if Path(p) == ro else real(p, m))
    with pytest.raises(ValueError, match=rf"cannot create --out {ro / 'new'}: {ro} is not writable"):
        rio.check_output_dir(ro / "new", "--out")
    with pytest.raises(ValueError, match=rf"--out {ro}: the folder is not writable"):
        rio.check_output_dir(ro, "--out")


# ------------------------------------------------------------------------------------------ annotate export
def _candidates(path: Path, n=4) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "bias_type", "comment", "phrase"])
        for i in range(n):
            w.writerow([f"c{i}", "religion1", f"comment {i} jews are greedy", f"jews are greedy {i}"])
    return path


def test_annotate_export_keeps_filled_files(tmp_path, capsys):
    cand = _candidates(tmp_path / "cand.csv")
    d = tmp_path / "ann"
    args = ["annotate", "export", "--candidates", str(cand), "--out-dir", str(d), "--annotators", "a", "b"]
    assert main(args) == 0
    assert main(args) == 0  # the same export again: its own unchanged files
    filled = (d / "a.csv").read_text().replace(",,,", ",biased,biased,", 1)
    (d / "a.csv").write_text(filled)
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"in {d}: a.csv (changed since rbjax wrote it)" in err and "--overwrite" in err
    assert (d / "a.csv").read_text() == filled
    assert main(args + ["--overwrite"]) == 0
    assert (d / "a.csv").read_text() != filled
    # --overwrite with annotator b dropped: b.csv of the earlier export would sit beside the new one as one of its
    # annotators (mixed folder); refused, nothing written
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    capsys.readouterr()
    assert main(args[:-2] + ["a", "c", "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "holds b.csv of an earlier export (annotators a, b) that this export (a, c) does not replace" in err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


# ------------------------------------------------------------------------------------------ splits
def test_splits_refuses_another_types_file_and_released_files(redditbias_dir, tmp_path, capsys):
    from rbjax.data.splits import make_splits
    from rbjax.specs import load_spec

    def never(phrases):
        raise AssertionError("nothing may be scored")

    # an annotated file of rbjax's pipeline names its bias type
    ann = tmp_path / "race_annotated.csv"
    with open(ann, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "bias_type", "comment", "phrase", "bias_sent", "bias_phrase"])
        for i in range(6):
            w.writerow([f"c{i}", "race", "c", f"black people are criminals {i}", "1", "1"])
    with pytest.raises(ValueError, match=r"bias_type column says race, not religion1"):
        make_splits(ann, load_spec("religion1"), tmp_path / "o", never)
    # a released file of another type (no bias_type column): no phrase changes under the religion1 swap
    other = redditbias_dir / "data/race/reddit_comments_race_black_processed_phrase_annotated.csv"
    with pytest.raises(ValueError, match=r"the religion1 swap leaves 498 of the 510 held-out phrases unchanged.* another bias type"):
        make_splits(other, load_spec("religion1"), tmp_path / "o", never)
    assert not (tmp_path / "o").exists()
    # the right annotated file into a copy of RedditBias: the released files are not replaced
    copy = tmp_path / "rb"
    shutil.copytree(redditbias_dir / "text_files/religion1", copy / "text_files/religion1")
    shutil.copytree(redditbias_dir / "data/religion1", copy / "data/religion1")
    train = copy / "text_files/religion1/religion1_bias_manual_train.txt"
    before = train.read_bytes()
    own = redditbias_dir / "data/religion1/reddit_comments_religion1_jews_processed_phrase_annotated.csv"
    capsys.readouterr()
    rc = main(["splits", "--bias", "religion1", "--annotated", str(own), "--out-dir", str(copy),
               "--model", str(tmp_path / "no_model")])  # refused before the (missing) model is loaded
    err = capsys.readouterr().err
    assert rc == 1 and "no record that rbjax wrote it" in err and "religion1_jews_biased_valid_reduced.csv" in err, err
    assert "--overwrite" in err and train.read_bytes() == before


# ------------------------------------------------------------------------------------------ measure
def test_measure_refuses_another_runs_folder(redditbias_dir, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "res"
    stored = ["measure", "--stored-perplexities", "--data-dir", str(redditbias_dir), "--out", str(out),
              "--no-progress", "--n-bootstrap", "0"]
    assert main(stored + ["--bias", "religion1,race"]) == 0
    assert main(stored + ["--bias", "religion1,race"]) == 0  # the same run again: its own files
    lmb = (out / "lmb.json").read_bytes()
    capsys.readouterr()
    # another model into the folder: refused before scoring, nothing touched
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "religion1", "--data-dir", str(redditbias_dir),
               "--out", str(out), "--no-progress", "--n-bootstrap", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and "religion1_perplexities.csv (written from other inputs" in err and "--overwrite" in err
    assert (out / "lmb.json").read_bytes() == lmb
    # no CSV name collides (another model, another type): lmb.json and lmb.png are another run's results, said
    # once, by the fields that differ (not every type's inputs dumped whole, twice)
    rc = main(["measure", "--model", str(tiny_model_dir), "--bias", "gender", "--data-dir", str(redditbias_dir),
               "--out", str(out), "--no-progress", "--n-bootstrap", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and "lmb.json, lmb.png (written from other inputs: " in err and len(err) < 1000, err
    assert ("types[bias_type=religion1]: {7 fields} → absent; types[bias_type=race]: {7 fields} → absent; "
            "types[bias_type=gender]: absent → {7 fields}") in err and "sha256" not in err and ".csv" not in err
    # fewer types with the same source: lmb.json is another run's result
    assert main(stored + ["--bias", "race"]) == 1
    err = capsys.readouterr().err
    assert "lmb.json, lmb.png (written from other inputs: types[bias_type=religion1]: {7 fields} → absent)" in err
    assert main(stored + ["--bias", "race", "--overwrite"]) == 0
    assert [r["bias_type"] for r in json.loads((out / "lmb.json").read_text())] == ["race"]


def test_measure_checks_out_before_any_work(redditbias_dir, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    rc = main(["measure", "--model", str(tmp_path / "no_model"), "--bias", "race", "--data-dir",
               str(redditbias_dir), "--out", str(blocker / "sub")])
    err = capsys.readouterr().err
    assert rc == 1 and f"cannot create --out {blocker / 'sub'}: {blocker} exists and is not a folder" in err
