"""Decode speed of batched sampling at the DialoGPT-small shape (random weights): rbjax's KV-cache sampler vs
PyTorch ``generate``, on the same machine, in one interleaved run.

Prompts are DSTC-7 test contexts (``../shared/redditbias/data/dstc7/response_hyp.txt``) tokenised, cut to their last
63 tokens and followed by ``<|endoftext|>`` (:func:`rbjax.dialog.crg_generation.build_prompt`). Both sides sample with
top-k 50 for ``--new-tokens`` new tokens, left-padded batches of ``--batch`` prompts, their own KV cache
(PyTorch: ``GPT2LMHeadModel.generate(do_sample=True, top_k=50, attention_mask=...)``). Random weights almost never
produce EOS, so every row generates the full budget; tokens/s counts the tokens actually generated (EOS included,
padding after it excluded), over the whole call (prefill included, on both sides). rbjax's compile time is reported
separately (first call minus a steady call); PyTorch gets one untimed warm-up call. The last line is JSON; its
``"ratios"`` move to ``"void_ratios"`` (and print as VOID) when the machine had foreign CPU load during the timed
rounds (``"load"``, ``benchmarks/_common.py``).

    python benchmarks/bench_generate.py [--prompts 32] [--batch 16] [--new-tokens 32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
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
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    ap.add_argument("--contexts", default=str(SHARED / "redditbias/data/dstc7/response_hyp.txt"))
    args = ap.parse_args()

    import jax
    import torch
    import transformers

    from rbjax.dialog.crg_generation import build_prompt
    from rbjax.model.generate import SamplingSettings, generate
    from rbjax.model.hf import load_pretrained
    from rbjax.model.tokenizer import load_tokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    tok = load_tokenizer(args.tokenizer)
    ctx = list(json.loads(Path(args.contexts).read_text()).values())[:args.prompts]
    ctx = [c.replace("__UNDISCLOSED__", "") for c in ctx]
    prompts = [build_prompt(t, tok.eos_id) for t in tok.encode_batch(ctx)]
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} tokens (lengths {min(map(len, prompts))}-"
          f"{max(map(len, prompts))}), batch {args.batch}, {args.new_tokens} new tokens", file=sys.stderr)

    cfg_json = json.loads((SHARED / "models/dialogpt-small-config/config.json").read_text())
    torch.manual_seed(0)
    tcfg = transformers.GPT2Config(**{k: cfg_json[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer",
                                                                 "n_head")})
    tmodel = transformers.GPT2LMHeadModel(tcfg).eval()
    with tempfile.TemporaryDirectory() as d:
        tmodel.save_pretrained(d)
        cfg, params = load_pretrained(d)
    params = jax.device_put(params)
    eos = tok.eos_id
    settings = SamplingSettings(max_new_tokens=args.new_tokens, top_k=50)

    def rbjax_run(precision):
        def run():
            g = generate(params, cfg, prompts, settings=settings, seed=0, batch_size=args.batch, precision=precision)
            return sum(len(t) + int(e) for t, e in zip(g.tokens, g.stopped_at_eos))
        return run

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))

    def torch_run():
        n_tok = 0
        with torch.inference_mode():
            for s in range(0, len(order), args.batch):
                rows = [prompts[i] for i in order[s:s + args.batch]]
                P = max(map(len, rows))
                x = torch.full((len(rows), P), eos, dtype=torch.long)
                m = torch.zeros((len(rows), P), dtype=torch.long)
                for r, p in enumerate(rows):
                    x[r, P - len(p):] = torch.tensor(p)
                    m[r, P - len(p):] = 1
                out = tmodel.generate(x, attention_mask=m, do_sample=True, top_k=50, max_new_tokens=args.new_tokens,
                                      pad_token_id=eos, eos_token_id=eos)
                new = out[:, P:]
                for row in new.tolist():
                    k = row.index(eos) + 1 if eos in row else len(row)
                    n_tok += k
        return n_tok

    res: dict = {}
    runs = {"torch_generate_fp32": torch_run, "rbjax_fp32": rbjax_run("fp32"), "rbjax_bf16": rbjax_run("bf16")}
    first = {}
    mon = LoadMonitor()
    runs["torch_generate_fp32"]()  # warm-up (first-call overheads), not timed
    with mon.section("rbjax_first_calls"):
        for k in ("rbjax_fp32", "rbjax_bf16"):
            t0 = time.perf_counter()
            runs[k]()
            first[k] = time.perf_counter() - t0
    rates: dict = {k: [] for k in runs}
    counts = {}
    with mon.section("rounds"):  # both frameworks, interleaved
        for _ in range(args.rounds):
            for k, fn in runs.items():
                t0 = time.perf_counter()
                counts[k] = fn()
                rates[k].append(counts[k] / (time.perf_counter() - t0))
    for k, v in rates.items():
        res[k] = float(np.median(v))
        res[k + "_rounds"] = [round(x, 1) for x in v]
        res[k + "_tokens"] = counts[k]
    steady = {k: counts[k] / res[k] for k in ("rbjax_fp32", "rbjax_bf16")}
    res["rbjax_compile_s"] = {k: round(first[k] - steady[k], 2) for k in first}
    ratios = {"ratio_rbjax_fp32_over_torch": res["rbjax_fp32"] / res["torch_generate_fp32"],
              "ratio_rbjax_bf16_over_torch": res["rbjax_bf16"] / res["torch_generate_fp32"]}
    depends = {k: ["rounds"] for k in ratios}
    res.update(prompts=len(prompts), batch=args.batch, new_tokens=args.new_tokens, rounds=args.rounds,
               machine=f"{os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.default_backend()}), "
                       f"torch {torch.__version__}, transformers {transformers.__version__}")
    try:
        res["load_average"] = os.getloadavg()
    except OSError:
        pass
    for k in runs:
        print(f"{k:>22}: {res[k]:8.1f} new tokens/s   rounds {res[k + '_rounds']}", file=sys.stderr)
    txt = {k: mon.ratio_text(v, unit="x", sections=depends[k]) for k, v in ratios.items()}
    print(f"rbjax fp32 / PyTorch generate: {txt['ratio_rbjax_fp32_over_torch']}; bf16: "
          f"{txt['ratio_rbjax_bf16_over_torch']}; rbjax compile {res['rbjax_compile_s']} s", file=sys.stderr)
    print(json.dumps(mon.finish(res, ratios, depends)))


if __name__ == "__main__":
    main()
