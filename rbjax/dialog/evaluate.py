"""Dialog quality of a (debiased) model, end to end: Reddit perplexity (LMP), dialog state tracking on MultiWOZ 2.0
(DST) and response generation on DSTC-7 (CRG) — paper §3.2, §5.3, Tables 4–5.

One entry point, :func:`evaluate` (``rbjax evaluate --task ...`` calls it; so does the study runner)::

    evaluate("all", "runs/hd_religion1", "results/dialog", data_dir="../shared/redditbias",
             multiwoz="../shared/dialog-data/multiwoz", max_steps=2)

writes ``OUT/<task>.json`` for each task (atomically) and returns the result (``{task: result}`` for ``all``).

**Model.** An HF model folder of any supported family, a hub id, or a finished ``rbjax debias`` run folder (its ``model/`` subfolder, the
exported debiased model, is evaluated). The tokenizer comes from the model folder unless ``tokenizer`` is given.

**Reuse.** Every result file carries a ``key``: the content digest of the model files
(:func:`rbjax.model.hf.model_files_key`), of the tokenizer files, of every data file read, and the settings
that shape the numbers. A rerun whose key equals the file's returns the file's content without recomputing (and
says so on stderr); a different key is refused (the difference named) unless ``overwrite`` — a result is
never relabelled. CRG also checks that ``crg_responses.jsonl`` is still the file its result was computed from.

**Tasks** (defaults from the paper and the reference code; ``docs/dialog.md`` has the details):

* ``lmp`` — :func:`rbjax.dialog.lmp.reddit_perplexity` on RedditBias ``text_files/humanref6k.txt`` (from
  ``data_dir``, ``$RBJAX_DATA_DIR`` or the verified download cache) or ``lmp_file``; 36-token lines.
* ``dst`` — the binary slot-value classifier (:mod:`rbjax.dialog.dst`): train the GPT-2 body + ``Linear(d→1)`` on
  the MultiWOZ 2.0 train split (``train_file``) or, by default, on the ``val`` split standing in for it (the train
  split is not in the default download; the result says so), with the shared trainer (batch 12, accumulation 4,
  1 epoch, lr 5e-5, block 128, seed 42); evaluate on the ``test`` split: accuracy, F1 (class 1), macro-F1, the
  confusion matrix and counts, optionally joint goal accuracy (``joint_goal``) with its cost.
* ``crg`` — DSTC-7: optionally fine-tune on a DSTC-7 TSV (``train_file``; the loss on the response only; batch 16,
  accumulation 5, 1 epoch, lr 5e-5, block 128), generate a response per test context
  (:func:`rbjax.dialog.generate.generate_responses`; top-k 50, 64 new tokens, or the reference's top-k 50 + top-p
  0.95, 128 tokens with the prompt) into ``OUT/crg_responses.jsonl`` (and the hypotheses, one per line, into
  ``OUT/crg_hypotheses.txt``), and score them with the DSTC-7 metrics (:func:`rbjax.dialog.crg_metrics.crg_metrics`;
  without reference files only the reference-free ones). Test contexts: ``test_file`` (DSTC-7 TSV), else the 1,472
  DSTC-7 test contexts of RedditBias ``data/dstc7/response_hyp.txt``.

Settings (keyword arguments; ``None`` means the task's default) are listed in :data:`DEFAULTS`. A setting applies to
every task that takes it (``seed``, ``max_steps``, ``max_examples``, ``batch_size`` ...); ``train_file`` is the task's
own training file (``dst_train_file`` / ``crg_train_file`` name them for ``task="all"``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from rbjax.core.errors import SettingError
from rbjax.core.io import atomic_write_json, atomic_write_text, check_output_dir, read_json, versions
from rbjax.core.keys import canonical, describe_difference, file_digest
from rbjax.core.log import say
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import KeyedResult
from rbjax.data.redditbias import RedditBiasData, manifest
from rbjax.dialog import crg, dst
from rbjax.dialog import multiwoz as mw
from rbjax.dialog.crg_metrics import METRIC_PACKAGES, crg_metrics, format_crg_table
from rbjax.dialog.generate import generate_responses
from rbjax.dialog.lmp import read_reference_lines, reddit_perplexity
from rbjax.model.generate import sampling_settings
from rbjax.model.handle import ModelHandle
from rbjax.train.batching import LAYOUTS, ArrayData
from rbjax.train.config import TrainerConfig
from rbjax.train.loop import Trainer

__all__ = ["TASKS", "DEFAULTS", "RESULT_FORMAT", "evaluate", "resolve_model", "EvalModel", "task_settings",
           "training_layout", "run_lmp", "run_dst", "run_crg", "format_result"]

#: tasks run by ``task="all"``, in this order
TASKS = ("lmp", "dst", "crg")
#: bumped when the result files change incompatibly (older files are then recomputed, not reused)
RESULT_FORMAT = 1

_COMMON = {"progress": True, "keep_checkpoints": False}
#: every setting of every task with its default (``None`` = resolved at run time, see each runner)
DEFAULTS: dict[str, dict[str, Any]] = {
    "lmp": {**_COMMON, "data_dir": None, "lmp_file": None, "lmp_max_lines": None, "lmp_block_size": 36,
            "eval_batch_size": 64},
    "dst": {**_COMMON, "multiwoz": None, "dst_train_file": None, "ontology": None, "mapping": None, "max_steps": None,
            "max_examples": None, "seed": 42, "semantics": "paper", "joint_goal": False, "jga_max_dialogues": None,
            "batch_size": 12, "grad_accum": 4, "epochs": 1, "learning_rate": 5e-5, "block_size": 128,
            "eval_batch_size": 64, "dropout": True, "layout": "packed"},
    "crg": {**_COMMON, "data_dir": None, "crg_train_file": None, "test_file": None, "refs": None, "max_steps": None,
            "max_examples": None, "seed": 42, "semantics": "paper", "batch_size": 16, "grad_accum": 5, "epochs": 1,
            "learning_rate": 5e-5, "block_size": 128, "gen_batch_size": 16, "greedy": False, "max_new_tokens": None,
            "clean": True, "meteor": True, "meteor_norm": True, "meteor_jar": None, "java": None, "dropout": True,
            "layout": "packed"},
}
#: settings that name files or folders: their *content* enters the key (as data digests), not the path
_PATH_SETTINGS = {"data_dir", "lmp_file", "multiwoz", "dst_train_file", "ontology", "mapping", "crg_train_file",
                  "test_file", "refs"}
#: the command-line option of each path setting (for error messages)
_OPTION = {"data_dir": "--data-dir", "lmp_file": "--lmp-file", "multiwoz": "--multiwoz", "dst_train_file": "--train-file",
           "ontology": "--ontology", "mapping": "--mapping", "crg_train_file": "--train-file",
           "test_file": "--test-file", "refs": "--refs"}
#: settings that do not change a result
_NO_KEY = {"progress", "keep_checkpoints", "overwrite"}
SEMANTICS = ("paper", "reference")


def _say(msg: str) -> None:
    say("evaluate", msg)


def _jsonable(obj):
    return canonical(obj)


# ------------------------------------------------------------------------------------------------ settings
def task_settings(task: str, settings: dict) -> dict:
    """The complete settings of one task: its :data:`DEFAULTS` updated by the given values that are not ``None``
    (keys the task does not take are ignored here; :func:`evaluate` rejects keys no task takes).

    Raises:
        rbjax.core.errors.SettingError: a value out of range (names the setting; the CLI shows its flag).
    """
    s = dict(DEFAULTS[task])
    for k, v in settings.items():
        if k in s and v is not None:
            s[k] = v
    if "semantics" in s and s["semantics"] not in SEMANTICS:
        raise SettingError("semantics", f"must be one of {SEMANTICS}, got {s['semantics']!r}")
    if "layout" in s and s["layout"] not in LAYOUTS:
        raise SettingError("layout", f"must be one of {', '.join(LAYOUTS)}, got {s['layout']!r}")
    for k in ("max_steps", "max_examples", "lmp_max_lines", "jga_max_dialogues", "max_new_tokens"):
        if k in s and s[k] is not None and (not isinstance(s[k], int) or isinstance(s[k], bool) or s[k] < 1):
            raise SettingError(k, f"must be a positive integer, got {s[k]!r}")
    for k in ("batch_size", "grad_accum", "epochs", "block_size", "lmp_block_size", "eval_batch_size",
              "gen_batch_size"):
        if k in s and (not isinstance(s[k], int) or isinstance(s[k], bool) or s[k] < 1):
            raise SettingError(k, f"must be a positive integer, got {s[k]!r}")
    if "learning_rate" in s and not s["learning_rate"] > 0:
        raise SettingError("learning_rate", f"must be > 0, got {s['learning_rate']!r}")
    if s.get("refs") is not None:
        s["refs"] = [str(p) for p in ([s["refs"]] if isinstance(s["refs"], (str, os.PathLike)) else s["refs"])]
    for k in _PATH_SETTINGS - {"refs"}:
        if s.get(k) is not None:
            s[k] = str(s[k])
    for k in sorted(_PATH_SETTINGS):  # a path that was given must exist: never fall back to a download silently
        for v in ([] if s.get(k) is None else (s[k] if k == "refs" else [s[k]])):
            if not Path(v).expanduser().exists():
                raise FileNotFoundError(f"{_OPTION.get(k, k)} {v}: not found")
    return s


def _key_settings(s: dict) -> dict:
    return {k: v for k, v in s.items() if k not in _NO_KEY and k not in _PATH_SETTINGS}


# ------------------------------------------------------------------------------------------------ model
#: the model under evaluation: :class:`rbjax.model.handle.ModelHandle` (its location, content digests, and weights
#: loaded once on demand)
EvalModel = ModelHandle


def resolve_model(model: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> ModelHandle:
    """Where the model to evaluate is: an HF folder, a hub id (downloaded into the HF cache), or a finished
    ``rbjax debias`` run folder (then its ``model/`` subfolder) — :meth:`rbjax.model.handle.ModelHandle.open`.

    Raises:
        FileNotFoundError: no such folder (and not a hub id).
        ValueError: a run folder without an exported model (unfinished run, or made with ``--no-export``), or one
            whose ``results.json`` says it did not finish.
        RuntimeError: a hub id that cannot be downloaded.
    """
    return ModelHandle.open(model, tokenizer)


# ------------------------------------------------------------------------------------------------ results
def _result_path(out_dir: Path, task: str) -> Path:
    return out_dir / f"{task}.json"


def _existing(path: Path, key: dict, task: str, s: dict, check=None) -> dict | None:
    """The existing result at ``path`` when its key equals ``key`` (and ``check(prev)`` passes), else ``None``
    (and the reason for recomputing is printed): :class:`rbjax.core.reuse.KeyedResult`.

    Raises:
        rbjax.core.reuse.OutputExists: ``path`` holds the result of other inputs (or its outputs were changed) and
            ``s["overwrite"]`` is not set: it is never replaced silently (nothing was computed).
    """
    return KeyedResult(path, key, task, _say, check, refuse_other=not s.get("overwrite")).stored()


def _key(task: str, model: EvalModel, data: dict, s: dict) -> dict:
    return _jsonable({"task": task, "format": RESULT_FORMAT, "model": model.digest,
                      "tokenizer": model.tokenizer_digest, "data": data, "settings": _key_settings(s)})


def _finish(task: str, out_dir: Path, key: dict, model: EvalModel, s: dict, body: dict, t0: float) -> dict:
    v = body.pop("versions", None) or versions()
    res = {"task": task, "format": RESULT_FORMAT, "model": model.describe(), **body, "settings": _jsonable(s),
           "versions": v}
    res.setdefault("timings", {})["total_s"] = time.perf_counter() - t0
    return KeyedResult(_result_path(out_dir, task), key, task).save(res)


def _file_record(path: Path) -> dict:

    return {"path": str(Path(path).resolve()), "sha256": file_digest(path)}


# ------------------------------------------------------------------------------------------------ training
def training_layout(method: str, s: dict) -> str:
    """The token layout a fine-tuning task trains in: the ``layout`` setting, except ``padded`` for DST in
    reference semantics, whose pooling (the batch's longest row's last column, padding attended:
    ``lm_dst_binary.py``) depends on the padding."""
    return "padded" if (method == "dst" and s["semantics"] == "reference") else s["layout"]


def _train(method: str, objective, model: EvalModel, out_dir: Path, s: dict, params, data, *, what: str):
    """Fine-tune with the shared trainer in ``OUT/<method>_train`` (checkpoints, resume, Ctrl-C saves).

    A training folder left by other inputs (its ``key.json`` differs) is cleared first. Unless ``keep_checkpoints``,
    the checkpoints are deleted after the task's result is written (``metrics.jsonl`` stays).

    Returns:
        ``(params, record, train_dir)``.
    """

    config, _, tok = model.load()
    train_dir = out_dir / f"{method}_train"
    cfg = TrainerConfig(model=str(model.folder), out_dir=str(train_dir), seed=s["seed"], epochs=s["epochs"],
                        batch_size=s["batch_size"], grad_accum=s["grad_accum"], learning_rate=s["learning_rate"],
                        block_size=s["block_size"], max_steps=s["max_steps"], dropout=s["dropout"],
                        layout=training_layout(method, s), progress=s["progress"], keep_checkpoints=1,
                        leftover="carry" if s["semantics"] == "reference" else "drop")
    try:
        trainer = Trainer(cfg, objective, model_config=config, params=params, model_key=model.digest, tokenizer=tok,
                          data=data)
    except ValueError as e:
        if "fewer than grad_accum" in str(e):
            raise ValueError(f"{what}: {data.n_examples} training examples make {-(-data.n_examples // cfg.batch_size)}"
                             f" micro-batch(es) of {cfg.batch_size}, fewer than grad_accum={cfg.grad_accum}: no update "
                             "would happen; raise --max-examples or lower --batch-size / --grad-accum") from None
        raise
    tkey = _jsonable(trainer.key())
    kpath = train_dir / "key.json"
    if train_dir.exists():
        old = read_json(kpath)
        if old != tkey:
            if (train_dir / "checkpoints").exists():
                _say(f"{train_dir}: training state of other inputs "
                     f"({describe_difference(old or {}, tkey) if old else 'no key.json'}); starting afresh")
            shutil.rmtree(train_dir)
    atomic_write_json(kpath, tkey)
    t0 = time.perf_counter()
    res = trainer.run()
    summary = {k: v for k, v in res.summary.items() if k != "last"}
    record = {"updates": res.updates_done, "t_total": res.t_total, "resumed_from": res.resumed_from,
              "n_examples": data.n_examples, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum,
              "epochs": cfg.epochs, "learning_rate": cfg.learning_rate, "max_steps": cfg.max_steps,
              "final_loss": (res.summary.get("last") or {}).get("total"), "last": res.summary.get("last"),
              "seconds": time.perf_counter() - t0, "folder": str(train_dir),
              "data_sha256": data.info.get("sha256_arrays"), **summary}
    return res.params, record, train_dir


def _drop_checkpoints(train_dir: Path | None, s: dict) -> None:
    if train_dir is not None and not s["keep_checkpoints"] and (train_dir / "checkpoints").exists():
        shutil.rmtree(train_dir / "checkpoints")


# ------------------------------------------------------------------------------------------------ LMP
def run_lmp(model: EvalModel, out_dir: str | os.PathLike, s: dict) -> dict:
    """Reddit-6K perplexity (paper §3.2; :mod:`rbjax.dialog.lmp`) → ``OUT/lmp.json``.

    ``s``: :func:`task_settings` of ``lmp`` (``lmp_file``/``data_dir``, ``lmp_max_lines``, ``lmp_block_size``,
    ``eval_batch_size``, ``progress``). Metrics: ``perplexity`` (corpus level), ``reference_grid``,
    ``reference_cda``, ``mean_nll`` and counts.
    """

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    path = Path(s["lmp_file"]) if s["lmp_file"] else RedditBiasData(s["data_dir"]).reddit_reference_file()
    if not path.is_file():
        raise FileNotFoundError(f"LMP reference file {path}: no such file")
    rec = _file_record(path)
    official = rec["sha256"] == manifest()["files"]["text_files/humanref6k.txt"]["sha256"]
    key = _key("lmp", model, {"lmp_file": rec["sha256"]}, s)
    prev = _existing(_result_path(out_dir, "lmp"), key, "lmp", s)
    if prev is not None:
        return prev
    t1 = time.perf_counter()
    config, params, tok = model.load()
    t_model = time.perf_counter() - t1
    lines = read_reference_lines(path, s["lmp_max_lines"])
    t1 = time.perf_counter()
    with progress_bar(len(lines), "LMP (Reddit 6K)", "line", enabled=s["progress"]) as bar:
        m = reddit_perplexity(params, config, tok, lines, block_size=s["lmp_block_size"],
                              batch_size=s["eval_batch_size"], progress=bar.update, bos_id=model.bos_id())
    t_eval = time.perf_counter() - t1
    data = {"lmp_file": {**rec, "n_lines_scored": len(lines), "official": official,
                         "what": "RedditBias text_files/humanref6k.txt (DialoGPT's human.ref.6k.txt)" if official
                         else "a reference file given by the user"}}
    notes = []
    if s["lmp_max_lines"]:
        notes.append(f"only the first {s['lmp_max_lines']} lines were scored: not the paper's LMP")
    return _finish("lmp", out_dir, key, model, s, {"metrics": m, "data": data, "notes": notes,
                                                     "timings": {"load_model_s": t_model, "eval_s": t_eval}}, t0)


# ------------------------------------------------------------------------------------------------ DST
def _search(folder: Path, name: str) -> Path | None:
    hits = sorted((q for q in folder.rglob(name) if "__MACOSX" not in q.parts), key=lambda q: (len(q.parts), q))
    return hits[0] if hits else None


def _dst_support_files(s: dict) -> tuple[Path, Path]:
    """``(mapping.pair, ontology file)``: given, else found in the MultiWOZ source (folder, or the official zip for
    the ontology), else the pinned, verified downloads."""
    import zipfile


    src = s["multiwoz"] or os.environ.get(mw.ENV_SOURCE)
    src = Path(src).expanduser() if src else None
    if src is not None and not src.exists():
        raise FileNotFoundError(f"{'--multiwoz ' if s['multiwoz'] else mw.ENV_SOURCE + '='}{src}: not found")

    def pinned(name: str, flag: str) -> Path:
        try:
            return mw.default_file(name)
        except RuntimeError as e:
            if src is None:
                raise
            raise RuntimeError(f"{src}: no {name} in this MultiWOZ source, and the pinned copy cannot be fetched "
                               f"({str(e).splitlines()[0]}); pass {flag} FILE") from None

    mapping = Path(s["mapping"]) if s["mapping"] else None
    if mapping is None and src is not None and src.is_dir():
        mapping = _search(src, "mapping.pair")
    mapping = mapping or pinned("mapping.pair", "--mapping")
    onto = Path(s["ontology"]).expanduser() if s["ontology"] else None
    if onto is not None and onto.is_dir():
        hit = _search(onto, "ontology.json")
        if hit is None:
            raise FileNotFoundError(f"{onto}: no ontology.json in this folder")
        onto = hit
    if onto is None and src is not None:
        if src.is_dir():
            onto = _search(src, "ontology.json")
        elif zipfile.is_zipfile(src):
            with zipfile.ZipFile(src) as z:
                if any(Path(n).name == "ontology.json" for n in z.namelist()):
                    onto = src
    onto = onto or pinned("ontology.json", "--ontology")
    for p, what in ((mapping, "mapping.pair"), (onto, "ontology")):
        if not p.exists():
            raise FileNotFoundError(f"{p}: {what} not found")
    return mapping, onto


def _trim_columns(arrays: dict, multiple: int = 8) -> dict:
    """Drop the trailing columns no row uses (rounded up to ``multiple``): no logit changes (causal attention, the
    pooled token is a real one), and the training step runs on fewer positions."""
    import numpy as np

    m = arrays["attention_mask"]
    used = int(np.max(np.where(m > 0, np.arange(m.shape[1]), -1))) + 1 if m.size else 1
    w = min(m.shape[1], max(multiple, -(-used // multiple) * multiple))
    return {k: (v[:, :w] if getattr(v, "ndim", 0) == 2 else v) for k, v in arrays.items()}


def run_dst(model: EvalModel, out_dir: str | os.PathLike, s: dict) -> dict:
    """Dialog state tracking on MultiWOZ 2.0 (paper §3.2, Table 4; reference-debias.md §10) → ``OUT/dst.json``.

    Trains the classifier (GPT-2 body + ``Linear(d→1)`` on the last real token, BCE) on the train split or its
    ``val`` stand-in with the shared trainer, then scores the sampled binary pairs of the ``test`` split.

    ``s``: :func:`task_settings` of ``dst``. Metrics: ``accuracy``, ``f1`` (class 1), ``f1_macro``, ``precision``,
    ``recall``, ``confusion_matrix`` ``[[tn, fp], [fn, tp]]``, ``n``, ``n_positive``; with ``joint_goal`` also
    ``joint_goal`` (JGA, turns, pairs scored, seconds). ``counts``: examples before and after ``max_examples``.
    ``data``: each split's files with sha256, whether it is the official split or a stand-in.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing/bad data (named), too few examples for one update.
    """
    import numpy as np


    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    reference = s["semantics"] == "reference"
    # the data first: a --multiwoz folder without the splits is refused by name (not by a failed download of
    # the support files it lacks too); the key from the files' content, before they are parsed (a reused result
    # costs no loading)
    test_files = mw.split_files(s["multiwoz"], "test")
    train_files = (mw.split_files(s["dst_train_file"], "train") if s["dst_train_file"]
                   else mw.split_files(s["multiwoz"], "val"))
    mapping, onto_path = _dst_support_files(s)
    digests = lambda files: [_file_record(p)["sha256"] for p in files]  # noqa: E731
    data_key = {"train": digests(train_files), "test": digests(test_files),
                "ontology": _file_record(onto_path)["sha256"], "mapping": _file_record(mapping)["sha256"]}
    key = _key("dst", model, data_key, s)
    prev = _existing(_result_path(out_dir, "dst"), key, "dst", s)
    if prev is not None:
        return prev
    test = mw.load_multiwoz(s["multiwoz"], "test", mapping=mapping)
    train = mw.load_training_split(s["dst_train_file"], source=s["multiwoz"], mapping=mapping)
    onto = mw.SlotOntology(mw.load_ontology(onto_path), mw.Normalizer(mw.load_mapping_pairs(mapping)))
    t_data = time.perf_counter() - t0

    # examples: the paper draws each split's negatives from its own seeded stream; the reference from one stream,
    # train first
    if reference:
        rng = random.Random(s["seed"])
        train_ex = dst.build_examples(train.dialogues, onto, semantics="reference", rng=rng)
        test_ex = dst.build_examples(test.dialogues, onto, semantics="reference", rng=rng)
    else:
        train_ex = dst.build_examples(train.dialogues, onto, semantics="paper", seed=s["seed"])
        test_ex = dst.build_examples(test.dialogues, onto, semantics="paper", seed=s["seed"])
    counts = {"train_all": dst.example_counts(train_ex), "test_all": dst.example_counts(test_ex)}
    if s["max_examples"]:
        train_ex, test_ex = train_ex[:s["max_examples"]], test_ex[:s["max_examples"]]
    counts.update(train=dst.example_counts(train_ex), test=dst.example_counts(test_ex))
    if not train_ex or not test_ex:
        raise ValueError(f"no DST examples (train {len(train_ex)}, test {len(test_ex)}): no turn with a turn_label")
    t1 = time.perf_counter()
    config, params, tok = model.load()
    t_model = time.perf_counter() - t1
    if s["block_size"] > config.max_positions:
        raise ValueError(f"block_size {s['block_size']} exceeds the model's maximum positions {config.max_positions}")
    trunc = "reference" if reference else "left"
    train_arr = dst.encode_examples(train_ex, tok, block_size=s["block_size"], truncation=trunc)
    test_arr = dst.encode_examples(test_ex, tok, block_size=s["block_size"], truncation=trunc)
    counts["train_truncated"] = int((train_arr["lengths"] > s["block_size"]).sum())
    counts["test_truncated"] = int((test_arr["lengths"] > s["block_size"]).sum())
    tr = _trim_columns({k: train_arr[k] for k in ("input_ids", "attention_mask", "labels")})
    data = ArrayData(tr, pad_id=tok.eos_id, info={"task": "dst", "split": train.split,
                                                  "stand_in_for": train.stand_in_for,
                                                  "n_examples": len(train_ex), "semantics": s["semantics"]})
    start = {"gpt2": params, "head": dst.init_head(config, s["seed"])}
    trained, training, train_dir = _train("dst", dst.DSTObjective(pooling="reference" if s["semantics"] == "reference" else "last"),
                                            model, out_dir, s, start, data, what="DST")

    t1 = time.perf_counter()
    pooling = "reference" if reference else "last"
    probs = dst.predict_proba(trained["gpt2"], trained["head"], test_arr, config, batch_size=s["eval_batch_size"],
                              pooling=pooling, progress=s["progress"], desc="DST test pairs")
    metrics = dst.binary_metrics(probs, test_arr["labels"])
    t_eval = time.perf_counter() - t1
    metrics["mean_prob_positive"] = float(np.mean(probs[test_arr["labels"] > 0.5])) if metrics["n_positive"] else None
    timings = {"load_data_s": t_data, "load_model_s": t_model, "train_s": training["seconds"], "eval_s": t_eval}
    if s["joint_goal"]:
        dials = test.dialogues[:s["jga_max_dialogues"]] if s["jga_max_dialogues"] else test.dialogues
        t1 = time.perf_counter()
        jr = dst.score_joint_goal(trained["gpt2"], trained["head"], config, tok, dials, onto,
                                  batch_size=s["eval_batch_size"], block_size=s["block_size"], truncation=trunc,
                                  pooling=pooling, progress=s["progress"])
        secs = time.perf_counter() - t1
        metrics["joint_goal"] = {
            "jga": jr["jga"], "n_turns": jr["n_turns"], "n_correct": jr["n_correct"],
            "oracle_jga": jr["oracle_jga"], "n_dialogues": len(dials), "dialogues_of_split": len(test.dialogues),
            "cost": {"pairs_scored": jr["n_pairs"], "seconds": secs,
                     "pairs_per_s": jr["n_pairs"] / secs if secs > 0 else None,
                     "binary_pairs": metrics["n"], "full_split": dst.jga_cost(test.dialogues, onto)},
            "per_dialogue": jr["per_dialogue"]}
        timings["joint_goal_s"] = secs
    notes = []
    if train.stand_in_for:
        notes.append(f"trained on the MultiWOZ 2.0 {train.split} split standing in for the {train.stand_in_for} "
                     "split (not in the default download); pass --train-file with the real train split for the "
                     "paper's setting")
    if s["max_examples"]:
        notes.append(f"--max-examples {s['max_examples']}: only the first {s['max_examples']} train and test "
                     "examples were used")
    if s["max_steps"]:
        notes.append(f"--max-steps {s['max_steps']}: training stopped after {s['max_steps']} update(s), not one epoch")
    data_rec = {"train": {**train.describe(), "official": train.stand_in_for is None},
                "test": {**test.describe(), "official": True,
                         "note": "the MultiWOZ 2.0 test split" + (" (ConvLab's re-tokenised copy: transcripts differ "
                                                                  "a little from the official text, belief states "
                                                                  "do not)" if test.layout == "convlab" else "")},
                "ontology": _file_record(onto_path), "mapping": _file_record(mapping),
                "stand_in_for": train.stand_in_for}
    res = _finish("dst", out_dir, key, model, s, {"metrics": metrics, "counts": counts, "training": training,
                                                   "data": data_rec, "notes": notes, "timings": timings}, t0)
    _drop_checkpoints(train_dir, s)
    return res


# ------------------------------------------------------------------------------------------------ CRG
def run_crg(model: EvalModel, out_dir: str | os.PathLike, s: dict) -> dict:
    """Response generation on DSTC-7 (paper §3.2, Table 5; reference-debias.md §11) → ``OUT/crg.json``,
    ``OUT/crg_responses.jsonl`` (``{key, context, response}``) and ``OUT/crg_hypotheses.txt`` (one per line).

    ``s``: :func:`task_settings` of ``crg``. Fine-tunes first when ``crg_train_file`` is given (else the model is
    used as it is: ``fine_tuned: false``). Metrics: :func:`rbjax.dialog.crg_metrics.crg_metrics`'s keys
    (``bleu``, ``nist``, ``meteor``, ``entropy``, ``dist``, ``avg_len``, ``null_reasons`` ...) and ``headline``
    (BLEU-4, NIST-2, METEOR, entropy-4, dist-2, avg_len, the paper's columns).

    Raises:
        FileNotFoundError, ValueError: missing or malformed files (named with the line), misaligned references.
    """

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    notes = []
    if s["test_file"]:
        rows = crg.read_dstc7_tsv(s["test_file"], what="--test-file")
        examples = [(r.hash, r.context) for r in rows]
        test_rec = {**_file_record(Path(s["test_file"])), "what": "DSTC-7 TSV given by the user", "n_rows": len(rows),
                    "official": None, "stand_in_for": None}
    else:
        path = RedditBiasData(s["data_dir"]).path(crg.RESPONSE_HYP)
        examples = crg.read_response_hyp(path)
        test_rec = {**_file_record(path), "what": "RedditBias data/dstc7/response_hyp.txt: the DSTC-7 test contexts "
                    "released with RedditBias", "n_rows": len(examples), "official": False,
                    "stand_in_for": "DSTC-7 test set (2,208 scored keys; its text is not distributed)"}
        notes.append(f"test contexts: the {len(examples)} DSTC-7 test contexts of RedditBias's response_hyp.txt "
                     "(the official test text is not distributed; pass --test-file for your own)")
    n_total = len(examples)
    refs = crg.read_reference_sets(s["refs"], n_total) if s["refs"] else None
    if s["max_examples"]:
        examples = examples[:s["max_examples"]]
        refs = None if refs is None else [r[:s["max_examples"]] for r in refs]
        notes.append(f"--max-examples {s['max_examples']}: only the first {len(examples)} of {n_total} test contexts")
    train_rows = (crg.read_dstc7_tsv(s["crg_train_file"], need_response=True, what="--train-file")
                  if s["crg_train_file"] else None)
    data_key = {"test": test_rec["sha256"], "train": None if train_rows is None else file_digest(s["crg_train_file"]),
                "refs": [file_digest(p) for p in (s["refs"] or [])]}
    key = _key("crg", model, data_key, s)
    resp_path, hyp_path = out_dir / "crg_responses.jsonl", out_dir / "crg_hypotheses.txt"

    def outputs_intact(prev):
        for p, k in ((resp_path, "responses"), (hyp_path, "hypotheses")):
            want = (prev.get("outputs") or {}).get(k, {}).get("sha256")
            if not p.exists() or file_digest(p) != want:
                return f"{p.name} is missing or was changed since the result was computed"
        return None

    prev = _existing(_result_path(out_dir, "crg"), key, "crg", s, check=outputs_intact)
    if prev is not None:
        return prev
    t_data = time.perf_counter() - t0
    t1 = time.perf_counter()
    config, params, tok = model.load()
    t_model = time.perf_counter() - t1
    timings = {"load_data_s": t_data, "load_model_s": t_model}
    training, train_dir = None, None
    if train_rows is not None:
        if s["block_size"] > config.max_positions:
            raise ValueError(f"block_size {s['block_size']} exceeds the model's maximum positions {config.max_positions}")
        arrays, stats = crg.build_crg_arrays(train_rows, tok, block_size=s["block_size"])
        data = ArrayData(arrays, pad_id=tok.eos_id, info={"task": "crg", **stats})
        params, training, train_dir = _train("crg", crg.CRGObjective(), model, out_dir, s, params, data,
                                                 what="CRG")
        training["examples"] = stats
        timings["train_s"] = training["seconds"]
    else:
        notes.append("no --train-file: responses generated by the model as it is (not fine-tuned on DSTC-7)")
    gen_sem = "reference" if s["semantics"] == "reference" else "rbjax"
    over = {}
    if s["greedy"]:
        over["greedy"] = True
    if s["max_new_tokens"]:
        over["max_new_tokens"] = s["max_new_tokens"]
    sampling = sampling_settings(gen_sem, **over)
    t1 = time.perf_counter()
    records = generate_responses(params, config, tok, examples, resp_path, semantics=gen_sem, seed=s["seed"],
                                 settings=sampling, batch_size=s["gen_batch_size"], progress=s["progress"])
    timings["generate_s"] = time.perf_counter() - t1
    hyps = [" ".join(r["response"].split()) for r in records]
    atomic_write_text(hyp_path, "".join(h + "\n" for h in hyps))
    gen = {"semantics": gen_sem, "sampling": dataclasses.asdict(sampling), "seed": s["seed"],
           "n_generated": len(records), "n_empty": sum(1 for h in hyps if not h),
           "n_multiline": sum(1 for r in records if "\n" in r["response"] or "\r" in r["response"]),
           "mean_response_chars": float(sum(len(r["response"]) for r in records) / max(len(records), 1))}
    t1 = time.perf_counter()
    m = crg_metrics(hyps, refs, clean=s["clean"], compute_meteor=s["meteor"], meteor_norm=s["meteor_norm"],
                    meteor_jar=s["meteor_jar"], java=s["java"])
    timings["metrics_s"] = time.perf_counter() - t1
    pick = (lambda xs, i: None if xs is None else xs[i])
    m["headline"] = {"bleu4": pick(m["bleu"], 3), "nist2": pick(m["nist"], 1), "meteor": m["meteor"],
                     "entropy4": pick(m["entropy"], 3), "dist2": pick(m["dist"], 1), "avg_len": m["avg_len"]}

    v = versions(extra=METRIC_PACKAGES)
    v["java"] = (m.get("meteor_info") or {}).get("java_version")
    data_rec = {"test": test_rec, "n_test_examples": len(examples),
                "train": None if train_rows is None else {**_file_record(Path(s["crg_train_file"])),
                                                          "n_rows": len(train_rows)},
                "refs": [{**_file_record(Path(p)), "n_lines": n_total} for p in (s["refs"] or [])]}
    outputs = {"responses": _file_record(resp_path), "hypotheses": _file_record(hyp_path)}
    res = _finish("crg", out_dir, key, model, s, {
        "metrics": m, "fine_tuned": train_rows is not None, "training": training, "generation": gen,
        "outputs": outputs, "data": data_rec, "notes": notes, "timings": timings, "versions": v}, t0)
    _drop_checkpoints(train_dir, s)
    return res


# ------------------------------------------------------------------------------------------------ entry point
_RUNNERS = {"lmp": run_lmp, "dst": run_dst, "crg": run_crg}


def evaluate(task: str, model: str | os.PathLike, out_dir: str | os.PathLike, *,
             tokenizer: str | os.PathLike | None = None, overwrite: bool = False, **settings) -> dict:
    """Run one dialog-quality task (or ``"all"``: lmp, dst, crg) on a model and write ``OUT/<task>.json``.

    Args:
        task: ``"lmp"``, ``"dst"``, ``"crg"`` or ``"all"``.
        model: HF model folder, hub id, or a finished ``rbjax debias`` run folder (its ``model/``).
        out_dir: result folder (created).
        tokenizer: tokenizer folder or hub id (default: the model folder).
        overwrite: replace a task's result file that holds the result of other inputs (another model, data or
            settings); without it such a file is refused before the task computes anything
            (:func:`rbjax.core.reuse.claim_outputs` is the same rule for the other commands).
        **settings: see :data:`DEFAULTS` (``None`` = the task's default). ``train_file`` is the task's own training
            file (``dst_train_file`` or ``crg_train_file``; with ``task="all"`` name them so).

    Returns:
        the result dict (as written, plus ``reused``: whether it came from the existing file), or ``{task: result}``
        for ``"all"``.
    Raises:
        ValueError: unknown task or setting, bad values, bad data (named), an unwritable ``out_dir``;
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
    known = set().union(*DEFAULTS.values())
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    tasks = TASKS if task == "all" else (task,)
    resolved = {t: {**task_settings(t, settings), "overwrite": overwrite}
                for t in tasks}  # validate everything before any work
    out = check_output_dir(Path(out_dir).expanduser(), "--out")
    out.mkdir(parents=True, exist_ok=True)
    m = resolve_model(model, tokenizer)
    results = {}
    for t in tasks:
        if len(tasks) > 1:
            _say(f"task {t}")
        results[t] = _RUNNERS[t](m, out, resolved[t])
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
