"""Packed-training benchmark: real (non-pad) tokens/s of the trainer's update as ``rbjax debias`` feeds it.

Same phrases, same micro-batches, DialoGPT-small shape (random GPT-2 117M: 12 layers, width 768, vocabulary 50257,
rbjax's initialiser, copied into PyTorch), dropout 0.1 on, Adam 5e-5, clip 1.0, accumulation 1:

* ``lm-packed`` — rbjax's update as ``rbjax debias`` feeds it now: :class:`rbjax.train.batching.BatchPlan` in the
  packed layout (religion1 training phrases, GPT-2 tokenizer, batch 8, seed 42, the plan's few static packed
  shapes; :func:`rbjax.train.step.train_step`), LM loss;
* ``lm-padded`` — the same updates in the padded layout (8 × 36, the trainer before packing);
* ``lm-torch`` — a PyTorch step (``transformers.GPT2LMHeadModel``, the same weights) on the same micro-batches,
  each padded to its longest phrase (the reference Trainer's collator), LM loss;
* ``dst-packed`` / ``dst-padded`` / ``dst-torch`` — the DST classifier step (GPT-2 + ``Linear(768→1)`` on the last
  real token, BCE) on real binary slot-value examples of the offline MultiWOZ 2.0 test split, batch 12: rbjax packed,
  rbjax padded (columns no example uses trimmed, as ``rbjax evaluate`` trains), PyTorch padded to each batch's
  longest example.

The timed updates are the plan's first ``--steps`` updates (so the packed shapes occur as often as in training);
every variant runs the same update in a round, round after round (interleaved), so load drifts on a shared machine
hit every variant alike. rbjax compiles every packed shape of the plan before timing (compile time reported
apart). Each framework runs in its own process (an idle thread pool of one slows the other), alternated
``--repeats`` times; per variant the best repeat (lowest total time) is kept, all are recorded. tokens/s = real
tokens of the timed updates / their total time; a timed update includes building and transferring its host batch.

Usage::

    python benchmarks/bench_packed_train.py [--steps 12] [--repeats 1] [--variants lm,dst]

The last line printed is a JSON object with the figures and the ratios packed/torch and packed/padded. Each worker
process is a section of the load monitor (``benchmarks/_common.py``, the worker's CPU counted as its own): the ratios
move to ``"void_ratios"`` (and print as VOID) when the machine had foreign CPU load during any worker (``"load"``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor, dialogpt_config, dst_array_data, random_params, torch_gpt2  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
LM_BATCH, DST_BATCH = 8, 12


def model_config(args):
    return dialogpt_config(args.smoke)  # DialoGPT-small shape


def lm_data(tok, config):
    from rbjax.debias.config import DebiasRun
    from rbjax.debias.data import TrainingData

    cfg = DebiasRun.from_flat(method="lm", bias_type="religion1", model="random", data_dir=str(SHARED / "redditbias"),
                              batch_size=LM_BATCH, export=False, evaluate=False, lmp=False, progress=False)
    return cfg.trainer_config, TrainingData(cfg, tok, config.vocab_size)


def dst_data(tok, n: int):
    from rbjax.train.config import TrainerConfig

    cfg = TrainerConfig(batch_size=DST_BATCH, block_size=128, progress=False)
    return cfg, dst_array_data(n, tok)


def plans(cfg, data, steps):
    from rbjax.train.batching import BatchPlan

    out = {}
    for layout in ("packed", "padded"):
        out[layout] = BatchPlan(data, cfg.batch_size, 1, cfg.epochs, cfg.seed, cfg.resolved_leftover,
                                layout=layout)
    return out


# ------------------------------------------------------------------------------------------------------ rbjax
class RbjaxVariant:
    def __init__(self, name, objective, plan, config, params, shared):
        import jax

        from rbjax.train.step import StepSpec, init_state

        self.name, self.plan, self.shared = name, plan, shared
        self.spec = StepSpec(config=config, objective=objective, dropout=True)
        self.state = init_state(jax.tree.map(lambda x: x.copy(), params), self.spec, hparams={}, lr=5e-5,
                                t_total=10_000)
        self.times, self.tokens = [], []

    def update(self, u: int) -> float:
        import jax

        from rbjax.train.step import train_step_jit

        t0 = time.perf_counter()
        host = {**self.plan.update_batch(u), **self.shared}
        self.state, m = train_step_jit(self.state, host, spec=self.spec)
        float(jax.device_get(m["total"]))
        jax.block_until_ready(self.state.params)
        return time.perf_counter() - t0


def rbjax_worker(args) -> dict:
    import jax

    from rbjax.debias.objective import DebiasObjective
    from rbjax.dialog.state_tracking import DSTObjective, init_head
    from rbjax.model.gpt2 import init_params
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.step import compiled_programs

    config = model_config(args)
    params = jax.device_get(init_params(config, seed=0))
    tok = load_tokenizer(args.tokenizer)
    variants, info = [], {}
    for task in args.variants.split(","):
        if task == "lm":
            cfg, data = lm_data(tok, config)
            start, objective = params, DebiasObjective("lm")
        else:
            cfg, data = dst_data(tok, DST_BATCH * (args.steps + 2))
            start, objective = {"gpt2": params, "head": init_head(config, 0)}, DSTObjective()
        for layout, plan in plans(cfg, data, args.steps).items():
            v = RbjaxVariant(f"{task}-{layout}", objective, plan, config, start, data.shared)
            # compile every shape the plan uses (one update of each), reported apart
            t0, before = time.perf_counter(), compiled_programs()
            seen = set()
            for u in range(len(plan.plan)):
                s = plan.update_shape(u)
                if s not in seen:
                    seen.add(s)
                    v.update(u)
            info[v.name] = {"compile_s": time.perf_counter() - t0, "programs": compiled_programs() - before,
                            "shapes": [list(s) for s in plan.shapes], "real_fraction_plan": plan.real_fraction(),
                            "real_fraction_timed": sum(plan.tokens(u) for u in range(args.steps)) /
                            sum(plan.slots(u) for u in range(args.steps))}
            i = info[v.name]
            print(f"[rbjax {v.name}] {i['programs']} program(s) compiled in {i['compile_s']:.0f} s; real slots "
                  f"{i['real_fraction_timed']:.2f}", file=sys.stderr, flush=True)
            variants.append(v)
    for u in range(args.steps):  # interleaved rounds
        for v in variants:
            v.times.append(v.update(u))
            v.tokens.append(v.plan.tokens(u))
        print(f"[rbjax] round {u + 1}/{args.steps}: " + ", ".join(f"{v.name} {v.times[-1]:.2f} s" for v in variants),
              file=sys.stderr, flush=True)
    return {v.name: {**info[v.name], "times_s": v.times, "tokens": v.tokens,
                     "tokens_per_s": sum(v.tokens) / sum(v.times)} for v in variants}


# ---------------------------------------------------------------------------------------------------- PyTorch
def torch_worker(args) -> dict:
    import torch

    from rbjax.model.tokenizer import load_tokenizer

    torch.manual_seed(0)
    config = model_config(args)
    params = random_params(config)
    tok = load_tokenizer(args.tokenizer)
    model = torch_gpt2(config, params)  # the same weights
    model.train()
    head = torch.nn.Linear(config.n_embd, 1)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=5e-5, weight_decay=0.0)
    F = torch.nn.functional
    variants = {}
    for task in args.variants.split(","):
        if task == "lm":
            cfg, data = lm_data(tok, config)
        else:
            cfg, data = dst_data(tok, DST_BATCH * (args.steps + 2))
        variants[f"{task}-torch"] = (task, plans(cfg, data, args.steps)["padded"])

    def batch(task, plan, u):
        (e, b), = plan.plan[u]
        rows = plan.batch_rows(e, b)
        mask = plan.data.mask[rows]
        n = int(mask.sum(1).max())  # the reference collator: pad to the batch's longest example
        out = {"input_ids": torch.tensor(plan.data.ids[rows][:, :n]).long(),
               "attention_mask": torch.tensor(mask[:, :n]).long()}
        if task == "dst":
            out["labels"] = torch.tensor(plan.data.extra["labels"][rows]).float()
        return out

    def step(task, bt):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ids, mask = bt["input_ids"], bt["attention_mask"]
        if task == "lm":
            lab = ids.masked_fill(mask == 0, -100)
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        else:
            h = model.transformer(input_ids=ids, attention_mask=mask).last_hidden_state
            last = mask.sum(1) - 1
            logit = head(h[torch.arange(len(ids)), last])[:, 0]
            loss = F.binary_cross_entropy_with_logits(logit, bt["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return time.perf_counter() - t0

    res = {n: {"times_s": [], "tokens": []} for n in variants}
    for name, (task, plan) in variants.items():  # warm-up
        step(task, batch(task, plan, 0))
    for u in range(args.steps):
        for name, (task, plan) in variants.items():
            bt = batch(task, plan, u)
            res[name]["times_s"].append(step(task, bt))
            res[name]["tokens"].append(int(bt["attention_mask"].sum()))
            res[name].setdefault("slots", []).append(int(bt["attention_mask"].numel()))
        print(f"[torch] round {u + 1}/{args.steps}: " + ", ".join(
            f"{n} {res[n]['times_s'][-1]:.2f} s" for n in variants), file=sys.stderr, flush=True)
    for r in res.values():
        r["tokens_per_s"] = sum(r["tokens"]) / sum(r["times_s"])
        r["real_fraction_timed"] = sum(r["tokens"]) / sum(r.pop("slots"))
    res["_threads"] = torch.get_num_threads()
    res["_torch"] = torch.__version__
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed updates per variant (the plan's first N)")
    ap.add_argument("--repeats", type=int, default=1, help="alternations of the rbjax and PyTorch processes")
    ap.add_argument("--variants", default="lm,dst", help="comma list of lm, dst")
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a 2-layer width-64 model (checks the script, not speed)")
    ap.add_argument("--worker", choices=["rbjax", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(rbjax_worker(args) if args.worker == "rbjax" else torch_worker(args)))
        return 0

    import subprocess

    from rbjax.core.io import versions

    out: dict = {}
    loads = []
    mon = LoadMonitor()
    for _ in range(args.repeats):
        for fw in ["rbjax"] + ([] if args.no_torch else ["torch"]):
            cmd = [sys.executable, __file__, "--worker", fw, "--steps", str(args.steps), "--variants", args.variants,
                   "--tokenizer", args.tokenizer] + (["--smoke"] if args.smoke else [])
            loads.append(os.getloadavg()[0])
            with mon.section(f"{fw} worker"):
                p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
            if p.returncode != 0:
                print(f"{fw} worker failed (exit {p.returncode})", file=sys.stderr)
                return 1
            r = json.loads(p.stdout.strip().splitlines()[-1])
            for k, v in r.items():
                if k.startswith("_"):
                    out[k] = v
                    continue
                hist = out.get(k, {}).get("repeat_tokens_per_s", []) + [v["tokens_per_s"]]
                if k not in out or v["tokens_per_s"] > out[k]["tokens_per_s"]:
                    out[k] = v
                out[k]["repeat_tokens_per_s"] = hist
    ratios = {}
    for task in args.variants.split(","):
        pk, pd, th = out.get(f"{task}-packed"), out.get(f"{task}-padded"), out.get(f"{task}-torch")
        line = f"[{task}] packed {pk['tokens_per_s']:.0f} real tok/s (real slots {pk['real_fraction_timed']:.2f}), " \
               f"padded {pd['tokens_per_s']:.0f} ({pd['real_fraction_timed']:.2f})"
        ratios[f"{task}_packed_over_padded"] = pk["tokens_per_s"] / pd["tokens_per_s"]
        if th:
            line += f", torch (pad to batch max) {th['tokens_per_s']:.0f} ({th['real_fraction_timed']:.2f})"
            ratios[f"{task}_packed_over_torch"] = pk["tokens_per_s"] / th["tokens_per_s"]
            ratios[f"{task}_padded_over_torch"] = pd["tokens_per_s"] / th["tokens_per_s"]
        print(line)
    for k, v in ratios.items():
        print(f"{k}: {mon.ratio_text(v, unit='')}")
    v = versions()
    print(json.dumps(mon.finish({"results": out, "steps": args.steps, "repeats": args.repeats,
                                 "load_avg_1min_at_worker_starts": loads,
                                 "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                             "jax_backend": v.get("jax_backend")},
                                 "versions": {k: v.get(k) for k in ("jax", "jaxlib", "flax", "optax", "numpy")}},
                                ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
