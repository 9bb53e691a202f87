"""A whole training command, as a user runs it: ``rbjax debias`` (LM loss, HD) and ``rbjax evaluate --task dst``
against a PyTorch reference-style loop of the same updates, wall clock from the command's start to its last update.

* Model: a random GPT-2 at the DialoGPT-small shape (12 layers, width 768, vocabulary 50257; rbjax's initialiser),
  saved once as a Hugging Face folder with the GPT-2 tokenizer; both frameworks load it from there.
* rbjax: the real command in a fresh process (``python -m rbjax --compile-cache DIR debias --method lm|hd --bias
  religion1 --batch-size 8 --max-steps N --no-export --no-eval --no-lmp``, or ``evaluate --task dst --max-steps N``:
  batch 12 × accumulation 4, the reference's), in two states of the persistent compilation cache: **cold** (an empty
  cache folder: every program compiled) and **warm** (the same command again: every program read from the cache).
  The time to the last update is read from the run's ``metrics.jsonl`` (the session's start + its compile time + the
  last update's ``elapsed_s``), so the final checkpoint write is not counted; ``evaluate --task dst`` goes on to the
  tracker's test-split evaluation, so its process is stopped once its last update is in ``metrics.jsonl``.
* PyTorch: a fresh process that loads the same folder with ``transformers``, builds the same micro-batches (rbjax's
  batch plan: the same phrases in the same order, seed 42) padded to each batch's longest phrase (the reference
  collator), and runs the same updates: forward, the same loss (LM; HD's neutralisation loss in torch ops, paper
  semantics, as ``bench_train_step.py``; DST's BCE on the last real token), backward, ``clip_grad_norm_(1.0)``,
  ``AdamW(lr 5e-5, wd 0)`` with linear decay, dropout 0.1 on. Its time runs from its process start to its last
  update.
* **The fixed part of an update** (``--fixed``): rbjax's clip + Adam + apply (:class:`rbjax.train.optim.ClipAdam`,
  jitted, the state donated) over the model's 124M float32 parameters, against the memory floor measured in the same
  process: one fused elementwise pass that reads and writes the same bytes (p, g, m, v in; p, m, v out), and optax's
  chain for reference.

The runs are interleaved (for each repeat: rbjax cold, rbjax warm, PyTorch, per method), so load drifts on a shared
machine hit all of them alike; the best repeat of each is kept and all are recorded.

Usage::

    python benchmarks/bench_debias_run.py [--methods lm,hd,dst] [--steps 60] [--repeats 1] [--fixed]

The last line printed is a JSON object with the figures and the ratios (``"ratios"``: ``<method>_vs_torch``, PyTorch's
time over rbjax's, warm and cold; ``fixed_*_over_floor``). Each run is a section of the load monitor
(``benchmarks/_common.py``, its process tree included): a method's ratios move to ``"void_ratios"`` when the machine had
foreign CPU load during one of its runs (``"load"``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor, dst_array_data, torch_losses  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
TOKENIZER = SHARED / "tokenizers" / "gpt2"
REDDITBIAS = SHARED / "redditbias"
MULTIWOZ = SHARED / "dialog-data" / "multiwoz"
LM_BATCH, DST_BATCH, DST_ACCUM = 8, 12, 4


def model_config(smoke: bool):
    from rbjax.model.gpt2 import GPT2Config

    return GPT2Config(n_layer=2, n_embd=64, n_head=2) if smoke else GPT2Config()  # DialoGPT-small shape


def make_model(folder: Path, smoke: bool) -> Path:
    from rbjax.model.gpt2 import init_params
    from rbjax.model.hf import save_pretrained

    config = model_config(smoke)
    return save_pretrained(init_params(config, seed=0), config, folder, tokenizer_dir=TOKENIZER)


# ------------------------------------------------------------------------------------------------------ rbjax
def rbjax_command(method: str, model: Path, out: Path, cache: Path, steps: int) -> list[str]:
    head = [sys.executable, "-m", "rbjax", "--compile-cache", str(cache)]
    if method == "dst":
        return head + ["evaluate", "--task", "dst", "--model", str(model), "--out", str(out), "--multiwoz",
                       str(MULTIWOZ), "--max-steps", str(steps),
                       "--no-progress"]
    return head + ["debias", "--method", method, "--bias", "religion1", "--model", str(model), "--data-dir",
                   str(REDDITBIAS), "--out", str(out), "--batch-size", str(LM_BATCH), "--max-steps", str(steps),
                   "--no-export", "--no-eval", "--no-lmp", "--no-progress", "--save-every-s", "0"]


def run_rbjax(method: str, model: Path, work: Path, cache: Path, steps: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{method}_", dir=work))
    metrics = out / ("dst_train" if method == "dst" else "") / "metrics.jsonl"
    t0 = time.time()
    if method != "dst":
        p = subprocess.run(rbjax_command(method, model, out, cache, steps), capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise RuntimeError(f"rbjax {method} failed:\n{p.stderr[-3000:]}")
        stderr = p.stderr
    else:  # rbjax evaluate goes on to the test split's evaluation, which is not timed: stopped after the last update
        with tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen(rbjax_command(method, model, out, cache, steps), stdout=subprocess.DEVNULL,
                                 stderr=err, text=True, cwd=ROOT)
            while p.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) >= steps):
                time.sleep(0.5)
            if p.poll() is None:
                time.sleep(1.0)  # (the last line written whole)
                p.terminate()  # SIGTERM: rbjax stops (its training is saved) instead of evaluating
                p.wait()
            elif p.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"rbjax {method} failed:\n{err.read()[-3000:]}")
            err.seek(0)
            stderr = err.read()
    lines = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    first, last = lines[0], lines[-1]
    to_last = first["session"] + first.get("compile_s", 0.0) + last["elapsed_s"] - t0
    report = [ln for ln in stderr.splitlines() if "XLA:" in ln]
    tokens = sum(r["tokens"] for r in lines)
    shutil.rmtree(out, ignore_errors=True)
    return {"to_last_update_s": to_last, "compile_s": first.get("compile_s"), "updates": len(lines),
            "tokens": tokens, "update_s": last["elapsed_s"], "xla": report[-1] if report else None}


# ---------------------------------------------------------------------------------------------------- PyTorch
def torch_worker(args) -> dict:
    """The reference-style loop in this (fresh) process; prints the wall time of its last update."""
    import numpy as np
    import torch
    import transformers

    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.batching import BatchPlan

    torch.manual_seed(0)
    tok = load_tokenizer(TOKENIZER)
    model = transformers.GPT2LMHeadModel.from_pretrained(args.model)
    model.train()
    if args.method == "dst":
        data = dst_array_data(DST_BATCH * DST_ACCUM * (args.steps + 1), tok)
        plan = BatchPlan(data, DST_BATCH, DST_ACCUM, 1, 42, "drop", args.steps, layout="padded")
    else:
        from rbjax.debias.config import DebiasRun
        from rbjax.debias.data import TrainingData

        cfg = DebiasRun.from_flat(method=args.method, bias_type="religion1", model=args.model,
                                  data_dir=str(REDDITBIAS), batch_size=LM_BATCH, max_steps=args.steps)
        data = TrainingData(cfg, tok, model.config.vocab_size)
        plan = BatchPlan.of_run(data, cfg.trainer_config.replace(layout="padded"))
    head = torch.nn.Linear(model.config.n_embd, 1)
    params = list(model.parameters()) + (list(head.parameters()) if args.method == "dst" else [])
    opt = torch.optim.AdamW(params, lr=5e-5, eps=1e-8, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: max(0.0, 1.0 - u / plan.t_total))
    F = torch.nn.functional
    shared = {k: torch.tensor(np.asarray(v)) for k, v in data.shared.items()}

    def loss_of(mb):
        n = int(mb["attention_mask"].sum(1).max())  # the reference collator: pad to the batch's longest
        ids = torch.tensor(mb["input_ids"][:, :n]).long()
        mask = torch.tensor(mb["attention_mask"][:, :n]).long()
        if args.method == "dst":
            h = model.transformer(input_ids=ids, attention_mask=mask).last_hidden_state
            last = mask.sum(1).clamp(min=1) - 1
            logit = head(h[torch.arange(len(ids)), last])[:, 0]
            w = (mask.sum(1) > 0).float()
            lab = torch.tensor(mb["labels"]).float()
            return (F.binary_cross_entropy_with_logits(logit, lab, reduction="none") * w).sum() / w.sum()
        if args.method == "lm":
            return model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        batch = {"input_ids": ids, "attention_mask": mask,
                 "occ_weights": torch.tensor(mb["occ_weights"][:, :, :n]).float(),
                 "occ_mask": torch.tensor(mb["occ_mask"]).float()}
        return torch_losses(model, batch, shared, args.method, "paper", (0.01, 10.0), torch)[2]

    for u in range(plan.t_total):
        opt.zero_grad(set_to_none=True)
        mbs = [plan.micro_batch(e, b) for e, b in plan.plan[u]]
        for mb in mbs:
            (loss_of(mb) / len(mbs)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
    return {"last_update_time": time.time(), "updates": plan.t_total, "threads": torch.get_num_threads()}


def run_torch(method: str, model: Path, steps: int) -> dict:
    t0 = time.time()
    p = subprocess.run([sys.executable, __file__, "--worker", "torch", "--method", method, "--model", str(model),
                        "--steps", str(steps)], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"PyTorch {method} failed:\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"to_last_update_s": r["last_update_time"] - t0, "updates": r["updates"], "threads": r["threads"]}


# ------------------------------------------------------------------------------------------- the fixed part
def fixed_part(smoke: bool, repeats: int = 5) -> dict:
    """Clip + Adam + apply over the model's parameters: rbjax's fused update, optax's chain, and the memory floor
    (one fused pass over the same bytes), each jitted with its buffers donated; the median of ``repeats`` calls."""
    import statistics

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rbjax.model.gpt2 import init_params
    from rbjax.train.optim import make_optimizer, reference_optimizer

    params = jax.device_put(init_params(model_config(smoke), seed=0))
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    opt = make_optimizer()
    ref = reference_optimizer(opt)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)

    fused = jax.jit(lambda p, g, s: opt.apply(p, g, s, 5e-5)[:2], donate_argnums=(0, 2))

    def chain_fn(p, g, s):
        d, s = ref.update(g, s, p)
        return jax.tree.map(lambda a, b: a - 5e-5 * b, p, d), s

    chain = jax.jit(chain_fn, donate_argnums=(0, 2))

    def floor_fn(p, g, m, v):  # reads p, g, m, v and writes p, m, v once: the bytes any Adam update must move
        out = jax.tree.map(lambda a, b, c, d: (a + b * 1e-7, c * 0.9 + b, d * 0.999 + b), p, g, m, v)
        tree = jax.tree.structure(p)
        flat = tree.flatten_up_to(out)
        return tuple(tree.unflatten([t[i] for t in flat]) for i in range(3))

    floor = jax.jit(floor_fn, donate_argnums=(0, 2, 3))

    def timed(fn, *state):
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            state = fn(*state)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])  # the first call compiles

    copy = lambda t: jax.tree.map(jnp.copy, t)  # noqa: E731
    t_fused = timed(lambda p, s: fused(p, grads, s), copy(params), opt.init(params))
    t_chain = timed(lambda p, s: chain(p, grads, s), copy(params), ref.init(params))
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)  # noqa: E731
    t_floor = timed(lambda p, m, v: floor(p, grads, m, v), copy(params), zeros(), zeros())
    moved = 7 * 4 * n  # bytes: p, g, m, v read; p, m, v written (float32)
    return {"parameters": n, "fused_s": t_fused, "optax_chain_s": t_chain, "floor_s": t_floor,
            "floor_GB_per_s": moved / t_floor / 1e9, "fused_over_floor": t_fused / t_floor,
            "optax_over_floor": t_chain / t_floor}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="lm,hd,dst", help="comma list of lm, hd, dst")
    ap.add_argument("--steps", type=int, default=60, help="updates per run")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--fixed", action="store_true", help="also time the fixed part of an update")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a 2-layer width-64 model (checks the script, not speed)")
    ap.add_argument("--worker", choices=["torch"], help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(torch_worker(args)))
        return 0

    from rbjax.core.io import versions

    work = Path(tempfile.mkdtemp(prefix="bench_debias_run_"))
    try:
        model = make_model(work / "model", args.smoke)
        out: dict = {"runs": {}, "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
                     "steps": args.steps, "versions": versions(("torch", "transformers"))}
        mon = LoadMonitor()
        for r in range(args.repeats):
            for m in args.methods.split(","):
                cold = work / f"cache_cold_{m}_{r}"
                res = out["runs"].setdefault(m, {"cold": [], "warm": [], "torch": []})
                with mon.section(f"{m} rbjax cold"):
                    res["cold"].append(run_rbjax(m, model, work, cold, args.steps))
                with mon.section(f"{m} rbjax warm"):
                    res["warm"].append(run_rbjax(m, model, work, cold, args.steps))  # the same cache, now filled
                if not args.no_torch:
                    with mon.section(f"{m} torch"):
                        res["torch"].append(run_torch(m, model, args.steps))
                line = {k: round(v[-1]["to_last_update_s"], 1) for k, v in res.items() if v}
                print(f"[{m} repeat {r + 1}] seconds to the last update: {line}", file=sys.stderr, flush=True)
                out.setdefault("cache_MB", {})[m] = round(sum(f.stat().st_size for f in cold.rglob("*")
                                                              if f.is_file()) / 2**20, 1)
        ratios, depends = {}, {}
        for m, res in out["runs"].items():
            best = {k: min(x["to_last_update_s"] for x in v) for k, v in res.items() if v}
            out.setdefault("best_s", {})[m] = best
            if "torch" in best:
                ratios[f"{m}_vs_torch"] = {"warm": best["torch"] / best["warm"], "cold": best["torch"] / best["cold"]}
                depends[f"{m}_vs_torch"] = [f"{m} rbjax cold", f"{m} rbjax warm", f"{m} torch"]
                print(f"[{m}] PyTorch / rbjax, time to the last update: warm "
                      f"{mon.ratio_text(ratios[f'{m}_vs_torch']['warm'], sections=depends[f'{m}_vs_torch'])}, cold "
                      f"{mon.ratio_text(ratios[f'{m}_vs_torch']['cold'], sections=depends[f'{m}_vs_torch'])}",
                      file=sys.stderr)
        if args.fixed:
            with mon.section("fixed_part"):
                out["fixed_part"] = fixed_part(args.smoke)
            for k in ("fused_over_floor", "optax_over_floor"):
                ratios[f"fixed_{k}"], depends[f"fixed_{k}"] = out["fixed_part"].pop(k), ["fixed_part"]
        mon.finish(out, ratios, depends)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
