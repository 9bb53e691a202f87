"""``rbjax evaluate`` / rbjax.dialog.evaluate end to end on tiny models: DST on the real offline MultiWOZ test split,
CRG with DSTC-7 TSV fixtures written here and on the offline DSTC-7 contexts, ``--task all`` on a finished
``rbjax debias`` run folder, and result reuse keyed on model, data and settings (a changed input recomputes)."""
import json
import shutil

import pytest

from rbjax.cli import main
from rbjax.core.io import sha256_file
from rbjax.dialog import crg_data
from rbjax.dialog.crg_metrics import crg_metrics
from rbjax.dialog.evaluate import evaluate

# generation and scoring here run longer than they compile: XLA's default code generation is faster overall (the
# module took 40 s with it, 66 s with the suite's faster-to-compile flags)
pytestmark = [pytest.mark.filterwarnings("ignore:Some donated buffers were not usable"), pytest.mark.xla_default_codegen]


@pytest.fixture(scope="module")
def mwoz_dir(shared_dir):
    return shared_dir / "dialog-data" / "multiwoz"


def _read_jsonl(path):
    return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------------------------ --task all
def test_all_tasks_on_a_debias_run_folder(tiny_model_dir, tokenizer_dir, redditbias_dir, mwoz_dir, tmp_path,
                                          capsys):
    run = tmp_path / "run"
    assert main(["debias", "--method", "lm", "--bias", "religion1", "--model", str(tiny_model_dir), "--tokenizer",
                 str(tokenizer_dir), "--data-dir", str(redditbias_dir), "--out", str(run), "--max-steps", "1",
                 "--batch-size", "4", "--no-eval", "--no-lmp", "--no-progress"]) == 0
    out = tmp_path / "eval"
    argv = ["evaluate", "--task", "all", "--model", str(run), "--out", str(out), "--data-dir", str(redditbias_dir),
            "--multiwoz", str(mwoz_dir), "--max-examples", "24", "--max-steps", "2", "--batch-size", "4",
            "--grad-accum", "1", "--lmp-max-lines", "16", "--joint-goal", "--jga-max-dialogues", "1", "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "LMP (Reddit 6K, 16 lines)" in printed and "DST (MultiWOZ 2.0 test, 24 pairs" in printed
    assert "joint goal acc." in printed
    assert "CRG (DSTC-7, 24 responses, not fine-tuned" in printed
    res = {t: json.loads((out / f"{t}.json").read_text()) for t in ("lmp", "dst", "crg")}
    for r in res.values():  # the debiased model inside the run folder was evaluated
        assert r["status"] == "done" and r["model"]["run_folder"] == str(run)
        assert r["model"]["folder"] == str(run / "model") and "jax" in r["versions"]

    # DST on the real offline MultiWOZ 2.0 test split, trained on the val split standing in for train
    dst = res["dst"]
    d = dst["data"]
    assert d["stand_in_for"] == "train" and d["train"]["split"] == "val" and d["train"]["official"] is False
    assert "stands in" in d["train"]["note"] and any("standing in" in n for n in dst["notes"])
    assert d["test"]["split"] == "test" and d["test"]["official"] is True and d["test"]["layout"] == "convlab"
    shared_test = mwoz_dir / "ConvLab-ConvLab" / "data" / "multiwoz" / "test.json.zip"
    assert {"path": str(shared_test), "sha256": sha256_file(shared_test)} in d["test"]["files"]
    assert d["ontology"]["sha256"] == sha256_file(mwoz_dir / "thu-coai-tatk" / "tatk" / "dst" / "sumbt" / "data" /
                                                  "ontology.json")
    c = dst["counts"]  # the full offline splits (paper semantics: one negative per positive), then the cap
    assert c["test_all"] == {"n_examples": 15870, "n_positive": 7935, "n_negative": 7935}
    assert c["train_all"] == {"n_examples": 16136, "n_positive": 8068, "n_negative": 8068}
    assert c["train"] == c["test"] == {"n_examples": 24, "n_positive": 12, "n_negative": 12}
    m = dst["metrics"]
    (tn, fp), (fn, tp) = m["confusion_matrix"]
    assert tn + fp + fn + tp == 24 and fn + tp == 12 and m["n"] == 24
    assert m["accuracy"] == pytest.approx((tn + tp) / 24)
    assert m["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    assert dst["training"]["updates"] == 2 and dst["training"]["n_examples"] == 24
    j = m["joint_goal"]  # the first test dialogue (SNG0073: 4 turns, 3,012 candidate pairs) and the cost reported
    assert j["n_dialogues"] == 1 and j["n_turns"] == 4 and 0 <= j["n_correct"] <= 4
    assert j["jga"] == pytest.approx(j["n_correct"] / 4) and j["cost"]["pairs_scored"] == 3012
    assert j["cost"]["full_split"]["n_pairs"] == 4713028 and j["cost"]["seconds"] > 0
    assert [d["dialogue_idx"] for d in j["per_dialogue"]] == ["SNG0073"]
    assert dst["settings"]["max_examples"] == 24 and dst["key"]["settings"]["max_steps"] == 2
    assert len((out / "dst_train" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (out / "dst_train" / "checkpoints").exists()  # deleted once the result is written
    # LMP of the exported model; CRG with the offline contexts and the reference-free metrics
    assert res["lmp"]["metrics"]["n_scored_lines"] == 16 and res["lmp"]["data"]["lmp_file"]["official"] is True
    assert res["crg"]["fine_tuned"] is False and res["crg"]["metrics"]["bleu"] is None
    assert len(_read_jsonl(out / "crg_responses.jsonl")) == 24

    # the same command again: every result is reused, nothing is recomputed or rewritten
    before = {t: (out / f"{t}.json").read_bytes() for t in res}
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert cap.err.count("reusing it (nothing recomputed") == 3 and cap.out.count("(reused:") == 3
    assert before == {t: (out / f"{t}.json").read_bytes() for t in res}


def test_model_argument_forms(tiny_model_dir, tmp_path, capsys):
    from rbjax.dialog.evaluate import resolve_model

    m = resolve_model(tiny_model_dir)
    assert m.folder == tiny_model_dir and m.run_folder is None
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoints").mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="run folder without a finished, exported model"):
        resolve_model(unfinished)
    assert main(["evaluate", "--task", "lmp", "--model", str(unfinished), "--out", str(tmp_path / "o")]) == 1
    assert "finish the run" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        resolve_model(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------ reuse
def test_lmp_reuse_and_recompute(tiny_model_dir, tokenizer_dir, tmp_path, capsys):
    from rbjax.dialog.reddit_perplexity import model_perplexity
    from rbjax.model.gpt2 import init_params
    from rbjax.model.hf import load_pretrained, save_pretrained

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    lines = tmp_path / "ref.txt"
    lines.write_text("\n".join(["i think so too", "that is a great idea , thanks !", "no way", "lol same",
                                "what do you mean ?", "it was fine"]) + "\n")
    out = tmp_path / "out"
    r1 = evaluate("lmp", model, out, lmp_file=lines, progress=False)
    assert r1["reused"] is False and r1["data"]["lmp_file"]["official"] is False
    # the same figure as rbjax.dialog.reddit_perplexity's own entry point
    assert r1["metrics"]["perplexity"] == pytest.approx(model_perplexity(model, lines)["perplexity"], rel=1e-6)
    capsys.readouterr()
    r2 = evaluate("lmp", model, out, lmp_file=lines, progress=False)
    assert r2["reused"] is True and r2["metrics"] == r1["metrics"] and "reusing it" in capsys.readouterr().err
    # a changed setting, data file or model is recomputed (never relabelled), replacing the result only with
    # overwrite (another result is never replaced silently; nothing is computed)
    from rbjax.core.reuse import OutputExists

    with pytest.raises(OutputExists, match=r"lmp.json: holds the lmp result of other inputs .*lmp_max_lines"):
        evaluate("lmp", model, out, lmp_file=lines, lmp_max_lines=3, progress=False)
    assert json.loads((out / "lmp.json").read_text())["metrics"] == r1["metrics"]
    r3 = evaluate("lmp", model, out, lmp_file=lines, lmp_max_lines=3, progress=False, overwrite=True)
    assert r3["reused"] is False and r3["metrics"]["n_scored_lines"] == 3
    assert "settings.lmp_max_lines: None → 3" in capsys.readouterr().err
    lines.write_text("something else entirely\nand more\n")
    r4 = evaluate("lmp", model, out, lmp_file=lines, lmp_max_lines=3, progress=False, overwrite=True)
    assert r4["reused"] is False and r4["metrics"]["n_scored_lines"] == 2
    assert "data.lmp_file" in capsys.readouterr().err
    config, _ = load_pretrained(model)
    save_pretrained(init_params(config, 7), config, model, tokenizer_dir=tokenizer_dir)  # new weights, same folder
    r5 = evaluate("lmp", model, out, lmp_file=lines, lmp_max_lines=3, progress=False, overwrite=True)
    assert r5["reused"] is False and r5["metrics"]["perplexity"] != r4["metrics"]["perplexity"]
    assert r5["key"]["model"] != r4["key"]["model"] and "model:" in capsys.readouterr().err
    assert json.loads((out / "lmp.json").read_text())["metrics"] == r5["metrics"]


# ------------------------------------------------------------------------------------------------ CRG
def _tsv(path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_crg_fine_tune_generate_and_score_with_references(tiny_model_dir, tmp_path):
    contexts = ["START EOS what are you reading these days ?", "START EOS any tips for a first marathon ?",
                "START EOS is the new phone worth it ? EOS depends on what you use it for",
                "START EOS best pizza topping ?", "START EOS how do i learn to cook ?"]
    replies = ["a book about trains", "start slow and rest", "i use it for photos", "pineapple , obviously",
               "start with eggs"]
    train = _tsv(tmp_path / "train.txt", [[f"t{i:02d}", "AskReddit", f"c{i}", str(i), "2", contexts[i % 5],
                                          replies[(i + 1) % 5]] for i in range(12)])
    test = _tsv(tmp_path / "test.txt", [[f"k{i}", "AskReddit", f"d{i}", "1", "2", contexts[i], "__UNDISCLOSED__"]
                                        for i in range(5)])
    refs = [tmp_path / "ref0.txt", tmp_path / "ref1.txt"]
    refs[0].write_text("\n".join(replies) + "\n")
    refs[1].write_text("\n".join(r.upper() + " !" for r in replies) + "\n")
    out = tmp_path / "out"
    res = evaluate("crg", tiny_model_dir, out, train_file=train, test_file=test, refs=refs, max_steps=1,
                   batch_size=4, grad_accum=1, meteor=False, progress=False)
    assert res["fine_tuned"] is True and res["training"]["updates"] == 1
    assert res["training"]["examples"]["n_examples"] == 12 and res["training"]["examples"]["n_dropped_too_long"] == 0
    recs = _read_jsonl(out / "crg_responses.jsonl")
    assert [r["key"] for r in recs] == [f"k{i}" for i in range(5)] and [r["context"] for r in recs] == contexts
    hyps = (out / "crg_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert hyps == [" ".join(r["response"].split()) for r in recs]
    # the metrics are crg_metrics of the written hypotheses against the reference files (cleaned: the default)
    want = crg_metrics(hyps, crg_data.read_reference_sets(refs, 5), clean=True, compute_meteor=False)
    m = res["metrics"]
    for k in ("bleu", "nist", "entropy", "dist", "avg_len"):
        assert m[k] == pytest.approx(want[k])
    assert len(m["bleu"]) == 4 and len(m["nist"]) == 4 and m["meteor"] is None
    assert "not requested" in m["null_reasons"]["meteor"] and m["headline"]["bleu4"] == m["bleu"][3]
    assert m["n_references"] == 2 and res["settings"]["clean"] is True
    assert res["data"]["train"]["sha256"] == sha256_file(train) and len(res["data"]["refs"]) == 2
    assert res["outputs"]["responses"]["sha256"] == sha256_file(out / "crg_responses.jsonl")
    assert not (out / "crg_train" / "checkpoints").exists() and (out / "crg_train" / "metrics.jsonl").exists()
    # bad inputs are named before any work
    _tsv(tmp_path / "test4.txt", [[f"k{i}", "s", "d", "1", "2", contexts[i], ""] for i in range(4)])
    with pytest.raises(ValueError, match="ref0.txt has 5 lines but there are 4 test examples"):
        evaluate("crg", tiny_model_dir, out, test_file=tmp_path / "test4.txt", refs=refs, progress=False)
    bad = _tsv(tmp_path / "bad.txt", [["t0", "s", "c", "1", "2", "ctx", "resp"], ["t1", "s", "c", "x", "2", "c", "r"]])
    with pytest.raises(ValueError, match=r"--train-file .*bad.txt line 2: score \(field 4\) must be an integer"):
        evaluate("crg", tiny_model_dir, out, train_file=bad, test_file=test, progress=False)


def test_crg_offline_default_contexts(tiny_model_dir, redditbias_dir, tmp_path, capsys):
    out = tmp_path / "out"
    res = evaluate("crg", tiny_model_dir, out, data_dir=redditbias_dir, max_examples=8, progress=False)
    first = crg_data.read_response_hyp(redditbias_dir / crg_data.RESPONSE_HYP)[:8]
    recs = _read_jsonl(out / "crg_responses.jsonl")
    assert [(r["key"], r["context"]) for r in recs] == first
    assert res["fine_tuned"] is False and res["training"] is None
    assert any("not fine-tuned" in n for n in res["notes"]) and res["data"]["test"]["n_rows"] == 1472
    assert res["data"]["test"]["stand_in_for"] and res["data"]["n_test_examples"] == 8
    m = res["metrics"]
    hyps = (out / "crg_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    want = crg_metrics(hyps, None, clean=True)
    assert m["entropy"] == pytest.approx(want["entropy"]) and m["dist"] == pytest.approx(want["dist"])
    assert m["avg_len"] == pytest.approx(want["avg_len"])
    for k in ("bleu", "nist", "meteor"):
        assert m[k] is None and "no references" in m["null_reasons"][k]
    # a changed output file is not trusted: the result is recomputed, and seeded sampling gives the same responses
    (out / "crg_responses.jsonl").write_text("tampered\n")
    capsys.readouterr()
    with pytest.raises(ValueError, match="was changed since the result was computed.*--overwrite"):
        evaluate("crg", tiny_model_dir, out, data_dir=redditbias_dir, max_examples=8, progress=False)
    res2 = evaluate("crg", tiny_model_dir, out, data_dir=redditbias_dir, max_examples=8, progress=False,
                    overwrite=True)
    assert res2["reused"] is False and "was changed since the result was computed" in capsys.readouterr().err
    assert _read_jsonl(out / "crg_responses.jsonl") == recs and res2["metrics"]["entropy"] == m["entropy"]
    # another seed: recomputed, other samples
    res3 = evaluate("crg", tiny_model_dir, out, data_dir=redditbias_dir, max_examples=8, seed=7, progress=False,
                    overwrite=True)
    assert res3["reused"] is False and _read_jsonl(out / "crg_responses.jsonl") != recs


# ------------------------------------------------------------------------------------------------ errors
def test_settings_and_cli_errors(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "o"
    with pytest.raises(ValueError, match="unknown setting\\(s\\) max_exampels"):
        evaluate("dst", tiny_model_dir, out, max_exampels=3)
    with pytest.raises(ValueError, match="max_examples must be a positive integer"):
        evaluate("dst", tiny_model_dir, out, max_examples=0)
    with pytest.raises(ValueError, match="semantics must be one of"):
        evaluate("crg", tiny_model_dir, out, semantics="faithful")
    with pytest.raises(ValueError, match="with task='all' pass dst_train_file"):
        evaluate("all", tiny_model_dir, out, train_file="x")
    with pytest.raises(ValueError, match="unknown task 'bleu'"):
        evaluate("bleu", tiny_model_dir, out)
    # a path that was given but does not exist is named, never replaced by a download
    with pytest.raises(FileNotFoundError, match=r"--multiwoz .*nowhere: not found"):
        evaluate("dst", tiny_model_dir, out, multiwoz=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"--refs .*r1.txt: not found"):
        evaluate("crg", tiny_model_dir, out, refs=[str(tmp_path / "r1.txt")])
    assert main(["evaluate", "--task", "dst", "--model", str(tiny_model_dir), "--out", str(out), "--multiwoz",
                 str(tmp_path / "nowhere")]) == 1
    assert "nowhere: not found" in capsys.readouterr().err
    assert main(["evaluate", "--task", "all", "--model", str(tiny_model_dir), "--out", str(out), "--train-file",
                 "x"]) == 1
    assert "--dst-train-file" in capsys.readouterr().err
    assert main(["evaluate", "--task", "dst", "--out", str(out)]) == 1
    assert "needs --model" in capsys.readouterr().err
    assert not any(out.glob("*.json"))


def test_an_empty_or_wrong_multiwoz_folder_is_refused_by_name(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Field case: `evaluate --task dst --multiwoz <empty or wrong folder>` said "cannot download … pass a local
    MultiWOZ 2.0 copy … as --multiwoz", which the user had just done (the support files were fetched first)."""
    monkeypatch.setenv("RBJAX_MULTIWOZ_URL", "http://127.0.0.1:9/nothing")  # a download attempt would fail
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    empty = tmp_path / "empty"
    empty.mkdir()
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "notes.txt").write_text("not MultiWOZ\n")
    out = tmp_path / "o"
    for folder in (empty, wrong):
        with pytest.raises(FileNotFoundError, match=rf"{folder}: no MultiWOZ 2.0 test data found"):
            evaluate("dst", tiny_model_dir, out, multiwoz=folder)
        assert main(["evaluate", "--task", "dst", "--model", str(tiny_model_dir), "--out", str(out), "--multiwoz",
                     str(folder)]) == 1
        err = capsys.readouterr().err
        assert f"{folder}: no MultiWOZ 2.0 test data found" in err and "download" not in err


def test_sigterm_during_the_dst_evaluation_stops_after_the_batch_in_flight(tiny_model_dir, mwoz_dir, tmp_path,
                                                                          monkeypatch):
    """The `rbjax` command's SIGTERM while DST scores its test pairs (after training): the batch in flight is
    finished, no other one runs, the message says the evaluation stopped and the training is kept (its checkpoint),
    and the same command again reuses the training and writes the result."""
    import os
    import signal

    from rbjax.cli import stop_on_sigterm
    from rbjax.core.interrupt import Interrupted
    from rbjax.dialog import state_tracking

    real_predict, real_batches = state_tracking.predict_proba, state_tracking.dst_batches
    seen = []

    def batches(*a, **kw):  # the test pairs' batches: SIGTERM once the first one is scored
        for b in real_batches(*a, **kw):
            if seen is not None and len(seen) == 1 and not got:  # (the first evaluation only)
                os.kill(os.getpid(), signal.SIGTERM)
            if seen is not None:
                seen.append(1)
            yield b

    def predict(*a, **kw):  # armed for the evaluation only (prediction_widths also walks the batches)
        nonlocal seen
        seen = []
        try:
            return real_predict(*a, **kw)
        finally:
            got.append(len(seen))
            seen = None

    got = []
    seen = None
    monkeypatch.setattr(state_tracking, "dst_batches", batches)
    monkeypatch.setattr(state_tracking, "predict_proba", predict)
    kw = dict(multiwoz=mwoz_dir, max_examples=24, max_steps=1, batch_size=4, grad_accum=1, eval_batch_size=4,
              progress=False)
    out = tmp_path / "o"
    previous = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()  # as the console script installs it
    try:
        with pytest.raises(KeyboardInterrupt) as ei:
            evaluate("dst", tiny_model_dir, out, **kw)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert got == [2]  # of 6 batches: the one in flight when the signal came was finished, no other
    msg = str(ei.value)
    assert isinstance(ei.value, Interrupted) and "SIGTERM" in msg, msg
    assert "dst stopped during the scoring of the test pairs; dst.json was not written" in msg
    assert f"training is finished and kept (1/1 updates, checkpoint in {out / 'dst_train' / 'checkpoints'})" in msg
    assert (out / "dst_train" / "checkpoints").is_dir() and not (out / "dst.json").exists()
    res = evaluate("dst", tiny_model_dir, out, **kw)
    assert got == [2, 6] and res["training"]["resumed_from"] == 1 and res["metrics"]["n"] == 24
    assert (out / "dst.json").exists()
