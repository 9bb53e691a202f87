"""The small grid of a method without training in a study (docs/debiasing.md §10, "A grid in the study"): each
value's run (SentenceDebias's k, INLP's iterations, Self-Debias's λ) measured on the valid split as a trained sweep's
grid points are — the debiased type's dev LMB (:func:`rbjax.debias.sweep.dev_lmb`) and the Reddit-6K LMP
(:func:`rbjax.dialog.reddit_perplexity.reddit_perplexity`, with [training]'s LMP settings) — and selected by the same
rules (:func:`rbjax.debias.sweep.select`) against the starting model's LMP.

Self-Debias rescales the next-token distribution at decoding time: its LMB and its LMP are both scored with the
rescaling (:class:`rbjax.lmb.self_debias.SelfDebiasScorer`, as ``rbjax evaluate --task lmp`` scores a Self-Debias run
folder), so its points are selected by the same rules as the others'.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.core.io import atomic_write_csv, atomic_write_json, versions
from rbjax.data.redditbias import RedditBiasData
from rbjax.debias.config import DebiasRun
from rbjax.debias.run import lmp_reference_file
from rbjax.debias.sweep import dev_lmb, select
from rbjax.debias.sweep_config import SweepConfig
from rbjax.dialog.reddit_perplexity import read_reference_lines, reddit_perplexity
from rbjax.lmb.self_debias import SelfDebiasScorer
from rbjax.model.chat import ChatSettings
from rbjax.model.handle import ModelHandle

__all__ = ["PointEvaluation", "select_no_training", "write_selection"]


@dataclasses.dataclass
class PointEvaluation:
    """How a grid point is measured: the debiased type's valid pairs, the LMP lines, and the sweep's settings.

    Attributes:
        base: the [training] settings (a :class:`DebiasRun`: bias type, data folder, LMP file and lines, block size,
            evaluation batch size, seed). sweep: the [sweep] settings (bootstrap, ``dev_max_pairs``, LMP tolerance).
        chat: the format the phrases are scored in (``None``: raw). lmp_lines: the Reddit-6K lines (``None``:
            [training] lmp = false).
    """

    base: DebiasRun
    sweep: SweepConfig
    chat: ChatSettings | None
    lmp_lines: list[str] | None
    data: RedditBiasData
    _baseline: dict | None = None

    @classmethod
    def of(cls, base: DebiasRun, sweep: SweepConfig, *, chat: ChatSettings | None = None) -> "PointEvaluation":
        """Raises FileNotFoundError, ValueError: a missing or unreadable LMP reference file."""
        lines = read_reference_lines(lmp_reference_file(base), base.evaluation.lmp_max_lines) \
            if base.evaluation.lmp else None
        return cls(base, sweep, chat, lines, RedditBiasData(base.debias.data_dir))

    def evaluate(self, model: str | Path) -> tuple[dict, dict | None]:
        """``(dev, lmp)`` of a model (a folder, or a run folder: SentenceDebias/INLP's folded model, a Self-Debias
        run scored with its rescaling): :func:`rbjax.debias.sweep.dev_lmb`'s record and ``{perplexity,
        reference_grid, reference_cda}`` (``None`` without LMP)."""
        handle = ModelHandle.open(model)
        handle.self_debias_accepted = True  # scored with the rescaling below
        config, params, tok = handle.load()
        e = self.base.evaluation
        turns = None if self.chat is None else self.chat.chat_turns(tok)

        def rescaled(bos_id):  # Self-Debias: a scorer of the rescaled log-likelihoods; otherwise the plain one (None)
            if handle.self_debias is None:
                return None
            return SelfDebiasScorer(params, config, handle.self_debias_prefix_ids(), handle.self_debias,
                                    batch_size=e.eval_batch_size, bos_id=bos_id)

        scorer = rescaled(tok.default_bos_id if turns is None else None)  # the BOS rule of dev_lmb's own scorer
        dev = dev_lmb(params, config, tok, self.base.debias.bias_type, self.data, batch_size=e.eval_batch_size,
                      n_bootstrap=self.sweep.n_bootstrap, seed=self.base.trainer.seed,
                      max_pairs=self.sweep.dev_max_pairs, chat=turns, scorer=scorer)
        lmp = None
        if self.lmp_lines is not None:  # raw lines, the tokenizer's own BOS rule: the raw format's scorer serves
            lmp_scorer = scorer if turns is None else rescaled(tok.default_bos_id)
            full = reddit_perplexity(params, config, tok, self.lmp_lines, block_size=self.base.trainer.block_size,
                                     batch_size=e.eval_batch_size, bos_id=tok.default_bos_id, scorer=lmp_scorer)
            lmp = {k: full[k] for k in ("perplexity", "reference_grid", "reference_cda")}
        return dev, lmp

    @property
    def baseline(self) -> dict:
        """``{"dev", "lmp"}`` of the starting model (computed once)."""
        if self._baseline is None:
            dev, lmp = self.evaluate(self.base.model)
            self._baseline = {"dev": dev, "lmp": lmp}
        return self._baseline


def select_no_training(records: list[dict], ev: PointEvaluation, method: str, sweep: dict) -> dict:
    """Both selection rules of :func:`rbjax.debias.sweep.select` on the grid's records (``id``, ``point``, ``dev``,
    ``lmp``), against the starting model's LMP, with the baseline, the method and the versions recorded."""
    base_lmp = (ev.baseline.get("lmp") or {}).get("perplexity")
    sel = select(records, base_lmp, ev.sweep.lmp_tolerance)
    sel.update(method=method, baseline=ev.baseline, n_points_planned=len(records), settings=dict(sweep),
               training_free=True, versions=versions())
    return sel


def write_selection(folder: Path, sel: dict, records: list[dict]) -> None:
    """``folder/selection.json`` (``sel``) and ``folder/sweep.csv`` (one row a point: its setting and value, dev t
    and p, the reference's t and p, LMP)."""
    header = ["id", "setting", "value", "dev_t", "dev_p", "dev_ref_t", "dev_ref_p", "lmp"]
    rows = []
    for r in records:
        (name, value), = r["point"].items()
        rows.append([r["id"], name, value, r["dev"]["t_value"], r["dev"]["p_value"], r["dev"]["reference"]["t_value"],
                     r["dev"]["reference"]["p_value"], (r.get("lmp") or {}).get("perplexity")])
    atomic_write_csv(folder / "sweep.csv", header, rows)
    atomic_write_json(folder / "selection.json", {**sel, "records": records})
