"""LMB scoring speed at the full DialoGPT-small shape (random weights): rbjax vs PyTorch transformers.

Scores real RedditBias test phrases (all five bias types, both sides) with
  * PyTorch, one phrase at a time (the reference measure_bias.py loop; on a subsample, --n-loop),
  * PyTorch, padded batches of 64 in file order,
  * PyTorch, padded batches of 64 after sorting by length,
  * rbjax (jit, length buckets, fixed batch), compile time reported separately,
checks that rbjax's perplexities equal PyTorch's, and prints phrases/s (median of interleaved rounds, so that a
change in machine load hits every method alike); the last line is JSON.

    python benchmarks/bench_scoring.py [--n-phrases 600 | --all] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


def phrases_from(data_dir: Path) -> list[str]:
    from rbjax.data.redditbias import load_pairs

    out = []
    for b in ("religion1", "religion2", "race", "gender", "queerness"):
        p = load_pairs(b, "test", data_dir)
        out += p.biased + p.counterfactual
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-phrases", type=int, default=320, help="evenly spaced sample of the test phrases")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per method (median reported)")
    ap.add_argument("--all", action="store_true", help="score all test phrases (≈2.4k)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--n-loop", type=int, default=60,
                    help="phrases for the slow one-at-a-time PyTorch loop (a rate; evenly spaced subsample)")
    ap.add_argument("--data-dir", default=str(SHARED / "redditbias"))
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    args = ap.parse_args()

    import jax
    import torch
    import transformers

    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    allp = phrases_from(Path(args.data_dir))
    if args.all or args.n_phrases >= len(allp):
        phrases = allp
    else:
        phrases = [allp[i] for i in np.linspace(0, len(allp) - 1, args.n_phrases).astype(int)]
    tok = load_tokenizer(args.tokenizer)
    ids = tok.encode_batch(phrases)
    n = len(ids)
    print(f"{n} phrases, {sum(map(len, ids))} tokens (lengths {min(map(len, ids))}-{max(map(len, ids))})", file=sys.stderr)

    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    torch.manual_seed(0)
    tcfg = transformers.GPT2Config(**{k: cfg_json[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")})
    tmodel = transformers.GPT2LMHeadModel(tcfg).eval()
    with tempfile.TemporaryDirectory() as d:
        tmodel.save_pretrained(d)
        cfg, params = load_pretrained(d)

    res: dict = {}
    from rbjax.lmb.perplexity import _bucket, token_nll

    scorer = PerplexityScorer(params, cfg, batch_size=args.batch_size)
    # compile time, measured on its own: ahead-of-time lowering + compilation of every bucket shape a run uses
    shapes = sorted({_bucket(len(s), scorer.buckets) for s in ids if len(s) >= 2})
    t0 = time.perf_counter()
    for L in shapes:
        z = np.zeros((args.batch_size, L), np.int32)
        token_nll.lower(scorer.params, z, z, cfg).compile()
    res["rbjax_compile_s"] = time.perf_counter() - t0
    res["rbjax_programs"] = len(shapes)
    t0 = time.perf_counter()
    scorer.score_ids(ids)  # first call through jit (warm-up)
    res["rbjax_first_call_s"] = time.perf_counter() - t0

    loop_idx = np.linspace(0, n - 1, min(args.n_loop, n)).astype(int)

    def torch_loop():
        out = []
        with torch.inference_mode():
            for i in loop_idx:
                x = torch.tensor([ids[i]])
                out.append(math.exp(tmodel(x, labels=x).loss.item()))
        return np.array(out)

    def torch_batched(order):
        out = np.zeros(n)
        with torch.inference_mode():
            for k in range(0, n, args.batch_size):
                rows = order[k:k + args.batch_size]
                L = max(len(ids[i]) for i in rows)
                x = torch.zeros((len(rows), L), dtype=torch.long)
                m = torch.zeros((len(rows), L), dtype=torch.long)
                for r, i in enumerate(rows):
                    x[r, :len(ids[i])] = torch.tensor(ids[i])
                    m[r, :len(ids[i])] = 1
                logits = tmodel(x, attention_mask=m).logits[:, :-1]
                nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
                tm = (m[:, 1:] * m[:, :-1]).float()
                out[rows] = torch.exp((nll * tm).sum(1) / tm.sum(1)).numpy()
        return out

    sorted_order = list(np.argsort([len(s) for s in ids], kind="stable"))
    runs = {
        "torch_one_at_a_time": (torch_loop, len(loop_idx)),
        "torch_batched": (lambda: torch_batched(list(range(n))), n),
        "torch_batched_sorted": (lambda: torch_batched(sorted_order), n),
        "rbjax": (lambda: scorer.score_ids(ids).perplexity, n),
    }
    # rounds interleave the methods, so a change in machine load hits all of them; the median round is reported
    rates: dict = {k: [] for k in runs}
    outputs = {}
    for _ in range(args.rounds):
        for k, (fn, count) in runs.items():
            t0 = time.perf_counter()
            outputs[k] = fn()
            rates[k].append(count / (time.perf_counter() - t0))
    for k, v in rates.items():
        res[k] = float(np.median(v))
        res[k + "_rounds"] = [round(x, 2) for x in v]
    ref_ppl, sorted_ppl, ours = outputs["torch_one_at_a_time"], outputs["torch_batched_sorted"], outputs["rbjax"]

    rel = np.abs(ours[loop_idx] - ref_ppl) / ref_ppl
    res["max_rel_diff_vs_torch"] = float(rel.max())  # vs the reference formula, one phrase at a time
    res["max_rel_diff_vs_torch_batched"] = float((np.abs(ours - sorted_ppl) / sorted_ppl).max())
    res["n_phrases"] = n
    res["batch_size"] = args.batch_size
    best_torch_batched = max(res["torch_batched"], res["torch_batched_sorted"])
    res["ratio_vs_torch_one_at_a_time"] = res["rbjax"] / res["torch_one_at_a_time"]
    res["ratio_vs_best_torch_batched"] = res["rbjax"] / best_torch_batched
    res["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__}"
    for k in ("torch_one_at_a_time", "torch_batched", "torch_batched_sorted", "rbjax"):
        print(f"{k:>22}: {res[k]:8.1f} phrases/s", file=sys.stderr)
    print(f"{'rbjax compile':>22}: {res['rbjax_compile_s']:8.1f} s   max rel diff vs torch {res['max_rel_diff_vs_torch']:.1e}", file=sys.stderr)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
