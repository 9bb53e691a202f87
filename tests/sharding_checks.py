"""Checks of models split over ``fsdp`` / ``tensor`` mesh axes, run by tests/test_sharding.py in one
subprocess with 8 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``; JAX reads the flag
once, when its CPU backend starts).

Usage::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python tests/sharding_checks.py --model DIR --tokenizer DIR --data-dir DIR --work DIR CHECK [CHECK ...]

Each check prints ``{"check": NAME, ...figures}`` on one line:

* ``families``: for Llama, GPT-NeoX and Gemma 2 (tiny 1-layer random models; GPT-2 is checked through the trainer
  and the scorer), 2 Adam updates of the mean next-token NLL with the parameters on a ``data=2,fsdp=2,tensor=2`` mesh (placed by the family's logical axes,
  rows over data × fsdp) and on one device: loss and parameter differences, the specs used, per-device bytes.
* ``train``: one debiasing run (HD, batch 8, accumulation 2, dropout on, 3 updates, padded token layout) on
  ``data=2,fsdp=4`` and on one device; the specs of the parameters and of Adam's first moment.
* ``grid``: a chunk of 4 grid points (padded token layout) on ``grid=2,fsdp=2,tensor=2`` and on one device.
* ``score``: LMB pair scoring (packed rows) on ``fsdp=4,tensor=2`` against one device; bf16
  parameter storage against fp32 (the effect of ``--param-dtype bf16``).
* ``resume``: the ``train`` run on ``data=2,fsdp=4`` stopped after 2 updates (orbax checkpoint of the sharded
  state), resumed on a 4-device ``data=2,fsdp=2`` mesh to its end; the restored parameters against the saved ones,
  the finished run against ``train``'s uninterrupted one-device run.
* ``generate``: greedy generation with the KV cache split over ``data=2,fsdp=2,tensor=2`` against one device.
* ``evaluate``: ``rbjax evaluate --task all`` (LMP; DST: 2 fine-tuning updates in the padded token layout, then the
  test pairs; CRG: greedy generation) with ``--mesh data=2,fsdp=2,tensor=2`` and with the default layout: the metrics, the training
  loss, the responses and the result keys of both.
* ``load``: safetensors weights (one file, a sharded index, bf16) read slice by slice into ``fsdp=4,tensor=2``:
  the values against the host loader, the layout, and how much of each tensor every read took.
* ``memory``: the memory plan's per-device parameter and Adam bytes against the bytes of the arrays a run actually
  holds on device 0.
* ``adapters``: low-rank adapters: an HD run with the frozen base on ``data=2,fsdp=2,tensor=2`` and a 4-point chunk
  on ``grid=2,fsdp=2,tensor=2`` against one device (the base split, the adapters replicated, the base unstacked), and
  the plan's bytes against device 0's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.mesh_checks import _cfg, _compare, _run  # noqa: E402


def _tiny_configs(layers: int = 2):
    from rbjax.model import gemma2, gpt2, gpt_neox, llama

    return {
        "gpt2": gpt2.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=layers, n_head=4, resid_pdrop=0.0,
                                embd_pdrop=0.0, attn_pdrop=0.0),
        "llama": llama.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8),
        "gpt_neox": gpt_neox.GPTNeoXConfig(**_kw(gpt_neox.GPTNeoXConfig, layers)),
        "gemma2": gemma2.Gemma2Config(**_kw(gemma2.Gemma2Config, layers)),
    }


def _kw(cls, layers):
    import dataclasses

    f = {x.name for x in dataclasses.fields(cls)}
    kw = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8)
    return {k: v for k, v in kw.items() if k in f}


def _per_device_bytes(tree, device) -> int:
    import jax

    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


def _param_diff(a, b, init) -> dict:
    import jax
    import numpy as np

    mx, d2, m2 = 0.0, 0.0, 0.0
    for x, y, i in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(init)):
        x, y, i = (np.asarray(v, np.float64) for v in (x, y, i))
        mx = max(mx, float(np.abs(x - y).max()))
        d2 += float(((x - y) ** 2).sum())
        m2 += float(((y - i) ** 2).sum())
    return {"max_abs": mx, "rel_to_movement": (d2 / m2) ** 0.5 if m2 else float("inf"), "movement": m2 ** 0.5}


def check_families(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from rbjax.core.mesh import batch_axes, make_mesh, tree_shardings
    from rbjax.model import registry
    from rbjax.model.partition import logical_axes_for

    lr = 1e-2
    out = {}
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    one = make_mesh({}, jax.devices()[:1])
    rng = np.random.default_rng(0)
    for name, cfg in _tiny_configs(layers=1).items():
        if name == "gpt2":  # GPT-2 is checked through the trainer and the scorer below
            continue
        fam = registry.FAMILIES[name]
        init = jax.device_get(fam.init_params(cfg, 0))
        ids = rng.integers(0, cfg.vocab_size, (8, 12)).astype(np.int32)
        mask = np.ones_like(ids)
        model = fam.module(cfg)
        opt = optax.adam(lr)

        def loss(p, ids, mask):
            logits = model.apply({"params": p}, ids, mask)[0].astype(jnp.float32)
            lp = jax.nn.log_softmax(logits[:, :-1])
            return -jnp.take_along_axis(lp, ids[:, 1:, None], -1).mean()

        def step(p, o, ids, mask):
            v, g = jax.value_and_grad(loss)(p, ids, mask)
            u, o = opt.update(g, o, p)
            return optax.apply_updates(p, u), o, v

        res = {}
        for label, m in (("sharded", mesh), ("one", one)):
            sh = tree_shardings(init, m, logical_axes_for(cfg))
            p = jax.device_put(init, sh)
            o = jax.jit(opt.init)(p)
            rows = NamedSharding(m, P(batch_axes(m, 8) or None))
            x, xm = jax.device_put(ids, rows), jax.device_put(mask, rows)
            f = jax.jit(step, out_shardings=(sh, tree_shardings(o, m, logical_axes_for(cfg)), NamedSharding(m, P())))
            losses = []
            for _ in range(2):
                p, o, v = f(p, o, x, xm)
                losses.append(float(v))
            res[label] = (jax.device_get(p), losses, p, o)
        ps, ls, pdev, odev = res["sharded"]
        p1, l1, _, _ = res["one"]
        total = sum(x.nbytes for x in jax.tree.leaves(p1))
        specs = sorted({str(x.sharding.spec) for x in jax.tree.leaves(pdev)})
        out[name] = {"losses_rel": max(abs(a - b) / abs(b) for a, b in zip(ls, l1)), "losses": l1,
                     **_param_diff(ps, p1, init), "lr": lr, "specs": specs,
                     "param_bytes_dev0": _per_device_bytes(pdev, jax.devices()[0]), "param_bytes": total,
                     "adam_mu_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(odev[0].mu)})}
    return out


_ONE_DEVICE: dict = {}


def _one_device(cfg):
    """``_run`` of ``cfg`` on one device, computed once per training settings (the output folder and checkpoint
    frequency aside: it runs without checkpoints), so that check_resume compares against check_train's run."""
    import jax

    from rbjax.core.mesh import grid_mesh
    from rbjax.debias.run import debias_trainer

    key = repr(cfg.replace(out_dir="-", save_every=1))
    if key not in _ONE_DEVICE:
        t1 = debias_trainer(cfg, mesh=grid_mesh(1, cfg.trainer.batch_size, jax.devices()[:1]))
        _ONE_DEVICE[key] = (t1, *_run(t1))
    return _ONE_DEVICE[key]


def check_train(args) -> dict:
    import jax

    from rbjax.core.mesh import make_mesh
    from rbjax.debias.run import debias_trainer

    lr = 5e-4
    # HD: besides the embedding gathers every loss has, its bias subspace (SVD of the target embeddings) is computed
    # from fsdp-split embeddings (LMD, ADD and CDA run on data/grid meshes in tests/mesh_checks.py)
    # the padded token layout: one compiled program per mesh (packed rows split over devices: mesh_checks.py)
    cfg = _cfg(args, method="hd", batch_size=8, grad_accum=2, max_steps=3, learning_rate=lr, layout="padded")
    t8 = debias_trainer(cfg, mesh=make_mesh({"data": 2, "fsdp": 4}))
    st = t8.initial_state()
    mu_specs = sorted({str(x.sharding.spec) for x in jax.tree.leaves(st.opt_state) if x.ndim >= 2})
    ids = t8.device_batch(0)["input_ids"]
    del st
    r8, m8, specs = _run(t8)
    t1, r1, m1, _ = _one_device(cfg)
    return {"param_specs": specs, "adam_specs": mu_specs, "batch_spec": str(ids.sharding.spec),
            "updates": len(m8), **_compare(r8.params, r1.params, t1.init_params, m8, m1, lr)}


def check_grid(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.mesh import grid_mesh, make_mesh
    from rbjax.debias.run import debias_trainer, lambda_point

    lr = 5e-4
    # the padded layout: one compiled program per mesh (packed rows on a mesh: mesh_checks.py's data_parallel)
    cfg = _cfg(args, batch_size=4, grad_accum=1, max_steps=3, layout="padded")
    pts = [lambda_point(lm, d, lr * (1 + k)) for k, (lm, d) in enumerate((0.01, d) for d in (10.0, 50.0, 100.0, 20.0))]
    t8 = debias_trainer(cfg, points=pts, mesh=make_mesh({"grid": 2, "fsdp": 2, "tensor": 2}))
    r8, m8, specs = _run(t8)
    t1 = debias_trainer(cfg, points=pts, mesh=grid_mesh(len(pts), 4, jax.devices()[:1]))
    r1, m1, _ = _run(t1)
    init = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (len(pts),) + np.shape(x)), t1.init_params)
    p8 = jax.tree.map(np.asarray, jax.device_get(r8.state.params))
    p1 = jax.tree.map(np.asarray, jax.device_get(r1.state.params))
    return {"param_specs": specs, "updates": len(m8), "n_padded": t8.n_padded,
            **_compare(p8, p1, init, m8, m1, lr)}


def _pairs(args, n=24):
    from rbjax.lmb.measure import LoadedModel  # noqa: F401 (the loader used by measure)
    from rbjax.model.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer, expected_vocab_size=None)
    lines = (Path(args.data_dir) / "text_files/religion1/religion1_bias_manual_train.txt").read_text().splitlines()
    texts = [ln.strip() for ln in lines if ln.strip()][:n]
    a = [tok.encode(t) for t in texts]
    c = [tok.encode(t.replace("jews", "christians").replace("jew", "christian")) for t in texts]
    return a, c


def check_score(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.mesh import make_mesh
    from rbjax.lmb.perplexity import PerplexityScorer
    from rbjax.model.hf import load_pretrained

    config, params = load_pretrained(args.model)
    a, c = _pairs(args, 12)
    ref = PerplexityScorer(params, config, batch_size=16, devices=jax.devices()[:1]).score_pairs(a, c)
    out = {}
    for label in ("fsdp=4,tensor=2",):
        from rbjax.core.mesh import parse_mesh

        sc = PerplexityScorer(params, config, batch_size=16, mesh=make_mesh(parse_mesh(label, 8)))
        r = sc.score_pairs(a, c)
        out[label] = {"ppl_rel": max(float(np.max(np.abs(x.perplexity - y.perplexity) / y.perplexity))
                                     for x, y in zip(r, ref)),
                      "param_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(sc.params)})}
    bf = PerplexityScorer(params, config, batch_size=16, devices=jax.devices()[:1], param_dtype="bf16")
    rb = bf.score_pairs(a, c)
    d = [np.log(x.perplexity) - np.log(y.perplexity) for x, y in zip(rb, ref)]
    # the same effect computed independently: fp32 weights rounded to bf16 and back
    import ml_dtypes

    rounded = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), params)
    rr = PerplexityScorer(rounded, config, batch_size=16, devices=jax.devices()[:1]).score_pairs(a, c)
    out["bf16"] = {"log_ppl_max_abs": float(max(np.abs(x).max() for x in d)),
                   "log_ppl_mean_abs": float(np.mean(np.concatenate([np.abs(x) for x in d]))),
                   "vs_rounded_rel": max(float(np.max(np.abs(x.perplexity - y.perplexity) / y.perplexity))
                                         for x, y in zip(rb, rr)),
                   "dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(bf.params)})}
    return out


def check_resume(args) -> dict:
    import jax
    import numpy as np

    from rbjax.core.mesh import make_mesh
    from rbjax.train.checkpoint import Checkpointer
    from rbjax.debias.run import debias_trainer

    lr = 5e-4
    out_dir = Path(args.work) / "resume"
    # the settings and the 8-device mesh of check_train: its compiled programs and its one-device run serve here too
    cfg = _cfg(args, method="hd", batch_size=8, grad_accum=2, max_steps=3, learning_rate=lr, out_dir=str(out_dir),
               save_every=1, layout="padded")
    t8 = debias_trainer(cfg, mesh=make_mesh({"data": 2, "fsdp": 4}))
    r8 = t8.run(stop_after=2)
    saved = jax.device_get(r8.state.params)
    specs8 = sorted({str(x.sharding.spec) for x in jax.tree.leaves(r8.state.params)})
    del r8
    t4 = debias_trainer(cfg, mesh=make_mesh({"data": 2, "fsdp": 2}, jax.devices()[:4]))
    ck = Checkpointer(out_dir / "checkpoints", 2)
    like = t4.initial_state()
    restored, meta = ck.restore(ck.latest_step(), like)
    ck.close()
    restored_devices = len({d for x in jax.tree.leaves(restored.params) for d in x.sharding.device_set})
    rmax = max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
               for x, y in zip(jax.tree.leaves(jax.device_get(restored.params)), jax.tree.leaves(saved)))
    specs4 = sorted({str(x.sharding.spec) for x in jax.tree.leaves(restored.params)})
    del restored, like
    r4 = t4.run()
    t1, r1, _, _ = _one_device(cfg)
    return {"restored_max_abs": rmax, "resumed_from": r4.resumed_from, "updates": r4.updates_done,
            "specs8": specs8, "specs4": specs4, "restored_devices": restored_devices,
            **_param_diff(jax.device_get(r4.params), jax.device_get(r1.params), t1.init_params), "lr": lr}


def check_generate(args) -> dict:
    import jax

    from rbjax.core.mesh import make_mesh
    from rbjax.model.generate import generate, sampling_settings
    from rbjax.model.hf import load_pretrained

    config, params = load_pretrained(args.model)
    a, _ = _pairs(args, 8)
    s = sampling_settings(greedy=True, max_new_tokens=12)
    g1 = generate(jax.device_put(params, jax.devices()[0]), config, a, settings=s, batch_size=8)
    g8 = generate(params, config, a, settings=s, batch_size=8, mesh=make_mesh({"data": 2, "fsdp": 2, "tensor": 2}))
    return {"same_tokens": g1.tokens == g8.tokens, "n_tokens": sum(len(t) for t in g1.tokens)}


def check_evaluate(args) -> dict:
    from rbjax.dialog.evaluate import evaluate

    settings = dict(data_dir=args.data_dir, multiwoz=args.multiwoz, max_examples=8, max_steps=2, batch_size=4,
                    grad_accum=1, lmp_max_lines=16, eval_batch_size=8, gen_batch_size=8, greedy=True,
                    max_new_tokens=6, meteor=False, progress=False,
                    layout="padded")  # one compiled fine-tuning program per mesh
    res = {label: evaluate("all", args.model, Path(args.work) / f"evaluate_{label}", tokenizer=args.tokenizer,
                           mesh=mesh, **settings)
           for label, mesh in (("default", None), ("sharded", "data=2,fsdp=2,tensor=2"))}
    a, b = res["default"], res["sharded"]
    rel = lambda x, y: abs(x - y) / max(abs(x), 1e-30)  # noqa: E731
    return {"lmp_rel": rel(a["lmp"]["metrics"]["perplexity"], b["lmp"]["metrics"]["perplexity"]),
            "dst_loss_rel": rel(a["dst"]["training"]["final_loss"], b["dst"]["training"]["final_loss"]),
            "dst_updates": [a["dst"]["training"]["updates"], b["dst"]["training"]["updates"]],
            "dst_prob_abs": abs(a["dst"]["metrics"]["mean_prob_positive"] - b["dst"]["metrics"]["mean_prob_positive"]),
            "dst_same_confusion": a["dst"]["metrics"]["confusion_matrix"] == b["dst"]["metrics"]["confusion_matrix"],
            "crg_same_responses": (Path(args.work, "evaluate_default", "crg_hypotheses.txt").read_text()
                                   == Path(args.work, "evaluate_sharded", "crg_hypotheses.txt").read_text()),
            "crg_n": a["crg"]["generation"]["n_generated"],
            "same_keys": all(a[t]["key"] == b[t]["key"] for t in a),
            "meshes": {t: [a[t]["settings"]["mesh"], b[t]["settings"]["mesh"]] for t in a}}


def _write_bf16_copy(src, dst) -> None:
    """``dst``: ``src``'s folder with its weights stored in bfloat16 (one safetensors file)."""
    import shutil

    from rbjax.model.hf import _read_safetensors
    from tests.test_families import _write_bf16_safetensors

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    _write_bf16_safetensors(dst / "model.safetensors", _read_safetensors(src / "model.safetensors"))


def check_load(args) -> dict:
    """Safetensors weights read slice by slice straight into a ``fsdp=4,tensor=2`` layout: one
    file, a sharded index of several files, bf16 storage; GPT-2 and an untied Llama (transposed Linear weights)."""
    import jax
    import numpy as np

    from rbjax.core.mesh import make_mesh, tree_shardings
    from rbjax.model import hf
    from rbjax.model.partition import logical_axes_for
    from rbjax.model.registry import family_of_config

    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    reads = []
    real_read = hf.LazyTensor.read

    def counting_read(self, index=()):
        out = real_read(self, index)
        reads.append((self.name, out.size, int(np.prod(self.shape))))
        return out

    hf.LazyTensor.read = counting_read
    out = {}
    cfgs = _tiny_configs()
    import dataclasses

    cfgs["llama"] = dataclasses.replace(cfgs["llama"], tie_word_embeddings=False)
    for fam_name in ("gpt2", "llama"):
        config = cfgs[fam_name]
        tokens = {f.name: 1 for f in dataclasses.fields(config) if f.name in ("bos_token_id", "eos_token_id",
                                                                                "pad_token_id")}
        config = dataclasses.replace(config, **tokens)  # inside the tiny vocabulary (checked when loaded)
        params = family_of_config(config).init_params(config, 3)
        one = Path(args.work) / f"load_{fam_name}_one"
        sharded = Path(args.work) / f"load_{fam_name}_sharded"
        hf.save_pretrained(params, config, one)
        hf.save_pretrained(params, config, sharded, max_shard_size=20_000)
        bf16 = Path(args.work) / f"load_{fam_name}_bf16"
        _write_bf16_copy(one, bf16)
        for label, folder in (("one_file", one), ("index", sharded), ("bf16", bf16)):
            reads.clear()
            _, host = hf.load_pretrained(folder)  # the host path, for comparison
            n_lazy_reads_host = len(reads)
            cfg2, placed = hf.load_pretrained(folder, mesh=mesh)
            want = tree_shardings(placed, mesh, logical_axes_for(cfg2))
            same_layout = all(a.sharding == w for a, w in zip(jax.tree.leaves(placed), jax.tree.leaves(want)))
            max_diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                           for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(host)))
            leaves = jax.tree.leaves(placed)
            out[f"{fam_name}_{label}"] = {
                "files": len(list(folder.glob("*.safetensors"))), "max_abs_diff": max_diff, "same_layout": same_layout,
                "host_path_lazy_reads": n_lazy_reads_host, "reads": len(reads), "leaves": len(leaves),
                "reads_of_a_slice": sum(r[1] < r[2] for r in reads),
                "elements_read": sum(r[1] for r in reads),
                "elements_on_devices": sum(sh.data.size for a in leaves for sh in a.addressable_shards),
                "replicated_leaves": sum(a.sharding.is_fully_replicated for a in leaves),
                "all_jax_arrays": all(isinstance(a, jax.Array) for a in leaves)}
    hf.LazyTensor.read = real_read
    return out


def check_memory(args) -> dict:
    import jax

    from rbjax.core.mesh import make_mesh
    from rbjax.debias.run import debias_trainer
    from rbjax.model.memory import plan_memory

    cfg = _cfg(args, batch_size=8, grad_accum=1, max_steps=1)
    out = {}
    for label, sizes in (("data2_fsdp4", {"data": 2, "fsdp": 4}), ("fsdp4_tensor2", {"fsdp": 4, "tensor": 2})):
        mesh = make_mesh(sizes)
        t = debias_trainer(cfg, mesh=mesh)
        st = t.initial_state()
        plan = plan_memory(t.config, mesh=mesh, training=True, batch_size=8, seq_len=cfg.trainer.block_size)
        dev = jax.devices()[0]
        mu_nu = [x for x in jax.tree.leaves(st.opt_state) if x.ndim >= 1]
        out[label] = {"plan_params": plan.parts["parameters"], "actual_params": _per_device_bytes(st.params, dev),
                      "plan_optimizer": plan.parts["optimizer"], "actual_optimizer": _per_device_bytes(mu_nu, dev),
                      "plan_params_total": plan.totals["parameters"]}
    return out


def check_adapters(args) -> dict:
    """Low-rank adapters on a mesh: an HD adapter run with the frozen base split over ``data=2,fsdp=2,tensor=2``
    (adapters replicated) and a 4-point adapter chunk on ``grid=2,fsdp=2,tensor=2`` against one device; the plan's
    per-device bytes against what the run holds on device 0."""
    import jax
    import numpy as np

    from rbjax.core.mesh import grid_mesh, make_mesh
    from rbjax.debias.run import debias_trainer, lambda_point
    from rbjax.model.memory import plan_memory
    from rbjax.train.frozen import split

    lr = 1e-3
    lo = dict(adapter="lora", lora_rank=4, lora_dropout=0.0, layout="padded", learning_rate=lr)
    out = {}
    cfg = _cfg(args, method="hd", batch_size=8, grad_accum=2, max_steps=3, **lo)
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    t8 = debias_trainer(cfg, mesh=mesh)
    r8, m8, _ = _run(t8)
    t1 = debias_trainer(cfg, mesh=grid_mesh(1, 8, jax.devices()[:1]))
    r1, m1, _ = _run(t1)
    init = split(t1.init_params, t1.trainable)[0]
    dev = jax.devices()[0]
    st = t8.initial_state()
    plan = plan_memory(t8.config, mesh=mesh, training=True, batch_size=8, seq_len=cfg.trainer.block_size,
                       grad_accum=2, adapter=cfg.adapter.lora_spec())
    moments = [x for x in jax.tree.leaves((st.opt_state.mu, st.opt_state.nu))]
    out["run"] = {"frozen_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(r8.frozen) if x.ndim == 2}),
                  "adapter_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(r8.state.params)}),
                  "plan_params": plan.parts["parameters"],
                  "actual_params": _per_device_bytes(t8.frozen, dev) + _per_device_bytes(st.params, dev),
                  "plan_optimizer": plan.parts["optimizer"], "actual_optimizer": _per_device_bytes(moments, dev),
                  "updates": len(m8), **_compare(jax.device_get(r8.state.params), jax.device_get(r1.state.params),
                                                 init, m8, m1, lr)}
    pts = [lambda_point(0.01, d, lr * (1 + k)) for k, d in enumerate((10.0, 50.0, 100.0, 20.0))]
    cfg = _cfg(args, batch_size=4, max_steps=3, **lo)
    g8 = debias_trainer(cfg, points=pts, mesh=make_mesh({"grid": 2, "fsdp": 2, "tensor": 2}))
    rg8, mg8, _ = _run(g8)
    g1 = debias_trainer(cfg, points=pts, mesh=grid_mesh(len(pts), 4, jax.devices()[:1]))
    rg1, mg1, _ = _run(g1)
    init = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (len(pts),) + np.shape(x)),
                        split(g1.init_params, g1.trainable)[0])
    base_shapes = {tuple(map(str, p)): np.shape(x) for p, x in jax.tree_util.tree_leaves_with_path(
        split(g1.init_params, g1.trainable)[1])}
    frozen_shapes = {tuple(map(str, p)): np.shape(x) for p, x in jax.tree_util.tree_leaves_with_path(rg8.frozen)}
    out["grid"] = {"frozen_unstacked": frozen_shapes == base_shapes,
                   "adapter_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(rg8.state.params)}),
                   "updates": len(mg8),
                   **_compare(jax.device_get(rg8.state.params), jax.device_get(rg1.state.params), init, mg8, mg1, lr)}
    return out


CHECKS = {"families": check_families, "train": check_train, "grid": check_grid, "score": check_score,
          "resume": check_resume, "generate": check_generate, "evaluate": check_evaluate, "load": check_load,
          "memory": check_memory, "adapters": check_adapters}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--method", default="lmd")
    p.add_argument("--multiwoz", help="the MultiWOZ 2.0 folder (the evaluate check)")
    p.add_argument("checks", nargs="+", choices=sorted(CHECKS))
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    import jax

    if jax.device_count() != 8:
        raise SystemExit(f"expected 8 simulated CPU devices, got {jax.device_count()}")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    import time

    for c in args.checks:
        t0 = time.perf_counter()
        r = CHECKS[c](args)
        print(json.dumps({"check": c, **r}), flush=True)
        print(f"check {c}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
