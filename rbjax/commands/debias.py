"""``rbjax debias``: fine-tune a model of any supported family with LMD, ADD, HD or CDA (paper §4) and evaluate it.

The options are the settings of :class:`rbjax.debias.config.DebiasRun` (every section's, by their flat names),
generated from the dataclasses by :func:`add_training_arguments` (help, choices and defaults are written once, in
the settings).
"""
from __future__ import annotations

import dataclasses

from pathlib import Path

from rbjax.commands.options import add_config_arguments, option_spec
from rbjax.commands.settings import NO_TRAINING_OPTIONS, NoTrainingOptions, Output, PlanSettings
from rbjax.core.config import leaves
from rbjax.core.io import check_output_dir
from rbjax.core.mesh import mesh_product
from rbjax.debias.config import DebiasRun
from rbjax.debias.grid_config import AXES as GRID_AXES
from rbjax.debias.run import check_own_bias_type_data, debias
from rbjax.debias.self_debias import METHOD as SELF_DEBIAS, SelfDebiasRun, run_self_debias
from rbjax.debias.training_free import TRAINING_FREE_METHODS, ProjectionRun, run_training_free
from rbjax.model.chat import ChatSettings, describe_chat
from rbjax.model.handle import ModelHandle
from rbjax.model.memory import plan_for_model


def add_training_arguments(p, *, grid: bool = False) -> None:
    """Options of ``rbjax debias`` (``grid=False``) or ``rbjax sweep`` (``grid=True``), one per setting of
    :class:`DebiasRun` (help, choices, metavar and the option's spelling from the field's metadata; the destination
    is the setting's flat name, read back by :func:`training_settings`), plus ``--overwrite``.

    Every option that takes a value requires one (``--max-steps`` alone is an error), a boolean is a switch
    (``--no-dropout``; ``--no-dropout false`` is an error). For the sweep, the grid's hyper-parameters (taken as
    lists) and the single run's export/evaluation switches are left out, and ``--method`` takes a comma list.
    """
    g = p.add_argument_group("settings shared by every grid point" if grid else
                             "training settings (defaults: the paper's and the reference code's)")
    for leaf in _cli_leaves(grid):
        f = leaf.field
        names, kw = option_spec(leaf.owner, f, default=leaf.default, help=leaf.help)
        if f.name in ("method", "bias_type"):  # no silent default for what to debias
            kw.update(required=True, default=None)
        if grid and f.name == "method":  # a study: several methods at once
            kw.pop("choices")
            kw.update(type=str, metavar="METHOD[,METHOD..]",
                      help="method(s), a comma list of lmd, add, hd, cda, lm (" + leaf.help + ")")
        if grid and f.name == "bias_type":
            kw["help"] = "bias type(s): all, or a comma list of " + leaf.help.removeprefix("bias type: ")
        g.add_argument(*names, **kw)
    add_config_arguments(p, Output, ("overwrite",))


def _cli_leaves(grid: bool):
    """The settings that are options, what to debias (method, bias type) first."""
    all_leaves = sorted(leaves(DebiasRun), key=lambda leaf: leaf.name not in ("method", "bias_type"))
    return [leaf for leaf in all_leaves
            if not (grid and (leaf.name in GRID_AXES or leaf.name in ("export", "evaluate", "eval_bias")))]


def training_settings(args) -> dict:
    """The :class:`DebiasRun` settings of the command line (with their defaults), by flat name."""
    return {leaf.name: getattr(args, leaf.name) for leaf in _cli_leaves(False) if hasattr(args, leaf.name)}


def register(sub) -> None:
    p = sub.add_parser(
        "debias", help="debias a model with LMD, ADD, HD or CDA, then export and evaluate it",
        description="Fine-tune a model (GPT-2/DialoGPT, Llama/Mistral/Qwen2, GPT-NeoX, Gemma 2) on the training phrases of one bias type (a packaged one or a spec "
                    "file of your own) with a debiasing loss (LMD, ADD, HD) or on the counterfactually augmented set "
                    "(CDA); Adam 5e-5, linear decay, clip 1.0, 2 epochs, block 36. Checkpoints in OUT/checkpoints "
                    "(Ctrl-C saves one; rerun the same command to resume), metrics in OUT/metrics.jsonl; afterwards "
                    "the model is exported to OUT/model, LMB is measured on the valid split (OUT/lmb_valid) and the "
                    "Reddit-6K perplexity computed; everything is summarised in OUT/results.json. Rerunning a "
                    "finished run reuses its training and adds only the evaluations it lacks.",
    )
    add_training_arguments(p)
    add_plan_arguments(p)
    add_training_free_arguments(p)
    add_self_debias_arguments(p)
    p.set_defaults(func=run)


def add_self_debias_arguments(p) -> None:
    """``--method self-debias`` (:mod:`rbjax.debias.self_debias`) and its options; it reads ``--model``,
    ``--tokenizer``, ``--out``, ``--bias`` (the default prefix) and ``--overwrite`` of the training options."""
    method = next(a for a in p._actions if a.dest == "method")
    method.choices = list(method.choices) + [SELF_DEBIAS]
    method.help += ("; self-debias: rescale the next-token distribution at decoding time with self-debiasing "
                    "prefixes (Schick et al. 2021) — inference-time only, see docs/debiasing.md")
    # its options: NoTrainingOptions (add_training_free_arguments)

def run_self_debias_command(args) -> int:
    """``rbjax debias --method self-debias``."""
    cfg = SelfDebiasRun(bias_type=args.bias_type, model=args.model, tokenizer=args.tokenizer, out_dir=args.out_dir,
                        prefixes=tuple(args.self_debias_prefix or ()), decay_constant=args.decay_constant,
                        epsilon=args.self_debias_epsilon)
    res = run_self_debias(cfg, overwrite=args.overwrite)
    sd = res["self_debias"]
    print(f"self-debias on {res['bias_type']}: {len(sd['prefixes'])} prefix(es), λ = {sd['decay_constant']:g}, "
          f"ε = {sd['epsilon']:g}{'  [reused]' if res.get('reused') else ''}")
    for t, n in zip(sd["prefixes"], res["prefix_tokens"]):
        print(f"  {t!r} ({n} tokens)")
    print("  inference-time only: measure/evaluate read the run folder as the base model with the rescaled "
          "distribution; export refuses it")
    print(f"\nwrote {Path(cfg.out_dir) / 'results.json'}")
    return 0


def add_training_free_arguments(p) -> None:
    """``--method sentence-debias|inlp`` (debiasing without training, :mod:`rbjax.debias.training_free`) and its
    options. Those methods read ``--model``, ``--tokenizer``, ``--out``, ``--bias``, ``--data-dir``, ``--seed`` and
    ``--overwrite`` of the training options; the others do not apply to them."""
    method = next(a for a in p._actions if a.dest == "method")
    method.choices = list(method.choices) + list(TRAINING_FREE_METHODS)
    method.help += ("; sentence-debias: project out the bias subspace of the final hidden state (Liang et al. "
                    "2020); inlp: iterative nullspace projection (Ravfogel et al. 2020) — no training, see "
                    "docs/debiasing.md")
    add_config_arguments(p.add_argument_group("debiasing without training (--method sentence-debias, inlp or "
                                              "self-debias; docs/debiasing.md §10-11)"), NoTrainingOptions)

#: the training settings each method without training reads (the others are refused when given: nothing is ignored)
#: (the chat format's settings but --score-end-of-turn, which only scoring reads; --mesh: of the representation pass)
_PROJECTION_SETTINGS = ("method", "bias_type", "model", "tokenizer", "out_dir", "data_dir", "seed", "mesh", "format",
                        "role", "system", "prompt", "chat_template")
TRAINING_FREE_SETTINGS = {"sentence-debias": _PROJECTION_SETTINGS, "inlp": _PROJECTION_SETTINGS,
                          SELF_DEBIAS: ("method", "bias_type", "model", "tokenizer", "out_dir")}


def refuse_options_it_ignores(args) -> None:
    """Refuse, by flag, an option the chosen ``--method`` would not read: a training setting (``--lr``, ``--mesh``,
    ``--dry-run``, …) given to a method without training, or a :class:`NoTrainingOptions` option of another method.

    Raises:
        SystemExit: naming the flags and the method.
    """
    given = []
    if args.method in TRAINING_FREE_SETTINGS:
        keep = TRAINING_FREE_SETTINGS[args.method]
        given = [leaf for leaf in _cli_leaves(False) if leaf.name not in keep
                 and hasattr(args, leaf.name) and getattr(args, leaf.name) != leaf.default]
        given = [option_spec(leaf.owner, leaf.field, default=leaf.default, help=leaf.help)[0][0] for leaf in given]
        given += [f for f, v in (("--dry-run", args.dry_run), ("--device-memory-gb", args.device_memory_gb)) if v]
    for f in dataclasses.fields(NoTrainingOptions):
        v = getattr(args, f.name, f.default)
        if args.method not in NO_TRAINING_OPTIONS[f.name] and v not in (f.default, None, ()):
            given.append(option_spec(NoTrainingOptions, f)[0][0])
    if given:
        raise SystemExit(f"--method {args.method}: {', '.join(given)} would have no effect (docs/debiasing.md says "
                         "which options each method reads)")


def run_without_training(args) -> int:
    """``rbjax debias --method sentence-debias|inlp`` (its options checked by :func:`refuse_options_it_ignores`)."""
    cfg = ProjectionRun(method=args.method, bias_type=args.bias_type, model=args.model, tokenizer=args.tokenizer,
                        out_dir=args.out_dir, data_dir=args.data_dir, corpus=args.corpus, pairs=args.pairs, k=args.k,
                        iterations=args.inlp_iterations, epsilon=args.inlp_epsilon,
                        dev_fraction=args.inlp_dev_fraction, seed=args.seed, mesh=args.mesh,
                        chat=ChatSettings(**{k: getattr(args, k) for k in ("format", "role", "system", "prompt",
                                                                            "chat_template")}))
    res = run_training_free(cfg, overwrite=args.overwrite)
    pj = res["projection"]
    print(f"{res['method']} on {res['bias_type']}: {res['sets']} counterfactual sets ({', '.join(res['groups'])}); "
          f"removed {pj['removed']} of {pj['dim']} dimensions{'  [reused]' if res.get('reused') else ''}")
    if res.get("chat"):
        print(f"  sentences read in the {describe_chat(res['chat'])}")
    print(f"  model: {res['model_dir']}")
    print(f"\nwrote {Path(cfg.out_dir) / 'results.json'}")
    return 0


def add_plan_arguments(p) -> None:
    """``--dry-run`` and ``--device-memory-gb``: the memory plan (:mod:`rbjax.model.memory`), the options of
    :class:`rbjax.commands.settings.PlanSettings`."""
    add_config_arguments(p, PlanSettings)


def check_plan(args, cfg, model: ModelHandle) -> bool:
    """The run's memory plan from the model's config.json (``model``: the run's handle), printed with ``--dry-run``
    (then ``True``: stop), and checked (:class:`rbjax.model.memory.PlanError` when it cannot fit, before anything is
    loaded; under ``--dry-run`` after the plan is printed, so a plan that does not fit exits non-zero)."""
    t = cfg.trainer
    plan = plan_for_model(model, mesh=cfg.mesh, training=True, batch_size=t.batch_size,
                          seq_len=cfg.plan_seq_len, grad_accum=t.grad_accum, precision=t.precision,
                          device_memory_gb=args.device_memory_gb,
                          n_devices=mesh_product(cfg.mesh) if args.dry_run and cfg.mesh else None,
                          **adapter_plan(cfg))
    if args.dry_run:
        print(plan.format())
    plan.check(printed=args.dry_run)
    return bool(args.dry_run)


def adapter_plan(cfg: DebiasRun) -> dict:
    """The memory plan's keywords of a run's adapters (none without): the adapter and the base's storage dtype."""
    a = cfg.adapter
    return {"adapter": a.lora_spec(), "param_dtype": a.param_dtype} if a.enabled else {}


def config_from_args(args, **override) -> DebiasRun:
    """The :class:`DebiasRun` of parsed arguments (``--no-export`` implies no evaluation)."""

    kw = training_settings(args)
    if "export" in kw and not kw["export"]:
        kw["evaluate"] = False
    kw.update(override)
    return DebiasRun.from_flat(kw)


def format_results(res: dict) -> str:
    tr = res["training"]
    name = res["bias_type"]
    if str(name).endswith(".json") and "lmb_valid" in res:  # a spec file: its bias type's own name, and the file
        name = f"{res['lmb_valid']['debiased_type']['bias_type']} ({name})"
    sessions = f", {tr['sessions']} sessions" if (tr.get("sessions") or 1) > 1 else ""
    lines = [f"{res['method']} on {name} ({res['semantics']} semantics): "
             f"{tr['updates']} updates in {tr.get('train_s', 0.0):.1f} s ({(tr.get('tokens_per_s') or 0):.0f} tokens/s"
             f"{sessions})"]
    # how it was trained: the format and what was trained (every weight, or LoRA adapters on a frozen base)
    how = describe_chat(res["chat"]) if res.get("format") == "chat" and res.get("chat") else (
        "raw text (the paper's format)")
    ad = res.get("adapter")
    what = (f"LoRA adapters of rank {ad['rank']} (α {ad['alpha']:g}) trained on a frozen base model stored in "
            f"{ad['param_dtype']}") if ad else "every weight trained"
    lines.append(f"  trained on {how}; {what}")
    reused = res.get("reused") or {}
    if reused.get("training"):
        lines[0] += "  [training reused from the finished run]"
    last = tr.get("last") or {}
    if last:
        num = lambda v: "n/a" if v is None or v != v else f"{v:.4g}"  # noqa: E731 (null/NaN: a skipped update)
        lines.append(f"  last update: total {num(last['total'])}  lm {num(last['lm_loss'])}  "
                     f"debias {num(last['debias_loss'])}")
    skipped = tr.get("skipped_updates") or 0
    skipped = sum(skipped) if isinstance(skipped, list) else int(skipped)  # a list in records of older versions
    if skipped:
        lines.append(f"  updates skipped for a non-finite gradient or loss: {skipped}")
    if res.get("model_dir"):
        lines.append(f"  model: {res['model_dir']}")
    if "lmb_valid" in res:
        lines.append("  LMB (valid split; t < 0 = stereotypical):")
        width = max([10] + [len(r["bias_type"]) for r in res["lmb_valid"]["all"]])
        for r in res["lmb_valid"]["all"]:
            t, p = r["t_value"], r["p_value"]
            tt = "n/a" if t is None else f"{t:8.3f}"
            pp = "n/a" if p is None else f"{p:.2e}"
            mark = " *" if r["significant"] else ""
            lines.append(f"    {r['bias_type']:<{width}} t {tt}  p {pp}{mark}")
    if "lmp" in res:
        lm = res["lmp"]
        sub = "" if not lm.get("max_lines") else f" (first {lm['max_lines']} lines only)"
        f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"  LMP (Reddit 6K){sub}: {f(lm['perplexity'])}  [reference grid {f(lm['reference_grid'])}, "
                     f"CDA estimator {f(lm['reference_cda'])}]")
    return "\n".join(lines)


def run(args) -> int:
    refuse_options_it_ignores(args)
    if args.method == SELF_DEBIAS:
        return run_self_debias_command(args)
    if args.method in TRAINING_FREE_METHODS:
        return run_without_training(args)
    cfg = config_from_args(args)
    check_own_bias_type_data(cfg)  # before the memory plan reads the model's config: the phrases are what is missing
    if not args.dry_run:
        check_output_dir(cfg.out_dir, "--out")  # a bad --out is named before the model is read
    model = ModelHandle.open(cfg.model, cfg.tokenizer)  # the one handle: the plan, the key and the loader
    if check_plan(args, cfg, model):
        return 0
    res = debias(cfg, overwrite=args.overwrite, model=model)
    print(format_results(res))
    print(f"\nwrote {Path(cfg.out_dir) / 'results.json'}")
    return 0
