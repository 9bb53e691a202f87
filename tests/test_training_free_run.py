"""``rbjax debias --method sentence-debias|inlp``: the run folder (projection, pairs, keys, the folded model) on the
tiny GPT-2, read back as every consumer reads a run (ModelHandle.open on the run folder)."""
import csv

import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.cli import main
from rbjax.debias.training_free import ProjectionRun, counterfactual_sets, read_pairs_csv, run_training_free
from rbjax.debias.config import bias_spec
from rbjax.model.handle import ModelHandle
from rbjax.model.hf import load_pretrained
from rbjax.model.registry import family_of_config

from .conftest import religion1_train_file


@pytest.fixture(scope="module")
def corpus(redditbias_dir, tmp_path_factory):
    return religion1_train_file(redditbias_dir, tmp_path_factory.mktemp("corpus"), 24)


def test_counterfactual_sets_swap_the_targets():
    spec = bias_spec("religion1")
    groups, sets = counterfactual_sets(["the jews are greedy", "nothing here", "Christians are kind",
                                        "the jews are greedy"], spec)
    assert groups == [spec.t1_group, spec.t2_group]
    assert sets[0] == ["the jews are greedy", "the christians are greedy"]
    assert len(sets) == 2 and sets[1][1] == "Christians are kind"  # T2 → T1, the repeat and the no-target skipped
    with pytest.raises(ValueError, match="no sentence holds a target term"):
        counterfactual_sets(["nothing here"], spec)


def test_read_pairs_csv_names_bad_rows(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("a,b\nx one,y one\nx two,\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.csv: row 3: expected 2 non-empty"):
        read_pairs_csv(p)
    p.write_text("a\nx\n", encoding="utf-8")
    with pytest.raises(ValueError, match="row 1: the header must name at least 2 groups"):
        read_pairs_csv(p)


def test_sentence_debias_run_folder_is_read_as_a_run(tiny_model_dir, redditbias_dir, corpus, tmp_path):
    out = tmp_path / "sd"
    rc = main(["debias", "--method", "sentence-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
               "--data-dir", str(redditbias_dir), "--corpus", corpus, "--out", str(out)])
    assert rc == 0
    for f in ("results.json", "projection.npy", "subspace.npy", "pairs.csv", "model/config.json"):
        assert (out / f).exists(), f
    import json
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["method"] == "sentence-debias" and res["projection"]["removed"] == 1
    assert set(res["key"]) == {"method", "settings", "model", "tokenizer", "pairs", "bos"}
    p = np.load(out / "projection.npy")
    v = np.load(out / "subspace.npy")
    assert v.shape == (1, 32)
    np.testing.assert_allclose(p, np.eye(32) - v.T @ v, atol=1e-12)
    with open(out / "pairs.csv", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["jews", "christians"] and len(rows) - 1 == res["sets"] > 0

    # the run folder as measure / evaluate / compare / export open it: the base with the head W·P, untied
    handle = ModelHandle.open(out)
    assert handle.run_folder == out
    cfg, params, _ = handle.load()
    base_cfg, base = load_pretrained(tiny_model_dir)
    assert not cfg.tie_word_embeddings and base_cfg.tie_word_embeddings
    w = np.asarray(base["wte"]["embedding"], np.float64)
    np.testing.assert_allclose(np.asarray(params["lm_head"]["embedding"]), w @ p, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(params["wte"]["embedding"]), np.asarray(base["wte"]["embedding"]))
    ids = jnp.asarray([[464, 14177, 389, 257, 1332]], jnp.int32)
    mod = family_of_config(cfg).module(cfg)
    logits, _ = mod.apply({"params": params}, ids)
    _, h = family_of_config(base_cfg).module(base_cfg).apply({"params": base}, ids)
    ref = (np.asarray(h[0], np.float64) @ p) @ w.T
    np.testing.assert_allclose(np.asarray(logits[0]), ref, atol=1e-4)

    # the memory plan that measure / evaluate make first knows the untied GPT-2 head (its logical axes)
    from rbjax.model.memory import plan_for_model
    plan = plan_for_model(ModelHandle.open(out), mesh=None, training=False, batch_size=1, seq_len=8)
    assert plan.format()

    # export: the folded model with a card that names the method and what was projected
    from rbjax.study.export import export_model
    exp = export_model(out, tmp_path / "export")
    card = exp["card"].read_text(encoding="utf-8")
    assert "with sentence-debias (rbjax, no training)" in card and "SentenceDebias (Liang et al." in card
    assert "1 direction(s) (k = 1) of the 32-dimensional final hidden state" in card
    assert "W ← W·P" in card and f"{res['sets']} sets of (jews, christians)" in card
    assert "- \"debiasing-sentence-debias\"" in card and "Training data" not in card
    assert (tmp_path / "export" / "model.safetensors").read_bytes() == (out / "model" / "model.safetensors").read_bytes()

    # the same command reuses the finished run; other settings in the same folder are refused
    again = run_training_free(ProjectionRun(method="sentence-debias", bias_type="religion1",
                                            model=str(tiny_model_dir), out_dir=str(out), corpus=corpus,
                                            data_dir=str(redditbias_dir)))
    assert again.get("reused")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_training_free(ProjectionRun(method="sentence-debias", bias_type="religion1", model=str(tiny_model_dir),
                                        out_dir=str(out), corpus=corpus, k=2, data_dir=str(redditbias_dir)))
    # --overwrite replaces the run whole, or not at all: one that fails after the checks leaves the earlier run as it
    # was (it used to be deleted first), and one that succeeds leaves none of its files
    before = {f.relative_to(out): f.read_bytes() for f in out.rglob("*") if f.is_file()}
    k2 = ProjectionRun(method="sentence-debias", bias_type="religion1", model=str(tiny_model_dir), out_dir=str(out),
                       corpus=corpus, k=2, data_dir=str(redditbias_dir))
    import rbjax.debias.training_free as tf

    def broken(*a, **kw):
        raise RuntimeError("the fit failed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tf, "fit_projection", broken)
        with pytest.raises(RuntimeError, match="the fit failed"):
            run_training_free(k2, overwrite=True)
    assert {f.relative_to(out): f.read_bytes() for f in out.rglob("*") if f.is_file()} == before
    (out / "model" / "stale.txt").write_text("an earlier run's file")
    assert run_training_free(k2, overwrite=True)["settings"]["k"] == 2
    assert not (out / "model" / "stale.txt").exists() and np.load(out / "subspace.npy").shape[0] == 2


def test_inlp_run_from_ready_made_pairs(tiny_model_dir, corpus, tmp_path):
    spec = bias_spec("religion1")
    lines = [ln for ln in open(corpus, encoding="utf-8").read().splitlines() if ln.strip()]
    groups, sets = counterfactual_sets(lines, spec)
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([["g1", "g2"]] + sets)
    res = run_training_free(ProjectionRun(method="inlp", bias_type="religion1", model=str(tiny_model_dir),
                                          out_dir=str(tmp_path / "inlp"), pairs=str(pairs), iterations=3))
    p = np.load(tmp_path / "inlp" / "projection.npy")
    assert np.abs(p - p.T).max() < 1e-12 and np.abs(p @ p - p).max() < 1e-10
    fit = res["fit"]
    assert res["groups"] == ["g1", "g2"] and res["projection"]["removed"] == fit["classifiers"]
    assert len(fit["history"]) <= 3 and [h["rank"] for h in fit["history"] if h["kept"]] == \
        [32 - i for i in range(1, fit["classifiers"] + 1)]
    assert np.load(tmp_path / "inlp" / "subspace.npy").shape == (fit["classifiers"], 32)
    from rbjax.study.export import export_model
    card = export_model(tmp_path / "inlp", tmp_path / "export")["card"].read_text(encoding="utf-8")
    assert f"{fit['classifiers']} of the 32 dimensions" in card
    assert f"row spaces of {fit['classifiers']} linear classifier(s) of the group (at most 3; stopped: " \
           f"{fit['stopped']}" in card and "INLP, iterative nullspace projection" in card


def test_corpus_and_pairs_are_alternatives(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="alternatives"):
        ProjectionRun(method="inlp", bias_type="religion1", model=str(tiny_model_dir), out_dir=str(tmp_path),
                      corpus="a.txt", pairs="b.csv")


def test_default_pairs_are_the_training_phrases_swapped(redditbias_dir):
    from rbjax.debias.cda import read_train_phrases

    phrases = read_train_phrases("religion1", redditbias_dir)
    groups, sets = counterfactual_sets(phrases, bias_spec("religion1"))
    assert groups == ["jews", "christians"] and len(sets) > len(phrases) // 2
    assert all(a != b for a, b in sets) and len({tuple(s) for s in sets}) == len(sets)


def test_corpus_is_an_option_of_the_training_free_methods_only(capsys):
    with pytest.raises(SystemExit, match="^--method hd: --corpus would have no effect"):
        main(["debias", "--method", "hd", "--bias", "religion1", "--corpus", "x.txt"])
