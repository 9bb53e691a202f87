"""BBQ scoring speed: rbjax vs lm-evaluation-harness's ``hf`` model, the same model, the same requests, interleaved.

Both score every row of the local BBQ files (``--rows N`` per category: a documented subset) as lm-evaluation-harness's
``bbq`` task does: ``loglikelihood`` requests ``(prompt, " " + choice)`` for the task's twelve choices per row (the
row's two other answers and the ten unknown phrasings).

  * lm-evaluation-harness: ``HFLM(pretrained=FOLDER, dtype=float32, device=DEV, batch_size=B).loglikelihood`` for each
    ``--lm-eval-batch`` size; the best one is the reference;
  * rbjax: :func:`rbjax.lmb.bbq._score_category` on each category (``PerplexityScorer.score_choices``: each row's
    prompt run once for all its answers; the three answers and ten phrasings of both conventions in one pass), fp32;
    its first call (compilation included) is timed apart.

The model: GPT-2 at ``../shared/models/dialogpt-small-config`` with seeded random weights (``transformers``), saved in
the HF format with the GPT-2 tokenizer; both load that folder. Medians over ``--rounds`` interleaved rounds; parity
(max |ΔLL| over the twelve choices of every row) is printed. The last line is JSON.

    python benchmarks/bench_bbq.py [--rows 0] [--rounds 3] [--lm-eval-batch 16 64 256] [--batch-size 256]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=str(SHARED / "bbq"))
    ap.add_argument("--rows", type=int, default=0, help="rows per category (0: all)")
    ap.add_argument("--lm-eval-batch", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--batch-size", type=int, default=256, help="rbjax nominal phrases per batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    args = ap.parse_args()

    import jax
    import torch
    import transformers
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from rbjax.data.bbq import UNKNOWN_RESPONSES, load_bbq
    from rbjax.lmb.bbq import _score_category
    from rbjax.lmb.measure import LoadedModel

    cats = load_bbq(args.data_dir)
    if args.rows:
        import dataclasses

        cats = [dataclasses.replace(c, **{f.name: getattr(c, f.name)[:args.rows] for f in dataclasses.fields(c)
                                          if isinstance(getattr(c, f.name), tuple)}) for c in cats]
    n_rows = sum(len(c) for c in cats)
    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    torch.manual_seed(0)
    tcfg = transformers.GPT2Config(**{k: cfg_json[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer",
                                                                 "n_head")})
    folder = Path(tempfile.mkdtemp(prefix="bench_bbq_")) / "model"
    transformers.GPT2LMHeadModel(tcfg).eval().save_pretrained(folder, safe_serialization=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(Path(args.tokenizer) / f, folder / f)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    requests, where = [], []
    for c in cats:
        for i in range(len(c)):
            nonunk = [k for k in range(3) if k != c.unknown[i]]
            for j, ch in enumerate([c.answers[i][k] for k in nonunk] + list(UNKNOWN_RESPONSES)):
                requests.append(Instance(request_type="loglikelihood", doc={}, arguments=(c.prompt(i), " " + ch),
                                         idx=j))
                where.append((c.name, i, nonunk[j] if j < 2 else 3 + j - 2))
    print(f"{n_rows} rows, {len(requests)} requests; model {folder}; {device}", file=sys.stderr)

    m = LoadedModel(str(folder), batch_size=args.batch_size)

    def rbjax_run():
        return {c.name: _score_category(m.scorer, m.tokenizer, c, m.scorer.bos_id, None, None) for c in cats}

    mon = LoadMonitor()
    with mon.section("rbjax_first_call"):
        t0 = time.perf_counter()
        ll = rbjax_run()
        first = time.perf_counter() - t0
    runs: dict[str, list[float]] = {"rbjax": []}
    parity = {}
    with mon.section("rounds"):  # rbjax and every lm-evaluation-harness batch size, interleaved
        _rounds(args, rbjax_run, runs, parity, requests, where, ll, folder, device, HFLM)
    med = {k: float(np.median(v)) for k, v in runs.items()}
    best = min((k for k in med if k != "rbjax"), key=med.get)
    out = {"device": device, "jax_backend": jax.default_backend(), "n_rows": n_rows, "n_requests": len(requests),
           "rbjax_first_call_s": first, "median_s": med, "best_lm_eval_batch": int(best),
           "max_abs_ll_diff": parity}
    ratios = {"speedup_vs_best_lm_eval": med[best] / med["rbjax"]}
    depends = {"speedup_vs_best_lm_eval": ["rounds"]}
    print(f"rbjax vs lm-eval (batch {best}): {mon.ratio_text(ratios['speedup_vs_best_lm_eval'], sections=['rounds'])}",
          file=sys.stderr)
    print(json.dumps(mon.finish(out, ratios, depends)))


def _rounds(args, rbjax_run, runs, parity, requests, where, ll, folder, device, HFLM) -> None:
    for rnd in range(args.rounds):
        t0 = time.perf_counter()
        rbjax_run()
        runs["rbjax"].append(time.perf_counter() - t0)
        for bs in args.lm_eval_batch:
            lm = HFLM(pretrained=str(folder), dtype="float32", device=device, batch_size=bs)
            t0 = time.perf_counter()
            res = lm.loglikelihood(requests, disable_tqdm=True)
            runs.setdefault(str(bs), []).append(time.perf_counter() - t0)
            ours = np.array([ll[c][i, k] for c, i, k in where])
            parity[str(bs)] = float(np.abs(ours - np.array([r[0] for r in res])).max())
            del lm
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in runs.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
