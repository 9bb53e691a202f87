"""Low-rank adapters: real tokens/s of a LoRA update against full fine-tuning and against PEFT in PyTorch,
and the memory of a 54-point adapter grid chunk on one frozen base.

Speed — same phrases, DialoGPT-small shape (random GPT-2 117M, rbjax's initialiser, copied into PyTorch), LM loss,
dropout 0.1 on, Adam, clip 1.0, batch 8, accumulation 1, religion1 training phrases (GPT-2 tokenizer, seed 42):

* ``full-packed`` — rbjax's update of every weight as ``rbjax debias`` feeds it (packed layout, the plan's few static
  shapes; :func:`rbjax.train.step.train_step`), lr 5e-5;
* ``lora-packed`` / ``lora-drop-packed`` — the same micro-batches, rbjax's LoRA update: rank 8, α 16, adapter dropout
  0 (the default) / 0.05 on every linear layer (``c_attn``, ``attn.c_proj``, ``c_fc``, ``mlp.c_proj``), the base
  frozen (:mod:`rbjax.train.frozen`), lr 2e-4;
* ``peft-padded`` / ``peft-drop-padded`` — PEFT's LoRA with the same settings on ``transformers.GPT2LMHeadModel`` (the same weights,
  ``target_modules="all-linear"``), each micro-batch padded to its longest phrase (the reference collator),
  ``torch.optim.AdamW`` (no weight decay) over the adapters, ``clip_grad_norm_`` 1.0.

The timed updates are the plan's first ``--steps``; the rbjax variants run the same update in a round, round after
round (interleaved), and so do the PyTorch variants; PyTorch runs in its own process, alternated with rbjax's ``--repeats`` times (an idle thread
pool of one framework slows the other); per variant the best repeat is kept, all are recorded. rbjax compiles every
packed shape first (reported apart). tokens/s = real tokens of the timed updates / their total time.

Memory (``--memory``, a subprocess with 8 simulated CPU devices): a chunk of 54 grid points that share one batch
plan (54 learning rates of the LM loss; a paper grid's chunks hold at most 6), LoRA rank 8 on all linear layers of
the DialoGPT-small shape, on a ``grid=2,fsdp=4`` mesh (27 points per device, the base split four ways), at the
plan's largest packed shape: XLA's buffer assignment of the compiled update per device (``memory_analysis()``:
arguments + outputs − donated aliases + temporaries) against the bound base + 27 × (adapter state + one point's
activations), the activations measured as the temporaries of a 2-point chunk (one point per device), and against
the memory plan (:func:`rbjax.model.memory.plan_memory`). Only compiled: an update of 54 DialoGPT-small points
takes minutes on this CPU.

Work (``--flops``; load-independent, for a machine too busy to time on): the FLOPs of each variant's timed updates,
counted after the timing — rbjax's from XLA's cost analysis of each compiled update program
(``jax.jit(train_step).lower(...).compile().cost_analysis()["flops"]``: every HLO op, the matmuls ≈ 98.5 % of it
at this shape), PEFT's from ``torch.utils.flop_counter.FlopCounterMode`` over the same updates (matmuls only) — and
their ratio beside the slot counts. With equal speed per FLOP, the tokens/s ratio is the FLOP ratio.

Usage::

    python benchmarks/bench_lora.py [--steps 12] [--repeats 1] [--memory] [--flops] [--smoke]

The last line printed is a JSON object with the figures and the ratios. Each worker process is a section of the
load monitor (``benchmarks/_common.py``, the worker's CPU counted as its own): the ratios move to ``"void_ratios"``
(and print as VOID) when the machine had foreign CPU load during any worker (``"load"``).
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
from benchmarks._common import LoadMonitor, dialogpt_config, random_params, torch_gpt2  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
BATCH, RANK, ALPHA = 8, 8, 16.0
#: adapter dropout of the variants: none (PEFT's and rbjax's default) and 0.05 (a common choice)
DROPOUTS = {"": 0.0, "-drop": 0.05}
LR_FULL, LR_LORA = 5e-5, 2e-4


def model_config(args):
    return dialogpt_config(args.smoke)  # DialoGPT-small shape


def lm_plan(tok, config):
    from rbjax.debias.config import DebiasRun
    from rbjax.debias.data import TrainingData
    from rbjax.train.batching import BatchPlan

    cfg = DebiasRun.from_flat(method="lm", bias_type="religion1", model="random", data_dir=str(SHARED / "redditbias"),
                              batch_size=BATCH, export=False, evaluate=False, lmp=False, progress=False)
    data = TrainingData(cfg, tok, config.vocab_size)
    return data, BatchPlan.of_run(data, cfg.trainer_config)


def lora_spec(dropout: float = 0.0):
    from rbjax.model.lora import LoraSpec

    return LoraSpec(rank=RANK, alpha=ALPHA, dropout=dropout, targets="all-linear")


# ------------------------------------------------------------------------------------------------------ rbjax
class RbjaxVariant:
    def __init__(self, name, plan, config, params, lr, shared):
        import jax

        from rbjax.debias.objective import DebiasObjective
        from rbjax.train.frozen import split, trainable_rule
        from rbjax.train.step import StepSpec, init_state

        self.name, self.plan, self.shared = name, plan, shared
        objective = DebiasObjective("lm")
        self.spec = StepSpec(config=config, objective=objective, dropout=True)
        trained, self.frozen = split(params, trainable_rule(params, objective))
        self.frozen = jax.device_put(self.frozen)
        self.n_trained = sum(int(x.size) for x in jax.tree.leaves(trained))
        self.state = init_state(jax.tree.map(lambda x: jax.numpy.array(x), trained), self.spec, hparams={}, lr=lr,
                                t_total=10_000)
        self.times, self.tokens = [], []

    def update(self, u: int) -> float:
        import jax

        from rbjax.train.step import train_step_jit

        t0 = time.perf_counter()
        host = {**self.plan.update_batch(u), **self.shared}
        self.state, m = train_step_jit(self.state, host, self.frozen, spec=self.spec)
        float(jax.device_get(m["total"]))
        jax.block_until_ready(self.state.params)
        return time.perf_counter() - t0


def rbjax_worker(args) -> dict:
    import jax

    from rbjax.model.gpt2 import init_params
    from rbjax.model.lora import add_adapters
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.step import compiled_programs

    config = model_config(args)
    params = jax.device_get(init_params(config, seed=0))
    tok = load_tokenizer(args.tokenizer)
    data, plan = lm_plan(tok, config)
    variants, info = [], {}
    runs = [("full-packed", params, LR_FULL)] + [
        (f"lora{suffix}-packed", add_adapters(params, config, lora_spec(rate), seed=0), LR_LORA)
        for suffix, rate in DROPOUTS.items()]
    for name, start, lr in runs:
        v = RbjaxVariant(name, plan, config, start, lr, data.shared)
        t0, before = time.perf_counter(), compiled_programs()
        seen = set()
        for u in range(len(plan.plan)):  # compile every shape the plan uses (one update of each), reported apart
            s = plan.update_shape(u)
            if s not in seen:
                seen.add(s)
                v.update(u)
        info[name] = {"compile_s": time.perf_counter() - t0, "programs": compiled_programs() - before,
                      "trained_parameters": v.n_trained,
                      "real_fraction_timed": sum(plan.tokens(u) for u in range(args.steps)) /
                      sum(plan.slots(u) for u in range(args.steps))}
        print(f"[rbjax {name}] {info[name]['programs']} program(s) compiled in {info[name]['compile_s']:.0f} s; "
              f"{v.n_trained:,} trained parameters", file=sys.stderr, flush=True)
        variants.append(v)
    for u in range(args.steps):  # interleaved rounds
        for v in variants:
            v.times.append(v.update(u))
            v.tokens.append(v.plan.tokens(u))
        print(f"[rbjax] round {u + 1}/{args.steps}: " + ", ".join(f"{v.name} {v.times[-1]:.2f} s" for v in variants),
              file=sys.stderr, flush=True)
    out = {v.name: {**info[v.name], "times_s": v.times, "tokens": v.tokens,
                    "tokens_per_s": sum(v.tokens) / sum(v.times)} for v in variants}
    if args.flops:  # counted after the timing: XLA's cost analysis of the program of each timed update's shape
        from rbjax.train.step import train_step_jit

        for v in variants:
            per_shape = {}
            for u in range(args.steps):
                s = plan.update_shape(u)
                if s not in per_shape:
                    host = {**plan.update_batch(u), **v.shared}
                    ca = train_step_jit.lower(v.state, host, v.frozen, spec=v.spec).compile().cost_analysis()
                    per_shape[s] = float((ca[0] if isinstance(ca, list) else ca)["flops"])
            out[v.name]["flops"] = sum(per_shape[plan.update_shape(u)] for u in range(args.steps))
            out[v.name]["slots"] = sum(plan.slots(u) for u in range(args.steps))
    return out


# ---------------------------------------------------------------------------------------------------- PyTorch
def torch_worker(args) -> dict:
    import peft
    import torch
    import transformers

    from rbjax.model.tokenizer import load_tokenizer

    torch.manual_seed(0)
    config = model_config(args)
    params = random_params(config)
    tok = load_tokenizer(args.tokenizer)
    base = torch_gpt2(config, params)  # the same weights
    tcfg = base.config
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    models = {}
    for suffix, rate in DROPOUTS.items():  # one PEFT model per adapter dropout, on the same base weights
        b = transformers.GPT2LMHeadModel(tcfg)
        b.load_state_dict(base_sd)
        b.tie_weights()
        m = peft.get_peft_model(b, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=rate,
                                                   target_modules="all-linear", task_type="CAUSAL_LM"))
        m.train()
        trained = [p for p in m.parameters() if p.requires_grad]
        models[f"peft{suffix}-padded"] = (m, trained, torch.optim.AdamW(trained, lr=LR_LORA, weight_decay=0.0))
    data, plan = lm_plan(tok, config)

    def batch(u):
        (e, b), = plan.plan[u]
        rows = plan.batch_rows(e, b)
        mask = plan.data.mask[rows]
        n = int(mask.sum(1).max())  # the reference collator: pad to the batch's longest phrase
        return torch.tensor(plan.data.ids[rows][:, :n]).long(), torch.tensor(mask[:, :n]).long()

    def step(name, ids, mask):
        model, trained, opt = models[name]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        return time.perf_counter() - t0

    res = {n: {"times_s": [], "tokens": [], "slots": [], "trained_parameters": sum(p.numel() for p in t)}
           for n, (_, t, _) in models.items()}
    for n in models:  # warm-up
        step(n, *batch(0))
    for u in range(args.steps):  # interleaved rounds
        ids, mask = batch(u)
        for n, r in res.items():
            r["times_s"].append(step(n, ids, mask))
            r["tokens"].append(int(mask.sum()))
            r["slots"].append(int(mask.numel()))
        print(f"[torch] round {u + 1}/{args.steps}: " + ", ".join(f"{n} {r['times_s'][-1]:.2f} s"
                                                                  for n, r in res.items()), file=sys.stderr, flush=True)
    for r in res.values():
        r["tokens_per_s"] = sum(r["tokens"]) / sum(r["times_s"])
        r["real_fraction_timed"] = sum(r["tokens"]) / sum(r["slots"])
        r["slots"] = sum(r["slots"])
    if args.flops:  # counted after the timing (the counter slows the step): the same updates once more
        from torch.utils.flop_counter import FlopCounterMode

        for n, r in res.items():
            r["flops"] = 0
            for u in range(args.steps):
                with FlopCounterMode(display=False) as fc:
                    step(n, *batch(u))
                r["flops"] += fc.get_total_flops()
    return {**res, "_threads": torch.get_num_threads(), "_torch": torch.__version__, "_peft": peft.__version__}


# ----------------------------------------------------------------------------------------------------- memory
def memory_worker(args) -> dict:
    """Adapter chunks of 2 and 54 points on grid=2,fsdp=4 (8 simulated devices): XLA's per-device buffers of each
    compiled update; the 2-point chunk (one point per device) measures one point's activations, the 54-point one the
    chunk's peak against base + 27 × (adapter state + activations) and against the plan."""
    import jax
    import numpy as np

    from rbjax.core.mesh import make_mesh
    from rbjax.debias.objective import DebiasObjective
    from rbjax.model.gpt2 import init_params
    from rbjax.model.handle import ModelHandle
    from rbjax.model.lora import add_adapters
    from rbjax.model.memory import plan_memory
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.train.config import TrainerConfig
    from rbjax.train.loop import Trainer, TrainPoint
    from rbjax.train.optim import make_optimizer
    from rbjax.train.step import step_on_mesh

    assert jax.device_count() == 8, jax.device_count()
    config = model_config(args)
    tok = load_tokenizer(args.tokenizer)
    params = add_adapters(jax.device_get(init_params(config, seed=0)), config, lora_spec(), seed=0)
    data, plan = lm_plan(tok, config)
    mesh = make_mesh({"grid": 2, "fsdp": 4})
    handle = ModelHandle.from_params(params, config, tok, name="bench", digest="bench")
    u = max(range(len(plan.plan)), key=lambda i: plan.slots(i))  # the update of the plan's largest shape
    dev0 = jax.devices()[0]

    def on_dev0(tree):
        return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == dev0)

    out = {}
    for n_points in (2, 54):
        points = [TrainPoint({}, float(lr)) for lr in np.geomspace(1e-5, 1e-3, n_points)]
        tr = Trainer(TrainerConfig(batch_size=BATCH, progress=False), handle, DebiasObjective("lm"),
                     make_optimizer(), data, mesh=mesh, points=points, params=params, plan=plan)
        state, frozen, batch = tr.initial_state(), tr.frozen, tr.device_batch(u)
        f = step_on_mesh(mesh, True, tr.state_shardings(state))
        t0 = time.perf_counter()
        ma = f.compile(state, batch, frozen, tr.spec).memory_analysis()
        out[n_points] = {
            "points_per_device": tr.n_padded // 2, "compile_s": time.perf_counter() - t0,
            "xla": {"argument_bytes": ma.argument_size_in_bytes, "output_bytes": ma.output_size_in_bytes,
                    "alias_bytes": ma.alias_size_in_bytes, "temp_bytes": ma.temp_size_in_bytes},
            "peak": ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes,
            "base_bytes": on_dev0(frozen), "batch_bytes": on_dev0(batch),
            "adapter_state_bytes": on_dev0(state.params) + on_dev0((state.opt_state.mu, state.opt_state.nu))}
        del state, frozen, batch, tr
    small, big = out[2], out[54]
    act_pp = small["xla"]["temp_bytes"] / small["points_per_device"]  # one point's activations and temporaries
    state_pp = big["adapter_state_bytes"] / big["points_per_device"]
    n = big["points_per_device"]
    bound = big["base_bytes"] + n * (state_pp + act_pp) + big["batch_bytes"]
    rows, slots = plan.update_shape(u)
    pl = plan_memory(config, mesh={"grid": 2, "fsdp": 4}, training=True, batch_size=rows, seq_len=slots,
                     n_points=54, adapter=lora_spec())
    full = plan_memory(config, mesh={"grid": 2, "fsdp": 4}, training=True, batch_size=rows, seq_len=slots,
                       n_points=54)
    return {"mesh": "grid=2,fsdp=4", "packed_shape": [rows, slots], "chunks": out,
            "activations_per_point": act_pp, "adapter_state_per_point": state_pp,
            "bound_per_device": bound, "peak_per_device": big["peak"], "plan_per_device": pl.per_device,
            "plan_parts": pl.parts, "full_finetuning_plan_per_device": full.per_device,
            "base_per_point_would_be": big["base_bytes"] * n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed updates per variant (the plan's first N)")
    ap.add_argument("--repeats", type=int, default=1, help="alternations of the rbjax and PyTorch processes")
    ap.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "gpt2"))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--memory", action="store_true", help="also the 54-point chunk's memory on 8 simulated devices")
    ap.add_argument("--flops", action="store_true", help="also count each variant's FLOPs (after the timing)")
    ap.add_argument("--smoke", action="store_true", help="a 2-layer width-64 model (checks the script, not speed)")
    ap.add_argument("--worker", choices=["rbjax", "torch", "memory"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fn = {"rbjax": rbjax_worker, "torch": torch_worker, "memory": memory_worker}[args.worker]
        print(json.dumps(fn(args)))
        return 0

    import subprocess

    from rbjax.core.io import versions

    def worker(fw, env=None):
        cmd = [sys.executable, __file__, "--worker", fw, "--steps", str(args.steps), "--tokenizer", args.tokenizer]
        cmd += (["--smoke"] if args.smoke else []) + (["--flops"] if args.flops else [])
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False, env=env)
        if p.returncode != 0:
            raise SystemExit(f"{fw} worker failed (exit {p.returncode})")
        return json.loads(p.stdout.strip().splitlines()[-1])

    out: dict = {}
    loads = []
    mon = LoadMonitor()
    for _ in range(args.repeats):
        for fw in ["rbjax"] + ([] if args.no_torch else ["torch"]):
            loads.append(os.getloadavg()[0])
            with mon.section(f"{fw} worker"):
                figures = worker(fw)
            for k, v in figures.items():
                if k.startswith("_"):
                    out[k] = v
                    continue
                hist = out.get(k, {}).get("repeat_tokens_per_s", []) + [v["tokens_per_s"]]
                if k not in out or v["tokens_per_s"] > out[k]["tokens_per_s"]:
                    out[k] = v
                out[k]["repeat_tokens_per_s"] = hist
    full = out["full-packed"]
    ratios, work = {}, {}
    for suffix, rate in DROPOUTS.items():
        lora, pt = out[f"lora{suffix}-packed"], out.get(f"peft{suffix}-padded")
        ratios[f"lora{suffix}_over_full"] = lora["tokens_per_s"] / full["tokens_per_s"]
        line = (f"adapter dropout {rate:g}: rbjax LoRA {lora['tokens_per_s']:.1f} real tok/s, rbjax full fine-tuning "
                f"{full['tokens_per_s']:.1f} (real slots {lora['real_fraction_timed']:.2f})")
        if pt:
            ratios[f"lora{suffix}_over_peft{suffix}"] = lora["tokens_per_s"] / pt["tokens_per_s"]
            line += f", PEFT LoRA (pad to batch max) {pt['tokens_per_s']:.1f} ({pt['real_fraction_timed']:.2f})"
        print(line)
        if pt and "flops" in lora and "flops" in pt:
            work[f"lora{suffix}_over_peft{suffix}"] = pt["flops"] / lora["flops"]
            print(f"  work of the {args.steps} timed updates: rbjax {lora['flops'] / 1e9:.1f} GFLOP over "
                  f"{lora['slots']:,} slots (XLA cost analysis), PEFT {pt['flops'] / 1e9:.1f} GFLOP over "
                  f"{pt['slots']:,} slots (FlopCounterMode, matmuls): PEFT/rbjax {pt['flops'] / lora['flops']:.3f}× "
                  f"FLOPs, {pt['slots'] / lora['slots']:.3f}× slots")
    for k, v in ratios.items():
        print(f"{k}: {mon.ratio_text(v, unit='')}")
    memory = None
    if args.memory:
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                                          " --xla_force_host_platform_device_count=8").strip(), JAX_PLATFORMS="cpu")
        memory = worker("memory", env)
        gb = 1e9
        big = memory["chunks"]["54"] if "54" in memory["chunks"] else memory["chunks"][54]
        print(f"54-point LoRA chunk on grid=2,fsdp=4 ({big['points_per_device']} points per device): XLA peak "
              f"{memory['peak_per_device'] / gb:.3f} GB per device (base {big['base_bytes'] / gb:.3f}, adapter state "
              f"{big['adapter_state_bytes'] / gb:.3f}, temporaries {big['xla']['temp_bytes'] / gb:.3f}) <= base + "
              f"{big['points_per_device']} × (adapter state + one point's activations, measured on a 2-point chunk) "
              f"= {memory['bound_per_device'] / gb:.3f} GB: {memory['peak_per_device'] <= memory['bound_per_device']}; "
              f"plan {memory['plan_per_device'] / gb:.3f} GB; the base once per point would be "
              f"{memory['base_per_point_would_be'] / gb:.2f} GB; full fine-tuning's plan "
              f"{memory['full_finetuning_plan_per_device'] / gb:.1f} GB")
    v = versions()
    print(json.dumps(mon.finish({"results": out, "memory": memory, "steps": args.steps,
                                 "repeats": args.repeats, "load_avg_1min_at_worker_starts": loads,
                                 "flop_ratios": work,
                                 "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                             "jax_backend": v.get("jax_backend")},
                                 "versions": {k: v.get(k) for k in ("jax", "jaxlib", "flax", "optax", "numpy")}},
                                ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
