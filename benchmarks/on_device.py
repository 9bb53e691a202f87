"""One prepared run on a machine with an NVIDIA GPU: parity and speed of rbjax against transformers / PyTorch CUDA.

Run by ``benchmarks/on_device.sh`` (which first installs the jax CUDA wheel matching the installed jax), in at most
about 8 minutes on one H100/H200; every figure lands in one JSON file (``--out``, default ``on_device.json``):

* ``parity``: fp32 logits of rbjax and ``transformers`` on the same random weights (rbjax's initialiser, saved as an
  HF folder and read by both), on the GPU, at the DialoGPT-small shape (GPT-2, 12 layers, width 768, vocabulary
  50,257) and at a ~1.1B Llama shape (22 layers, width 2,048, 32 query / 4 key-value heads, MLP 5,632, vocabulary
  32,000: TinyLlama's): the largest absolute difference over a 4 × 128 batch, relative to the largest logit;
* ``scoring``: LMB scoring of real RedditBias test phrases (DialoGPT-small shape) — rbjax's ``PerplexityScorer``
  against PyTorch CUDA in length-sorted padded batches, interleaved rounds, median wall time each, and the largest
  per-phrase difference of the mean NLL;
* ``debias_update``: one HD update (paper semantics: LM loss + hard-debiasing loss, clip 1.0, Adam) at the
  DialoGPT-small shape on 8 religion1 training phrases — rbjax's ``train_step`` against the same update written in
  PyTorch (``benchmarks/_common.py``'s ``TorchStep``, the loss of ``bench_train_step.py``), interleaved, median of
  the timed updates;
* ``lora_update``: one LoRA update (rank 8, α 16, every linear layer, LM loss, AdamW, clip 1.0) — rbjax's frozen-base
  ``train_step`` against PEFT on ``GPT2LMHeadModel``, same batch, interleaved.

Each speed figure is ``rbjax / PyTorch`` in the same process on the same device (the first update or round, which
compiles, is timed apart). The interleaved rounds of each section are a section of the load monitor
(``benchmarks/_common.py``): its foreign CPU is in ``"load"``, and a section's ratio is kept (``"ratio"``, and under
``"ratios"``) only when the host had no foreign CPU load while it was timed; otherwise it is ``"void_ratio"`` (under
``"void_ratios"``) and prints as VOID. ``--dry-run`` runs every section on the CPU at tiny shapes (a 2-layer width-64
GPT-2 and Llama, a few phrases): it checks the script, not speed, and is what ``tests/test_on_device.py`` runs.

    python benchmarks/on_device.py [--dry-run] [--out FILE] [--rounds 5]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import (LoadMonitor, RbjaxStep, TorchStep, build_batch, interleaved,  # noqa: E402
                                medians, torch_gpt2, torch_sorted_mean_nll)

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))

GPT2_FULL = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
             "n_head": 12, "bos_token_id": 50256, "eos_token_id": 50256}
LLAMA_1B = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
            "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2}
TINY = {"gpt2": {**GPT2_FULL, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 256},
        "llama": {**LLAMA_1B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}}


def _log(msg: str) -> None:
    print(f"[on_device] {msg}", file=sys.stderr, flush=True)


class Clock:
    """Wall time of a call on the device: waits for PyTorch's CUDA stream (rbjax's callers block on their results)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - t0


def _model_folder(hf_config: dict, root: Path, seed: int = 0):
    """rbjax's random weights for an HF config dict, saved as an HF folder: ``(config, params, folder)``."""
    import jax

    from rbjax.model.hf import save_pretrained
    from rbjax.model.registry import FAMILIES

    fam = FAMILIES[hf_config["model_type"]]
    cfg = fam.config_from_hf(dict(hf_config), hf_config["model_type"])
    params = jax.device_get(fam.init_params(cfg, seed))
    folder = save_pretrained(params, cfg, root / hf_config["model_type"])
    return cfg, params, folder


def parity(hf_config: dict, root: Path, torch, device, seq: int) -> dict:
    import jax
    import numpy as np
    import transformers

    from rbjax.model.hf import load_pretrained
    from rbjax.model.registry import family_of_config

    _, _, folder = _model_folder(hf_config, root)
    cfg, params = load_pretrained(folder)  # as every rbjax command reads a model
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, seq))
    ours = np.asarray(jax.jit(lambda p, i: family_of_config(cfg).module(cfg).apply({"params": p}, i)[0])(params, ids))
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        ref = tm(torch.tensor(ids, device=device)).logits.float().cpu().numpy()
    del tm
    scale = float(np.abs(ref).max())
    return {"model_type": hf_config["model_type"], "n_params": int(sum(x.size for x in jax.tree.leaves(params))),
            "batch": list(ids.shape), "max_abs_diff": float(np.abs(ours - ref).max()), "max_abs_logit": scale,
            "relative": float(np.abs(ours - ref).max() / scale)}


def _phrases(n: int):
    from rbjax.data.redditbias import load_pairs
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    texts = []
    for b in ("religion1", "religion2", "race", "gender", "queerness"):
        p = load_pairs(b, "test", SHARED / "redditbias")
        texts += list(p.biased) + list(p.counterfactual)
    step = max(1, len(texts) // n)
    return tok, [ids for ids in tok.encode_batch(texts[::step][:n]) if len(ids) >= 2]


def scoring(cfg, params, torch, device, tm, n: int, rounds: int, batch: int, mon: LoadMonitor) -> dict:
    import numpy as np

    from rbjax.lmb.perplexity import PerplexityScorer

    tok, ids = _phrases(n)
    clock = Clock(torch, device)
    scorer = PerplexityScorer(params, cfg, batch_size=batch)
    ref = np.zeros(len(ids))

    def torch_score():
        ref[:] = torch_sorted_mean_nll(tm, ids, batch, device)

    out = {}
    first = time.perf_counter()
    ours = scorer.score_ids(ids)
    out["rbjax_first_s"] = time.perf_counter() - first
    times = interleaved(mon, "scoring", rounds, {"rbjax": lambda: clock(lambda: scorer.score_ids(ids)),
                                                 "torch": lambda: clock(torch_score)})
    med = medians(times)
    return {**out, "phrases": len(ids), "tokens": int(sum(map(len, ids))), "times_s": times,
            "rbjax_s": med["rbjax"], "torch_s": med["torch"], "ratio": med["torch"] / med["rbjax"],
            "max_abs_mean_nll_diff": float(np.nanmax(np.abs(ours.mean_nll - ref)))}


def debias_update(cfg, params, torch, device, rounds: int, mon: LoadMonitor) -> dict:
    import jax
    import numpy as np

    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    batch, shared = build_batch("hd", "paper", tok, SHARED / "redditbias")
    ours = RbjaxStep(cfg, params)
    ref = TorchStep(cfg, params)
    ref.model.to(device)
    ref.opt = torch.optim.AdamW(ref.model.parameters(), lr=5e-5, weight_decay=0.0)
    conv, sh = ref.convert(batch, shared)
    conv = {k: v.to(device) for k, v in conv.items()}
    sh = {k: v.to(device) for k, v in sh.items()}
    clock = Clock(torch, device)
    first = ours(batch, shared, "hd", "paper")
    clock(lambda: ref(conv, sh, "hd", "paper"))  # warm-up
    times = interleaved(mon, "debias_update", rounds, {"rbjax": lambda: ours(batch, shared, "hd", "paper"),
                                                        "torch": lambda: clock(lambda: ref(conv, sh, "hd", "paper"))})
    med = medians(times)
    jax.clear_caches()
    return {"method": "hd", "tokens": int(np.asarray(batch["attention_mask"]).size), "rbjax_first_s": first,
            "times_s": times, "rbjax_s": med["rbjax"], "torch_s": med["torch"], "ratio": med["torch"] / med["rbjax"]}


def lora_update(cfg, params, torch, device, rounds: int, mon: LoadMonitor) -> dict:
    import jax
    import numpy as np
    import peft

    from rbjax.debias.objective import DebiasObjective
    from rbjax.model.lora import LoraSpec, add_adapters
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.batching import dropout_key
    from rbjax.train.frozen import split, trainable_rule
    from rbjax.train.step import StepSpec, init_state, train_step_jit

    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    batch, _ = build_batch("lm", "paper", tok, SHARED / "redditbias")
    spec_l = LoraSpec(rank=8, alpha=16.0, targets="all-linear")
    objective = DebiasObjective("lm")
    spec = StepSpec(config=cfg, objective=objective, dropout=True)
    adapted = add_adapters(params, cfg, spec_l, seed=0)
    trained, frozen = split(adapted, trainable_rule(adapted, objective))
    frozen = jax.device_put(frozen)
    state = init_state(jax.tree.map(jax.numpy.array, trained), spec, hparams={}, lr=2e-4, t_total=1000)
    host = {k: np.asarray(v)[None] for k, v in batch.items()}
    counter = [0]

    def ours():
        nonlocal state
        host["rng"] = dropout_key(0, 0, counter[0])[None]
        counter[0] += 1
        t0 = time.perf_counter()
        state, m = train_step_jit(state, host, frozen, spec=spec)
        float(jax.device_get(m["total"]))
        jax.block_until_ready(state.params)
        return time.perf_counter() - t0

    base = torch_gpt2(cfg, params)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                   task_type="CAUSAL_LM")).to(device).train()
    tuned = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(tuned, lr=2e-4, weight_decay=0.0)
    ids = torch.tensor(np.asarray(batch["input_ids"])).long().to(device)
    mask = torch.tensor(np.asarray(batch["attention_mask"])).long().to(device)

    def theirs():
        opt.zero_grad(set_to_none=True)
        pm(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        torch.nn.utils.clip_grad_norm_(tuned, 1.0)
        opt.step()

    clock = Clock(torch, device)
    first = ours()
    clock(theirs)  # warm-up
    times = interleaved(mon, "lora_update", rounds, {"rbjax": ours, "torch": lambda: clock(theirs)})
    med = medians(times)
    return {"rank": 8, "tokens": int(mask.numel()), "rbjax_first_s": first, "times_s": times,
            "rbjax_s": med["rbjax"], "torch_s": med["torch"], "ratio": med["torch"] / med["rbjax"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the script, not speed")
    ap.add_argument("--out", default="on_device.json", help="the JSON file to write")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per section")
    ap.add_argument("--phrases", type=int, default=1024, help="RedditBias test phrases scored per round")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    rounds = 2 if args.dry_run else args.rounds
    gpt2, llama = (TINY["gpt2"], TINY["llama"]) if args.dry_run else (GPT2_FULL, LLAMA_1B)
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "dry_run": args.dry_run,
           "jax": jax.__version__, "jax_devices": [str(d) for d in jax.devices()],
           "torch": torch.__version__, "torch_device": str(device),
           "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
           "host": platform.node(), "cpus": os.cpu_count()}
    if not args.dry_run and jax.default_backend() != "gpu":
        _log(f"jax runs on {jax.default_backend()}, not a GPU: install the CUDA wheel (benchmarks/on_device.sh)")
    t_all = time.perf_counter()
    mon = LoadMonitor()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        res["parity"] = []
        for hc in (gpt2, llama):
            _log(f"parity {hc['model_type']}")
            res["parity"].append(parity(hc, root / "parity", torch, device, seq=32 if args.dry_run else 128))
            jax.clear_caches()
        cfg, params, folder = _model_folder(gpt2, root / "speed")
        import transformers

        tm = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(device).eval()
        _log("scoring")
        res["scoring"] = scoring(cfg, params, torch, device, tm, 48 if args.dry_run else args.phrases, rounds,
                                 batch=16 if args.dry_run else 64, mon=mon)
        del tm
        _log("debias update (hd)")
        res["debias_update"] = debias_update(cfg, params, torch, device, rounds, mon)
        _log("lora update")
        res["lora_update"] = lora_update(cfg, params, torch, device, rounds, mon)
    res["total_s"] = time.perf_counter() - t_all
    sections = ("scoring", "debias_update", "lora_update")  # each ratio timed in its own section of the monitor
    ratios = {k: res[k].pop("ratio") for k in sections}
    for k in sections:
        _log(f"{k}: time PyTorch / rbjax {mon.ratio_text(ratios[k], unit='x', sections=[k])}")
        res[k]["void_ratio" if mon.void_sections([k]) else "ratio"] = ratios[k]
    mon.finish(res, ratios, {k: [k] for k in sections})
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    _log(f"wrote {args.out} in {res['total_s']:.0f} s")
    print(json.dumps({k: res[k] for k in ("gpu", "jax_devices")} | {
        "parity_relative": [p["relative"] for p in res["parity"]]}
        | {k: res[k] for k in ("ratios", "void_ratios", "load") if k in res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
