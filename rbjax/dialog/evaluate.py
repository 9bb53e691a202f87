"""Dialog quality of a (debiased) model, end to end: Reddit perplexity (LMP), dialog state tracking on MultiWOZ 2.0
(DST) and response generation on DSTC-7 (CRG) — paper §3.2, §5.3, Tables 4–5.

One entry point, :func:`evaluate` (``rbjax evaluate --task ...`` calls it; so does the study runner)::

    evaluate("all", "runs/hd_religion1", "results/dialog", data_dir="../shared/redditbias",
             multiwoz="../shared/dialog-data/multiwoz", max_steps=2)

writes ``OUT/<task>.json`` for each task (atomically) and returns the result (``{task: result}`` for ``all``).

**Model.** An HF model folder of any supported family, a hub id, or a finished ``rbjax debias`` run folder (its ``model/`` subfolder, the
exported debiased model, is evaluated). The tokenizer comes from the model folder unless ``tokenizer`` is given. A
Self-Debias run folder (inference-time only: its base model with the rescaled next-token distribution) is evaluated
with the rescaling: ``lmp`` scores the lines with the self-debiased log-likelihoods (the Self-Debias scorer of
``rbjax measure``), ``crg`` draws every token from the self-debiased distribution
(:func:`rbjax.model.generate.generate`); ``dst`` (and ``all``, which includes it) is refused by name
(:data:`SELF_DEBIAS_DST`: its classifier never reads the next-token distribution). One device: no ``mesh``.

**Reuse.** Every result file carries a ``key``: the content digest of the model files
(:func:`rbjax.model.hf.model_files_key`), of the tokenizer files, of every data file read, and the settings
that shape the numbers. A rerun whose key equals the file's returns the file's content without recomputing (and
says so on stderr); a different key is refused (the difference named) unless ``overwrite`` — a result is
never relabelled. CRG also checks that ``crg_responses.jsonl`` is still the file its result was computed from.

**Tasks** (defaults from the paper and the reference code; ``docs/dialog.md`` has the details):

Each task is a module of :mod:`rbjax.dialog.tasks` (its settings dataclass and its runner, behind a registry:
:func:`rbjax.dialog.tasks.get_task`):

* ``lmp`` (:mod:`rbjax.dialog.tasks.lmp`) — :func:`rbjax.dialog.reddit_perplexity.reddit_perplexity` on RedditBias ``text_files/humanref6k.txt`` (from
  ``data_dir``, ``$RBJAX_DATA_DIR`` or the verified download cache) or ``lmp_file``; 36-token lines.
* ``dst`` (:mod:`rbjax.dialog.tasks.dst`) — the binary slot-value classifier (:mod:`rbjax.dialog.state_tracking`): train the GPT-2 body + ``Linear(d→1)`` on
  the MultiWOZ 2.0 train split (``train_file``) or, by default, on the ``val`` split standing in for it (the train
  split is not in the default download; the result says so), with the shared trainer (batch 12, accumulation 4,
  1 epoch, lr 5e-5, block 128, seed 42); evaluate on the ``test`` split: accuracy, F1 (class 1), macro-F1, the
  confusion matrix and counts, optionally joint goal accuracy (``joint_goal``) with its cost.
* ``crg`` (:mod:`rbjax.dialog.tasks.crg`) — DSTC-7: optionally fine-tune on a DSTC-7 TSV (``train_file``; the loss on the response only; batch 16,
  accumulation 5, 1 epoch, lr 5e-5, block 128), generate a response per test context
  (:func:`rbjax.dialog.crg_generation.generate_responses`; top-k 50, 64 new tokens, or the reference's top-k 50 + top-p
  0.95, 128 tokens with the prompt) into ``OUT/crg_responses.jsonl`` (and the hypotheses, one per line, into
  ``OUT/crg_hypotheses.txt``), and score them with the DSTC-7 metrics (:func:`rbjax.dialog.crg_metrics.crg_metrics`;
  without reference files only the reference-free ones). Test contexts: ``test_file`` (DSTC-7 TSV), else the 1,472
  DSTC-7 test contexts of RedditBias ``data/dstc7/response_hyp.txt``.

Settings (keyword arguments; ``None`` means the task's default) are the fields of the tasks' settings dataclasses
(:class:`~rbjax.dialog.tasks.lmp.LMPSettings`, :class:`~rbjax.dialog.tasks.dst.DSTSettings`,
:class:`~rbjax.dialog.tasks.crg.CRGSettings`; :func:`task_settings` gives one task's as a dict). A setting applies to
every task that takes it (``seed``, ``max_steps``, ``max_examples``, ``batch_size`` ...); ``train_file`` is the task's
own training file (``dst_train_file`` / ``crg_train_file`` name them for ``task="all"``).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from rbjax.core.interrupt import Interrupted
from rbjax.core.io import check_output_dir
from rbjax.core.log import get_logger
from rbjax.dialog.crg_metrics import format_crg_table
from rbjax.dialog.tasks import TASKS, get_task
from rbjax.dialog.tasks.common import memory_plans, resolve_model, result_path, training_layout
from rbjax.model.handle import ModelHandle

__all__ = ["SELF_DEBIAS_DST", "TASKS", "evaluate", "format_result", "resolve_model", "task_settings", "training_layout"]

log = get_logger("evaluate")

#: why DST refuses a Self-Debias model (``{name}``: the model, ``{task}``: the task asked for)
SELF_DEBIAS_DST = ("{name}: a Self-Debias run folder, and --task {task} includes dst: DST fine-tunes a classifier on "
                   "the model's hidden states and never reads its next-token distribution, which is all Self-Debias "
                   "rescales (at inference time), so DST of a Self-Debias model would be DST of its base model; "
                   "evaluate the base model for DST, and this folder with --task lmp and --task crg (both apply the "
                   "rescaling)")




def task_settings(task: str, settings: dict) -> dict:
    """The complete settings of one task as a dict: its settings dataclass (:func:`rbjax.dialog.tasks.get_task`)
    with the given values that are not ``None`` (keys the task does not take are ignored here; :func:`evaluate`
    rejects keys no task takes).

    Raises:
        ValueError: unknown task. rbjax.core.errors.SettingError: a value out of range (names the setting; the CLI
        shows its flag). FileNotFoundError: a path that was given does not exist.
    """
    return get_task(task).settings.from_settings(settings).to_dict()


# ------------------------------------------------------------------------------------------------ entry point
def evaluate(task: str, model: str | os.PathLike, out_dir: str | os.PathLike | None, *,
             tokenizer: str | os.PathLike | None = None, overwrite: bool = False, dry_run: bool = False,
             **settings) -> dict:
    """Run one dialog-quality task (or ``"all"``: lmp, dst, crg) on a model and write ``OUT/<task>.json``.

    Args:
        task: ``"lmp"``, ``"dst"``, ``"crg"`` or ``"all"``.
        model: HF model folder, hub id, or a finished ``rbjax debias`` run folder (its ``model/``).
        out_dir: result folder (created).
        tokenizer: tokenizer folder or hub id (default: the model folder).
        overwrite: replace a task's result file that holds the result of other inputs (another model, data or
            settings); without it such a file is refused before the task computes anything
            (:func:`rbjax.core.reuse.claim_outputs` is the same rule for the other commands).
        dry_run: only the memory plans of each task's computations on its ``mesh``
            (:func:`rbjax.dialog.tasks.common.memory_plans`, from ``model``'s ``config.json``: no weights are read,
            nothing is written, ``out_dir`` may be ``None``, and the mesh may name more devices than this machine
            has): returns ``{task: [MemoryPlan, ...]}``. Without it every task checks its plans before it loads the
            weights (:class:`rbjax.model.memory.PlanError`).
        **settings: the fields of the tasks' settings classes (``None`` = the task's default). ``train_file`` is
            the task's own training file (``dst_train_file`` or ``crg_train_file``; with ``task="all"`` name them
            so).

    Returns:
        the result dict (as written, plus ``reused``: whether it came from the existing file), or ``{task: result}``
        for ``"all"``.
    Raises:
        rbjax.core.interrupt.Interrupted: SIGINT/SIGTERM: training stops after its update in flight (checkpoint
            saved), an evaluation (scoring, generation) after its batch in flight; the message says what is kept
            (the training, the tasks finished before) and to run the same command again.
        ValueError: unknown task or setting, bad values, bad data (named), an unwritable ``out_dir``; ``dst`` or
            ``all`` of a Self-Debias run folder (:data:`SELF_DEBIAS_DST`);
        FileNotFoundError: missing model/data; RuntimeError: downloads that fail;
        rbjax.core.reuse.OutputExists: see ``overwrite``.
    """
    if task not in (*TASKS, "all"):
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join((*TASKS, 'all'))}")
    settings = dict(settings)
    if settings.get("train_file") is not None:
        if task not in ("dst", "crg"):
            raise ValueError(f"train_file is the training file of the dst task (MultiWOZ train split) or the crg task "
                             f"(DSTC-7 TSV), not of {task!r}; with task='all' pass dst_train_file / crg_train_file")
        settings[f"{task}_train_file"] = settings["train_file"]
    settings.pop("train_file", None)
    known = set().union(*(get_task(t).settings.names() for t in TASKS))
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    tasks = TASKS if task == "all" else (task,)
    resolved = {t: get_task(t).settings.from_settings(settings) for t in tasks}  # validate everything before any work
    if out_dir is None and not dry_run:
        raise ValueError("out_dir is needed (only a dry run writes nothing)")
    m = model if isinstance(model, ModelHandle) else resolve_model(model, tokenizer)
    if m.self_debias is not None and "dst" in tasks:
        raise ValueError(SELF_DEBIAS_DST.format(name=m.name, task=task))
    if dry_run:  # the plans from config.json alone (of a hub id only that file is fetched)
        return {t: memory_plans(m, resolved[t], get_task(t).plans(resolved[t]), dry_run=True) for t in tasks}
    out = check_output_dir(Path(out_dir).expanduser(), "--out")
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for t in tasks:
        if len(tasks) > 1:
            log.info(f"task {t}")
        try:
            results[t] = get_task(t).run(m, out, resolved[t], overwrite=overwrite)
        except KeyboardInterrupt as e:  # (each task says what of it is kept; the tasks before it are finished)
            if not results:
                raise
            done = ", ".join(result_path(out, d).name for d in results)
            raise Interrupted(f"{str(e) or f'rbjax evaluate: interrupted during {t}.'} The results of the tasks "
                              f"finished before it are kept ({done} in {out}); the same command reuses them.",
                              signal_name=getattr(e, "signal_name", None)) from None
    return results if task == "all" else results[task]


# ------------------------------------------------------------------------------------------------ printing
def _f(v, fmt="{:.4f}") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def format_result(res: dict) -> str:
    """A short text table of one task's result."""
    t = res.get("task")
    m = res.get("metrics") or {}
    lines = []
    if t == "lmp":
        lines += [f"LMP (Reddit 6K, {m.get('n_scored_lines')} lines)",
                  f"  perplexity       {_f(m.get('perplexity'), '{:.3f}')}",
                  f"  reference grid   {_f(m.get('reference_grid'), '{:.3f}')}",
                  f"  reference CDA    {_f(m.get('reference_cda'), '{:.3f}')}"]
    elif t == "dst":
        c = res.get("counts", {})
        tn, fp, fn, tp = (x for row in m.get("confusion_matrix", [[0, 0], [0, 0]]) for x in row)
        tr = res.get("training") or {}
        stand = (res.get("data") or {}).get("stand_in_for")
        lines += [f"DST (MultiWOZ 2.0 test, {c.get('test', {}).get('n_examples')} pairs; trained on "
                  f"{c.get('train', {}).get('n_examples')} pairs of "
                  f"{'val, standing in for train' if stand else 'the train split'}, {tr.get('updates')} update(s))",
                  f"  accuracy         {_f(m.get('accuracy'))}",
                  f"  F1 (class 1)     {_f(m.get('f1'))}",
                  f"  macro-F1         {_f(m.get('f1_macro'))}",
                  f"  confusion        tn {tn}  fp {fp}  fn {fn}  tp {tp}"]
        j = m.get("joint_goal")
        if j:
            lines.append(f"  joint goal acc.  {_f(j.get('jga'))}  ({j.get('n_turns')} turns of {j.get('n_dialogues')}"
                         f" dialogues, {j['cost']['pairs_scored']} pairs in {j['cost']['seconds']:.1f} s)")
    elif t == "crg":

        g = res.get("generation") or {}
        lines += [f"CRG (DSTC-7, {g.get('n_generated')} responses, "
                  f"{'fine-tuned' if res.get('fine_tuned') else 'not fine-tuned'}, "
                  f"{'greedy' if (g.get('sampling') or {}).get('greedy') else g.get('semantics') + ' sampling'})",
                  format_crg_table(m)]
    for n in res.get("notes") or []:
        lines.append(f"  note: {n}")
    if res.get("reused"):
        lines.append("  (reused: same model, data and settings as before)")
    return "\n".join(lines)
