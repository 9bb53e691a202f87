"""``rbjax evaluate``: dialog-quality checks of a (debiased) model (paper §3.2, Tables 4–5).

One ``--task`` per check. Each task is a handler in :data:`TASKS` (``name -> Task``) with the options it needs. The
model tasks are those of :mod:`rbjax.dialog.tasks`, and their options are generated from the fields of the tasks'
settings dataclasses (help, choices, metavar and spelling live in the fields; an option several tasks take appears
once; an option not written on the command line leaves each task's own default — command line > default, the one
precedence rule :func:`rbjax.core.config.precedence`): :data:`OPTION_GROUPS` places each field in the help.
The others are the shared blocks of :mod:`rbjax.commands.settings` (``--out``, ``--overwrite``, ``--model``,
``--tokenizer``, ``--dry-run``) and :class:`EvaluateCommand`'s (``--task``, ``--hyp`` of crg-metrics and the three
training-file options: ``--train-file`` is the field ``dst_train_file`` or ``crg_train_file`` of the task that runs).

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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, given_options, option_spec, record_given
from rbjax.commands.settings import ModelSource, Output, PlanSettings
from rbjax.core.config import Leaf, field, leaves
from rbjax.dialog.crg_metrics import evaluate_crg_metrics, format_crg_table
from rbjax.dialog.evaluate import TASKS as MODEL_TASKS
from rbjax.dialog.evaluate import evaluate, format_result
from rbjax.dialog.tasks import get_task


@dataclass(frozen=True)
class Task:
    """One ``--task``: its handler ``run(args) -> int``, a help line and the options it cannot do without."""

    run: Callable
    help: str
    required: tuple[str, ...] = ()


def _run_crg_metrics(args) -> int:
    model_only = (("--dry-run", args.dry_run), ("--mesh", args.mesh), ("--device-memory-gb", args.device_memory_gb),
                  ("--format", args.format), ("--system", args.system), ("--chat-template", args.chat_template))
    for opt, given in model_only:
        if given:
            raise ValueError(f"{opt} concerns a model task (lmp, dst, crg, all), not --task crg-metrics, which runs "
                             "no model")

    result = evaluate_crg_metrics(args.hyp, args.refs, args.out, clean=bool(args.clean),
                                  compute_meteor=args.meteor is not False, meteor_norm=args.meteor_norm is not False,
                                  meteor_jar=args.meteor_jar, java=args.java, overwrite=args.overwrite)
    print(format_crg_table(result))
    for metric, why in result["null_reasons"].items():
        if metric != "meteor":
            print(f"{metric}: none ({why})")
    print(f"\nwrote {Path(args.out) / 'crg_metrics.json'}")
    return 0


def _settings(args) -> dict:
    """The :func:`rbjax.dialog.evaluate.evaluate` settings written on the command line
    (:func:`rbjax.commands.options.given_options`; a setting not written is the task's default: command line >
    default, :func:`rbjax.core.config.precedence`)."""
    given = given_options(args)
    return {name: getattr(args, name) for name in ("train_file", "dst_train_file", "crg_train_file", *_option_fields())
            if name in given}


def _run_model_task(args) -> int:

    if args.task == "all" and args.train_file:
        raise ValueError("--train-file is the training file of one task; with --task all use --dst-train-file "
                         "and/or --crg-train-file")
    if args.hyp:
        raise ValueError(f"--hyp belongs to --task crg-metrics, not --task {args.task}")
    if args.dry_run:
        plans = evaluate(args.task, args.model, None, tokenizer=args.tokenizer, dry_run=True, **_settings(args))
        for t, ps in plans.items():
            for p in ps:
                print(f"{t}: {p.format()}")
        for ps in plans.values():  # a plan that does not fit: an error (exit 1) after every plan is printed
            for p in ps:
                p.check(printed=True)
        return 0
    if not args.out:
        raise ValueError(f"--task {args.task} needs --out")
    res = evaluate(args.task, args.model, args.out, tokenizer=args.tokenizer, overwrite=args.overwrite,
                   **_settings(args))
    results = res if args.task == "all" else {args.task: res}
    for t in MODEL_TASKS:
        if t in results:
            print(format_result(results[t]))
            print()
    out = Path(args.out)
    written = [out / f for t in results for f in get_task(t).outputs]
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _task_help(name: str) -> str:
    t = get_task(name)
    return f"{t.help} ({', '.join('OUT/' + f for f in t.outputs)})"


#: task name -> handler; the ``--task`` choices are exactly these keys
TASKS: dict[str, Task] = {
    **{name: Task(_run_model_task, _task_help(name), ("model",)) for name in MODEL_TASKS},
    "all": Task(_run_model_task, f"{', '.join(MODEL_TASKS[:-1])} and {MODEL_TASKS[-1]}", ("model",)),
    "crg-metrics": Task(_run_crg_metrics, "score given responses with the DSTC-7 metrics (OUT/crg_metrics.json)",
                        ("hyp", "out")),
}

def _train_file_field(task: str):
    """The training-file field of the dialog task ``task`` (its help and metavar)."""
    return next(leaf.field for leaf in leaves(get_task(task).settings) if leaf.name == f"{task}_train_file")


@dataclasses.dataclass(frozen=True)
class EvaluateCommand:
    """The options of ``rbjax evaluate`` that are no task setting (the shared blocks aside: ``--out``,
    ``--overwrite``, ``--model``, ``--tokenizer``, ``--dry-run``, :mod:`rbjax.commands.settings`): the task, the
    crg-metrics hypotheses and the training files (``--train-file`` is the field ``dst_train_file`` or
    ``crg_train_file`` of the task that runs; ``--dst-train-file`` / ``--crg-train-file`` name one for --task all)."""

    task: str | None = field(None, "which check to run", choices=tuple(TASKS))
    hyp: str | None = field(None, "crg-metrics: generated responses, one per line (UTF-8)", metavar="FILE")
    train_file: str | None = field(None, f"the task's training data: dst — "
                                         f"{_train_file_field('dst').metadata['help']}; crg — "
                                         f"{_train_file_field('crg').metadata['help']}", metavar="PATH")
    dst_train_file: str | None = field(None, "--train-file of dst, for --task all",
                                       metavar=_train_file_field("dst").metadata["metavar"])
    crg_train_file: str | None = field(None, "--train-file of crg, for --task all",
                                       metavar=_train_file_field("crg").metadata["metavar"])


#: where each setting of the model tasks appears in ``rbjax evaluate --help``: ``(group title or None for the
#: top level, field names)``. Every field of every task's settings is an option placed here, or listed in
#: :data:`NOT_OPTIONS` (checked when the parser is built).
OPTION_GROUPS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("seed", "semantics", "mesh", "device_memory_gb", "progress")),
    ("training (dst, crg)", ("max_steps", "max_examples", "batch_size", "grad_accum", "epochs", "learning_rate",
                             "dropout", "layout", "keep_checkpoints", "eval_batch_size")),
    ("adapters (dst, crg fine-tuning)", ("adapter", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets",
                                         "lora_rslora", "param_dtype")),
    ("lmp", ("data_dir", "lmp_file", "lmp_max_lines", "lmp_block_size")),
    ("dst", ("multiwoz", "ontology", "mapping", "joint_goal", "jga_max_dialogues")),
    ("chat format (crg; lmp and dst refuse it)", ("format", "system", "chat_template")),
    ("crg and crg-metrics", ("test_file", "refs", "gen_batch_size", "greedy", "max_new_tokens", "clean", "meteor",
                             "meteor_jar", "meteor_norm", "java")),
)
#: settings that are not options: the training files (``--train-file`` and the ``--<task>-train-file`` options are
#: written by hand below) and those of the Python API and study files only
NOT_OPTIONS = ("dst_train_file", "crg_train_file", "block_size")


def _fields() -> dict[str, list[tuple[str, Leaf]]]:
    """``{setting: [(task, setting), ...]}`` over the model tasks, in task order (a training task's trainer and
    optimiser settings by their flat names, :func:`rbjax.core.config.leaves`)."""
    out: dict[str, list] = {}
    for name in MODEL_TASKS:
        for leaf in leaves(get_task(name).settings):
            out.setdefault(leaf.name, []).append((name, leaf))
    return out


def _option_fields() -> tuple[str, ...]:
    return tuple(name for _, names in OPTION_GROUPS for name in names)


def _add_setting(g, name: str, owners: list) -> None:
    """One option for the setting ``name`` of the tasks ``owners`` (``[(task, Leaf), ...]``): spelling, help,
    choices and metavar from the field (the same in every task that takes it), type from its annotation, default
    ``None`` (= each task's own, shown in the help when the help does not already say it)."""
    leaf = owners[0][1]
    md = leaf.field.metadata
    for task, other in owners[1:]:
        if dict(other.field.metadata) != dict(md) or other.help != leaf.help:
            raise TypeError(f"setting {name}: {task}'s field differs from {owners[0][0]}'s in its help or spelling")
    flags, kw = option_spec(leaf.owner, leaf.field, unset_default=True, default=leaf.default, help=leaf.help)
    defaults = {task: other.default for task, other in owners}
    if "action" not in kw and "default" not in leaf.help.lower() and any(v is not None for v in defaults.values()):
        shown = ({str(v) for v in defaults.values()}.pop() if len(set(defaults.values())) == 1
                 else ", ".join(f"{task} {v}" for task, v in defaults.items()))
        kw["help"] = f"{leaf.help} (default: {shown})"
    record_given(g.add_argument(*flags, **kw))


def register(sub) -> None:

    tasks = "; ".join(f"{name}: {t.help}" for name, t in TASKS.items())
    p = sub.add_parser(
        "evaluate", help="dialog-quality checks: Reddit perplexity, MultiWOZ DST, DSTC-7 response generation",
        description=f"Dialog-quality checks of a (debiased) model (paper §3.2, Tables 4-5). Tasks — {tasks}. "
                    "MODEL may be an HF model folder of any supported family, a hub id, or a finished `rbjax debias` run folder (its "
                    "model/ is evaluated). Each result file carries a key (model, tokenizer and data file contents, "
                    "settings): a rerun with the same key reuses it, any change recomputes. Defaults follow the "
                    "paper and the reference code; see docs/dialog.md.",
        formatter_class=HelpFormatter)
    add_config_arguments(p, EvaluateCommand, ("task",), required=("task",))
    add_config_arguments(p, Output, ("out", "overwrite"))
    add_config_arguments(p, ModelSource, ("model", "tokenizer"))
    add_config_arguments(p, PlanSettings, ("dry_run",))

    fields = _fields()
    placed = _option_fields() + NOT_OPTIONS
    missing = [name for name in fields if name not in placed]
    if missing or len(set(placed)) != len(placed) or set(placed) - set(fields):
        raise TypeError(f"rbjax evaluate: OPTION_GROUPS / NOT_OPTIONS must place every task setting once (unplaced: "
                        f"{missing}; unknown: {sorted(set(placed) - set(fields))})")
    for title, names in OPTION_GROUPS:
        g = p if title is None else p.add_argument_group(title)
        if title == "training (dst, crg)":  # the training files: one option per task, named by the task that runs
            add_config_arguments(g, EvaluateCommand, ("train_file", "dst_train_file", "crg_train_file"))
        for name in names:
            _add_setting(g, name, fields[name])
            if name == "test_file":
                add_config_arguments(g, EvaluateCommand, ("hyp",))
    p.set_defaults(func=run)


def run(args) -> int:
    task = TASKS[args.task]
    missing = [f"--{opt.replace('_', '-')}" for opt in task.required if getattr(args, opt, None) in (None, "", [])]
    if missing:
        raise ValueError(f"--task {args.task} needs {' and '.join(missing)}")
    return task.run(args)
