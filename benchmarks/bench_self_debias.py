"""Self-Debias scoring cost against plain scoring, at the DialoGPT-small shape (random weights).

The goal: scoring with K self-debiasing prefixes costs at most (1 + K)× plain scoring — one regular pass
and one pass per prefix over the same tokens. This script scores real RedditBias test pairs (evenly spaced over the
five bias types, both sides) with

  * the plain :class:`rbjax.lmb.perplexity.PerplexityScorer` (``score_pairs``: packed pair trees),
  * :class:`rbjax.lmb.self_debias.SelfDebiasScorer` with 1 and with 2 of bias-bench's prefixes (religion; religion
    and race/color), ``score_pairs`` on the same pairs,

each with a fresh scorer, timing the **whole call, compilation included** (``first``), then ``--warm-rounds`` rounds
of one more call of each scorer, interleaved so that a change in the machine's load hits all alike (``warm``:
medians). For each it records the wall time, the process CPU time (the figure to
read on a shared machine: other jobs stretch wall time more than CPU time) and the scorer's ``last_stats`` (slots of
the compiled batches, rows, batches, programs). Printed: each Self-Debias/plain ratio beside its goal 1 + K. The
last line is JSON; its wall-time ratios move to ``"void_ratios"`` (printed VOID) when the machine had foreign CPU
load during the timed sections (``benchmarks/_common.py``); the CPU-time ratios are filed beside them.

    python benchmarks/bench_self_debias.py [--n-pairs 120] [--prefixes 1 2] [--warm-rounds 2] [--batch-size 64]
        [--bos] [--layers 12]

``--n-pairs`` and ``--layers`` shrink the run (the default, 12 layers and 120 pairs, takes about 3 minutes of CPU time); ``--bos``
scores with GPT-2's ``<|endoftext|>`` as a start token (the prefix then goes after it).
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
PREFIX_NAMES = ("religion", "race-color")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-pairs", type=int, default=120, help="RedditBias test pairs, evenly spaced (0: all)")
    ap.add_argument("--prefixes", type=int, nargs="+", default=[1, 2], choices=[1, 2], help="prefix counts to time")
    ap.add_argument("--warm-rounds", type=int, default=2,
                    help="interleaved rounds after the first (compiled) calls; 0: none")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than DialoGPT-small's 12 (faster)")
    ap.add_argument("--bos", action="store_true", help="score with <|endoftext|> as the start token")
    ap.add_argument("--data-dir", default=str(SHARED / "redditbias"))
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    args = ap.parse_args()

    import jax

    from rbjax.data.redditbias import load_pairs
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.lmb.self_debias import SelfDebiasScorer
    from rbjax.model import gpt2
    from rbjax.model.self_debias import BIAS_BENCH_PREFIXES, SelfDebiasSettings
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer, expected_vocab_size=None)
    a, c = [], []
    for b in TYPES:
        p = load_pairs(b, "test", Path(args.data_dir))
        a += tok.encode_batch(p.biased)
        c += tok.encode_batch(p.counterfactual)
    if 0 < args.n_pairs < len(a):
        idx = np.linspace(0, len(a) - 1, args.n_pairs).astype(int)
        a, c = [a[i] for i in idx], [c[i] for i in idx]
    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    cfg = gpt2.GPT2Config(vocab_size=cfg_json["vocab_size"], n_positions=cfg_json["n_positions"],
                          n_embd=cfg_json["n_embd"], n_layer=args.layers or cfg_json["n_layer"],
                          n_head=cfg_json["n_head"])
    params = gpt2.init_params(cfg, seed=0)
    bos = tok.bos_id if args.bos else None
    texts = [BIAS_BENCH_PREFIXES[k] for k in PREFIX_NAMES]
    prefix_ids = [tok.encode(t) for t in texts]
    print(f"{len(a)} pairs, {sum(map(len, a + c))} tokens; layers {cfg.n_layer}; prefixes of "
          f"{[len(p) for p in prefix_ids]} tokens; bos {bos}", file=sys.stderr)

    def make(k):
        if k == 0:
            return PerplexityScorer(params, cfg, batch_size=args.batch_size, bos_id=bos)
        return SelfDebiasScorer(params, cfg, prefix_ids[:k], SelfDebiasSettings(tuple(texts[:k])),
                                batch_size=args.batch_size, bos_id=bos)

    mon = LoadMonitor()
    out: dict = {"machine": {"cores": os.cpu_count(), "jax_backend": jax.default_backend()},
                 "n_pairs": len(a), "layers": cfg.n_layer, "bos": bos, "prefix_tokens": [len(p) for p in prefix_ids],
                 "runs": {}}
    kinds = [0] + sorted(set(args.prefixes))
    names = {k: "plain" if k == 0 else f"self_debias_{k}" for k in kinds}
    scorers = {}
    for k in kinds:  # first calls: a fresh scorer each, compilation included
        sc = scorers[k] = make(k)
        with mon.section(names[k]):
            c0, t0 = time.process_time(), time.perf_counter()
            sc.score_pairs(a, c)
            first = (time.perf_counter() - t0, time.process_time() - c0)
        st = {k2: v for k2, v in sc.last_stats.items() if isinstance(v, (int, float))}
        out["runs"][names[k]] = {"first_s": first[0], "first_cpu_s": first[1], "programs": sc.compile_count,
                                 "stats": st}
        print(f"{names[k]}: first call {first[0]:.1f} s wall, {first[1]:.1f} s CPU; {sc.compile_count} programs; "
              f"stats {st}", file=sys.stderr)
    warm: dict = {k: [] for k in kinds}
    with mon.section("warm_rounds"):  # interleaved: a change in the machine's load hits every scorer alike
        for rnd in range(args.warm_rounds):
            for k in kinds:
                c0, t0 = time.process_time(), time.perf_counter()
                scorers[k].score_pairs(a, c)
                warm[k].append((time.perf_counter() - t0, time.process_time() - c0))
            print(f"round {rnd + 1}: " + ", ".join(f"{names[k]} {warm[k][-1][0]:.1f} s wall {warm[k][-1][1]:.1f} s "
                                                  "CPU" for k in kinds), file=sys.stderr)
    for k in kinds:
        if warm[k]:
            out["runs"][names[k]]["warm_s"] = float(np.median([w for w, _ in warm[k]]))
            out["runs"][names[k]]["warm_cpu_s"] = float(np.median([x for _, x in warm[k]]))

    plain = out["runs"]["plain"]
    ratios, cpu_ratios, depends = {}, {}, {}
    for k in sorted(set(args.prefixes)):
        sd = out["runs"][f"self_debias_{k}"]
        for when in ("first", "warm"):
            if f"{when}_s" not in sd:
                continue
            key = f"{when}_{k}_prefixes"
            ratios[key] = sd[f"{when}_s"] / plain[f"{when}_s"]
            cpu_ratios[key] = sd[f"{when}_cpu_s"] / plain[f"{when}_cpu_s"]
            depends[key] = ["plain", f"self_debias_{k}"] if when == "first" else ["warm_rounds"]
            slots = sd["stats"].get("slots_all_passes", sd["stats"].get("slots_total", 0))
            print(f"{k} prefix(es), {when} call: Self-Debias / plain = {mon.ratio_text(ratios[key], sections=depends[key])}"
                  f" wall, {cpu_ratios[key]:.2f}× CPU time, {slots / max(1, plain['stats']['slots_total']):.2f}× "
                  f"slots (goal ≤ {1 + k}×)", file=sys.stderr)
    out["cpu_time_ratios"] = cpu_ratios
    out["goal"] = {f"{k}_prefixes": 1 + k for k in sorted(set(args.prefixes))}
    print(json.dumps(mon.finish(out, ratios, depends)))


if __name__ == "__main__":
    main()
