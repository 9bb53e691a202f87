"""Splits from annotated phrases (rbjax.data.splits, `rbjax splits`; docs/data-building.md §3), and the worked
example of a new bias type (docs/data-building.md)."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import random
from pathlib import Path

import numpy as np
import pytest

from rbjax.cli import main as cli_main
from rbjax.data.dumps import write_zst
from rbjax.data.redditbias import load_pair_files
from rbjax.data.splits import (
    T1_COLUMNS,
    T2_COLUMNS,
    default_train_size,
    load_biased_phrases,
    make_splits,
    read_biased_rows,
    shuffle_split,
)
from rbjax.specs import load_spec

ROOT = Path(__file__).resolve().parents[1]
R1 = "data/religion1/reddit_comments_religion1_jews_processed_phrase_annotated.csv"


def _col(path, col):
    with open(path, newline="", encoding="utf-8") as f:
        return [r[col] for r in csv.DictReader(f)]


def _lines(path):
    return Path(path).read_text(encoding="utf-8").split("\n")


def _header(path):
    with open(path, newline="", encoding="utf-8") as f:
        return tuple(next(csv.reader(f)))


# ------------------------------------------------------------------ the random splits
def test_shuffle_split_sizes_and_order():
    tr, te = shuffle_split(10, 0.6, 1)
    assert (len(tr), len(te)) == (6, 4)
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(10))
    assert shuffle_split(10, 0.6, 1)[0].tolist() == tr.tolist()
    v, t = shuffle_split(7, 0.5, 1)
    assert (len(v), len(t)) == (3, 4)  # valid = floor(n/2), test = the rest
    with pytest.raises(ValueError, match="train fraction"):
        shuffle_split(10, 1.5)
    with pytest.raises(ValueError, match="empty"):
        shuffle_split(1, 0.5)
    assert default_train_size("gender") == 0.75 and default_train_size("religion1") == 0.6


def test_released_religion1_train_heldout(redditbias_dir):
    """From the released annotated file with seed 1: 720 / 480, and exactly the released phrases in order."""
    rows = load_biased_phrases(redditbias_dir / R1)
    assert len(rows) == 1200
    tr, he = shuffle_split(len(rows), default_train_size("religion1"), seed=1)
    assert (len(tr), len(he)) == (720, 480)
    tf = redditbias_dir / "text_files/religion1"
    assert [rows[i]["phrase"] for i in tr] == _lines(tf / "religion1_bias_manual_train.txt")[:720]
    assert [rows[i]["phrase"] for i in he] == _lines(tf / "religion1_bias_manual_valid.txt")[:480]


@pytest.mark.parametrize("btype,up,g,n,n_train", [
    ("religion2", "religion2", "muslims", 1200, 720),
    ("race", "race", "black", 1273, 763),
    ("gender", "gender", "female", 2028, 1521),
    ("queerness", "orientation", "lgbtq", 1200, 720),
])
def test_released_sizes_other_types(redditbias_dir, btype, up, g, n, n_train):
    path = redditbias_dir / f"data/{up}/reddit_comments_{up}_{g}_processed_phrase_annotated.csv"
    if btype == "gender":  # 24 rows have bias_phrase = 2: an error unless skipped (upstream kept only 1s)
        with pytest.raises(ValueError, match=r"row 132 column bias_phrase: unknown label '2'"):
            load_biased_phrases(path)
        assert read_biased_rows(path, unknown="skip").n_unknown_label == 24
    rows = load_biased_phrases(path, unknown="skip")
    assert len(rows) == n
    tr, he = shuffle_split(n, default_train_size(btype), 1)
    assert (len(tr), len(he)) == (n_train, n - n_train)
    if btype == "religion2":  # same phrases and order as released (which capitalises Muslim/Islam/Arab)
        rel = _lines(redditbias_dir / f"text_files/{up}/{up}_bias_manual_train.txt")[:n_train]
        assert [rows[i]["phrase"] for i in tr] == [s.lower() for s in rel]


def test_make_splits_reproduces_released_religion1(redditbias_dir, tmp_path):
    """Whole procedure on the released annotations with the released perplexities as the 'model':
    the written valid/test files are the released ones, row for row."""
    d = redditbias_dir / "data/religion1"
    t1, t2 = {}, {}
    for split in ("valid", "test"):
        f1 = d / f"reddit_comments_religion1_jews_biased_{split}_reduced.csv"
        f2 = d / f"reddit_comments_religion1_christians_biased_{split}_reduced.csv"
        t1.update(zip(_col(f1, "comments_processed"), map(float, _col(f1, "perplexity"))))
        t2.update(zip(_col(f2, "comments_processed"), map(float, _col(f2, "perplexity"))))
    calls = []

    def score_fn(phrases):  # first call: biased phrases, second: counterfactuals
        table = t1 if not calls else t2
        calls.append(len(phrases))
        # the 4 pairs the upstream reduction removed are not in the released files: make them outliers
        return np.array([table.get(p, 1e12) for p in phrases])

    res = make_splits(redditbias_dir / R1, load_spec("religion1"), tmp_path, score_fn, swap_mode="reference")
    assert calls == [480, 480]
    assert (res.n_biased, res.n_train, res.n_heldout, res.n_outliers) == (1200, 720, 480, 4)
    assert (res.n_valid, res.n_test) == (238, 238)
    out = tmp_path / "data/religion1"
    for split in ("valid", "test"):
        mine1 = out / f"reddit_comments_religion1_jews_biased_{split}_reduced.csv"
        mine2 = out / f"reddit_comments_religion1_christians_biased_{split}_reduced.csv"
        rel1 = d / mine1.name
        rel2 = d / mine2.name
        assert _header(mine1) == T1_COLUMNS == _header(rel1)
        assert _header(mine2) == T2_COLUMNS == _header(rel2)
        for col in ("id", "comment", "comments_processed"):
            assert _col(mine1, col) == _col(rel1, col), col
        assert [float(x) for x in _col(mine1, "perplexity")] == [float(x) for x in _col(rel1, "perplexity")]
        for col in ("comments", "comments_processed"):
            assert _col(mine2, col) == _col(rel2, col), col
        assert [float(x) for x in _col(mine2, "perplexity")] == [float(x) for x in _col(rel2, "perplexity")]
        for g in ("jews", "christians"):
            name = f"religion1_{g}_biased_{split}_reduced.txt"
            assert _lines(tmp_path / "text_files/religion1" / name)[:238] == _lines(
                redditbias_dir / "text_files/religion1" / name)[:238]
        pairs = load_pair_files(mine1, mine2, bias_type="religion1", split=split, need_stored_ppl=True)
        assert len(pairs) == 238
    assert _lines(res.files["train_txt"])[:720] == _lines(redditbias_dir / "text_files/religion1/religion1_bias_manual_train.txt")[:720]
    summary = json.loads(res.files["summary"].read_text())
    assert summary["n_test"] == 238 and summary["seed"] == 1


# ------------------------------------------------------------------ a user spec
USER_SPEC = {
    "name": "zorbness", "t1_group": "zorbs", "t2_group": "quells",
    "targets_t1": ["zorbs", "zorb"], "targets_t2": ["quells", "quell"],
    "queries": ["zorbs are", "zorb is"], "attributes_a1": ["lazy", "greed*"], "attributes_a2": ["active", "generous"],
    "pairs": [["zorbs", "quells"], ["zorb", "quell"]],
}


def _annotated(path, n=41):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["item", "id", "attribute_in_window", "comment", "phrase", "bias_sent", "bias_phrase"])
        for i in range(n):
            phrase = f"zorbs are lazy number {i}" if i != 5 else "zorbs are lazy OUTLIER"
            if i == 7:
                phrase = "zorbs"  # the scorer calls this unscorable
            label = "1" if i % 4 != 3 else "0"
            w.writerow([i + 1, f"c{i}", "True", f"well {phrase} indeed", phrase, label, label])
        w.writerow([n + 1, "cx", "True", "c", "", "1", "1"])  # empty phrase: dropped
        w.writerow([n + 2, "cy", "True", "c", "zorb is greedy", "1", ""])  # not annotated: dropped
    return path


def _fake_score(phrases):
    return np.array([np.nan if p in ("zorbs", "quells") else 1e9 if "OUTLIER" in p else 50.0 + len(p)
                     for p in phrases])


def test_user_spec_splits(tmp_path):
    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    spec = load_spec(spec_path)
    ann = _annotated(tmp_path / "annotated.csv")
    res = make_splits(ann, spec, tmp_path / "out", _fake_score, train_size=0.5)
    assert res.n_biased == 31 and (res.n_train, res.n_heldout) == (15, 16)
    assert res.n_empty_phrase == 1 and "(dropped 1 biased rows with an empty phrase)" in res.summary()
    held = _lines(res.files["heldout_txt"])[:-1]
    assert res.n_unscorable == int("zorbs" in held) and res.n_outliers == int("zorbs are lazy OUTLIER" in held)
    n = 16 - res.n_unscorable - res.n_outliers
    assert (res.n_valid, res.n_test) == (n // 2, n - n // 2)
    d = tmp_path / "out/data/zorbness"
    f1 = d / "reddit_comments_zorbness_zorbs_biased_test_reduced.csv"
    f2 = d / "reddit_comments_zorbness_quells_biased_test_reduced.csv"
    assert _header(f1) == T1_COLUMNS and _header(f2) == T2_COLUMNS
    pairs = load_pair_files(f1, f2, bias_type="zorbness", split="test", need_stored_ppl=True)
    assert all(b.replace("zorbs", "quells") == c for b, c in zip(pairs.biased, pairs.counterfactual))
    assert _col(f2, "initial_demo")[0] == "['zorbs']" and _col(f2, "replaced_demo")[0] == "['quells']"
    assert (tmp_path / "out/text_files/zorbness/zorbness_quells_biased_valid_reduced.txt").exists()


def test_splits_errors(tmp_path):
    spec = load_spec("religion1")
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        make_splits(tmp_path / "nope.csv", spec, tmp_path, _fake_score)
    bad = tmp_path / "bad.csv"
    bad.write_text("id,comment\n1,x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no 'phrase' column"):
        make_splits(bad, spec, tmp_path, _fake_score)
    ann = _annotated(tmp_path / "a.csv")
    zorb = tmp_path / "zorb.json"
    zorb.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    with pytest.raises(ValueError, match="scorer returned shape"):
        make_splits(ann, load_spec(zorb), tmp_path, lambda p: np.zeros(3))


# ------------------------------------------------------------------ worked example (docs/data-building.md)
EXAMPLE_SPEC = ROOT / "experiments/specs/example_nationality.json"


def _example_dump(path, n=400, seed=0):
    rng = random.Random(seed)
    subjects = ["the irish are", "irishmen are", "irish people are", "an irishman is"]
    attrs = ["drunk", "drunks", "alcoholics", "heavy drinkers", "violent", "lazy", "hot-tempered", "brawlers"]
    filler = "we went to the pub and then home it was a good night with friends and music".split()
    recs = []
    for i in range(n):
        if i % 3 == 0:
            words = rng.sample(filler, 4)
            body = f"{' '.join(words)} {rng.choice(subjects)} {rng.choice(attrs)} {rng.randint(0, 999)}"
        else:
            body = " ".join(rng.choice(filler) for _ in range(rng.randint(3, 20)))
        recs.append({"id": f"n{i}", "body": body, "author": "x", "subreddit": "ireland", "created_utc": 1600000000 + i})
    write_zst(recs, path, window_log=31)
    return path


def _annotated_example(tmp_path) -> Path:
    """The worked example up to the annotated file: retrieve -> annotate export -> (simulated annotators) ->
    annotate import, through the CLI as docs/data-building.md runs it."""
    spec = str(EXAMPLE_SPEC)
    dump = _example_dump(tmp_path / "RC_2020-09.zst")
    cand = tmp_path / "candidates.csv"
    assert cli_main(["retrieve", "--bias", spec, "--dump", str(dump), "--out", str(cand), "--no-progress"]) == 0
    n_cand = len(_col(cand, "phrase"))
    assert n_cand > 100
    ann_dir = tmp_path / "annotation"
    assert cli_main(["annotate", "export", "--candidates", str(cand), "--out-dir", str(ann_dir),
                     "--annotators", "ann", "bob", "cat"]) == 0
    rng = random.Random(1)
    for name in ("ann", "bob", "cat"):  # simulated annotators: mostly "biased", some disagreement
        p = ann_dir / f"{name}.csv"
        with open(p, newline="", encoding="utf-8") as f:
            r = csv.DictReader(f)
            header, rows = r.fieldnames, list(r)
        for row in rows:
            row["comment_label"] = "biased" if rng.random() < 0.8 else "unbiased"
            row["phrase_label"] = "biased" if rng.random() < 0.85 else rng.choice(["unbiased", "skip"])
        with open(p, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, header)
            w.writeheader()
            w.writerows(rows)
    annotated = tmp_path / "annotated.csv"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli_main(["annotate", "import", *(str(ann_dir / f"{a}.csv") for a in ("ann", "bob", "cat")),
                         "--items", str(ann_dir / "items.csv"), "--out", str(annotated)]) == 0
    assert "Krippendorff's alpha (phrase level):" in printed.getvalue()
    return annotated


def test_worked_example_new_bias_type(tmp_path, capsys):
    """retrieve -> annotate export -> (annotators) -> annotate import -> splits -> measure-ready files."""
    spec = str(EXAMPLE_SPEC)
    annotated = _annotated_example(tmp_path)
    res = make_splits(annotated, load_spec(spec), tmp_path / "data_dir", _fake_score)
    assert res.n_train + res.n_heldout == res.n_biased > 50
    d = tmp_path / "data_dir/data/nationality"
    pairs = load_pair_files(d / "reddit_comments_nationality_irish_biased_test_reduced.csv",
                            d / "reddit_comments_nationality_english_biased_test_reduced.csv",
                            bias_type="nationality", split="test", need_stored_ppl=True)
    assert len(pairs) == res.n_test
    assert all("irish" not in c for c in pairs.counterfactual)
    from rbjax.lmb.stats import lmb_statistics

    stats = lmb_statistics(pairs.stored_biased_ppl, pairs.stored_counter_ppl, n_bootstrap=100)
    assert stats["n_pairs"] == res.n_test
    # last step: `rbjax measure` with the spec file as --bias reads the new type's files
    assert cli_main(["measure", "--stored-perplexities", "--bias", spec, "--data-dir", str(tmp_path / "data_dir"),
                     "--out", str(tmp_path / "results"), "--no-progress", "--n-bootstrap", "100"]) == 0
    rec = json.loads((tmp_path / "results" / "lmb.json").read_text())[0]
    assert rec["bias_type"] == "nationality" and rec["n_pairs"] == res.n_test
    assert (tmp_path / "results" / "nationality_perplexities.csv").exists()


@pytest.fixture(scope="module")
def example_data_dir(tmp_path_factory, tiny_model_dir):
    """The worked example's data folder as `rbjax splits --model` writes it (retrieve -> annotate -> splits)."""
    tmp = tmp_path_factory.mktemp("worked_example")
    annotated = _annotated_example(tmp)
    data = tmp / "data_dir"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["splits", "--bias", str(EXAMPLE_SPEC), "--annotated", str(annotated), "--out-dir", str(data),
                         "--model", str(tiny_model_dir)]) == 0
    summary = json.loads((data / "data/nationality/nationality_splits.json").read_text())
    assert summary["n_train"] > 50 and summary["n_valid"] > 10
    return data, summary


def _check_debias_run(out: Path, method: str, n_train: int, n_valid: int) -> dict:
    """What `rbjax debias` on the example spec must leave in ``out`` (results.json, LMB of the new type, model)."""
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["training"]["updates"] == 2 and res["method"] == method
    assert res["bias_type"] == str(EXAMPLE_SPEC)
    lmb = res["lmb_valid"]
    assert lmb["debiased_type"]["bias_type"] == "nationality" and lmb["debiased_type"]["n_pairs"] == n_valid
    assert isinstance(lmb["debiased_type"]["t_value"], float)
    assert [r["bias_type"] for r in lmb["all"]] == ["nationality"]
    assert json.loads((out / "lmb_valid/lmb.json").read_text())[0]["bias_type"] == "nationality"
    assert (out / "model/model.safetensors").is_file()
    triggers = res["training"]["triggers"]
    if method in ("lmd", "add", "hd"):
        # every training phrase of the example names the Irish and holds an A1 attribute (see _example_dump)
        assert triggers["sentences_triggered"] == triggers["n_sentences"] == n_train
        assert triggers["triggered_positions" if method == "lmd" else "occurrences"] >= n_train
    else:
        assert triggers == {}
    return res


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_worked_example_continues_through_debiasing(example_data_dir, tiny_model_dir, shared_dir, capsys):
    """The worked example for a new bias type (docs/data-building.md) after `rbjax splits --model`: `rbjax measure`,
    the training data and triggers of lmd/add/hd/cda, `rbjax debias --method hd` on the spec file and
    the data folder that `splits` wrote. The CLI runs of the other methods and the sweep:
    test_worked_example_debias_every_method_and_sweep (slow)."""
    from rbjax.debias.config import DebiasRun
    from rbjax.debias.data import TrainingData
    from rbjax.model.tokenizer import load_tokenizer

    data, summary = example_data_dir
    spec, tmp = str(EXAMPLE_SPEC), data.parent
    n_train, n_valid = summary["n_train"], summary["n_valid"]
    assert cli_main(["measure", "--model", str(tiny_model_dir), "--bias", spec, "--data-dir", str(data),
                     "--split", "valid", "--out", str(tmp / "results"), "--n-bootstrap", "100", "--no-progress"]) == 0
    base = json.loads((tmp / "results/lmb.json").read_text())[0]
    assert base["bias_type"] == "nationality" and base["n_pairs"] == n_valid

    # each method's training set and triggers on the new type (no training needed to see them)
    tok = load_tokenizer(tiny_model_dir)
    for method in ("lmd", "add", "hd", "cda"):
        td = TrainingData(DebiasRun.from_flat(method=method, bias_type=spec, data_dir=str(data)), tok, 50257)
        assert td.n_examples == (2 * n_train if method == "cda" else n_train)
        if method == "lmd":
            assert td.trigger_stats["sentences_triggered"] == n_train  # every phrase names the Irish
        elif method in ("add", "hd"):
            # ... and holds an A1 attribute, "heavy drinkers" (a quoted multi-word attribute) included
            assert td.trigger_stats["sentences_triggered"] == n_train
            assert td.trigger_stats["occurrences"] >= n_train
        else:
            assert td.trigger_stats == {} and td.info["source"].startswith("CDA")

    common = ["--bias", spec, "--model", str(tiny_model_dir), "--data-dir", str(data), "--max-steps", "2",
              "--no-progress"]
    out = tmp / "runs/hd"
    lmp_file = shared_dir / "redditbias/text_files/humanref6k.txt"
    capsys.readouterr()
    # the default --eval-bias all: this data folder holds only the new type, which the command says
    assert cli_main(["debias", "--method", "hd", *common, "--out", str(out), "--lmp-file", str(lmp_file),
                     "--lmp-max-lines", "8"]) == 0
    printed = capsys.readouterr()
    assert "holds no RedditBias files of religion1" in printed.err and "nationality" in printed.out
    res = _check_debias_run(out, "hd", n_train, n_valid)
    assert res["lmp"]["n_lines"] == 8 and res["lmp"]["perplexity"] > 1

    # the official code's token-id lists and substring rules exist only for the packaged types: a clear error
    for cmd, method in (("debias", "hd"), ("debias", "cda"), ("sweep", "lmd")):
        capsys.readouterr()
        assert cli_main([cmd, "--method", method, *common, "--out", str(tmp / "ref"), "--semantics", "reference"]) == 1
        err = capsys.readouterr().err
        assert "exist only for the five packaged bias types; use --semantics paper" in err and "Traceback" not in err
    assert not (tmp / "ref").exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_worked_example_debias_every_method_and_sweep(example_data_dir, tiny_model_dir, shared_dir, capsys):
    """`rbjax debias` with lmd, add and cda on the example spec (hd: the fast test above), each evaluated on the new
    type's valid split (lmd also with the LMP of 8 lines), and a 2-point `rbjax sweep`."""
    data, summary = example_data_dir
    spec, tmp = str(EXAMPLE_SPEC), data.parent
    lmp_file = shared_dir / "redditbias/text_files/humanref6k.txt"
    for method in ("lmd", "add", "cda"):
        out = tmp / "runs" / method
        lmp = ["--lmp-file", str(lmp_file), "--lmp-max-lines", "8"] if method == "lmd" else ["--no-lmp"]
        assert cli_main(["debias", "--method", method, "--bias", spec, "--model", str(tiny_model_dir),
                         "--data-dir", str(data), "--max-steps", "2", "--no-progress", "--out", str(out),
                         "--eval-bias", spec, *lmp]) == 0, method
        assert "nationality" in capsys.readouterr().out
        res = _check_debias_run(out, method, summary["n_train"], summary["n_valid"])
        if method == "lmd":
            assert res["lmp"]["n_lines"] == 8 and res["lmp"]["perplexity"] > 1
        else:
            assert "lmp" not in res
        if method == "cda":
            assert json.loads((out / "config.json").read_text())["data"]["n_lines"] == 2 * summary["n_train"]

    out = tmp / "sweep"
    assert cli_main(["sweep", "--method", "hd", "--bias", spec, "--model", str(tiny_model_dir), "--data-dir",
                     str(data), "--max-steps", "2", "--no-progress", "--out", str(out), "--batch-sizes", "8",
                     "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10,100", "--max-points", "2",
                     "--no-lmp", "--n-bootstrap", "100"]) == 0
    runs = [json.loads(ln) for ln in (out / "sweep.jsonl").read_text().splitlines()]
    assert [r["id"] for r in runs] == ["b8_a1_lm0.01_d10", "b8_a1_lm0.01_d100"]
    assert all(r["updates"] == 2 and r["dev"]["n_pairs"] == summary["n_valid"] for r in runs)
    assert json.loads((out / "selection.json").read_text())["n_runs"] == 2
    assert "nationality" in capsys.readouterr().out


def test_spec_run_without_lmp_reference_fails_before_training(example_data_dir, tiny_model_dir, tmp_path,
                                                              monkeypatch, capsys):
    """The data folder of a new type has no text_files/humanref6k.txt; offline, the RedditBias release cannot be
    read either: the run must say so (and name --lmp-file / --no-lmp) before training, not after it."""
    from rbjax.data.redditbias import RedditBiasData

    data, _ = example_data_dir
    orig = RedditBiasData.reddit_reference_file

    def offline(self):
        if self.is_cache:
            raise RuntimeError("cannot download text_files/humanref6k.txt (offline)")
        return orig(self)

    monkeypatch.setattr(RedditBiasData, "reddit_reference_file", offline)
    monkeypatch.delenv("RBJAX_DATA_DIR", raising=False)
    base = ["debias", "--method", "hd", "--bias", str(EXAMPLE_SPEC), "--model", str(tiny_model_dir), "--data-dir",
            str(data), "--max-steps", "2", "--no-eval", "--no-progress"]
    capsys.readouterr()
    assert cli_main([*base, "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert f"not in --data-dir {data}" in err and "--lmp-file" in err and "--no-lmp" in err and "(offline)" in err
    assert not (tmp_path / "a/checkpoints").exists()
    assert cli_main([*base, "--out", str(tmp_path / "b"), "--lmp-file", str(tmp_path / "nope.txt")]) == 1
    assert f"--lmp-file {tmp_path / 'nope.txt'}: LMP reference file not found" in capsys.readouterr().err
    assert not (tmp_path / "b/checkpoints").exists()


def test_quoted_multi_word_attribute_of_a_spec_triggers(tokenizer_dir):
    """A user spec writes multi-word attributes in the paper's quotes ('"heavy drinker*"', as retrieval reads
    them); the ADD/HD triggers used to look for the quote characters and never fired on them."""
    from rbjax.debias.triggers import TriggerBuilder
    from rbjax.model.tokenizer import load_tokenizer

    spec = load_spec(EXAMPLE_SPEC)
    assert '"heavy drinker*"' in spec.attributes_a1
    tok = load_tokenizer(tokenizer_dir)
    tb = TriggerBuilder(spec, tok, semantics="paper")
    texts = ["the irish are Heavy  drinkers, really", "irishmen are heavy drinker", "irishmen are heavy", "ok"]
    enc = tok.encode_batch(texts)
    ids = np.zeros((len(texts), 12), np.int32)
    mask = np.zeros((len(texts), 12), np.int32)
    for r, t in enumerate(enc):
        ids[r, :len(t)], mask[r, :len(t)] = t, 1
    occ = tb.attributes(ids, mask, max_occurrences=None)
    assert occ.mask.sum(1).tolist() == [1, 1, 0, 0]
    k = spec.attributes_a1.index('"heavy drinker*"')
    assert occ.rows[0, 0] == occ.rows[1, 0] == k
    # the occurrence covers both words' tokens: "heavy" and "drinkers" in the first text
    covered = [tok.decode([int(i)]) for i, w in zip(ids[0], occ.weights[0, 0]) if w > 0]
    assert "".join(covered).strip().lower() == "heavy  drinkers"


def test_cli_splits_with_tiny_model(tmp_path, tiny_model_dir, capsys):
    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    ann = _annotated(tmp_path / "annotated.csv", n=21)
    rc = cli_main(["splits", "--bias", str(spec_path), "--annotated", str(ann), "--out-dir", str(tmp_path / "o"),
                   "--model", str(tiny_model_dir), "--batch-size", "8"])
    assert rc == 0
    assert "zorbness: 16 biased phrases" in capsys.readouterr().out
    f1 = tmp_path / "o/data/zorbness/reddit_comments_zorbness_zorbs_biased_test_reduced.csv"
    assert all(float(x) > 1 for x in _col(f1, "perplexity"))
    summary = json.loads((tmp_path / "o/data/zorbness/zorbness_splits.json").read_text())
    assert summary["perplexity"]["model"] == str(tiny_model_dir)


# ------------------------------------------------------------------ fresh-user findings
def _rewrite_row(path, i, **cells):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        header, rows = r.fieldnames, list(r)
    rows[i].update(cells)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerows(rows)


def test_unknown_bias_phrase_label_is_an_error(tmp_path):
    """Field failure: bias_phrase=maybe was dropped silently (31 -> 30 phrases)."""
    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    ann = _annotated(tmp_path / "annotated.csv")
    _rewrite_row(ann, 4, bias_phrase="maybe")  # file row 6
    calls = []

    def score(p):
        calls.append(p)
        return _fake_score(p)

    with pytest.raises(ValueError, match=r"annotated.csv row 6 column bias_phrase: unknown label 'maybe'"):
        make_splits(ann, load_spec(spec_path), tmp_path / "out", score, train_size=0.5)
    assert calls == [] and not (tmp_path / "out").exists()
    res = make_splits(ann, load_spec(spec_path), tmp_path / "out", score, train_size=0.5, unknown="skip")
    assert (res.n_biased, res.n_unknown_label, res.n_empty_phrase) == (30, 1, 1)
    assert "1 rows with an unknown bias_phrase label" in res.summary()
    summary = json.loads(res.files["summary"].read_text())
    assert (summary["n_unknown_label"], summary["n_empty_phrase"], summary["unknown_labels"]) == (1, 1, "skip")


def test_empty_biased_phrases_are_counted(tmp_path, capsys, monkeypatch):
    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    ann = _annotated(tmp_path / "annotated.csv")
    _rewrite_row(ann, 0, phrase="   ")  # a second biased row with an empty phrase
    rows = read_biased_rows(ann)
    assert (len(rows.rows), rows.n_empty_phrase, rows.n_rows) == (30, 2, 43)
    res = make_splits(ann, load_spec(spec_path), tmp_path / "out", _fake_score, train_size=0.5)
    assert res.n_empty_phrase == 2 and "dropped 2 biased rows with an empty phrase" in res.summary()
    assert json.loads(res.files["summary"].read_text())["n_empty_phrase"] == 2
    # the CLI prints it (the model is replaced by the fake scorer)
    import rbjax.lmb.measure as measure

    monkeypatch.setattr(measure, "LoadedModel", lambda *a: None)
    monkeypatch.setattr(measure, "score_phrases", lambda model, phrases: _fake_score(phrases))
    capsys.readouterr()
    assert cli_main(["splits", "--bias", str(spec_path), "--annotated", str(ann), "--out-dir", str(tmp_path / "o2"),
                     "--model", "fake/model", "--train-size", "0.5"]) == 0
    assert "30 biased phrases (dropped 2 biased rows with an empty phrase)" in capsys.readouterr().out


def test_out_dir_that_is_a_file_is_a_clear_error(tmp_path, capsys):
    """Field failure: --out-dir <a file> ended in a NotADirectoryError traceback (after scoring)."""
    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    ann = _annotated(tmp_path / "annotated.csv")
    blocker = tmp_path / "blocker"
    blocker.write_text("x", encoding="utf-8")

    def never(p):
        raise AssertionError("the scorer must not run")

    with pytest.raises(ValueError, match=rf"output folder {blocker} exists and is not a folder"):
        make_splits(ann, load_spec(spec_path), blocker, never)
    with pytest.raises(ValueError, match=rf"cannot create output folder {blocker / 'x'}: {blocker} exists"):
        make_splits(ann, load_spec(spec_path), blocker / "x", never)
    (tmp_path / "o" / "data").mkdir(parents=True)
    (tmp_path / "o" / "data" / "zorbness").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data/zorbness exists and is not a folder"):
        make_splits(ann, load_spec(spec_path), tmp_path / "o", never)
    capsys.readouterr()
    # the CLI fails before loading the (here nonexistent) model
    rc = cli_main(["splits", "--bias", str(spec_path), "--annotated", str(ann), "--out-dir", str(blocker),
                   "--model", str(tmp_path / "no_model")])
    err = capsys.readouterr().err
    assert rc == 1 and f"output folder {blocker} exists and is not a folder" in err and "Traceback" not in err


def test_splits_json_records_model_versions_seed_fractions(tmp_path):
    import rbjax

    spec_path = tmp_path / "zorb.json"
    spec_path.write_text(json.dumps(USER_SPEC), encoding="utf-8")
    ann = _annotated(tmp_path / "annotated.csv")
    res = make_splits(ann, load_spec(spec_path), tmp_path / "a", _fake_score, train_size=0.5, seed=3)
    s = json.loads(res.files["summary"].read_text())
    assert s["perplexity"]["model"] == "tests.test_splits._fake_score" == res.perplexity_model
    assert s["perplexity"]["source"] == "score function name"
    assert s["versions"]["rbjax"] == rbjax.__version__
    assert s["seed"] == 3 and s["fractions"]["train"] == 0.5 and s["fractions"]["heldout"] == 0.5
    res = make_splits(ann, load_spec(spec_path), tmp_path / "b", _fake_score, model="microsoft/DialoGPT-small")
    s = json.loads(res.files["summary"].read_text())
    assert s["perplexity"]["model"] == "microsoft/DialoGPT-small" and s["perplexity"]["source"] == "model argument"
    assert s["train_size"] == s["fractions"]["train"] == 0.6
