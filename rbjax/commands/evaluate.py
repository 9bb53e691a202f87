"""``rbjax evaluate``: dialog-quality checks of a (debiased) model (paper §3.2, Tables 4–5).

One ``--task`` per check. Each task is a handler in :data:`TASKS` (``name -> Task``) with the options it needs;
adding a task means adding its options to the parser and one entry to :data:`TASKS`.

* ``lmp`` — Reddit-6K perplexity → ``OUT/lmp.json``.
* ``dst`` — MultiWOZ 2.0 dialog state tracking (train the classifier, score the test split) → ``OUT/dst.json``.
* ``crg`` — DSTC-7 response generation (optional fine-tuning, generation, DSTC-7 metrics) → ``OUT/crg.json``,
  ``OUT/crg_responses.jsonl``, ``OUT/crg_hypotheses.txt``.
* ``all`` — lmp, dst and crg, one after the other.
* ``crg-metrics`` — score given responses with the DSTC-7 metrics: ``--hyp FILE --refs FILE [FILE ...] --out DIR``
  → ``DIR/crg_metrics.json``.

The model tasks call :func:`rbjax.dialog.evaluate.evaluate` (the Python API); a rerun with the same model, data and
settings reuses the result file.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rbjax.commands import HelpFormatter
from rbjax.dialog.crg_metrics import evaluate_crg_metrics, format_crg_table
from rbjax.dialog.evaluate import TASKS as MODEL_TASKS
from rbjax.dialog.evaluate import evaluate, format_result


@dataclass(frozen=True)
class Task:
    """One ``--task``: its handler ``run(args) -> int``, a help line and the options it cannot do without."""

    run: Callable
    help: str
    required: tuple[str, ...] = ()


def _run_crg_metrics(args) -> int:

    result = evaluate_crg_metrics(args.hyp, args.refs, args.out, clean=bool(args.clean),
                                  compute_meteor=not args.no_meteor, meteor_norm=not args.meteor_no_norm,
                                  meteor_jar=args.meteor_jar, java=args.java, overwrite=args.overwrite)
    print(format_crg_table(result))
    for metric, why in result["null_reasons"].items():
        if metric != "meteor":
            print(f"{metric}: none ({why})")
    print(f"\nwrote {Path(args.out) / 'crg_metrics.json'}")
    return 0


def _settings(args) -> dict:
    """The :func:`rbjax.dialog.evaluate.evaluate` settings of the command-line options (``None`` = the task's
    default)."""
    return {
        "progress": not args.no_progress, "keep_checkpoints": args.keep_checkpoints or None,
        "data_dir": args.data_dir, "lmp_file": args.lmp_file, "lmp_max_lines": args.lmp_max_lines,
        "lmp_block_size": args.lmp_block_size, "eval_batch_size": args.eval_batch_size,
        "multiwoz": args.multiwoz, "ontology": args.ontology, "mapping": args.mapping,
        "train_file": args.train_file, "dst_train_file": args.dst_train_file, "crg_train_file": args.crg_train_file,
        "test_file": args.test_file, "refs": args.refs, "max_steps": args.max_steps, "max_examples": args.max_examples,
        "seed": args.seed, "semantics": args.semantics, "joint_goal": args.joint_goal or None,
        "jga_max_dialogues": args.jga_max_dialogues, "batch_size": args.batch_size, "grad_accum": args.grad_accum,
        "epochs": args.epochs, "learning_rate": args.lr, "gen_batch_size": args.gen_batch_size,
        "greedy": args.greedy or None, "max_new_tokens": args.max_new_tokens, "clean": args.clean,
        "meteor": False if args.no_meteor else None, "meteor_norm": False if args.meteor_no_norm else None,
        "meteor_jar": args.meteor_jar, "java": args.java, "dropout": False if args.no_dropout else None,
    }


def _run_model_task(args) -> int:

    if args.task == "all" and args.train_file:
        raise ValueError("--train-file is the training file of one task; with --task all use --dst-train-file "
                         "and/or --crg-train-file")
    if args.hyp:
        raise ValueError(f"--hyp belongs to --task crg-metrics, not --task {args.task}")
    res = evaluate(args.task, args.model, args.out, tokenizer=args.tokenizer, overwrite=args.overwrite,
                   **_settings(args))
    results = res if args.task == "all" else {args.task: res}
    for t in MODEL_TASKS:
        if t in results:
            print(format_result(results[t]))
            print()
    out = Path(args.out)
    written = [out / f"{t}.json" for t in results]
    if "crg" in results:
        written += [out / "crg_responses.jsonl", out / "crg_hypotheses.txt"]
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


#: task name -> handler; the ``--task`` choices are exactly these keys
TASKS: dict[str, Task] = {
    "lmp": Task(_run_model_task, "Reddit-6K perplexity of the model (OUT/lmp.json)", ("model", "out")),
    "dst": Task(_run_model_task, "MultiWOZ 2.0 dialog state tracking: train the classifier on train (default: the "
                                 "val split standing in), score the test split (OUT/dst.json)", ("model", "out")),
    "crg": Task(_run_model_task, "DSTC-7 response generation: optional fine-tuning, generation, DSTC-7 metrics "
                                 "(OUT/crg.json, OUT/crg_responses.jsonl)", ("model", "out")),
    "all": Task(_run_model_task, "lmp, dst and crg", ("model", "out")),
    "crg-metrics": Task(_run_crg_metrics, "score given responses with the DSTC-7 metrics (OUT/crg_metrics.json)",
                        ("hyp", "out")),
}


def register(sub) -> None:

    tasks = "; ".join(f"{name}: {t.help}" for name, t in TASKS.items())
    p = sub.add_parser(
        "evaluate", help="dialog-quality checks: Reddit perplexity, MultiWOZ DST, DSTC-7 response generation",
        description=f"Dialog-quality checks of a (debiased) model (paper §3.2, Tables 4-5). Tasks — {tasks}. "
                    "MODEL may be an HF GPT-2 folder, a hub id, or a finished `rbjax debias` run folder (its "
                    "model/ is evaluated). Each result file carries a key (model, tokenizer and data file contents, "
                    "settings): a rerun with the same key reuses it, any change recomputes. Defaults follow the "
                    "paper and the reference code; see docs/dialog.md.",
        formatter_class=HelpFormatter)
    p.add_argument("--task", required=True, choices=list(TASKS), help="which check to run")
    p.add_argument("--out", help="output folder (the result is OUT/<task>.json)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a result in --out of other inputs (another model, data or settings); without it "
                        "such a result is refused before the task computes anything (same inputs: reused)")
    p.add_argument("--model", metavar="MODEL",
                   help="HF GPT-2 folder, hub id (e.g. microsoft/DialoGPT-small) or `rbjax debias` run folder")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer folder or hub id (default: the model folder)")
    p.add_argument("--seed", type=int, metavar="N",
                   help="seed of the DST negatives, classifier head, data order and dropout, and of CRG sampling "
                        "(default: 42, the reference's)")
    p.add_argument("--semantics", choices=("paper", "reference"),
                   help="paper (default): rbjax's corrected semantics; reference: reproduce the official scripts "
                        "(DST negatives with the slot-remap bug, pooling the last padded column, start-of-text "
                        "truncation; CRG prompts and top-k 50 + top-p 0.95 sampling, 128 tokens with the prompt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")

    g = p.add_argument_group("training (dst, crg)")
    g.add_argument("--train-file", metavar="PATH",
                   help="the task's training data: dst — the MultiWOZ 2.0 train split (official MultiWOZ_2.0.zip, "
                        "ConvLab train.json.zip or TRADE train_dials.json; default: the val split stands in); crg — a "
                        "DSTC-7 TSV (hash, subreddit, conv_id, score, turn, context, response; default: no "
                        "fine-tuning)")
    g.add_argument("--dst-train-file", metavar="PATH", help="--train-file of dst, for --task all")
    g.add_argument("--crg-train-file", metavar="FILE", help="--train-file of crg, for --task all")
    g.add_argument("--max-steps", type=int, metavar="N", help="stop training after N updates (quick runs)")
    g.add_argument("--max-examples", type=int, metavar="N",
                   help="use only the first N examples: dst — of the train and of the test pairs; crg — of the test "
                        "contexts (quick runs; recorded in the result)")
    g.add_argument("--batch-size", type=int, metavar="N", help="training micro-batch (default: dst 12, crg 16)")
    g.add_argument("--grad-accum", type=int, metavar="N", help="micro-batches per update (default: dst 4, crg 5)")
    g.add_argument("--epochs", type=int, metavar="N", help="training epochs (default: 1)")
    g.add_argument("--lr", type=float, metavar="X", help="peak learning rate, linear decay (default: 5e-5)")
    g.add_argument("--no-dropout", action="store_true", help="train without GPT-2's dropout (the reference uses it)")
    g.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the fine-tuned model's checkpoints in OUT/<task>_train/checkpoints after the result is "
                        "written (default: deleted then); with them a rerun that changes only evaluation settings "
                        "(e.g. adds --joint-goal) restores the trained model instead of training again")
    g.add_argument("--eval-batch-size", type=int, metavar="N",
                   help="rows per scoring batch of LMP lines and DST pairs (default: 64)")

    g = p.add_argument_group("lmp")
    g.add_argument("--data-dir", metavar="DIR",
                   help="RedditBias data folder: the LMP file text_files/humanref6k.txt and the offline DSTC-7 test "
                        "contexts data/dstc7/response_hyp.txt (default: $RBJAX_DATA_DIR, else the verified download "
                        "cache)")
    g.add_argument("--lmp-file", metavar="FILE", help="LMP reference file, one utterance a line (default: "
                                                      "RedditBias text_files/humanref6k.txt)")
    g.add_argument("--lmp-max-lines", type=int, metavar="N", help="score only the first N LMP lines (quick runs)")
    g.add_argument("--lmp-block-size", type=int, metavar="N", help="tokens kept per LMP line (default: 36)")

    g = p.add_argument_group("dst")
    g.add_argument("--multiwoz", metavar="PATH",
                   help="MultiWOZ 2.0: a folder or zip in the official, ConvLab or TRADE layout (mapping.pair and "
                        "ontology.json are taken from it when present; default: $RBJAX_MULTIWOZ, else ConvLab's val "
                        "and test splits downloaded and verified)")
    g.add_argument("--ontology", metavar="FILE", help="MultiWOZ 2.0 ontology.json (default: from --multiwoz, else the "
                                                      "pinned download)")
    g.add_argument("--mapping", metavar="FILE", help="TRADE's mapping.pair (default: from --multiwoz, else the pinned "
                                                     "download)")
    g.add_argument("--joint-goal", action="store_true",
                   help="also joint goal accuracy: every candidate value of every slot at every turn (about 300 times "
                        "the pairs of the binary metrics); the cost is reported")
    g.add_argument("--jga-max-dialogues", type=int, metavar="N",
                   help="joint goal accuracy on the first N test dialogues only")

    g = p.add_argument_group("crg and crg-metrics")
    g.add_argument("--test-file", metavar="FILE",
                   help="crg: DSTC-7 TSV of test contexts (default: the 1,472 DSTC-7 test contexts of RedditBias "
                        "data/dstc7/response_hyp.txt)")
    g.add_argument("--hyp", metavar="FILE", help="crg-metrics: generated responses, one per line (UTF-8)")
    g.add_argument("--refs", metavar="FILE", nargs="+",
                   help="reference files, one per reference set, line-aligned with the test examples (crg) or with "
                        "--hyp (crg-metrics); without them only the reference-free metrics (entropy, dist, avg_len) "
                        "are computed and BLEU/NIST/METEOR are null with the reason")
    g.add_argument("--gen-batch-size", type=int, metavar="N", help="crg: contexts per generation batch (default: 16)")
    g.add_argument("--greedy", action="store_true", help="crg: greedy decoding instead of sampling")
    g.add_argument("--max-new-tokens", type=int, metavar="N", help="crg: at most N new tokens per response "
                                                                   "(default: 64)")
    g.add_argument("--clean", action=argparse.BooleanOptionalAction, default=None,
                   help="DSTC-7's -c cleaning of hypotheses and references (lower-case, URLs to __url__, tweet "
                        "tokenisation, contractions split), as the official scores use it (default: on for crg, off "
                        "for crg-metrics)")
    g.add_argument("--no-meteor", action="store_true", help="skip METEOR (it starts Java and loads 60 MB of paraphrases)")
    g.add_argument("--meteor-jar", metavar="JAR",
                   help="meteor-1.5.jar with data/paraphrase-en.gz beside it (default: $RBJAX_METEOR_JAR, else the "
                        "copy bundled in the pycocoevalcap package)")
    g.add_argument("--meteor-no-norm", action="store_true",
                   help="run METEOR without -norm (the official command uses -norm; the official README's demo "
                        "value was computed without it)")
    g.add_argument("--java", help="Java executable for METEOR (default: java on PATH)")
    p.set_defaults(func=run)


def run(args) -> int:
    task = TASKS[args.task]
    missing = [f"--{opt.replace('_', '-')}" for opt in task.required if getattr(args, opt, None) in (None, "", [])]
    if missing:
        raise ValueError(f"--task {args.task} needs {' and '.join(missing)}")
    return task.run(args)
