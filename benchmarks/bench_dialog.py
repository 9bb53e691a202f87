"""Dialog fine-tuning benchmark: DST training examples/s against the plain LM step, DialoGPT-small shape.

What is timed: one update of the shared trainer (:class:`rbjax.train.loop.Trainer`: forward, loss, backward, clip
1.0, Adam 5e-5, dropout 0.1), in one process, on one set of random weights (GPT-2 117M: 12 layers, width 768,
vocabulary 50257, rbjax's initialiser), for

* ``dst`` — the DST classifier step (``method="dst"``: GPT-2 body + ``Linear(768→1)`` on the last real token, BCE) on
  a batch of 12 real binary slot-value examples of the offline MultiWOZ 2.0 test split, with the padding columns no
  example uses dropped, as ``rbjax evaluate --task dst`` trains (``rbjax.dialog.tasks.dst.trim_columns``);
* ``dst-128`` — the same step at the full 128 columns (the reference's block, every row padded to it);
* ``lm`` — the plain causal-LM step (``method="lm"``) on the same 12 token rows and width as ``dst``.

Accumulation is 1 (the reference's DST run accumulates 4 micro-batches per update; examples/s is per micro-batch
work either way). Each variant is the trainer's own data plan, spec and compiled update
(:func:`rbjax.train.step.train_step`); a timed update includes building the host batch and the device sync, as in
real training. The first update (compilation) is reported apart; then the variants are timed in interleaved rounds
(every variant once per round), so that load changes on a shared machine affect them alike, and the median is
reported.

Usage::

    python benchmarks/bench_dialog.py [--steps 3] [--batch 12] [--variants dst,dst-128,lm]

The last line printed is a JSON object with the figures (examples/s, tokens/s, ms per update, compile s) and the
ratios DST/LM; those move to ``"void_ratios"`` (and print as VOID) when the machine had foreign CPU load during the
timed rounds (``"load"``, ``benchmarks/_common.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks._common import LoadMonitor, dst_arrays  # noqa: E402

SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))


class Variant:
    """One variant's trainer step: the shared trainer's data plan, spec, initial state and compiled update."""

    def __init__(self, name: str, config, params, arrays: dict, batch: int, rounds: int, pad_id: int, tokenizer):
        import numpy as np

        from rbjax.debias.objective import DebiasObjective
        from rbjax.dialog.state_tracking import DSTObjective, init_head
        from rbjax.dialog.tasks.dst import trim_columns
        from rbjax.train.batching import ArrayData
        from rbjax.core.mesh import run_mesh
        from rbjax.model.handle import ModelHandle
        from rbjax.train.config import TrainerConfig
        from rbjax.train.loop import Trainer, TrainPoint
        from rbjax.train.optim import make_optimizer

        self.name = name
        self.method = "lm" if name == "lm" else "dst"
        a = {k: arrays[k] for k in ("input_ids", "attention_mask", "labels")}
        if name != "dst-128":
            a = trim_columns(a)
        if self.method == "lm":
            a.pop("labels")
        start = {"gpt2": params, "head": init_head(config, 0)} if self.method == "dst" else params
        cfg = TrainerConfig(batch_size=batch, grad_accum=1, epochs=1, max_steps=rounds + 1, block_size=128,
                            progress=False)
        objective = DebiasObjective("lm") if self.method == "lm" else DSTObjective()
        model = ModelHandle.from_params(params, config, tokenizer, name=name, digest=name)
        self.trainer = Trainer(cfg, model, objective, make_optimizer(), ArrayData(a, pad_id=pad_id,
                                                                                  info={"bench": name}),
                               mesh=run_mesh(None, batch_size=batch), points=TrainPoint({}, 5e-5), params=start)
        self.state = self.trainer.initial_state()
        self.u = 0
        self.batch, self.width = batch, int(a["input_ids"].shape[1])
        self.real_tokens = float(np.mean([self.trainer.plan.tokens(u) for u in range(self.trainer.t_total)]))
        self.times: list[float] = []
        self.loss = None

    def update(self) -> float:
        """One update (host batch built, stepped, synced); seconds."""
        import jax

        from rbjax.train.step import train_step_jit

        t0 = time.perf_counter()
        host = self.trainer.plan.update_batch(self.u % self.trainer.t_total)
        self.state, m = train_step_jit(self.state, host, spec=self.trainer.spec)
        self.loss = float(jax.device_get(m["total"]))
        jax.block_until_ready(self.state.params)
        self.u += 1
        return time.perf_counter() - t0

    def summary(self) -> dict:
        med = statistics.median(self.times)
        return {"variant": self.name, "method": self.method, "batch": self.batch, "width": self.width,
                "first_update_s": self.first, "update_ms": [t * 1e3 for t in self.times],
                "median_update_ms": med * 1e3, "best_update_ms": min(self.times) * 1e3,
                "examples_per_s": self.batch / med, "positions_per_s": self.batch * self.width / med,
                "real_tokens_per_s": self.real_tokens / med, "last_loss": self.loss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed rounds (one update of every variant per round)")
    ap.add_argument("--batch", type=int, default=12, help="examples per update (reference DST micro-batch: 12)")
    ap.add_argument("--variants", default="dst,dst-128,lm", help="comma list of dst, dst-128, lm")
    args = ap.parse_args()

    import jax

    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(SHARED / "tokenizers" / "gpt2")
    config = GPT2Config()
    params = jax.device_get(init_params(config, 0))
    n = args.batch * (args.steps + 1)
    arrays = dst_arrays(n, tok)
    print(f"DialoGPT-small shape, random weights; {n} DST examples of the MultiWOZ 2.0 test split "
          f"(mean {arrays['attention_mask'].sum(1).mean():.1f} tokens, longest {arrays['attention_mask'].sum(1).max()}); "
          f"batch {args.batch}; {jax.default_backend()} ({os.cpu_count()} CPUs)")
    mon = LoadMonitor()
    variants = []
    for v in args.variants.split(","):  # build and compile each (the first update), then time them in rounds
        var = Variant(v.strip(), config, params, arrays, args.batch, args.steps, tok.eos_id, tok)
        with mon.section(f"{var.name} first update"):
            var.first = var.update()
        print(f"{var.name:>8}: width {var.width:>3}  compile + first update {var.first:6.1f} s", flush=True)
        variants.append(var)
    with mon.section("rounds"):
        for _ in range(args.steps):  # interleaved: a load change on the shared machine hits every variant alike
            for var in variants:
                var.times.append(var.update())
    out = [var.summary() for var in variants]
    for r in out:
        print(f"{r['variant']:>8}: width {r['width']:>3}  update median {r['median_update_ms']:7.0f} ms (best "
              f"{r['best_update_ms']:7.0f})  {r['examples_per_s']:6.2f} examples/s  {r['real_tokens_per_s']:6.0f} "
              "real tokens/s", flush=True)
    by = {r["variant"]: r for r in out}
    ratios = {}
    if "dst" in by and "lm" in by:
        ratios["dst_over_lm_examples_per_s"] = by["dst"]["examples_per_s"] / by["lm"]["examples_per_s"]
    if "dst" in by and "dst-128" in by:
        ratios["trimmed_over_128_examples_per_s"] = by["dst"]["examples_per_s"] / by["dst-128"]["examples_per_s"]
    for k, v in ratios.items():
        print(f"{k}: {mon.ratio_text(v, unit='', sections=['rounds'])}")
    print(json.dumps(mon.finish({"results": out, "machine": platform.platform(), "cpus": os.cpu_count(),
                                 "backend": jax.default_backend()}, ratios, {k: ["rounds"] for k in ratios})))


if __name__ == "__main__":
    main()
