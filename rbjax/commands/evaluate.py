"""``rbjax evaluate``: dialog-quality checks of a (debiased) model (paper §3.2, Tables 4–5).

One ``--task`` per check. Each task is a handler in :data:`TASKS` (``name -> Task``) with the options it needs;
adding a task means adding its options to the parser and one entry to :data:`TASKS`.

Tasks available in this build:

* ``crg-metrics`` — score given responses with the DSTC-7 metrics (BLEU-1..4, NIST-1..4, METEOR, entropy-1..4,
  dist-1/2, average length): ``--hyp FILE --refs FILE [FILE ...] --out DIR [--clean]`` → ``DIR/crg_metrics.json``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Task:
    """One ``--task``: its handler ``run(args) -> int``, a help line and the options it cannot do without."""

    run: Callable
    help: str
    required: tuple[str, ...] = ()


def _run_crg_metrics(args) -> int:
    from rbjax.dialog.crg_metrics import evaluate_crg_metrics, format_crg_table

    result = evaluate_crg_metrics(args.hyp, args.refs, args.out, clean=args.clean, compute_meteor=not args.no_meteor,
                                  meteor_norm=not args.meteor_no_norm, meteor_jar=args.meteor_jar, java=args.java)
    print(format_crg_table(result))
    for metric, why in result["null_reasons"].items():
        if metric != "meteor":
            print(f"{metric}: none ({why})")
    print(f"\nwrote {Path(args.out) / 'crg_metrics.json'}")
    return 0


#: task name -> handler; the ``--task`` choices are exactly these keys
TASKS: dict[str, Task] = {
    "crg-metrics": Task(_run_crg_metrics, "score given responses with the DSTC-7 metrics", ("hyp", "out")),
}


def register(sub) -> None:
    from rbjax.cli import HelpFormatter

    tasks = "; ".join(f"{name}: {t.help}" for name, t in TASKS.items())
    p = sub.add_parser(
        "evaluate", help="dialog-quality checks (DSTC-7 response-generation metrics)",
        description=f"Dialog-quality checks of a model (paper §3.2). Tasks — {tasks}. "
                    "crg-metrics writes OUT/crg_metrics.json: BLEU-1..4 and NIST-1..4 as mteval-v14c.pl computes "
                    "them, METEOR (meteor-1.5.jar; null with a reason when Java or the jar is missing), "
                    "entropy-1..4 (nats), dist-1/2 (pooled) and the average length, as DSTC-7's dstc.py defines them.",
        formatter_class=HelpFormatter)
    p.add_argument("--task", required=True, choices=list(TASKS), help="which check to run")
    p.add_argument("--out", help="output folder (the result is OUT/<task>.json)")
    g = p.add_argument_group("crg-metrics")
    g.add_argument("--hyp", metavar="FILE", help="generated responses, one per line (UTF-8)")
    g.add_argument("--refs", metavar="FILE", nargs="+",
                   help="reference files, one per reference set, line-aligned with --hyp; without them only the "
                        "reference-free metrics (entropy, dist, avg_len) are computed")
    g.add_argument("--clean", action="store_true",
                   help="DSTC-7's -c cleaning of hypotheses and references (lower-case, URLs to __url__, tweet "
                        "tokenisation, contractions split); the official DSTC-7 scores use it")
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
