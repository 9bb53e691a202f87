"""``crg``: response generation on DSTC-7 (paper §3.2, Table 5; docs/dialog.md "CRG") → ``OUT/crg.json``,
``OUT/crg_responses.jsonl`` and ``OUT/crg_hypotheses.txt``.

Optionally fine-tunes on a DSTC-7 TSV (``crg_train_file``; the loss on the response only, :mod:`rbjax.dialog.crg_data`),
generates a response per test context (:func:`rbjax.dialog.crg_generation.generate_responses`) and scores them with the
DSTC-7 metrics (:func:`rbjax.dialog.crg_metrics.crg_metrics`; without reference files only the reference-free
ones).
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from rbjax.core.config import field
from rbjax.core.digests import file_digest
from rbjax.core.io import atomic_write_text, versions
from rbjax.data.redditbias import RedditBiasData
from rbjax.dialog import crg_data
from rbjax.dialog.crg_generation import CHAT_PROMPT_WIDTH, REFERENCE_PROMPT_WIDTH, generate_responses
from rbjax.dialog.crg_metrics import METRIC_PACKAGES, crg_metrics
from rbjax.dialog.tasks.common import (EvalModel, Task, TrainingSettings, check_memory, data_dir_field,
    drop_checkpoints, evaluation_phase, existing_result, file_record, fine_tune, finish, result_key, result_path, task_mesh,
    trainer_section)
from rbjax.model.generate import sampling_settings
from rbjax.train.batching import ArrayData
from rbjax.train.config import TrainerConfig

__all__ = ["TASK", "CRGSettings", "memory_plans", "run_crg"]


@dataclasses.dataclass(frozen=True)
class CRGSettings(TrainingSettings):
    """The settings of ``crg`` (see :class:`rbjax.dialog.tasks.common.TrainingSettings`); the trainer's defaults are
    the reference's (batch 16, accumulation 5, 1 epoch, lr 5e-5, block 128, seed 42)."""

    data_dir: str | None = data_dir_field()
    crg_train_file: str | None = field(None, "a DSTC-7 TSV (hash, subreddit, conv_id, score, turn, context, "
                                             "response; default: no fine-tuning)", metavar="FILE")
    test_file: str | None = field(None, "crg: DSTC-7 TSV of test contexts (default: the 1,472 DSTC-7 test contexts of "
                                        "RedditBias data/dstc7/response_hyp.txt)", metavar="FILE")
    refs: tuple[str, ...] | None = field(None, "reference files, one per reference set, line-aligned with the test "
                                               "examples (crg) or with --hyp (crg-metrics); without them only the "
                                               "reference-free metrics (entropy, dist, avg_len) are computed and "
                                               "BLEU/NIST/METEOR are null with the reason", metavar="FILE")
    gen_batch_size: int = field(16, "crg: contexts per generation batch")
    greedy: bool = field(False, "crg: greedy decoding instead of sampling")
    max_new_tokens: int | None = field(None, "crg: at most N new tokens per response (default: 64)", metavar="N")
    clean: bool = field(True, "DSTC-7's -c cleaning of hypotheses and references (lower-case, URLs to __url__, tweet "
                              "tokenisation, contractions split), as the official scores use it (default: on for "
                              "crg, off for crg-metrics)")
    meteor: bool = field(True, "METEOR (it starts Java and loads 60 MB of paraphrases)", negate="--no-meteor")
    meteor_norm: bool = field(True, "METEOR's -norm, as the official command uses it (the official README's demo "
                                    "value was computed without it)", negate="--meteor-no-norm")
    meteor_jar: str | None = field(None, "meteor-1.5.jar with data/paraphrase-en.gz beside it (default: "
                                         "$RBJAX_METEOR_JAR, else the copy bundled in the pycocoevalcap package)",
                                   metavar="JAR")
    java: str | None = field(None, "Java executable for METEOR (default: java on PATH)", metavar="JAVA")

    trainer: TrainerConfig = trainer_section(batch_size=16, grad_accum=5)

    path_fields = ("data_dir", "crg_train_file", "test_file", "refs")
    chat_refusal = None
    path_options = (("crg_train_file", "--train-file"),)


def _generation_semantics(s: CRGSettings) -> str:
    return "reference" if s.semantics == "reference" else "rbjax"


def _sampling(s: CRGSettings):
    """The sampling settings of the task: the preset of its semantics, ``greedy``/``max_new_tokens`` applied."""
    over = {}
    if s.greedy:
        over["greedy"] = True
    if s.max_new_tokens:
        over["max_new_tokens"] = s.max_new_tokens
    return sampling_settings(_generation_semantics(s), **over)


def memory_plans(s: CRGSettings, prefix_ids=None) -> list[dict]:
    """The memory plan's computations: fine-tuning when ``crg_train_file`` is given, then generation (its KV cache:
    ``gen_batch_size`` rows of the prompt width + the new tokens; with Self-Debias ``prefix_ids``, (1 + K) times the
    rows, each as wide as the longest prefix more)."""
    max_new = _sampling(s).max_new_tokens
    width = CHAT_PROMPT_WIDTH if s.is_chat else REFERENCE_PROMPT_WIDTH
    rows = s.gen_batch_size * (1 + len(prefix_ids or ()))
    width += max((len(q) for q in prefix_ids or ()), default=0)
    gen = {"training": False, "batch_size": rows, "seq_len": width,
           "kv_cache": (rows, width + max_new),
           "flags": {"batch_size": "--gen-batch-size", "param_dtype": None}}
    train = s.training_plan()
    return ([train] if s.crg_train_file else []) + [gen]


def run_crg(model: EvalModel, out_dir: str | os.PathLike, s: CRGSettings, *, overwrite: bool = False) -> dict:
    """Response generation on DSTC-7 (paper §3.2, Table 5; docs/dialog.md "CRG") → ``OUT/crg.json``,
    ``OUT/crg_responses.jsonl`` (``{key, context, response}``) and ``OUT/crg_hypotheses.txt`` (one per line).

    ``s``: the task's settings; ``overwrite``: replace a result of other inputs (else refused:
    :class:`rbjax.core.reuse.OutputExists`). Fine-tunes first when ``crg_train_file`` is given (else the model is
    used as it is: ``fine_tuned: false``). A Self-Debias model (:attr:`rbjax.model.handle.ModelHandle.self_debias`)
    draws every token from the self-debiased distribution of its base model (fine-tuned first when
    ``crg_train_file`` is given; one device: no ``mesh``; recorded under ``generation.self_debias``). Metrics: :func:`rbjax.dialog.crg_metrics.crg_metrics`'s keys
    (``bleu``, ``nist``, ``meteor``, ``entropy``, ``dist``, ``avg_len``, ``null_reasons`` ...) and ``headline``
    (BLEU-4, NIST-2, METEOR, entropy-4, dist-2, avg_len, the paper's columns).

    Raises:
        FileNotFoundError, ValueError: missing or malformed files (named with the line), misaligned references.
    """

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    notes = []
    examples, test_rec = _test_contexts(s, notes)
    n_total = len(examples)
    refs = crg_data.read_reference_sets(s.refs, n_total) if s.refs else None
    if s.max_examples:
        examples = examples[:s.max_examples]
        refs = None if refs is None else [r[:s.max_examples] for r in refs]
        notes.append(f"--max-examples {s.max_examples}: only the first {len(examples)} of {n_total} test contexts")
    train_rows = (crg_data.read_dstc7_tsv(s.crg_train_file, need_response=True, what="--train-file")
                  if s.crg_train_file else None)
    data_key = {"test": test_rec["sha256"], "train": None if train_rows is None else file_digest(s.crg_train_file),
                "refs": [file_digest(p) for p in (s.refs or [])]}
    chat = s.chat_turns(model.tokenizer)  # a model without a template fails here, before any work
    if chat is not None:  # the template's text and what it renders around a turn
        data_key["chat"] = chat.key()
    key = result_key("crg", model, data_key, s)
    resp_path, hyp_path = out_dir / "crg_responses.jsonl", out_dir / "crg_hypotheses.txt"

    def outputs_intact(prev):
        for p, k in ((resp_path, "responses"), (hyp_path, "hypotheses")):
            want = (prev.get("outputs") or {}).get(k, {}).get("sha256")
            if not p.exists() or file_digest(p) != want:
                return f"{p.name} is missing or was changed since the result was computed"
        return None

    prev = existing_result(result_path(out_dir, "crg"), key, "crg", overwrite, check=outputs_intact)
    if prev is not None:
        return prev
    t_data = time.perf_counter() - t0
    gen_sem, sampling = _generation_semantics(s), _sampling(s)
    mesh = task_mesh(s)
    sd, prefix_ids = _self_debias(model, mesh)
    check_memory(model, s, memory_plans(s, prefix_ids))
    t1 = time.perf_counter()
    config, params, tok = model.load(mesh=mesh)
    t_model = time.perf_counter() - t1
    timings = {"load_data_s": t_data, "load_model_s": t_model}
    training, train_dir = None, None
    if train_rows is not None:
        params, training, train_dir = _fine_tune(model, out_dir, s, train_rows, chat, params, config, tok)
        timings["train_s"] = training["seconds"]
    else:
        notes.append("no --train-file: responses generated by the model as it is (not fine-tuned on DSTC-7)")
    if sd is not None:
        notes.append("Self-Debias: every token drawn from the self-debiased distribution of the "
                     f"{'fine-tuned ' if train_rows is not None else ''}base model ({len(sd.prefixes)} prefix(es), "
                     f"λ {sd.decay_constant:g}, ε {sd.epsilon:g})")
    t1 = time.perf_counter()
    with evaluation_phase("crg", "the generation of the responses", out_dir, training):  # stops between batches
        records = generate_responses(params, config, tok, examples, resp_path, semantics=gen_sem, seed=s.seed,
                                     settings=sampling, batch_size=s.gen_batch_size, progress=s.progress,
                                     mesh=mesh, chat=chat,
                                     end_ids=None if chat is None else model.end_token_ids(chat.template),
                                     self_debias=sd, prefix_ids=prefix_ids,
                                     bos_id=None if sd is None else model.bos_id())
    timings["generate_s"] = time.perf_counter() - t1
    hyps = [" ".join(r["response"].split()) for r in records]
    atomic_write_text(hyp_path, "".join(h + "\n" for h in hyps))
    gen = _generation_record(records, hyps, s, gen_sem, sampling, chat, model, sd, prefix_ids)
    t1 = time.perf_counter()
    m = crg_metrics(hyps, refs, clean=s.clean, compute_meteor=s.meteor, meteor_norm=s.meteor_norm,
                    meteor_jar=s.meteor_jar, java=s.java)
    timings["metrics_s"] = time.perf_counter() - t1
    pick = (lambda xs, i: None if xs is None else xs[i])
    m["headline"] = {"bleu4": pick(m["bleu"], 3), "nist2": pick(m["nist"], 1), "meteor": m["meteor"],
                     "entropy4": pick(m["entropy"], 3), "dist2": pick(m["dist"], 1), "avg_len": m["avg_len"]}
    v = versions(extra=METRIC_PACKAGES)
    v["java"] = (m.get("meteor_info") or {}).get("java_version")
    data_rec = {"test": test_rec, "n_test_examples": len(examples),
                "train": None if train_rows is None else {**file_record(Path(s.crg_train_file)),
                                                          "n_rows": len(train_rows)},
                "refs": [{**file_record(Path(p)), "n_lines": n_total} for p in (s.refs or [])]}
    outputs = {"responses": file_record(resp_path), "hypotheses": file_record(hyp_path)}
    res = finish("crg", out_dir, key, model, s, overwrite, {
        "metrics": m, "fine_tuned": train_rows is not None, "training": training, "generation": gen,
        "outputs": outputs, "data": data_rec, "notes": notes, "timings": timings, "versions": v}, t0)
    drop_checkpoints(train_dir, s)
    return res


def _test_contexts(s: CRGSettings, notes: list[str]) -> tuple[list, dict]:
    """The test contexts ``[(key, context)]`` — the user's ``--test-file`` (a DSTC-7 TSV) or RedditBias's
    ``response_hyp.txt`` (a note is added to ``notes``) — and ``crg.json``'s record of their file.

    Raises:
        FileNotFoundError, ValueError: a missing or malformed file (named with the line).
    """
    if s.test_file:
        rows = crg_data.read_dstc7_tsv(s.test_file, what="--test-file")
        return [(r.hash, r.context) for r in rows], {
            **file_record(Path(s.test_file)), "what": "DSTC-7 TSV given by the user", "n_rows": len(rows),
            "official": None, "stand_in_for": None}
    path = RedditBiasData(s.data_dir).path(crg_data.RESPONSE_HYP)
    examples = crg_data.read_response_hyp(path)
    notes.append(f"test contexts: the {len(examples)} DSTC-7 test contexts of RedditBias's response_hyp.txt "
                 "(the official test text is not distributed; pass --test-file for your own)")
    return examples, {**file_record(path), "what": "RedditBias data/dstc7/response_hyp.txt: the DSTC-7 test contexts "
                      "released with RedditBias", "n_rows": len(examples), "official": False,
                      "stand_in_for": "DSTC-7 test set (2,208 scored keys; its text is not distributed)"}


def _fine_tune(model: EvalModel, out_dir: Path, s: CRGSettings, train_rows, chat, params, config, tok):
    """Fine-tune on the DSTC-7 training rows (plain or in the chat format): ``(params, training, train_dir)``, the
    training record with its ``examples`` counts.

    Raises:
        ValueError: ``block_size`` beyond the model's positions, no example that fits.
    """
    if s.trainer.block_size > config.max_positions:
        raise ValueError(f"block_size {s.trainer.block_size} exceeds the model's maximum positions {config.max_positions}")
    if chat is None:
        arrays, stats = crg_data.build_crg_arrays(train_rows, tok, block_size=s.trainer.block_size)
    else:
        pad = tok.eos_id if tok.eos_id is not None else 0  # (a filler: masked)
        arrays, stats = crg_data.build_chat_crg_arrays(train_rows, chat, block_size=s.trainer.block_size,
                                                       pad_id=pad)
    data = ArrayData(arrays, pad_id=tok.eos_id if tok.eos_id is not None else 0, info={"task": "crg", **stats})
    params, training, train_dir = fine_tune("crg", crg_data.CRGObjective(), model, out_dir, s, params, data,
                                            what="CRG")
    training["examples"] = stats
    return params, training, train_dir


def _self_debias(model: EvalModel, mesh):
    """A Self-Debias run folder's settings and prefix ids (its base model is decoded with the rescaling), or
    ``(None, None)``.

    Raises:
        ValueError: a Self-Debias model with a mesh (it generates on one device).
    """
    sd = model.self_debias
    if sd is None:
        return None, None
    if mesh is not None:
        raise ValueError(f"{model.name}: a Self-Debias model generates on one device (no --mesh)")
    model.self_debias_accepted = True  # (the rescaling is applied: generate_responses)
    return sd, model.self_debias_prefix_ids()


def _generation_record(records: list[dict], hyps: list[str], s: CRGSettings, gen_sem: str, sampling, chat,
                       model: EvalModel, sd=None, prefix_ids=None) -> dict:
    """``crg.json``'s ``generation``: the semantics, sampling and seed, the chat format, the Self-Debias settings
    (``sd``, with its ``prefix_ids``) and counts of the responses (generated, empty, on several lines, mean
    characters)."""
    return {"semantics": gen_sem, "sampling": dataclasses.asdict(sampling), "seed": s.seed, "format": s.format,
            **({} if chat is None else {"chat": {**chat.record(), "prompt_width": CHAT_PROMPT_WIDTH,
                                                "end_token_ids": list(model.end_token_ids(chat.template))}}),
            **({} if sd is None else {"self_debias": {**sd.to_dict(), "prefix_tokens": [len(q) for q in prefix_ids],
                                                      "bos_id": model.bos_id()}}),
            "n_generated": len(records), "n_empty": sum(1 for h in hyps if not h),
            "n_multiline": sum(1 for r in records if "\n" in r["response"] or "\r" in r["response"]),
            "mean_response_chars": float(sum(len(r["response"]) for r in records) / max(len(records), 1))}


TASK = Task("crg", CRGSettings, run_crg, "DSTC-7 response generation: optional fine-tuning, generation, DSTC-7 metrics",
            ("crg.json", "crg_responses.jsonl", "crg_hypotheses.txt"), memory_plans)
