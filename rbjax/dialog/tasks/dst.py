"""``dst``: dialog state tracking on MultiWOZ 2.0 (paper §3.2, Table 4; docs/dialog.md "DST") → ``OUT/dst.json``.

Trains the binary slot-value classifier (:mod:`rbjax.dialog.state_tracking`: GPT-2 body + ``Linear(d→1)``) with the shared
trainer on the MultiWOZ 2.0 train split (``dst_train_file``) or, by default, on the ``val`` split standing in for it
(the result says so), then scores the sampled binary pairs of the ``test`` split; optionally joint goal accuracy.
"""
from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path

from rbjax.core.config import field
from rbjax.dialog import multiwoz as mw
from rbjax.dialog import state_tracking
from rbjax.dialog.tasks.common import (EvalModel, Task, TrainingSettings, check_memory, drop_checkpoints,
    eval_batch_size_field, evaluation_phase, existing_result, file_record, fine_tune, finish, result_key, result_path, task_mesh,
    trainer_section)
from rbjax.train.batching import ArrayData
from rbjax.train.config import TrainerConfig

__all__ = ["TASK", "DSTSettings", "memory_plans", "run_dst"]


@dataclasses.dataclass(frozen=True)
class DSTSettings(TrainingSettings):
    """The settings of ``dst`` (see :class:`rbjax.dialog.tasks.common.TrainingSettings`); the trainer's defaults are
    the reference's (batch 12, accumulation 4, 1 epoch, lr 5e-5, block 128, seed 42)."""

    multiwoz: str | None = field(None, "MultiWOZ 2.0: a folder or zip in the official, ConvLab or TRADE layout "
                                       "(mapping.pair and ontology.json are taken from it when present; default: "
                                       "$RBJAX_MULTIWOZ, else ConvLab's val and test splits downloaded and verified)",
                                 metavar="PATH")
    dst_train_file: str | None = field(None, "the MultiWOZ 2.0 train split (official MultiWOZ_2.0.zip, ConvLab "
                                             "train.json.zip or TRADE train_dials.json; default: the val split stands "
                                             "in)", metavar="PATH")
    ontology: str | None = field(None, "MultiWOZ 2.0 ontology.json (default: from --multiwoz, else the pinned "
                                       "download)", metavar="FILE")
    mapping: str | None = field(None, "TRADE's mapping.pair (default: from --multiwoz, else the pinned download)",
                                metavar="FILE")
    joint_goal: bool = field(False, "also joint goal accuracy: every candidate value of every slot at every turn "
                                    "(about 300 times the pairs of the binary metrics); the cost is reported")
    jga_max_dialogues: int | None = field(None, "joint goal accuracy on the first N test dialogues only", metavar="N")
    eval_batch_size: int = eval_batch_size_field()

    trainer: TrainerConfig = trainer_section(batch_size=12, grad_accum=4)

    path_fields = ("multiwoz", "dst_train_file", "ontology", "mapping")
    chat_refusal = ("DST's classifier reads a dialog history and a slot-value pair as bare text (the reference's "
                    "input); a chat-format DST is not implemented")
    path_options = (("dst_train_file", "--train-file"),)


# ------------------------------------------------------------------------------------------------ data
def _search(folder: Path, name: str) -> Path | None:
    hits = sorted((q for q in folder.rglob(name) if "__MACOSX" not in q.parts), key=lambda q: (len(q.parts), q))
    return hits[0] if hits else None


def _dst_support_files(s: DSTSettings) -> tuple[Path, Path]:
    """``(mapping.pair, ontology file)``: given, else found in the MultiWOZ source (folder, or the official zip for
    the ontology), else the pinned, verified downloads."""
    import zipfile


    src = s.multiwoz or os.environ.get(mw.ENV_SOURCE)
    src = Path(src).expanduser() if src else None
    if src is not None and not src.exists():
        raise FileNotFoundError(f"{'--multiwoz ' if s.multiwoz else mw.ENV_SOURCE + '='}{src}: not found")

    def pinned(name: str, flag: str) -> Path:
        try:
            return mw.default_file(name)
        except RuntimeError as e:
            if src is None:
                raise
            raise RuntimeError(f"{src}: no {name} in this MultiWOZ source, and the pinned copy cannot be fetched "
                               f"({str(e).splitlines()[0]}); pass {flag} FILE") from None

    mapping = Path(s.mapping) if s.mapping else None
    if mapping is None and src is not None and src.is_dir():
        mapping = _search(src, "mapping.pair")
    mapping = mapping or pinned("mapping.pair", "--mapping")
    onto = Path(s.ontology).expanduser() if s.ontology else None
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


def trim_columns(arrays: dict, multiple: int = 8) -> dict:
    """Drop the trailing columns no row uses (rounded up to ``multiple``): no logit changes (causal attention, the
    pooled token is a real one), and the training step runs on fewer positions."""
    import numpy as np

    m = arrays["attention_mask"]
    used = int(np.max(np.where(m > 0, np.arange(m.shape[1]), -1))) + 1 if m.size else 1
    w = min(m.shape[1], max(multiple, -(-used // multiple) * multiple))
    return {k: (v[:, :w] if getattr(v, "ndim", 0) == 2 else v) for k, v in arrays.items()}


# ------------------------------------------------------------------------------------------------ the task
def memory_plans(s: DSTSettings) -> list[dict]:
    """The memory plan's computations: fine-tuning (micro-batch ``batch_size`` × ``block_size``), then scoring the
    test pairs in batches of ``eval_batch_size``."""
    return [s.training_plan(),
            {"training": False, "batch_size": s.eval_batch_size, "seq_len": s.trainer.block_size,
             "flags": {"batch_size": "--eval-batch-size", "param_dtype": None}}]


def run_dst(model: EvalModel, out_dir: str | os.PathLike, s: DSTSettings, *, overwrite: bool = False) -> dict:
    """Dialog state tracking on MultiWOZ 2.0 (paper §3.2, Table 4; docs/dialog.md "DST") → ``OUT/dst.json``.

    Trains the classifier (GPT-2 body + ``Linear(d→1)`` on the last real token, BCE) on the train split or its
    ``val`` stand-in with the shared trainer, then scores the sampled binary pairs of the ``test`` split.

    ``s``: the task's settings; ``overwrite``: replace a result of other inputs (else refused:
    :class:`rbjax.core.reuse.OutputExists`). Metrics: ``accuracy``, ``f1`` (class 1), ``f1_macro``, ``precision``,
    ``recall``, ``confusion_matrix`` ``[[tn, fp], [fn, tp]]``, ``n``, ``n_positive``; with ``joint_goal`` also
    ``joint_goal`` (JGA, turns, pairs scored, seconds). ``counts``: examples before and after ``max_examples``.
    ``data``: each split's files with sha256, whether it is the official split or a stand-in.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing/bad data (named), too few examples for one update.
    """
    import numpy as np


    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    reference = s.semantics == "reference"
    # the data first: a --multiwoz folder without the splits is refused by name (not by a failed download of
    # the support files it lacks too); the key from the files' content, before they are parsed (a reused result
    # costs no loading)
    mapping, onto_path, data_key = _dst_data_key(s)
    key = result_key("dst", model, data_key, s)
    prev = existing_result(result_path(out_dir, "dst"), key, "dst", overwrite)
    if prev is not None:
        return prev
    test = mw.load_multiwoz(s.multiwoz, "test", mapping=mapping)
    train = mw.load_training_split(s.dst_train_file, source=s.multiwoz, mapping=mapping)
    onto = mw.SlotOntology(mw.load_ontology(onto_path), mw.Normalizer(mw.load_mapping_pairs(mapping)))
    t_data = time.perf_counter() - t0

    train_ex, test_ex, counts = _dst_examples(train, test, onto, s)
    mesh = task_mesh(s)
    check_memory(model, s, memory_plans(s))
    t1 = time.perf_counter()
    config, params, tok = model.load(mesh=mesh)
    t_model = time.perf_counter() - t1
    if s.trainer.block_size > config.max_positions:
        raise ValueError(f"block_size {s.trainer.block_size} exceeds the model's maximum positions {config.max_positions}")
    trunc = "reference" if reference else "left"
    train_arr = state_tracking.encode_examples(train_ex, tok, block_size=s.trainer.block_size, truncation=trunc)
    test_arr = state_tracking.encode_examples(test_ex, tok, block_size=s.trainer.block_size, truncation=trunc)
    counts["train_truncated"] = int((train_arr["lengths"] > s.trainer.block_size).sum())
    counts["test_truncated"] = int((test_arr["lengths"] > s.trainer.block_size).sum())
    tr = trim_columns({k: train_arr[k] for k in ("input_ids", "attention_mask", "labels")})
    data = ArrayData(tr, pad_id=tok.eos_id, info={"task": "dst", "split": train.split,
                                                  "stand_in_for": train.stand_in_for,
                                                  "n_examples": len(train_ex), "semantics": s.semantics})
    start = {"gpt2": params, "head": state_tracking.init_head(config, s.seed)}
    pooling = "reference" if reference else "last"
    after = [] if mesh is not None else [_compile_predictions(test_arr, config, s, pooling)]
    trained, training, train_dir = fine_tune("dst", state_tracking.DSTObjective(pooling=pooling),
                                             model, out_dir, s, start, data, what="DST", after=after)

    t1 = time.perf_counter()
    with evaluation_phase("dst", "the scoring of the test pairs", out_dir, training):  # stops between batches
        probs = state_tracking.predict_proba(trained["gpt2"], trained["head"], test_arr, config,
                                             batch_size=s.eval_batch_size, pooling=pooling, progress=s.progress,
                                             desc="DST test pairs", mesh=mesh)
    metrics = state_tracking.binary_metrics(probs, test_arr["labels"])
    t_eval = time.perf_counter() - t1
    metrics["mean_prob_positive"] = float(np.mean(probs[test_arr["labels"] > 0.5])) if metrics["n_positive"] else None
    timings = {"load_data_s": t_data, "load_model_s": t_model, "train_s": training["seconds"], "eval_s": t_eval}
    if s.joint_goal:
        dials = test.dialogues[:s.jga_max_dialogues] if s.jga_max_dialogues else test.dialogues
        t1 = time.perf_counter()
        with evaluation_phase("dst", "the joint goal accuracy", out_dir, training):
            jr = state_tracking.score_joint_goal(trained["gpt2"], trained["head"], config, tok, dials, onto,
                                                 batch_size=s.eval_batch_size, block_size=s.trainer.block_size,
                                                 truncation=trunc, pooling=pooling, progress=s.progress, mesh=mesh)
        timings["joint_goal_s"] = time.perf_counter() - t1
        metrics["joint_goal"] = _joint_goal_record(jr, dials, test, onto, metrics["n"], timings["joint_goal_s"])
    data_rec = _dst_data_record(train, test, onto_path, mapping)
    res = finish("dst", out_dir, key, model, s, overwrite, {"metrics": metrics, "counts": counts, "training": training,
                                                            "data": data_rec, "notes": _dst_notes(train, s),
                                                            "timings": timings}, t0)
    drop_checkpoints(train_dir, s)
    return res


def _dst_data_key(s: DSTSettings) -> tuple[Path, Path, dict]:
    """``(mapping, ontology, data key)``: the support files and the content digests of the train (or its ``val``
    stand-in) and test files, read before they are parsed (a reused result costs no loading).

    Raises:
        FileNotFoundError: a ``--multiwoz`` folder without the splits (named).
    """
    test_files = mw.split_files(s.multiwoz, "test")
    train_files = (mw.split_files(s.dst_train_file, "train") if s.dst_train_file
                   else mw.split_files(s.multiwoz, "val"))
    mapping, onto_path = _dst_support_files(s)
    digests = lambda files: [file_record(p)["sha256"] for p in files]
    data_key = {"train": digests(train_files), "test": digests(test_files),
                "ontology": file_record(onto_path)["sha256"], "mapping": file_record(mapping)["sha256"]}
    return mapping, onto_path, data_key


def _dst_examples(train, test, onto, s: DSTSettings) -> tuple[list, list, dict]:
    """The binary examples of the train and test splits (cut to ``max_examples``) and their counts before and after
    the cut. The paper draws each split's negatives from its own seeded stream; the reference from one stream,
    train first.

    Raises:
        ValueError: a split without examples.
    """
    if s.semantics == "reference":
        rng = random.Random(s.seed)
        train_ex = state_tracking.build_examples(train.dialogues, onto, semantics="reference", rng=rng)
        test_ex = state_tracking.build_examples(test.dialogues, onto, semantics="reference", rng=rng)
    else:
        train_ex = state_tracking.build_examples(train.dialogues, onto, semantics="paper", seed=s.seed)
        test_ex = state_tracking.build_examples(test.dialogues, onto, semantics="paper", seed=s.seed)
    counts = {"train_all": state_tracking.example_counts(train_ex), "test_all": state_tracking.example_counts(test_ex)}
    if s.max_examples:
        train_ex, test_ex = train_ex[:s.max_examples], test_ex[:s.max_examples]
    counts.update(train=state_tracking.example_counts(train_ex), test=state_tracking.example_counts(test_ex))
    if not train_ex or not test_ex:
        raise ValueError(f"no DST examples (train {len(train_ex)}, test {len(test_ex)}): no turn with a turn_label")
    return train_ex, test_ex, counts


def _compile_predictions(test_arr: dict, config, s: DSTSettings, pooling: str):
    """The job (for the trainer's ``after``) that compiles the test pairs' programs (and, for the joint goal, every
    bucket width) before update 1."""
    widths = state_tracking.prediction_widths(test_arr, s.eval_batch_size)
    if s.joint_goal:
        widths |= state_tracking.prediction_widths(block_size=s.trainer.block_size)
    return lambda final: state_tracking.compile_predictions(final["gpt2"], final["head"], config, widths,
                                                            batch_size=s.eval_batch_size, pooling=pooling)


def _joint_goal_record(jr: dict, dials: list, test, onto, binary_pairs: int, secs: float) -> dict:
    """``metrics["joint_goal"]``: JGA, turns, the oracle, the dialogues scored and the cost (pairs, seconds, the
    whole split's pairs)."""
    return {"jga": jr["jga"], "n_turns": jr["n_turns"], "n_correct": jr["n_correct"],
            "oracle_jga": jr["oracle_jga"], "n_dialogues": len(dials), "dialogues_of_split": len(test.dialogues),
            "cost": {"pairs_scored": jr["n_pairs"], "seconds": secs,
                     "pairs_per_s": jr["n_pairs"] / secs if secs > 0 else None,
                     "binary_pairs": binary_pairs, "full_split": state_tracking.jga_cost(test.dialogues, onto)},
            "per_dialogue": jr["per_dialogue"]}


def _dst_notes(train, s: DSTSettings) -> list[str]:
    """What a reader of ``dst.json`` must know: a stand-in train split, ``--max-examples``, ``--max-steps``."""
    notes = []
    if train.stand_in_for:
        notes.append(f"trained on the MultiWOZ 2.0 {train.split} split standing in for the {train.stand_in_for} "
                     "split (not in the default download); pass --train-file with the real train split for the "
                     "paper's setting")
    if s.max_examples:
        notes.append(f"--max-examples {s.max_examples}: only the first {s.max_examples} train and test "
                     "examples were used")
    if s.trainer.max_steps:
        notes.append(f"--max-steps {s.trainer.max_steps}: training stopped after {s.trainer.max_steps} update(s), not "
                     "one epoch")
    return notes


def _dst_data_record(train, test, onto_path: Path, mapping: Path) -> dict:
    """``dst.json``'s ``data``: each split's files and whether it is the official one, the ontology and mapping."""
    return {"train": {**train.describe(), "official": train.stand_in_for is None},
            "test": {**test.describe(), "official": True,
                     "note": "the MultiWOZ 2.0 test split" + (" (ConvLab's re-tokenised copy: transcripts differ "
                                                              "a little from the official text, belief states "
                                                              "do not)" if test.layout == "convlab" else "")},
            "ontology": file_record(onto_path), "mapping": file_record(mapping),
            "stand_in_for": train.stand_in_for}




TASK = Task("dst", DSTSettings, run_dst, "MultiWOZ 2.0 dialog state tracking: train the classifier on train (default: "
                                         "the val split standing in), score the test split", ("dst.json",),
            memory_plans)
