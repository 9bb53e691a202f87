"""``rbjax debias``: fine-tune a GPT-2/DialoGPT with LMD, ADD, HD or CDA (paper §4) and evaluate it."""
from __future__ import annotations

import argparse

METHOD_HELP = ("lmd: equalising loss (§4.1); add: attribute distance (§4.2); hd: hard debiasing (§4.3); "
               "cda: counterfactual data augmentation (§4.4); lm: plain LM fine-tuning (control)")

#: per-method defaults where the paper gives none (the grid selects them; see ``rbjax sweep``)
METHOD_DEFAULTS = {
    "cda": {"batch_size": 2, "grad_accum": 1},  # the reference's CDA run (cai README: bs 2, accumulation 1)
}
DEFAULTS = {"batch_size": 8, "grad_accum": 1, "lambda_lm": 0.01, "lambda_d": 10.0}


def add_training_arguments(p: argparse.ArgumentParser, *, grid: bool = False) -> None:
    """Options shared by ``rbjax debias`` and ``rbjax sweep``."""
    p.add_argument("--method", required=True, choices=["lmd", "add", "hd", "cda", "lm"], help=METHOD_HELP)
    p.add_argument("--bias", required=True, help="bias type: religion1, religion2, race, gender, queerness (orientation)")
    p.add_argument("--model", default="microsoft/DialoGPT-small", help="HF GPT-2 folder or hub id to start from")
    p.add_argument("--out", required=True, help="run folder (an existing run there is resumed)")
    p.add_argument("--tokenizer", help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--data-dir", help="RedditBias data folder (default: $RBJAX_DATA_DIR, else download & cache)")
    p.add_argument("--train-file", help="train on this text file (one phrase a line) instead of the RedditBias train set")
    p.add_argument("--semantics", choices=["paper", "reference"], default="paper",
                   help="paper: the paper's losses/triggers/swapping; reference: reproduce the official PyTorch code "
                        "(see docs/debiasing.md)")
    p.add_argument("--seed", type=int, default=42, help="data order and dropout (the reference: 42)")
    p.add_argument("--epochs", type=int, default=2)
    if not grid:
        p.add_argument("--batch-size", type=int, help="micro-batch size (default: 8; cda: 2 as the reference)")
        p.add_argument("--grad-accum", type=int, help="micro-batches per update (default: 1)")
        p.add_argument("--lambda-lm", type=float, help="λ_LM of eq. 2 (default: 0.01)")
        p.add_argument("--lambda-d", type=float, help="λ_D of eq. 2 (default: 10)")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (linear decay to 0, no warm-up)")
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--block-size", type=int, default=36, help="tokens kept per training phrase")
    p.add_argument("--max-steps", type=int, help="stop after N updates (smoke runs; the schedule decays over N, as HF)")
    p.add_argument("--leftover", choices=["drop", "carry"],
                   help="micro-batches left at an epoch's end when #batches %% accum != 0: drop (paper default) or "
                        "carry into the next epoch's first update (reference Trainer; reference default)")
    p.add_argument("--no-dropout", action="store_true", help="train without dropout (the reference uses 0.1)")
    p.add_argument("--save-every", type=int, default=100, help="checkpoint interval in updates")
    p.add_argument("--keep-checkpoints", type=int, default=2)
    p.add_argument("--lmp-file", help="LMP reference file (default: RedditBias text_files/humanref6k.txt)")
    p.add_argument("--lmp-max-lines", type=int, help="score only the first N LMP lines (smoke runs)")
    p.add_argument("--no-lmp", action="store_true", help="skip the Reddit perplexity")
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out instead of resuming it")


def register(sub) -> None:
    p = sub.add_parser(
        "debias", help="debias a model with LMD, ADD, HD or CDA, then export and evaluate it",
        description="Fine-tune a GPT-2/DialoGPT on the RedditBias training phrases of one bias type with a debiasing "
                    "loss (LMD, ADD, HD) or on the counterfactually augmented set (CDA); Adam 5e-5, linear decay, "
                    "clip 1.0, 2 epochs, block 36. Checkpoints in OUT/checkpoints (rerun the same command to resume "
                    "a killed run), metrics in OUT/metrics.jsonl; afterwards the model is exported to OUT/model, LMB "
                    "is measured on the valid split (OUT/lmb_valid) and the Reddit-6K perplexity computed; "
                    "everything is summarised in OUT/results.json.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_training_arguments(p)
    p.add_argument("--eval-bias", default="all",
                   help="bias types for the post-training LMB (comma list or all; the debiased type is always included)")
    p.add_argument("--no-eval", action="store_true", help="skip the post-training LMB")
    p.add_argument("--no-export", action="store_true", help="do not write OUT/model (implies --no-eval)")
    p.set_defaults(func=run)


def config_from_args(args, **override):
    from rbjax.debias.train import TrainConfig

    def pick(name):
        v = getattr(args, name, None)
        if v is not None:
            return v
        return METHOD_DEFAULTS.get(args.method, {}).get(name, DEFAULTS[name])

    kw = dict(
        method=args.method, bias_type=args.bias, model=args.model, out_dir=args.out, tokenizer=args.tokenizer,
        data_dir=args.data_dir, train_file=args.train_file, semantics=args.semantics, seed=args.seed,
        epochs=args.epochs, batch_size=pick("batch_size"), grad_accum=pick("grad_accum"),
        learning_rate=args.lr, adam_eps=args.adam_eps, max_grad_norm=args.max_grad_norm, block_size=args.block_size,
        lambda_lm=pick("lambda_lm"), lambda_d=pick("lambda_d"), max_steps=args.max_steps, leftover=args.leftover,
        dropout=not args.no_dropout, save_every=args.save_every, keep_checkpoints=args.keep_checkpoints,
        lmp=not args.no_lmp, lmp_file=args.lmp_file, lmp_max_lines=args.lmp_max_lines,
        eval_batch_size=args.eval_batch_size, progress=not args.no_progress)
    if hasattr(args, "no_eval"):
        kw.update(export=not args.no_export, evaluate=not (args.no_eval or args.no_export), eval_bias=args.eval_bias)
    kw.update(override)
    return TrainConfig(**kw)


def format_results(res: dict) -> str:
    lines = [f"{res['method']} on {res['bias_type']} ({res['semantics']} semantics): "
             f"{res['training']['updates']} updates in {res['training']['train_s']:.1f} s "
             f"({(res['training'].get('tokens_per_s') or 0):.0f} tokens/s)"]
    last = res["training"].get("last") or {}
    if last:
        lines.append(f"  last update: total {last['total']:.4g}  lm {last['lm_loss']:.4g}  debias {last['debias_loss']:.4g}")
    if res.get("model_dir"):
        lines.append(f"  model: {res['model_dir']}")
    if "lmb_valid" in res:
        lines.append("  LMB (valid split; t < 0 = stereotypical):")
        for r in res["lmb_valid"]["all"]:
            t, p = r["t_value"], r["p_value"]
            tt = "n/a" if t is None else f"{t:8.3f}"
            pp = "n/a" if p is None else f"{p:.2e}"
            mark = " *" if r["significant"] else ""
            lines.append(f"    {r['bias_type']:<10} t {tt}  p {pp}{mark}")
    if "lmp" in res:
        lm = res["lmp"]
        sub = "" if not lm.get("max_lines") else f" (first {lm['max_lines']} lines only)"
        f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"  LMP (Reddit 6K){sub}: {f(lm['perplexity'])}  [reference grid {f(lm['reference_grid'])}, "
                     f"CDA estimator {f(lm['reference_cda'])}]")
    return "\n".join(lines)


def run(args) -> int:
    from pathlib import Path

    from rbjax.debias.train import train

    cfg = config_from_args(args)
    res = train(cfg, overwrite=args.overwrite)
    print(format_results(res))
    print(f"\nwrote {Path(cfg.out_dir) / 'results.json'}")
    return 0
