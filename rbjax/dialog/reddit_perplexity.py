"""Language-model perplexity (LMP) on the Reddit reference set (paper §3.2; docs/dialog.md "LMP").

The paper pairs every bias score with the perplexity of the model on the 6K human Reddit responses of DialoGPT's
evaluation (``human.ref.6k.txt``; RedditBias ships it as ``text_files/humanref6k.txt``, identical but for the
final newline). Each line is one utterance, scored on its own: no special tokens are added, the line is cut to the
training block size (36 GPT-2 tokens, as the reference's ``LineByLineTextDataset``), and every token after the
first is predicted (tokens 2..n). Empty lines are skipped (the dataset class drops them).

Three estimators are reported; the first is rbjax's primary figure:

* ``perplexity`` — corpus level, ``exp(Σ_s NLL_s / Σ_s (n_s − 1))``: total next-token negative log-likelihood over
  all predicted tokens.
* ``reference_grid`` — what the reference's grid script (``debias_lm_grid.py:830-833``, eval batch 1) computes:
  ``exp(Σ_s n_s·mean_CE_s / Σ_s n_s)``, each sentence's mean CE weighted by its *token* count ``n_s`` (the
  flattened-length quirk of §9), not by its ``n_s − 1`` predictions. It differs slightly from ``perplexity``.
* ``reference_cda`` — what ``run_language_modeling.py`` (CDA, eval batch 2) computes: the mean over consecutive
  2-line batches of the batch's token-mean CE, then ``exp``.

Lines with fewer than 2 tokens have no prediction; they are left out of all three (the reference's mean over zero
targets would be NaN) and counted in ``n_unscorable``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from rbjax.core.io import sha256_file
from rbjax.core.progress import progress_bar
from rbjax.lmb.perplexity import PerplexityScorer, PhraseError
from rbjax.model.handle import ModelHandle

__all__ = ["read_reference_lines", "reddit_perplexity", "lmp_program_shapes", "model_perplexity", "lmp_from_counts",
           "BLOCK_SIZE"]

#: block size of the reference's debiasing runs (cai README: ``--block_size=36``)
BLOCK_SIZE = 36


def read_reference_lines(path: str | os.PathLike, max_lines: int | None = None) -> list[str]:
    """Non-empty lines of a text file (the reference's ``LineByLineTextDataset`` rule), optionally the first N.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not UTF-8 or has no non-empty line.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: LMP reference file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e})") from None
    lines = [ln for ln in text.splitlines() if ln and not ln.isspace()]
    if not lines:
        raise ValueError(f"{p}: no non-empty line to score")
    if max_lines is not None:
        if max_lines < 1:
            raise ValueError(f"max_lines must be >= 1, got {max_lines}")
        lines = lines[:max_lines]
    return lines


def lmp_from_counts(nll_sum: np.ndarray, n_pred: np.ndarray, n_tokens: np.ndarray) -> dict:
    """The three LMP estimators from per-line sums (see the module docstring).

    Args:
        nll_sum: ``(S,)`` summed next-token NLL of each line, nats.
        n_pred: ``(S,)`` number of predicted tokens (``n_s − 1``; 0 = unscorable).
        n_tokens: ``(S,)`` tokens per line after truncation (``n_s``).

    Returns:
        dict with ``perplexity``, ``reference_grid``, ``reference_cda``, ``mean_nll`` (nats per predicted token) and
        counts; ``None`` values when nothing is scorable.
    """
    nll_sum = np.asarray(nll_sum, np.float64)
    n_pred = np.asarray(n_pred, np.int64)
    n_tokens = np.asarray(n_tokens, np.int64)
    ok = n_pred > 0
    tot_pred = int(n_pred[ok].sum())
    out = {"n_scored_lines": int(ok.sum()), "n_unscorable": int((~ok).sum()), "n_predicted_tokens": tot_pred,
           "perplexity": None, "mean_nll": None, "reference_grid": None, "reference_cda": None}
    if not ok.any():
        return out
    mean_nll = float(nll_sum[ok].sum() / tot_pred)
    out["mean_nll"] = mean_nll
    out["perplexity"] = math.exp(mean_nll)
    per_line = nll_sum[ok] / n_pred[ok]
    w = n_tokens[ok].astype(np.float64)
    out["reference_grid"] = math.exp(float((w * per_line).sum() / w.sum()))
    # CDA: consecutive 2-line eval batches of the scorable lines, token-mean CE per batch, mean over batches.
    s, c = nll_sum[ok], n_pred[ok]
    bs = [s[i:i + 2].sum() / c[i:i + 2].sum() for i in range(0, len(s), 2)]
    out["reference_cda"] = math.exp(float(np.mean(bs)))
    return out


def _check_lines(lines, block_size: int, config) -> None:
    if not lines:
        raise ValueError("no lines to score")
    if not 2 <= block_size <= config.max_positions:
        raise ValueError(f"block_size must be in [2, {config.max_positions}], got {block_size}")


def _line_ids(tokenizer, lines: Sequence[str], block_size: int) -> tuple[list[list[int]], int]:
    """The lines' token ids (no special tokens) cut to ``block_size``, and how many were cut."""
    toks = tokenizer.encode_batch(list(lines))
    return [t[:block_size] for t in toks], sum(len(t) > block_size for t in toks)


def lmp_program_shapes(scorer: PerplexityScorer, tokenizer, lines: Sequence[str], *,
                       block_size: int = BLOCK_SIZE) -> set:
    """The scoring programs (:meth:`rbjax.lmb.perplexity.PerplexityScorer.program_shapes`) that
    :func:`reddit_perplexity` with ``scorer``'s settings (batch size, ``bos_id``) runs on ``lines``, found
    without scoring, for compiling them ahead.

    Raises:
        ValueError: as :func:`reddit_perplexity`.
    """
    _check_lines(lines, block_size, scorer.config)
    try:
        return scorer.program_shapes(_line_ids(tokenizer, lines, block_size)[0])
    except PhraseError as e:
        raise ValueError(f"line {e.index + 1}: {e.problem}") from None


def reddit_perplexity(params, config, tokenizer, lines: Sequence[str], *, block_size: int = BLOCK_SIZE,
                      batch_size: int = 64, progress: Callable[[int], None] | None = None,
                      stacked: bool = False, bos_id: int | None = None, mesh=None,
                      scorer: PerplexityScorer | None = None) -> dict | list[dict]:
    """LMP of a causal LM on reference lines (paper §3.2).

    Every line is tokenised without special tokens, cut to ``block_size`` tokens and scored by the LMB scorer
    (:class:`rbjax.lmb.perplexity.PerplexityScorer`: length-sorted batches, padding masked out of attention and
    loss); the per-line NLL sums are pooled by :func:`lmp_from_counts`.

    Args:
        params: GPT-2 params pytree (numpy or jax arrays).
        config: its config (any family).
        tokenizer: a :class:`rbjax.model.tokenizer.Tokenizer` (``encode_batch``).
        lines: the utterances (:func:`read_reference_lines`).
        block_size: truncation length in tokens (36 as the reference; must be ≤ ``config.max_positions``).
        batch_size: lines per compiled batch.
        progress: called with the number of lines after each batch.
        stacked: ``params`` carry a leading model axis M (several models, e.g. a sweep chunk's grid points): one
            vmapped pass over the lines, one result per model.
        bos_id: put this token before every line as context (the model's tokenizer adds a BOS:
            :meth:`rbjax.model.handle.ModelHandle.bos_id`), so every line token is predicted; ``None`` (GPT-2, as
            the reference): the first token is context only. Not counted in ``block_size``.
        mesh: a named device mesh (:func:`rbjax.core.mesh.make_mesh`): the parameters split by the family's logical
            axes over ``fsdp``/``tensor``, the rows over ``data``×``fsdp`` (:class:`PerplexityScorer`); ``None``:
            rows over this process's devices, parameters replicated.
        scorer: score with this scorer instead of a :class:`PerplexityScorer` built from ``params`` (one with its
            interface, e.g. :class:`rbjax.lmb.self_debias.SelfDebiasScorer`, whose log-likelihoods are the
            self-debiased ones; its own batch size and BOS apply, not ``batch_size`` and ``bos_id``); not with
            ``stacked`` or ``mesh``.

    Returns:
        :func:`lmp_from_counts`'s dict plus ``n_lines``, ``n_truncated`` (lines longer than ``block_size``),
        ``block_size``, ``bos`` (whether a BOS was put before each line) (a list of M such dicts with ``stacked``).

    Raises:
        ValueError: ``block_size`` out of range, empty ``lines``, or a token id outside the model's vocabulary.
    """

    _check_lines(lines, block_size, config)
    toks, n_trunc = _line_ids(tokenizer, lines, block_size)
    n = len(toks)
    lens = np.array([len(t) for t in toks], np.int64)
    if scorer is not None and (stacked or mesh is not None):
        raise ValueError("a scorer of its own is given: stacked and mesh belong to the scorer built here")
    if scorer is None:
        scorer = PerplexityScorer(params, config, batch_size=batch_size, stacked=stacked, bos_id=bos_id, mesh=mesh)
    try:
        scores = scorer.score_ids(toks, progress=progress)
    except PhraseError as e:
        raise ValueError(f"line {e.index + 1}: {e.problem}") from None
    outs = []
    for sc in (scores if stacked else [scores]):
        out = lmp_from_counts(sc.nll_sum, sc.n_scored, lens)
        out.update(n_lines=n, n_truncated=int(n_trunc), block_size=int(block_size),
                   bos=scorer.bos_id is not None)
        outs.append(out)
    return outs if stacked else outs[0]



def model_perplexity(model: str | os.PathLike, path: str | os.PathLike, *, tokenizer: str | os.PathLike | None = None,
                     block_size: int = BLOCK_SIZE, batch_size: int = 64, max_lines: int | None = None,
                     progress: bool = False) -> dict:
    """LMP of an HF model folder (or hub id, or finished ``rbjax debias`` run folder) on a reference file; the file and its sha256 are recorded.

    Args:
        model: HF folder or hub id. tokenizer: tokenizer folder/hub id (default: the model folder).
        path: the reference file (e.g. ``RedditBiasData().reddit_reference_file()``).
        max_lines: score only the first N non-empty lines (smoke runs; the figure is then not the paper's LMP).

    Returns:
        :func:`reddit_perplexity`'s dict plus ``file``, ``sha256``, ``max_lines``.
    """
    handle = ModelHandle.open(model, tokenizer)
    config, params, tok = handle.load()
    lines = read_reference_lines(path, max_lines)
    bar = None
    if progress:
        bar = progress_bar(len(lines), "LMP", "line")
    try:
        out = reddit_perplexity(params, config, tok, lines, block_size=block_size, batch_size=batch_size,
                                bos_id=handle.bos_id(),
                                progress=None if bar is None else bar.update)
    finally:
        if bar is not None:
            bar.close()
    out.update(file=str(path), sha256=sha256_file(Path(path)), max_lines=max_lines)
    return out
