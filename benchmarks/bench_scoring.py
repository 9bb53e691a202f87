"""LMB scoring speed at the full DialoGPT-small shape (random weights): rbjax vs PyTorch, with a roofline line.

Scores real RedditBias test pairs (evenly spaced over all five bias types; both sides) with

  * PyTorch, one phrase at a time (the reference measure_bias.py loop; on a subsample, --n-loop),
  * PyTorch, length-sorted padded batches of --torch-batch phrases, fp32 and bf16 autocast (like for like),
  * rbjax ``PerplexityScorer.score_pairs`` (pairs share their prefix, packed rows, LM head only where a token is
    predicted), fp32 and bf16, and fp32 scoring each side alone (``score_ids``: no prefix sharing),

in interleaved rounds (a change in machine load hits every method alike; medians reported). Every round also
measures the machine's dense matmul peak: the sustained rate of back-to-back matmuls (XLA and PyTorch, fp32 and
bf16 with fp32 accumulation, at the MLP's two shapes and a larger one; the best shape); the peak of a precision is
the better framework's median over the rounds.

Roofline: the *dense floor* of a method is the time its matmul FLOPs take at that peak —
body ``n_layer·24·d²`` per token run (+ attention ``4·d·n_layer`` per attended key), LM head ``2·d·V`` per
position it is applied to — counting the work each method actually does: PyTorch runs every token of every phrase and the
head on every position; rbjax runs shared prefixes once and the head only where a token is predicted. Padding is
not counted as work: it is the method's overhead. Each method's "fraction of floor" = its rate / its floor rate.

Also printed: the fraction of tokens prefix sharing saves, parity (rbjax vs PyTorch fp32 perplexities), what bf16
changes (per-phrase relative error of the mean NLL, both frameworks), compile counts and times. The last line is JSON.
The foreign CPU of the timed sections is recorded (``"load"``); the ratios move to ``"void_ratios"`` (and print as
VOID) when it exceeds the threshold of ``benchmarks/_common.py``.

The same script runs unchanged on an accelerator (rbjax on JAX's default device; PyTorch on CUDA when available,
else CPU — then the PyTorch figures are not like for like and are marked so).

    python benchmarks/bench_scoring.py [--n-pairs 160 | --all] [--rounds 3] [--batch-size 64] [--family llama]

``--family llama``: the same at a Llama-architecture model of DialoGPT-small's size — 12 layers, width
768, 12 query heads sharing 4 key/value heads (grouped-query attention), a gated MLP of 2,048 (as many MLP weights as
GPT-2's 3,072), RMSNorm, rotary positions, the 50,257-token vocabulary with a tied head — against
``transformers.LlamaForCausalLM`` with the same random weights. Body FLOPs are counted from the model's own matmul
weights (2 per weight per token), so the roofline holds for either family.
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
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor, torch_sorted_mean_nll  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
TYPES = ("religion1", "religion2", "race", "gender", "queerness")


def test_pairs(data_dir: Path, tok) -> tuple[list, list]:
    from rbjax.data.redditbias import load_pairs

    a, c = [], []
    for b in TYPES:
        p = load_pairs(b, "test", data_dir)
        a += tok.encode_batch(p.biased)
        c += tok.encode_batch(p.counterfactual)
    return a, c


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-pairs", type=int, default=160, help="evenly spaced sample of the 1,216 test pairs")
    ap.add_argument("--all", action="store_true", help="all test pairs (2,432 phrases)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--batch-size", type=int, default=64, help="rbjax nominal phrases per batch (1,024 slots)")
    ap.add_argument("--torch-batch", type=int, default=64, help="PyTorch phrases per padded batch")
    ap.add_argument("--n-loop", type=int, default=60, help="phrases for the one-at-a-time PyTorch loop (0: skip)")
    ap.add_argument("--data-dir", default=str(SHARED / "redditbias"))
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    ap.add_argument("--family", choices=("gpt2", "llama"), default="gpt2",
                    help="gpt2: DialoGPT-small's shape; llama: a Llama-architecture model of that size")
    ap.add_argument("--no-bf16", action="store_true",
                    help="skip the bf16 rows: on a CPU without bf16 matrix units PyTorch's bf16 autocast runs at "
                         "~1 GFLOP/s and one round takes tens of minutes")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    tok = load_tokenizer(args.tokenizer)
    A, C = test_pairs(Path(args.data_dir), tok)
    if not args.all and args.n_pairs < len(A):
        idx = np.linspace(0, len(A) - 1, args.n_pairs).astype(int)
        A, C = [A[i] for i in idx], [C[i] for i in idx]
    ids = A + C
    n = len(ids)
    n_tok = sum(map(len, ids))
    print(f"{len(A)} pairs, {n} phrases, {n_tok} tokens (lengths {min(map(len, ids))}-{max(map(len, ids))})",
          file=sys.stderr)

    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    torch.manual_seed(0)
    if args.family == "gpt2":
        tcfg = transformers.GPT2Config(**{k: cfg_json[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer",
                                                                     "n_head")})
        tmodel = transformers.GPT2LMHeadModel(tcfg).eval().to(tdev)
    else:
        tcfg = transformers.LlamaConfig(vocab_size=cfg_json["vocab_size"], hidden_size=cfg_json["n_embd"],
                                        intermediate_size=2048, num_hidden_layers=cfg_json["n_layer"],
                                        num_attention_heads=cfg_json["n_head"], num_key_value_heads=4,
                                        max_position_embeddings=cfg_json["n_positions"], tie_word_embeddings=True,
                                        bos_token_id=50256, eos_token_id=50256)
        tmodel = transformers.LlamaForCausalLM(tcfg).eval().to(tdev)
    with tempfile.TemporaryDirectory() as d:
        tmodel.save_pretrained(d)
        cfg, params = load_pretrained(d)
    d_, V = cfg_json["n_embd"], cfg_json["vocab_size"]
    nl, qdim = cfg_json["n_layer"], cfg_json["n_embd"]  # both families: 12 layers, 12 heads × 64 = 768 query dims
    # FLOPs per token through the blocks' dense layers: 2 per matmul weight (GPT-2: 24·d² per layer)
    body_tok = 2 * sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
                       if "kernel" in jax.tree_util.keystr(path))
    head_pos = 2 * d_ * V          # FLOPs of the LM head per position

    def attn_flops(seqs):  # useful attention: 4·(query dims) per layer per attended key (causal, within the phrase)
        return sum(4 * qdim * nl * len(s) * (len(s) + 1) / 2 for s in seqs)

    # ------------------------------------------------------------------ methods
    scorers = {"fp32": PerplexityScorer(params, cfg, batch_size=args.batch_size),
               "bf16": PerplexityScorer(params, cfg, batch_size=args.batch_size, precision="bf16"),
               "fp32_alone": PerplexityScorer(params, cfg, batch_size=args.batch_size)}
    if args.no_bf16:
        del scorers["bf16"]
    res: dict = {}
    first = {}
    mon = LoadMonitor()
    with mon.section("first_calls"):
        for k, sc in scorers.items():  # first call: compile + run
            t0 = time.perf_counter()
            (sc.score_ids(A), sc.score_ids(C)) if k == "fp32_alone" else sc.score_pairs(A, C)
            first[k] = time.perf_counter() - t0

    loop_idx = np.linspace(0, n - 1, min(args.n_loop, n)).astype(int) if args.n_loop else np.array([], int)

    def torch_loop():
        out = []
        with torch.inference_mode():
            for i in loop_idx:
                x = torch.tensor([ids[i]], device=tdev)
                out.append(math.exp(tmodel(x, labels=x).loss.item()))
        return np.array(out)

    def torch_sorted(bf16: bool):  # mean NLL per phrase, length-sorted padded batches
        return torch_sorted_mean_nll(tmodel, ids, args.torch_batch, tdev, bf16=bf16)

    def rb(k):
        sc = scorers[k]
        if k == "fp32_alone":
            sa, scf = sc.score_ids(A), sc.score_ids(C)
        else:
            sa, scf = sc.score_pairs(A, C)
        return np.concatenate([sa.mean_nll, scf.mean_nll])

    # matmul peak: the workload's two big shapes, (tokens × d) @ (d × 4d) and (tokens × 4d) @ (4d × d), plus a
    # larger one; fp32 and bf16 inputs with fp32 accumulation; the best rate of 8 repeats per shape
    rng = np.random.default_rng(0)
    shapes = [(1024, d_, 4 * d_), (1024, 4 * d_, d_), (2048, d_, 4 * d_)]
    mats = [(rng.normal(size=(M, K)).astype(np.float32), rng.normal(size=(K, N)).astype(np.float32))
            for M, K, N in shapes]
    jm = [(jnp.asarray(x), jnp.asarray(w)) for x, w in mats]
    jmb = [(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)) for x, w in jm]
    tm = [(torch.tensor(x, device=tdev), torch.tensor(w, device=tdev)) for x, w in mats]
    tmb = [(x.bfloat16(), w.bfloat16()) for x, w in tm]
    mm32 = jax.jit(lambda a, b: jnp.dot(a, b, precision="highest"))
    mm16 = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))

    def peak(call, pairs, seconds=0.4):
        """Sustained rate: back-to-back calls for ``seconds`` per shape; the best shape (GFLOP/s)."""
        best = 0.0
        for (M, K, N), (x, w) in zip(shapes, pairs):
            call(x, w)
            k, t0 = 0, time.perf_counter()
            while True:
                call(x, w)
                k += 1
                dt = time.perf_counter() - t0
                if dt >= seconds:
                    break
            best = max(best, k * 2 * M * K * N / dt)
        return best / 1e9

    def tcall(x, w):
        y = torch.mm(x, w)
        if tdev == "cuda":
            torch.cuda.synchronize()
        return y

    peaks = {"xla_fp32": lambda: peak(lambda x, w: mm32(x, w).block_until_ready(), jm),
             "xla_bf16": lambda: peak(lambda x, w: mm16(x, w).block_until_ready(), jmb),
             "torch_fp32": lambda: peak(tcall, tm),
             "torch_bf16": lambda: peak(tcall, tmb)}
    runs = {"torch_one_at_a_time": (torch_loop, len(loop_idx)),
            "torch_sorted_fp32": (lambda: torch_sorted(False), n),
            "torch_sorted_bf16": (lambda: torch_sorted(True), n),
            "rbjax_fp32": (lambda: rb("fp32"), n),
            "rbjax_bf16": (lambda: rb("bf16"), n),
            "rbjax_fp32_no_prefix_sharing": (lambda: rb("fp32_alone"), n)}
    if not len(loop_idx):
        del runs["torch_one_at_a_time"]
    if args.no_bf16:
        for k in ("torch_sorted_bf16", "rbjax_bf16"):
            del runs[k]
        for k in ("xla_bf16", "torch_bf16"):
            del peaks[k]
    rates: dict = {k: [] for k in runs}
    peak_rounds: dict = {k: [] for k in peaks}
    outputs = {}
    with mon.section("rounds"):  # the matmul peaks and every method, interleaved
        for _ in range(args.rounds):
            for k, fn in peaks.items():
                peak_rounds[k].append(fn())
            for k, (fn, count) in runs.items():
                t0 = time.perf_counter()
                outputs[k] = fn()
                rates[k].append(count / (time.perf_counter() - t0))
    for k, v in rates.items():
        res[k] = float(np.median(v))
        res[k + "_rounds"] = [round(x, 2) for x in v]
    # measured like the methods (median of the interleaved rounds), so that load hits floor and rate alike
    res["peak_gflops"] = {k: round(float(np.median(v)), 1) for k, v in peak_rounds.items()}
    res["peak_gflops_rounds"] = {k: [round(x, 1) for x in v] for k, v in peak_rounds.items()}
    pk = {"fp32": max(res["peak_gflops"]["xla_fp32"], res["peak_gflops"]["torch_fp32"]) * 1e9}
    if not args.no_bf16:
        pk["bf16"] = max(res["peak_gflops"]["xla_bf16"], res["peak_gflops"]["torch_bf16"]) * 1e9

    # ------------------------------------------------------------------ FLOP accounting (work each method does)
    st_pairs = dict(scorers["fp32"].last_stats)
    att_all = attn_flops(ids)
    from rbjax.lmb.perplexity import common_prefix_length

    att_shared = sum(4 * qdim * nl * p * (p + 1) / 2 for p in (common_prefix_length(x, y) for x, y in zip(A, C)))
    work = {
        # PyTorch: every token through the body, the head on every position (last and padding excluded)
        "torch": n_tok * (body_tok + head_pos) + att_all,
        # rbjax with prefix sharing: tokens it runs, the head where a token is predicted
        "rbjax_pairs": st_pairs["slots_run"] * body_tok + st_pairs["predicting"] * head_pos + att_all - att_shared,
        # rbjax each phrase alone: every token, the head where a token is predicted
        "rbjax_alone": n_tok * body_tok + sum(max(len(s) - 1, 0) for s in ids) * head_pos + att_all,
    }
    kind = {"torch_one_at_a_time": ("torch", "fp32"), "torch_sorted_fp32": ("torch", "fp32"),
            "torch_sorted_bf16": ("torch", "bf16"), "rbjax_fp32": ("rbjax_pairs", "fp32"),
            "rbjax_bf16": ("rbjax_pairs", "bf16"), "rbjax_fp32_no_prefix_sharing": ("rbjax_alone", "fp32")}
    res["gflop_per_phrase"] = {k: round(v / n / 1e9, 3) for k, v in work.items()}
    res["floor_phrases_per_s"] = {}
    res["fraction_of_floor"] = {}
    for k in runs:
        w, p = kind[k]
        floor = pk[p] / (work[w] / n)
        res["floor_phrases_per_s"][k] = round(floor, 1)
        res["fraction_of_floor"][k] = round(res[k] / floor, 3)
    res["tokens_saved_by_prefix_sharing"] = 1 - st_pairs["slots_run"] / st_pairs["phrase_tokens"]
    res["rbjax_plan"] = st_pairs
    res["rbjax_padding_fraction"] = 1 - st_pairs["slots_run"] / st_pairs["slots_total"]
    res["rbjax_head_rows_over_predicting"] = st_pairs["head_rows"] / st_pairs["predicting"]

    # ------------------------------------------------------------------ accuracy
    ref32 = outputs["torch_sorted_fp32"]
    ours32 = outputs["rbjax_fp32"]
    res["max_rel_diff_ppl_rbjax_vs_torch_fp32"] = float(np.max(np.abs(np.exp(ours32) - np.exp(ref32)) / np.exp(ref32)))
    if len(loop_idx):
        ref_loop = outputs["torch_one_at_a_time"]
        res["max_rel_diff_ppl_vs_reference_loop"] = float(
            np.max(np.abs(np.exp(ours32[loop_idx]) - ref_loop) / ref_loop))
    res["max_rel_diff_nll_prefix_shared_vs_alone"] = float(
        np.max(np.abs(ours32 - outputs["rbjax_fp32_no_prefix_sharing"]) / outputs["rbjax_fp32_no_prefix_sharing"]))
    if not args.no_bf16:
        rel16 = np.abs(outputs["rbjax_bf16"] - ours32) / ours32
        trel16 = np.abs(outputs["torch_sorted_bf16"] - ref32) / ref32
        res["bf16_rel_err_mean_nll"] = {"rbjax_median": float(np.median(rel16)), "rbjax_max": float(rel16.max()),
                                        "torch_autocast_median": float(np.median(trel16)),
                                        "torch_autocast_max": float(trel16.max())}
    res["compile"] = {k: {"programs": sc.compile_count, "first_call_s": round(first[k], 2)}
                      for k, sc in scorers.items()}
    ratios = {"rbjax_fp32_over_torch_sorted_fp32": res["rbjax_fp32"] / res["torch_sorted_fp32"]}
    if not args.no_bf16:
        ratios.update({
            "rbjax_bf16_over_torch_sorted_bf16": res["rbjax_bf16"] / res["torch_sorted_bf16"],
            "rbjax_bf16_over_torch_sorted_fp32": res["rbjax_bf16"] / res["torch_sorted_fp32"],
            "rbjax_bf16_over_rbjax_fp32": res["rbjax_bf16"] / res["rbjax_fp32"],
        })
    if len(loop_idx):
        ratios["rbjax_fp32_over_torch_one_at_a_time"] = res["rbjax_fp32"] / res["torch_one_at_a_time"]
    depends = {k: ["rounds"] for k in ratios}
    res.update(family=args.family, model_class=type(tmodel).__name__, n_pairs=len(A), n_phrases=n, n_tokens=n_tok, batch_size=args.batch_size, torch_batch=args.torch_batch,
               rounds=args.rounds, torch_device=tdev, jax_backend=jax.default_backend(),
               machine=f"{cpu_name()}, {os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.default_backend()}: "
                       f"{jax.devices()[0].device_kind}), torch {torch.__version__} ({tdev})")
    try:
        res["load_average"] = os.getloadavg()
    except OSError:
        pass

    # ------------------------------------------------------------------ report
    print(f"\nmachine: {res['machine']}", file=sys.stderr)
    print(f"matmul peak (GFLOP/s, sustained, median of rounds): {res['peak_gflops']}", file=sys.stderr)
    print(f"{'method':>30} {'phrases/s':>10} {'floor':>8} {'of floor':>9}   rounds", file=sys.stderr)
    for k in runs:
        print(f"{k:>30} {res[k]:10.1f} {res['floor_phrases_per_s'][k]:8.1f} {res['fraction_of_floor'][k]:9.1%}   "
              f"{res[k + '_rounds']}", file=sys.stderr)
    r = {k: mon.ratio_text(v, unit="x", sections=depends[k]) for k, v in ratios.items()}
    print(f"rbjax fp32 / PyTorch sorted fp32: {r['rbjax_fp32_over_torch_sorted_fp32']}" + (
          "" if args.no_bf16 else f"   rbjax bf16 / PyTorch bf16 autocast: {r['rbjax_bf16_over_torch_sorted_bf16']}"
          f"   rbjax bf16 / fp32: {r['rbjax_bf16_over_rbjax_fp32']}"), file=sys.stderr)
    print(f"prefix sharing saves {res['tokens_saved_by_prefix_sharing']:.1%} of the tokens; padding "
          f"{res['rbjax_padding_fraction']:.1%} of the slots; head rows / predicting positions "
          f"{res['rbjax_head_rows_over_predicting']:.3f}", file=sys.stderr)
    print(f"parity: max rel diff of perplexity vs PyTorch fp32 {res['max_rel_diff_ppl_rbjax_vs_torch_fp32']:.1e}; "
          f"bf16 rel err of mean NLL: {res.get('bf16_rel_err_mean_nll', 'not measured (--no-bf16)')}", file=sys.stderr)
    print(f"compile: {res['compile']}", file=sys.stderr)
    if tdev != "cuda" and jax.default_backend() != "cpu":
        print("note: PyTorch ran on the CPU, rbjax on the accelerator: not like for like", file=sys.stderr)
    print(json.dumps(mon.finish(res, ratios, depends)))


if __name__ == "__main__":
    main()
