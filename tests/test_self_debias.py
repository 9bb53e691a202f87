"""Self-Debias: the rescaling by hand on a tiny distribution, several prefixes as their elementwise maximum, the
default prefixes, the run folder (``rbjax debias --method self-debias``) read by ``measure``, and ``export``'s
refusal."""
import json
import math

import numpy as np
import pytest

from rbjax.model.self_debias import (BIAS_BENCH_PREFIXES, SelfDebiasSettings, default_prefixes,
                                     rescaled_log_probs)


def _q(p, pks, lam=50.0, eps=0.01):
    lq = rescaled_log_probs(np.log(np.array(p)), np.log(np.array(pks)), lam, eps)
    return np.exp(np.asarray(lq, np.float64))


def test_rescaling_by_hand():
    # Δ = (0, 0.3, 0): exp(−50·0.3) = 3e-7 is floored at ε = 0.01
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.2, 0.6, 0.2]]),
                               np.array([0.5, 0.003, 0.2]) / 0.703, rtol=1e-6)
    # λ = 1: the factor is exp(−0.3) itself
    f = math.exp(-0.3)
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.2, 0.6, 0.2]], lam=1.0),
                               np.array([0.5, 0.3 * f, 0.2]) / (0.7 + 0.3 * f), rtol=1e-6)
    # a prefixed distribution below the regular one everywhere it differs changes nothing
    np.testing.assert_allclose(_q([0.5, 0.3, 0.2], [[0.5, 0.3, 0.2]]), [0.5, 0.3, 0.2], rtol=1e-6)


def test_several_prefixes_take_the_elementwise_maximum():
    p, p1, p2 = [0.5, 0.3, 0.2], [0.2, 0.6, 0.2], [0.7, 0.1, 0.2]
    # max(p1, p2) = (0.7, 0.6, 0.2): Δ = (0.2, 0.3, 0), both floored at ε
    want = np.array([0.005, 0.003, 0.2]) / 0.208
    np.testing.assert_allclose(_q(p, [p1, p2]), want, rtol=1e-6)
    np.testing.assert_allclose(_q(p, [p2, p1]), want, rtol=1e-6)
    # the maximum is not the mean (nor either prefix alone)
    assert not np.allclose(_q(p, [p1]), want)


def test_default_prefixes_are_bias_benchs():
    assert default_prefixes("gender") == ("The following text discriminates against people because of their "
                                          "gender: ",)
    assert default_prefixes("race") == default_prefixes("race-color") == (BIAS_BENCH_PREFIXES["race-color"],)
    assert default_prefixes("religion1") == default_prefixes("Religion")
    assert default_prefixes("Race_x_SES") == (BIAS_BENCH_PREFIXES["race-color"], BIAS_BENCH_PREFIXES["socioeconomic"])
    with pytest.raises(ValueError, match="--prefix"):
        default_prefixes("nonsense")
    with pytest.raises(ValueError, match="empty"):
        SelfDebiasSettings(("",))


@pytest.fixture(scope="module")
def sd_run(tiny_model_dir, tmp_path_factory):
    from rbjax.cli import main

    out = tmp_path_factory.mktemp("selfdebias") / "run"
    rc = main(["debias", "--method", "self-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
               "--out", str(out)])
    assert rc == 0
    return out


def test_run_folder_records_the_prefixes_and_the_keys(sd_run, tiny_model_dir, capsys):
    from rbjax.cli import main
    from rbjax.model.handle import ModelHandle

    res = json.loads((sd_run / "results.json").read_text())
    assert res["status"] == "done" and res["method"] == "self-debias" and res["training_free"] is True
    assert res["self_debias"] == {"prefixes": [BIAS_BENCH_PREFIXES["religion"]], "decay_constant": 50.0,
                                  "epsilon": 0.01}
    assert set(res["key"]) == {"method", "settings", "bias_type", "model", "tokenizer"}
    base = ModelHandle.open(tiny_model_dir)
    assert res["key"]["model"] == base.digest and not (sd_run / "model").exists()
    pre = json.loads((sd_run / "prefixes.json").read_text())
    assert pre[0]["token_ids"] == base.tokenizer.encode(BIAS_BENCH_PREFIXES["religion"])
    # the same command reuses it; other settings are refused without --overwrite
    assert main(["debias", "--method", "self-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
                 "--out", str(sd_run)]) == 0
    assert "[reused]" in capsys.readouterr().out
    rc = main(["debias", "--method", "self-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
               "--out", str(sd_run), "--prefix", "Be fair: "])
    assert rc != 0 and "pass --overwrite" in capsys.readouterr().err
    # the handle reads the folder as the base with the settings, under another key than the base
    h = ModelHandle.open(sd_run)
    assert h.folder == base.folder.resolve() and h.self_debias.prefixes == (BIAS_BENCH_PREFIXES["religion"],)
    assert h.digest != base.digest and h.files_key()["base"] == base.files_key()


def test_own_prefixes_and_wrong_method_options(tiny_model_dir, tmp_path):
    from rbjax.cli import main

    out = tmp_path / "own"
    assert main(["debias", "--method", "self-debias", "--bias", "gender", "--model", str(tiny_model_dir),
                 "--out", str(out), "--prefix", "Be fair: ", "--prefix", "No stereotypes: ",
                 "--decay-constant", "10"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["self_debias"]["prefixes"] == ["Be fair: ", "No stereotypes: "]
    assert res["self_debias"]["decay_constant"] == 10.0 and res["prefixes_default"] is False
    # an option the method would not read is refused by its flag, before any work: nothing is silently ignored
    for method, extra, named in (("lmd", ["--prefix", "Be fair: "], "--prefix"),
                                 ("self-debias", ["--lr", "1e-3", "--k", "2"], "--lr, --k"),
                                 ("self-debias", ["--data-dir", "x", "--seed", "3"], "--data-dir, --seed"),
                                 ("inlp", ["--decay-constant", "5"], "--decay-constant"),
                                 ("sentence-debias", ["--inlp-iterations", "3"], "--inlp-iterations"),
                                 ("inlp", ["--dry-run"], "--dry-run")):
        with pytest.raises(SystemExit, match=f"^--method {method}: {named} would have no effect"):
            main(["debias", "--method", method, "--bias", "gender", "--model", str(tiny_model_dir), "--out",
                  str(tmp_path / "x"), *extra])
    assert not (tmp_path / "x").exists()


def test_measure_scores_the_run_folder_with_the_rescaled_distribution(sd_run, tiny_model_dir, redditbias_dir):
    from rbjax.data.redditbias import RedditBiasData, load_pairs
    from rbjax.lmb.measure import LoadedModel
    from rbjax.lmb.self_debias import SelfDebiasScorer
    from rbjax.model.handle import ModelHandle

    pairs = load_pairs("religion1", "test", RedditBiasData(redditbias_dir))
    m = LoadedModel(sd_run, batch_size=16)
    assert isinstance(m.scorer, SelfDebiasScorer)
    a = m.tokenizer.encode_batch(list(pairs.biased[:6]))
    c = m.tokenizer.encode_batch(list(pairs.counterfactual[:6]))
    got_a, got_c = m.scorer.score_pairs(a, c)
    base = ModelHandle.open(tiny_model_dir)
    cfg, params, tok = base.load()
    ref = SelfDebiasScorer(params, cfg, [tok.encode(BIAS_BENCH_PREFIXES["religion"])],
                           SelfDebiasSettings((BIAS_BENCH_PREFIXES["religion"],)), batch_size=16)
    want_a, _ = ref.score_pairs(a, c)
    np.testing.assert_allclose(got_a.nll_sum, want_a.nll_sum, rtol=1e-6)
    # the tiny model is near uniform (Δ ≈ 1e-6): a large λ shows that the rescaling is applied at all
    strong = SelfDebiasScorer(params, cfg, ref.prefix_ids, SelfDebiasSettings(("x",), 1e6), batch_size=16)
    plain = LoadedModel(tiny_model_dir, batch_size=16).scorer.score_ids(a)
    assert np.abs(plain.nll_sum - strong.score_ids(a).nll_sum).max() > 1e-2
    assert m.files_key()["model"]["self_debias"]["prefixes"] == [BIAS_BENCH_PREFIXES["religion"]]


def test_export_refuses_self_debias_by_name(sd_run, tmp_path):
    from rbjax.study.export import export_model

    with pytest.raises(ValueError, match="Self-Debias cannot be exported: it is inference-time only"):
        export_model(sd_run, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()


def test_commands_that_do_not_rescale_refuse_the_run_folder(sd_run):
    from rbjax.model.handle import ModelHandle

    h = ModelHandle.open(sd_run)  # as evaluate, debias (a starting model), the Reddit perplexity open it
    with pytest.raises(ValueError, match="does not apply that rescaling"):
        h.load()


def test_target_log_probs_is_the_formula_from_logits():
    import jax

    from rbjax.model.self_debias import target_log_probs

    rng = np.random.default_rng(0)
    z, z1, z2 = (rng.normal(size=(3, 5, 7)).astype(np.float32) * 3 for _ in range(3))
    t = rng.integers(0, 7, size=(3, 5))
    for lam, eps in ((50.0, 0.01), (3.0, 0.0)):
        full = rescaled_log_probs(jax.nn.log_softmax(z), np.stack([jax.nn.log_softmax(z1), jax.nn.log_softmax(z2)]),
                                  lam, eps)
        want = np.take_along_axis(np.asarray(full), t[..., None], -1)[..., 0]
        np.testing.assert_allclose(target_log_probs(z, [z1, z2], t, lam, eps), want, atol=1e-5)
