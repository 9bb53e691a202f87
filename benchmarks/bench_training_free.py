"""The cost of fitting SentenceDebias and INLP (``rbjax debias --method sentence-debias|inlp``) against one plain
scoring pass over the same sentences, at the DialoGPT-small shape (random weights).

The corpus is the real RedditBias training phrases of ``--bias`` (default religion1) swapped into counterfactual
sets (:func:`rbjax.debias.training_free.counterfactual_sets`, as the command builds them; ``--n-sets`` takes the
first N), each sentence tokenised as the command does. Timed, each from a cleared compile cache (compile included):

  * ``score``: ``PerplexityScorer.score_ids`` over every sentence of the sets (one plain LMB scoring pass);
  * ``sentence-debias``: :func:`rbjax.debias.training_free.fit_projection` (the representation pass, the subspace);
  * ``inlp``: the same with INLP (the representation pass, then the classifiers), its two parts timed apart
    (``inlp_representations``, ``inlp_classifiers``).

The goal: fitting ≤ 1.5 × one scoring pass. The machine may be shared, so the ratios are given twice: of
wall time, and of this process's CPU time (``time.process_time``: user + system of every thread), which another
job's load changes much less. The foreign CPU of every section is recorded (``benchmarks/_common.py``); the wall
ratios move to ``"void_ratios"`` when it exceeds the threshold (the CPU-time ratios are kept, marked).

    python benchmarks/bench_training_free.py [--n-sets 400 | --n-sets 0 (all)] [--bias religion1] [--iterations 80]
                                             [--batch-size 32] [--small]

``--small``: a 2-layer, width-256 model of the same vocabulary (a quick run). The last line is JSON.
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


class Clock:
    """Wall and process-CPU seconds of a block."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bias", default="religion1")
    ap.add_argument("--n-sets", type=int, default=400,
                    help="the first N counterfactual sets (default 400: about 3 minutes on 2 CPU cores; 0: all)")
    ap.add_argument("--iterations", type=int, default=80, help="INLP's classifiers at most (bias-bench: 80)")
    ap.add_argument("--batch-size", type=int, default=32, help="rows per forward call of both sides")
    ap.add_argument("--small", action="store_true", help="a 2-layer, width-256 model (quick)")
    args = ap.parse_args()

    import jax

    from rbjax.debias.cda import read_train_phrases
    from rbjax.debias.config import bias_spec
    from rbjax.debias.training_free import ProjectionRun, counterfactual_sets, fit_projection
    from rbjax.debias import projection as pr
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(str(SHARED / "tokenizers" / "gpt2"))
    _, sets = counterfactual_sets(read_train_phrases(args.bias, SHARED / "redditbias"), bias_spec(args.bias))
    sets = sets[:args.n_sets or None]
    token_sets = [[tok.encode(s) for s in row] for row in sets]
    flat = [t for row in token_sets for t in row]
    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4) if args.small else GPT2Config()
    params = jax.device_put(init_params(cfg, 0))
    bos = tok.default_bos_id
    print(f"{len(sets)} sets, {len(flat)} sentences, {sum(map(len, flat))} tokens; model "
          f"{cfg.n_layer} layers × {cfg.n_embd}", file=sys.stderr)

    mon = LoadMonitor()
    res: dict = {"bias": args.bias, "sets": len(sets), "sentences": len(flat), "tokens": sum(map(len, flat)),
                 "model": {"n_layer": cfg.n_layer, "n_embd": cfg.n_embd}, "batch_size": args.batch_size,
                 "iterations": args.iterations, "jax": jax.__version__, "devices": str(jax.devices())}
    t: dict = {}

    jax.clear_caches()
    with mon.section("score"), Clock() as c:
        PerplexityScorer(params, cfg, batch_size=args.batch_size, bos_id=bos).score_ids(flat)
    t["score"] = c

    def run(method: str):
        return ProjectionRun(method=method, bias_type=args.bias, model="-", out_dir="-", iterations=args.iterations,
                             batch_size=args.batch_size)

    jax.clear_caches()
    with mon.section("sentence-debias"), Clock() as c:
        fit_projection(run("sentence-debias"), params, cfg, token_sets, bos_id=bos)
    t["sentence-debias"] = c

    jax.clear_caches()  # INLP in its two parts: the representation pass, then the classifiers
    from rbjax.debias.representations import sentence_representations

    with mon.section("inlp"), Clock() as c:
        with Clock() as cr:
            reps = sentence_representations(params, cfg, [s[g] for g in range(2) for s in token_sets], bos_id=bos,
                                            batch_size=args.batch_size).reshape(2, len(sets), -1)
        with Clock() as cc:
            train, dev = pr.split_groups(len(sets), 0.3, 0)
            x = lambda idx: reps[:, idx].reshape(-1, reps.shape[2])  # noqa: E731
            y = lambda idx: np.repeat(np.arange(2), len(idx))  # noqa: E731
            inlp = pr.inlp_projection(x(train), y(train), x(dev), y(dev), n_classes=2, iterations=args.iterations)
    t["inlp"], t["inlp_representations"], t["inlp_classifiers"] = c, cr, cc
    res["inlp_classifiers_fitted"] = len(inlp.history)
    res["inlp_stopped"] = inlp.stopped

    res["seconds"] = {k: {"wall": round(v.wall, 3), "cpu": round(v.cpu, 3)} for k, v in t.items()}
    cpu = {f"{k}_over_score_cpu": round(t[k].cpu / t["score"].cpu, 3)
           for k in ("sentence-debias", "inlp", "inlp_representations", "inlp_classifiers")}
    wall = {f"{k}_over_score_wall": round(t[k].wall / t["score"].wall, 3)
            for k in ("sentence-debias", "inlp", "inlp_representations", "inlp_classifiers")}
    res["cpu_ratios"] = cpu
    for k, v in t.items():
        print(f"{k:>22}: wall {v.wall:7.2f} s  CPU {v.cpu:7.2f} s", file=sys.stderr)
    for k in ("sentence-debias", "inlp"):
        print(f"{k} / one scoring pass: CPU {cpu[k + '_over_score_cpu']:.2f}×, wall "
              f"{mon.ratio_text(wall[k + '_over_score_wall'])} (goal ≤ 1.5×)", file=sys.stderr)
    mon.finish(res, wall)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
