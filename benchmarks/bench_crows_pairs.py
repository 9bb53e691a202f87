"""CrowS-Pairs scoring speed at the DialoGPT-small shape (random weights): rbjax vs lm-evaluation-harness's ``hf`` model.

Both score all 1,508 CrowS-Pairs pairs (3,016 sentences, the verified upstream file) the way lm-evaluation-harness's
``crows_pairs_english`` does: each sentence's total log-likelihood given the start token (``<|endoftext|>``), i.e.
``loglikelihood`` requests with an empty context (``lm_eval/api/model.py``).

  * lm-evaluation-harness: ``HFLM(pretrained=FOLDER, dtype=float32, device=cpu, batch_size=B).loglikelihood(requests)``
    for each ``--lm-eval-batch`` size (its default is 1: timed in the first round only, ``--default-batch-rounds``),
    the requests built as the task builds them;
  * rbjax: ``PerplexityScorer.with_bos(<|endoftext|>).score_text_pairs`` (packed rows, each pair's common prefix run
    once, the LM head only where a token is predicted), fp32; the first call (compilation included) is timed apart;
  * rbjax ``measure_pair_benchmark`` end to end (both conventions: a GPT-2 encodes without a BOS, so rbjax's own
    convention is a second pass; statistics and files included), for the record.

The methods run in interleaved rounds (``--rounds``; a change in machine load hits every method alike): medians of
wall time are reported, with each method's process CPU time beside it (less sensitive to other processes on a shared
machine). The model: GPT-2 at ``../shared/models/dialogpt-small-config`` built by ``transformers`` with seeded random weights
and saved in the HF format with the GPT-2 tokenizer files; both load that folder. Parity (max |ΔLL| between rbjax and
lm-evaluation-harness) is printed. The last line is JSON; its ``"ratios"`` (rbjax over the best lm-evaluation-harness
batch size) move to ``"void_ratios"``, and print as VOID, when the machine had foreign CPU load during the timed
sections (``"load"``, ``benchmarks/_common.py``).

The work each side does, counted without timing anything (``"work"`` in the JSON; load-independent): rbjax's slots
(padding included) and LM-head rows from the scorer's own accounting (``last_stats``); lm-evaluation-harness's for
each batch size as it batches (:func:`lm_eval_batches`: identical model inputs once, sorted by length, longest
first, each batch right-padded to its longest input; the head and a full-vocabulary ``log_softmax`` on every slot); the matmul FLOPs of both by one model
(:func:`matmul_flops`); and the floor of any exact method: a trie of all 3,016 sentences (each distinct prefix that
predicts a token run once, its head row once, no padding; :func:`trie_floor`). With equal speed per FLOP,
the wall ratio is the FLOP ratio; against the trie floor no exact packing can do better.

    python benchmarks/bench_crows_pairs.py [--rounds 3] [--lm-eval-batch 1 16 64] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def lm_eval_batches(inputs, batch_size: int) -> list[tuple[int, int]]:
    """``[(rows, padded length)]`` of lm-evaluation-harness's ``loglikelihood`` batches (``HFLM``, ``logits_cache``
    on, its default): requests with the same model input (context + continuation without its last token) run once
    (its ``Collator`` groups them by that input), sorted by length, longest first, cut into batches of
    ``batch_size``, each right-padded to its longest input. ``inputs``: each request's model input (token ids; an
    empty context: the start token and the sentence but its last token)."""
    order = sorted({tuple(int(t) for t in x) for x in inputs}, key=lambda x: (-len(x), x))
    return [(len(order[i:i + batch_size]), len(order[i])) for i in range(0, len(order), batch_size)]


def matmul_flops(batches, head_rows: int, d: int, vocab: int, n_layers: int) -> float:
    """Forward matmul FLOPs of scoring: ``batches`` ``[(rows, row length)]`` through ``n_layers`` blocks (per
    slot 24·d² for the four projections and 4·L·d for attention over a row of L slots) and ``head_rows`` LM-head
    rows (2·d·V each). The model rbjax's row-length planner uses (:mod:`rbjax.lmb.perplexity`)."""
    body = sum(r * L * n_layers * (24 * d * d + 4 * L * d) for r, L in batches)
    return float(body + head_rows * 2 * d * vocab)


def trie_floor(seqs) -> int:
    """The fewest token states and LM-head rows of any exact scoring of ``seqs`` (token id lists, the start token
    included): the distinct proper prefixes of a trie over them. Each is run once and predicts its next token(s)
    from one log-sum-exp; a sequence's last token needs no state unless it starts a longer sequence's next token."""
    return len({tuple(s[:k]) for s in seqs for k in range(1, len(s))})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm-eval-batch", type=int, nargs="+", default=[1, 16, 64],
                    help="lm-evaluation-harness batch sizes to time (1 is its default)")
    ap.add_argument("--batch-size", type=int, default=64, help="rbjax nominal phrases per batch (1,024 slots)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    ap.add_argument("--default-batch-rounds", type=int, default=1,
                    help="rounds that also time lm-evaluation-harness's default batch size 1 (slow)")
    ap.add_argument("--crows-pairs", default=str(SHARED / "crows-pairs"))
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    ap.add_argument("--no-measure", action="store_true", help="skip the end-to-end measure_pair_benchmark timing")
    args = ap.parse_args()

    import shutil

    import jax
    import torch
    import transformers
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from rbjax.data.pairs import load_crows_pairs
    from rbjax.lmb.measure import LoadedModel
    from rbjax.lmb.pair_benchmark import measure_pair_benchmark

    pf = load_crows_pairs(args.crows_pairs)
    stereo, other = pf.stereotypical_sentences(), pf.other_sentences()
    sentences = stereo + other
    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    torch.manual_seed(0)
    tcfg = transformers.GPT2Config(**{k: cfg_json[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer",
                                                                 "n_head")})
    tmp = Path(tempfile.mkdtemp(prefix="bench_crows_"))
    folder = tmp / "model"
    transformers.GPT2LMHeadModel(tcfg).eval().save_pretrained(folder, safe_serialization=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(Path(args.tokenizer) / f, folder / f)
    print(f"{len(pf)} pairs, {len(sentences)} sentences; model {folder}", file=sys.stderr)

    out: dict = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "jax_backend": jax.default_backend(),
                             "torch_threads": torch.get_num_threads(),
                             "load_at_start": os.getloadavg()[0]},
                 "versions": {"jax": jax.__version__, "torch": torch.__version__,
                              "transformers": transformers.__version__},
                 "n_sentences": len(sentences), "lm_eval": {}, "rbjax": {}}
    try:
        import importlib.metadata as md

        out["versions"]["lm_eval"] = md.version("lm-eval")
    except Exception:  # noqa: BLE001
        pass

    # -- rbjax: the lm-evaluation-harness convention (the same work); compiled once before the rounds ------------
    mon = LoadMonitor()
    m = LoadedModel(str(folder), batch_size=args.batch_size)
    tok = m.tokenizer
    scorer = m.scorer.with_bos(tok.bos_id)
    with mon.section("rbjax_first_call"):
        t0 = time.perf_counter()
        sb, sc = scorer.score_text_pairs(stereo, other, tok)
        first = time.perf_counter() - t0
    ll_rbjax = np.concatenate([-sb.nll_sum, -sc.nll_sum])
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=("", s), idx=0) for s in sentences]
    runs: dict[str, list[tuple[float, float]]] = {"rbjax": []}
    parity: dict[str, float] = {}
    pct: dict[str, float] = {}
    with mon.section("rounds"):  # rbjax and every lm-evaluation-harness batch size, interleaved
        for rnd in range(args.rounds):
            c0, t0 = time.process_time(), time.perf_counter()
            scorer.score_text_pairs(stereo, other, tok)
            runs["rbjax"].append((time.perf_counter() - t0, time.process_time() - c0))
            print(f"round {rnd + 1}: rbjax {runs['rbjax'][-1][0]:.1f} s", file=sys.stderr)
            for bs in args.lm_eval_batch:
                if bs == 1 and rnd >= args.default_batch_rounds:
                    continue
                lm = HFLM(pretrained=str(folder), dtype="float32", device="cpu", batch_size=bs)
                c0, t0 = time.process_time(), time.perf_counter()
                res = lm.loglikelihood(requests, disable_tqdm=True)
                runs.setdefault(str(bs), []).append((time.perf_counter() - t0, time.process_time() - c0))
                ll = np.array([r[0] for r in res])
                parity[str(bs)] = float(np.abs(ll - ll_rbjax).max())
                pct[str(bs)] = float(np.mean(ll[:len(pf)] > ll[len(pf):]))
                print(f"round {rnd + 1}: lm-eval hf batch {bs}: {runs[str(bs)][-1][0]:.1f} s, max |ΔLL| vs rbjax "
                      f"{parity[str(bs)]:.2e}", file=sys.stderr)
                del lm
    st = scorer.last_stats
    # -- the work of each side, counted (load-independent): slots, head rows, matmul FLOPs, the trie floor --------
    d, V, nl = m.config.hidden_size, m.config.vocab_size, m.config.num_layers
    ids = tok.encode_batch(sentences)
    rb_flops = matmul_flops([(st["slots_total"] // st["row_len"], st["row_len"])], st["head_rows"], d, V, nl)
    floor = trie_floor([[tok.bos_id] + list(x) for x in ids])
    work = {"rbjax": {"slots": st["slots_total"], "head_rows": st["head_rows"], "predicting": st["predicting"],
                      "matmul_flops": rb_flops},
            "trie_floor": {"slots": floor, "head_rows": floor,  # attention as over rbjax's rows
                           "matmul_flops": matmul_flops([(floor / st["row_len"], st["row_len"])], floor, d, V, nl)},
            "lm_eval": {}}
    inputs = [[tok.bos_id] + list(x)[:-1] for x in ids]  # lm-eval's model inputs (its start token, empty context)
    for bs in args.lm_eval_batch:
        b = lm_eval_batches(inputs, bs)
        slots = sum(r * L for r, L in b)
        f = matmul_flops(b, slots, d, V, nl)
        work["lm_eval"][str(bs)] = {"slots": slots, "real_slots": sum(len(x) for x in {tuple(y) for y in inputs}),
                                    "head_rows": slots,
                                    "matmul_flops": f, "flop_ratio_vs_rbjax": f / rb_flops,
                                    "flop_ratio_vs_trie_floor": f / work["trie_floor"]["matmul_flops"]}
        print(f"work: lm-eval batch {bs}: {slots:,} slots (head on all), {f / 1e12:.2f} TFLOP; rbjax "
              f"{st['slots_total']:,} slots, {st['head_rows']:,} head rows, {rb_flops / 1e12:.2f} TFLOP "
              f"(ratio {f / rb_flops:.3f}); trie floor {floor:,} slots and head rows "
              f"(ratio {f / work['trie_floor']['matmul_flops']:.3f})", file=sys.stderr)
    out["work"] = work
    med = {k: (float(np.median([w for w, _ in v])), float(np.median([c for _, c in v]))) for k, v in runs.items()}
    out["rbjax"]["lm_eval_convention"] = {
        "first_call_s": first, "median_s": med["rbjax"][0], "median_cpu_s": med["rbjax"][1],
        "sentences_per_s": len(sentences) / med["rbjax"][0], "rounds_s": [w for w, _ in runs["rbjax"]],
        "compiled_programs": scorer.compile_count, "prefix_sharing_saves": 1 - st["slots_run"] / st["phrase_tokens"],
        "padding": 1 - st["slots_run"] / st["slots_total"], "batches": st["batches"], "row_len": st["row_len"],
        "pct_stereotype": float(np.mean(ll_rbjax[:len(pf)] > ll_rbjax[len(pf):]))}
    for bs in args.lm_eval_batch:
        k = str(bs)
        out["lm_eval"][k] = {"median_s": med[k][0], "median_cpu_s": med[k][1],
                             "sentences_per_s": len(sentences) / med[k][0], "rounds_s": [w for w, _ in runs[k]],
                             "max_abs_ll_diff_vs_rbjax": parity[k], "pct_stereotype": pct[k]}

    # -- rbjax measure end to end (both conventions, statistics, files) ------------------------------------------
    if not args.no_measure:
        with mon.section("measure_end_to_end"):
            t0 = time.perf_counter()
            r = measure_pair_benchmark(m, "crows-pairs", data_dir=args.crows_pairs, out_dir=tmp / "measure",
                                       progress=False)
            dt = time.perf_counter() - t0
        out["rbjax"]["measure_end_to_end_s"] = dt
        out["rbjax"]["pct_stereotype"] = r["summary"]["lm_eval"]["overall"]["pct_stereotype"]
        print(f"rbjax measure --benchmark crows-pairs end to end (two passes, 10,000-resample bootstrap CIs, "
              f"files): {dt:.1f} s", file=sys.stderr)

    best = max(out["lm_eval"].values(), key=lambda x: x["sentences_per_s"])
    default = out["lm_eval"].get("1")
    rb = out["rbjax"]["lm_eval_convention"]
    ratios = {"ratio_vs_best_lm_eval": rb["sentences_per_s"] / best["sentences_per_s"],
              "cpu_time_ratio_vs_best_lm_eval": best["median_cpu_s"] / rb["median_cpu_s"],
              "ratio_vs_best_lm_eval_first_call": best["median_s"] / rb["first_call_s"]}
    if default:
        ratios["ratio_vs_lm_eval_default_batch"] = rb["sentences_per_s"] / default["sentences_per_s"]
    depends = {k: ["rounds"] for k in ratios}
    depends["ratio_vs_best_lm_eval_first_call"] = ["rbjax_first_call", "rounds"]
    out["load_at_end"] = os.getloadavg()[0]
    txt = {k: mon.ratio_text(v, sections=depends[k]) for k, v in ratios.items()}
    print(f"rbjax fp32 / best lm-eval: {txt['ratio_vs_best_lm_eval']} wall, {txt['cpu_time_ratio_vs_best_lm_eval']} "
          f"CPU time (first call incl. compilation {txt['ratio_vs_best_lm_eval_first_call']})", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(mon.finish(out, ratios, depends)))


if __name__ == "__main__":
    main()
