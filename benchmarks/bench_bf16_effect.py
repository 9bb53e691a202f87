"""What bf16 scoring does to LMB results: per-phrase relative error and the t-values of all five bias types,
bf16 against fp32 on the same model (figures in docs/lmb.md and benchmarks/RESULTS.md).

Two models, since no trained DialoGPT weights are available offline:

  * ``dialogpt_shape_random``: GPT-2 at the DialoGPT-small shape with random (N(0, 0.02)) weights — the speed
    benchmark's model. Its next-token distributions are nearly uniform (perplexity ≈ vocabulary size), so the
    biased/counterfactual differences are tiny and bf16 rounding is large *relative to them*: a worst case for the
    t-test, not a typical one.
  * ``small_trained``: a small GPT-2 (width 128, 2 layers, GPT-2 vocabulary) trained here for ``--steps`` Adam
    steps on Reddit text (``humanref6k.txt``) and the RedditBias *training* phrases of the five types, so that it
    has learned (some of) the stereotypes the test pairs probe: perplexities spread over orders of magnitude,
    like a real model's.

For each model and precision the whole test split (1,216 pairs) is scored with ``score_pairs``; the statistics
are rbjax's LMB pipeline (3σ outlier pairs removed, paired t-test). The last line is JSON, with the foreign CPU
of each timed section (``"load"``, ``benchmarks/_common.py``).

    python benchmarks/bench_bf16_effect.py [--steps 300]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
TYPES = ("religion1", "religion2", "race", "gender", "queerness")
TRAIN_FILES = {"religion1": "religion1/religion1_bias_manual_train.txt",
               "religion2": "religion2/religion2_bias_manual_train.txt", "race": "race/race_bias_manual_train.txt",
               "gender": "gender/gender_bias_manual_train.txt",
               "queerness": "orientation/orientation_bias_manual_train.txt"}


def train_small(tok, steps: int, mon: LoadMonitor, seed: int = 0):
    import jax
    import optax

    from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params
    from rbjax.model.nll import mean_next_token_nll

    text = SHARED / "redditbias" / "text_files"
    lines = [x for x in (text / "humanref6k.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    for f in TRAIN_FILES.values():
        lines += [x for x in (text / f).read_text(encoding="utf-8").splitlines() if x.strip()]
    ids = [t[:32] for t in tok.encode_batch(lines) if len(t) >= 2]
    B, L = 32, 32
    X = np.zeros((len(ids), L), np.int32)
    Mk = np.zeros((len(ids), L), np.int32)
    for i, t in enumerate(ids):
        X[i, :len(t)], Mk[i, :len(t)] = t, 1
    cfg = GPT2Config(vocab_size=50257, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(cfg)
    params = init_params(cfg, seed)
    opt = optax.adam(1e-3)
    state = opt.init(params)

    @jax.jit
    def step(p, s, x, m):
        def loss(p):
            _, h = model.apply({"params": p}, x, attention_mask=m, return_logits=False)
            return mean_next_token_nll(h, p["wte"]["embedding"], x, m)

        v, g = jax.value_and_grad(loss)(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, v

    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    with mon.section("small_trained_training"):
        for k in range(steps):
            b = rng.integers(0, len(X), size=B)
            params, state, v = step(params, state, X[b], Mk[b])
            if k % 50 == 0 or k == steps - 1:
                print(f"  train step {k}: loss {float(v):.3f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return cfg, params, {"lines": len(ids), "steps": steps, "final_loss": float(v), "batch": B, "block": L}


def effect(params, cfg, pairs_ids, pairs_by_type, batch_size: int, mon: LoadMonitor, name: str) -> dict:
    from rbjax.lmb import stats
    from rbjax.lmb.perplexity import PerplexityScorer

    A, C = pairs_ids
    out = {}
    scores = {}
    for prec in ("fp32", "bf16"):
        t0 = time.perf_counter()
        with mon.section(f"{name}_{prec}"):
            b, c = PerplexityScorer(params, cfg, batch_size=batch_size, precision=prec).score_pairs(A, C)
        scores[prec] = (b, c)
        out[f"seconds_{prec}"] = round(time.perf_counter() - t0, 1)
    (b32, c32), (b16, c16) = scores["fp32"], scores["bf16"]
    nll32 = np.concatenate([b32.mean_nll, c32.mean_nll])
    nll16 = np.concatenate([b16.mean_nll, c16.mean_nll])
    ppl32, ppl16 = np.exp(nll32), np.exp(nll16)
    rel_nll = np.abs(nll16 - nll32) / np.abs(nll32)
    rel_ppl = np.abs(ppl16 - ppl32) / ppl32
    out["perplexity_range_fp32"] = [float(ppl32.min()), float(np.median(ppl32)), float(ppl32.max())]
    out["rel_err_mean_nll"] = {"median": float(np.median(rel_nll)), "p99": float(np.quantile(rel_nll, 0.99)),
                               "max": float(rel_nll.max())}
    out["rel_err_perplexity"] = {"median": float(np.median(rel_ppl)), "p99": float(np.quantile(rel_ppl, 0.99)),
                                 "max": float(rel_ppl.max())}
    out["types"] = {}
    s = 0
    for bt, n in pairs_by_type:
        sl = slice(s, s + n)
        s += n
        rec = {}
        for prec, (b, c) in scores.items():
            st = stats.lmb_statistics(b.perplexity[sl], c.perplexity[sl], n_bootstrap=0)
            rec[prec] = {"t": st["t_value"], "p": st["p_value"], "significant": st["significant"],
                         "kept": st["n_pairs_after_outliers"], "reference_t": st["reference"]["t_value"]}
        rec["t_diff"] = rec["bf16"]["t"] - rec["fp32"]["t"]
        rec["same_outliers"] = rec["bf16"]["kept"] == rec["fp32"]["kept"]
        out["types"][bt] = rec
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps of the small model")
    ap.add_argument("--batch-size", type=int, default=64, help="scorer nominal phrases per batch")
    ap.add_argument("--skip-dialogpt-shape", action="store_true")
    args = ap.parse_args()

    import jax

    from rbjax.data.redditbias import load_pairs
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.tokenizer import load_tokenizer

    mon = LoadMonitor()
    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    A, C, by_type = [], [], []
    for b in TYPES:
        p = load_pairs(b, "test", SHARED / "redditbias")
        A += tok.encode_batch(p.biased)
        C += tok.encode_batch(p.counterfactual)
        by_type.append((b, len(p)))
    res: dict = {"n_pairs": len(A)}
    if not args.skip_dialogpt_shape:
        print("DialoGPT-small shape, random weights", file=sys.stderr)
        cfg = GPT2Config()
        res["dialogpt_shape_random"] = effect(init_params(cfg, 0), cfg, (A, C), by_type, args.batch_size, mon,
                                               "dialogpt_shape_random")
    print("small model, trained here", file=sys.stderr)
    cfg, params, info = train_small(tok, args.steps, mon)
    res["small_trained"] = effect(params, cfg, (A, C), by_type, args.batch_size, mon, "small_trained")
    res["small_trained"]["training"] = info
    res["machine"] = f"{os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.default_backend()})"
    for name in ("dialogpt_shape_random", "small_trained"):
        if name not in res:
            continue
        r = res[name]
        print(f"\n{name}: perplexity (min/median/max) {[round(x, 1) for x in r['perplexity_range_fp32']]}",
              file=sys.stderr)
        print(f"  bf16 vs fp32, relative error of the mean NLL: {r['rel_err_mean_nll']}", file=sys.stderr)
        print(f"  ... of the perplexity: {r['rel_err_perplexity']}", file=sys.stderr)
        print(f"  {'type':<10} {'t fp32':>8} {'t bf16':>8} {'Δt':>8} {'p fp32':>9} {'p bf16':>9}  "
              "sig32 sig16 kept32 kept16", file=sys.stderr)
        for bt, rec in r["types"].items():
            f, h = rec["fp32"], rec["bf16"]
            print(f"  {bt:<10} {f['t']:8.3f} {h['t']:8.3f} {rec['t_diff']:8.4f} {f['p']:9.2e} {h['p']:9.2e}  "
                  f"{f['significant']!s:>5} {h['significant']!s:>5} {f['kept']:>6} {h['kept']:>6}", file=sys.stderr)
    mon.finish(res)  # no speed ratio here: the load block records how busy the machine was
    print(json.dumps(res))


if __name__ == "__main__":
    main()
