"""Host-side data of a debiasing run: training phrases → token ids → trigger arrays.

Everything here is numpy on the host and is computed **once**: the phrases are tokenised once per run, the trigger
arrays of the debiasing losses once per example (paper semantics: a phrase's triggers do not depend on its batch
mates) or once per micro-batch of a batch plan (reference semantics: the code's attribute windows end at the longest
sentence of the micro-batch), and every grid point that shares a batch plan shares the same stream. No regular
expression runs inside the step loop. The order of the examples, the updates and the token layout are the trainer's
(:class:`rbjax.train.batching.BatchPlan`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from rbjax.core.keys import digest
from rbjax.core.padding import pad_sequences
from rbjax.data.redditbias import RedditBiasData
from rbjax.debias import cda
from rbjax.debias.config import LOSS_METHODS, DebiasRun, bias_spec
from rbjax.debias.triggers import TriggerBuilder, is_gpt2_bpe, pad_occurrences
from rbjax.train.batching import sha256_arrays, tokenize_lines

__all__ = ["load_training_texts", "TrainingData", "chat_examples"]


def chat_examples(texts: list[str], chat, block_size: int, pad_id: int):
    """The training phrases as turns of a chat (:class:`rbjax.model.chat.ChatTurns`, docs/chat.md): each row is
    the rendered chat up to the end of the phrase (and its end-of-turn token when ``chat.score_end_of_turn``),
    whose leading template tokens are context only.

    ``block_size`` counts the phrase's own tokens, as in the raw format (a longer phrase is cut to its first
    ``block_size`` tokens, and then has no end-of-turn token); the rows are as wide as the longest example.

    Returns:
        ``(ids, mask, n_context, loss_mask, stats)``: int32 ``(N', W)`` ids and 0/1 mask, right padded; int32
        ``(N',)`` context tokens of each row; int32 ``(N', W)`` 1 on the phrase's tokens (the LM loss's targets);
        stats ``{"n_dropped_empty", "n_truncated", "n_tokens", "n_context_tokens", "n_loss_tokens"}``.

    Raises:
        ValueError: no phrase has a token. rbjax.model.chat.ChatError: a phrase the template changes.
    """
    spans = chat.encode(list(texts))
    keep = [sp for sp in spans if len(sp.span) > 0]
    if not keep:
        raise ValueError("no training line has a token")
    eot = 1 if chat.score_end_of_turn else 0
    long = [len(sp.span) - eot > block_size for sp in keep]
    cut = [sp.ids[:sp.n_context + block_size] if lg else sp.ids for sp, lg in zip(keep, long)]
    n = len(keep)
    ids, mask = pad_sequences(cut, pad_id)  # as wide as the longest row
    loss = np.zeros_like(mask)
    ctx = np.array([sp.n_context for sp in keep], np.int32)
    for r, c in enumerate(cut):
        loss[r, ctx[r]:len(c)] = 1
    n_trunc = sum(long)
    return ids, mask, ctx, loss, {"n_dropped_empty": len(spans) - n, "n_truncated": int(n_trunc),
                                  "n_tokens": int(mask.sum()), "n_context_tokens": int(ctx.sum()),
                                  "n_loss_tokens": int(loss.sum())}


# ----------------------------------------------------------------------------------------------------- texts
def load_training_texts(cfg: DebiasRun, data=None) -> tuple[list[str], dict]:
    """The training phrases of a run and a description of where they came from.

    * ``train_file`` set: its non-empty lines (for ``cda``, followed by their swapped copies).
    * ``cda``: :func:`rbjax.debias.cda.augmented_training_set` (phrases + our swapped copies; mode = semantics).
    * otherwise: the bias type's training phrases (:meth:`RedditBiasData.train_file`: the released file of a
      packaged type — the lower-case file for religion2 — or ``text_files/<name>/<name>_bias_manual_train.txt`` of a
      spec file's data folder, as ``rbjax splits`` writes it); in paper semantics the literal ``"<bos> "`` prefix of
      the queerness lines is removed (an artefact of the data preparation), in reference semantics it is kept and
      tokenised as text, as the reference grid does.

    Returns:
        ``(texts, info)`` with ``info = {"files": [...], "n_lines": ..., ...}``.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing or empty data.
    """

    if cfg.debias.train_file is not None:
        p = Path(cfg.debias.train_file)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: training file not found" if not p.exists() else f"{p}: not a file")
        texts = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln and not ln.isspace()]
        if not texts:
            raise ValueError(f"{p}: no non-empty line to train on")
        info = {"files": [str(p)], "source": "train_file"}
        if cfg.debias.method == "cda":
            texts = cda.augment(texts, bias_spec(cfg.debias.bias_type), mode=cfg.debias.semantics)
            info["source"] = f"train_file, CDA augmented ({cfg.debias.semantics} swapping)"
        info["n_lines"] = len(texts)
        return texts, info
    if data is None or not isinstance(data, RedditBiasData):
        data = RedditBiasData(data if data is not None else cfg.debias.data_dir)
    rel = RedditBiasData.train_file(cfg.debias.bias_type)
    if cfg.debias.method == "cda":
        texts = cda.augmented_training_set(cfg.debias.bias_type, data, mode=cfg.debias.semantics)
        info = {"files": [str(data.path(rel))], "source": f"CDA augmented ({cfg.debias.semantics} swapping)",
                "n_original": len(texts) // 2}
        try:
            cc = cda.cross_check(cfg.debias.bias_type, data, cfg.debias.semantics)
            info["released_cross_check"] = {"file": RedditBiasData.swapped_targets_train_file(cfg.debias.bias_type),
                                            "n_identical": cc.n_identical, "n_released": cc.n_released,
                                            "agreement": cc.agreement}
        except (FileNotFoundError, RuntimeError, ValueError) as e:  # the released file is only a cross-check
            info["released_cross_check"] = {"error": str(e)}
    else:
        texts = cda.read_train_phrases(cfg.debias.bias_type, data, strip_bos=cfg.debias.semantics == "paper")
        info = {"files": [str(data.path(rel))], "source": "training phrases of the bias type"}
    info["n_lines"] = len(texts)
    return texts, info


class TrainingData:
    """The tokenised training set of a run and its trigger arrays, shared by every grid point.

    Args:
        cfg: the run's settings (method, bias type, semantics, block size, training file, data folder).
        tokenizer: the GPT-2 tokenizer (``encode_batch``, ``eos_id``, ``vocab_size``).
        vocab_size: the model's vocabulary size (target ids are checked against it).
        texts: the training phrases (default: :func:`load_training_texts`).

    Attributes:
        ids, mask: int32 ``(N, block_size)``. n_examples: N. pad_id: filler id. info: where the data came from.
        shared: target-pair arrays of the loss methods (``pair_ids``/``pair_mask`` ``(P, 2, W)``), else ``{}``.
        trigger_stats: trigger coverage over the whole set. n_occ: size of the occurrence axis (ADD/HD).
        key: content digest of everything here (tokens, triggers, bias specification), for resume keys.

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing or bad data.
    """

    def __init__(self, cfg: DebiasRun, tokenizer, vocab_size: int, texts: list[str] | None = None):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        if texts is None:
            texts, self.info = load_training_texts(cfg)
        else:
            self.info = {"source": "given texts", "n_lines": len(texts)}
        self.chat = cfg.debias.chat_turns(tokenizer)
        #: (N,) leading context tokens of each example (a chat template's prefix; zeros in the raw format) and
        #: (N, L) the targets of the LM loss (the phrase's tokens), or None in the raw format (every real token)
        self.n_context: np.ndarray | None = None
        self.loss_mask: np.ndarray | None = None
        if self.chat is None:
            self.ids, self.mask, tstats = tokenize_lines(texts, tokenizer, cfg.trainer.block_size, self.pad_id)
        else:
            self.ids, self.mask, self.n_context, self.loss_mask, tstats = chat_examples(
                texts, self.chat, cfg.trainer.block_size, self.pad_id)
            self.info["chat"] = self.chat.record(texts[0] if texts else None)
        self.info.update(tstats)
        self.info["sha256_tokens"] = sha256_arrays(self.ids, self.mask) if self.chat is None else sha256_arrays(
            self.ids, self.mask, self.n_context, self.loss_mask)
        self.n_examples = len(self.ids)
        self.spec = bias_spec(cfg.debias.bias_type)
        self.shared: dict[str, np.ndarray] = {}
        self.trigger_stats: dict[str, Any] = {}
        self.n_occ = 0
        self.tb = None
        self._per_example: dict[str, np.ndarray] | None = None
        if cfg.debias.method in LOSS_METHODS:
            self._setup_triggers(vocab_size)

        self.key = digest({"tokens": self.info["sha256_tokens"], "spec": dataclasses.asdict(self.spec),
                           **({} if self.chat is None else {"chat": self.chat.key()}),
                           "triggers": None if self._per_example is None else sha256_arrays(
                               *[self._per_example[k] for k in sorted(self._per_example)]),
                           "shared": {k: v.tolist() for k, v in self.shared.items()}})

    def _setup_triggers(self, vocab_size: int) -> None:

        cfg = self.cfg
        if cfg.debias.semantics == "reference" and not is_gpt2_bpe(self.tokenizer):
            raise ValueError(f"--semantics reference reproduces the official code's GPT-2 token-id lists; the "
                             f"tokenizer {getattr(self.tokenizer, 'source', self.tokenizer)} is not GPT-2's BPE. "
                             "Use --semantics paper (terms matched on text, any tokenizer)")
        self.tb = TriggerBuilder(self.spec, self.tokenizer, semantics=cfg.debias.semantics)
        ids, mask = self.tb.pair_ids("lmd" if cfg.debias.method == "lmd" else "add_hd")
        if ids.max(initial=0) >= vocab_size:
            raise ValueError(f"a target-pair token id ({int(ids.max())}) is outside the model vocabulary")
        self.shared = {"pair_ids": ids.astype(np.int32), "pair_mask": mask.astype(bool)}
        # one pass over the whole training set: trigger coverage, the occurrence-axis size and (paper semantics,
        # where a phrase's triggers do not depend on its batch) the per-example trigger arrays themselves
        if cfg.debias.method == "lmd":
            t = self.tb.lmd(self.ids, self.mask, context=self.n_context)
            fired = t.mask.sum(axis=(1, 2)) > 0
            self.trigger_stats = {"sentences_triggered": int(fired.sum()), "n_sentences": self.n_examples,
                                  "triggered_positions": int((t.mask.sum(-1) > 0).sum()),
                                  "unpredicted_term_occurrences": int(t.unpredicted.sum())}
            if cfg.debias.semantics == "paper":
                self._per_example = {"lmd_mask": t.mask, "norm": t.norm}
        else:
            o = self.tb.attributes(self.ids, self.mask, max_occurrences=None, context=self.n_context)
            per = o.mask.sum(1)
            self.n_occ = pad_occurrences(int(per.max(initial=0)))
            self.trigger_stats = {"sentences_triggered": int((per > 0).sum()), "n_sentences": self.n_examples,
                                  "occurrences": int(per.sum()), "max_per_sentence": int(per.max(initial=0)),
                                  "zero_vector_occurrences": int(((o.weights.sum(-1) == 0) & (o.mask > 0)).sum())}
            if cfg.debias.semantics == "paper":
                w = np.zeros((self.n_examples, self.n_occ, o.weights.shape[-1]), np.float32)
                m = np.zeros((self.n_examples, self.n_occ), np.float32)
                w[:, :o.weights.shape[1]], m[:, :o.mask.shape[1]] = o.weights, o.mask
                self._per_example = {"occ_weights": w, "occ_mask": m}

        if self.trigger_stats["sentences_triggered"] == 0:
            what = "a term of the target pairs" if cfg.debias.method == "lmd" else "an A1 attribute"
            raise ValueError(
                f"no training phrase triggers the {cfg.debias.method} loss (0 of {self.n_examples} phrases contain {what} of "
                f"{cfg.debias.bias_type}): the run would be plain LM fine-tuning; check the training file and the bias "
                "specification")

    def triggers(self, ids: np.ndarray, mask: np.ndarray, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The method's trigger arrays of a micro-batch (``ids``/``mask`` ``(B, L)``, ``rows`` its example indices).

        Paper semantics: gathered from the per-example arrays computed once (filler rows get zeros); reference
        semantics: computed from the micro-batch itself (it depends on the batch's longest sentence).
        """
        B = ids.shape[0]
        out = {}
        if self.loss_mask is not None:  # chat format: the LM loss is on the phrase's tokens only
            if rows is None:
                raise ValueError("the chat format's loss mask is gathered by example: give the micro-batch's rows")
            out["loss_mask"] = np.zeros((B,) + self.loss_mask.shape[1:], self.loss_mask.dtype)
            out["loss_mask"][:len(rows)] = self.loss_mask[rows]
        if self.tb is None:
            return out
        if self._per_example is not None and rows is not None:
            for k, v in self._per_example.items():
                a = np.zeros((B,) + v.shape[1:], v.dtype)
                a[:len(rows)] = v[rows]
                out[k] = a
            return out
        if self.cfg.debias.method == "lmd":
            t = self.tb.lmd(ids, mask)
            return {**out, "lmd_mask": t.mask, "norm": t.norm}
        o = self.tb.attributes(ids, mask, max_occurrences=self.n_occ)
        return {**out, "occ_weights": o.weights, "occ_mask": o.mask}

