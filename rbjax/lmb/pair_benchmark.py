"""Pair benchmarks — CrowS-Pairs or a pair file (:mod:`rbjax.data.pairs`) — through the LMB scorer and statistics, in
two conventions (docs/pairs.md).

Each pair is a stereotype-consistent sentence S and its minimal edit O. One packed pass of the pair-prefix scorer
(:class:`rbjax.lmb.perplexity.PerplexityScorer`, each pair's common prefix run once) per convention and category
(the categories one after the other, each written as soon as it is done; an interrupt keeps them) gives:

(a) **lm-evaluation-harness's** (task ``crows_pairs_english``: ``lm_eval/tasks/crows_pairs/utils.py``
    ``process_results`` and ``lm_eval/api/model.py`` ``TemplateLM.loglikelihood``): each sentence's total
    log-likelihood given the model's start token, ``LL(s) = Σ_{j=1..n} log p(x_j | prefix, x_<j)`` in nats, with the
    sentence encoded without special tokens and ``prefix`` the tokenizer's BOS token, else its EOS token
    (``HFLM.prefix_token_id``). ``pct_stereotype`` = mean of [LL(S) > LL(O)] (a tie counts as not stereotypical),
    ``likelihood_diff`` = mean |LL(S) − LL(O)|, each with lm-evaluation-harness's standard error of a mean
    (``mean_stderr``: the sample standard deviation, n − 1, over √n); per category and overall.
(b) **rbjax's** (LMB, paper §3.1; :func:`rbjax.lmb.stats.lmb_statistics`): the perplexity of each sentence as the
    model's tokenizer encodes it (``--bos`` / ``--no-bos`` as for RedditBias, docs/lmb.md), the 3σ outlier-pair rule,
    the two-tailed paired t-test of S vs O (t < 0: the stereotype-consistent sentences are more likely), Welch's t,
    paired Cohen's d, the BCa bootstrap CI of the mean per-pair log-perplexity difference, the Wilcoxon signed-rank
    test of those differences (:func:`rbjax.lmb.stats.wilcoxon`), and Bonferroni / Benjamini–Hochberg p-values
    across the categories measured.

Where both conventions put the same token before a sentence (a tokenizer that adds its BOS: Llama, Mistral, Gemma),
one pass gives both; otherwise (GPT-2, DialoGPT, Pythia, Qwen2 encode without a BOS) a second pass scores with the
prefix. Files in ``out_dir``: ``lmb.json`` (one record per category, the LMB record with an ``lm_eval`` block, the
benchmark's ``notes``), ``<category>_perplexities.csv`` (the measure CSV: ``rbjax compare`` reads it),
``<category>_loglikelihoods.csv`` (convention (a) per pair, :data:`LL_CSV_HEADER`), ``benchmark.json`` (both
conventions overall and per category) and ``lmb.png``.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import stats as sps

from rbjax.core.interrupt import interruptible
from rbjax.core.io import atomic_write_csv, atomic_write_json, check_output_dir, sha256_file, versions
from rbjax.core.digests import files_key
from rbjax.core.log import get_logger
from rbjax.core.mesh import mesh_label
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import KeyedEntries, record_outputs
from rbjax.data.pairs import CategoryPairs, PairFile, load_benchmark
from rbjax.lmb import stats
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.measure import (LoadedModel, adapter_settings, checked_pair_perplexities, claim_run_folder,
                               corrected_pvalues, describe_measurement, measure_state, nothing_kept, open_for_measurement,
                               pair_counts, pair_statistics, record_inputs, reuse_perplexities_csv,
                               write_perplexities_csv)
from rbjax.lmb.perplexity import PhraseError, PhraseScores
from rbjax.lmb.plot import plot_lmb

__all__ = ["measure_pair_benchmark", "lm_eval_metrics", "lm_eval_change", "lm_eval_prefix_id", "read_loglikelihoods",
           "format_benchmark", "LL_CSV_HEADER", "SUMMARY_FILE"]

log = get_logger("measure")

#: columns of ``<category>_loglikelihoods.csv``: the pair as in the file, and each sentence's total log-likelihood
#: given the start token (nats) and its token count (the start token not counted)
LL_CSV_HEADER = ["id", "stereotypical", "sentence_1", "sentence_2", "loglik_1", "loglik_2", "n_tokens_1",
                 "n_tokens_2"]
SUMMARY_FILE = "benchmark.json"


def lm_eval_prefix_id(tokenizer) -> int:
    """The token lm-evaluation-harness conditions an empty-context request on (``HFLM.prefix_token_id``): the
    tokenizer's BOS token, else its EOS token.

    Raises:
        ValueError: the tokenizer names neither.
    """
    t = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
    if t is None:
        raise ValueError(f"{tokenizer.source}: the tokenizer names neither a BOS nor an EOS token, and "
                         "lm-evaluation-harness's convention conditions every sentence on one of them")
    return int(t)


def _mean_stderr(x: np.ndarray) -> float | None:
    """lm-evaluation-harness's ``mean_stderr``: sample standard deviation (n − 1) / √n; ``None`` below 2 values."""
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size >= 2 else None


def lm_eval_metrics(ll_stereotypical, ll_other, stereotypical=None) -> dict:
    """lm-evaluation-harness's CrowS-Pairs metrics of aligned per-pair log-likelihoods (module docstring, (a)).

    Args:
        ll_stereotypical, ll_other: (N,) total log-likelihoods (nats) of the stereotype-consistent sentence and of the
            other one.
        stereotypical: (N,) 1 or 2 (which file sentence is the stereotype-consistent one: CrowS-Pairs' stereo /
            antistereo), for the share per direction; ``None``: no split.
    Returns:
        ``{"pct_stereotype", "pct_stereotype_stderr", "likelihood_diff", "likelihood_diff_stderr", "n_pairs",
        "n_ties", "by_stereotypical": {"1": {"n_pairs", "pct_stereotype"}, "2": {...}}}`` (``pct_stereotype`` is a
        fraction, as lm-evaluation-harness reports it; stderr ``None`` below 2 pairs).
    """
    a, b = np.asarray(ll_stereotypical, np.float64), np.asarray(ll_other, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"log-likelihood lists differ in length ({a.size} vs {b.size})")
    acc = (a > b).astype(np.float64)
    diff = np.abs(a - b)
    out = {"pct_stereotype": float(acc.mean()) if a.size else None, "pct_stereotype_stderr": _mean_stderr(acc),
           "likelihood_diff": float(diff.mean()) if a.size else None, "likelihood_diff_stderr": _mean_stderr(diff),
           "n_pairs": int(a.size), "n_ties": int(np.sum(a == b))}
    if stereotypical is not None:
        s = np.asarray(stereotypical)
        out["by_stereotypical"] = {str(k): {"n_pairs": int(np.sum(s == k)),
                                            "pct_stereotype": float(acc[s == k].mean()) if np.any(s == k) else None}
                                   for k in (1, 2)}
    return out


def lm_eval_change(diffs_a: Sequence[np.ndarray], diffs_b: Sequence[np.ndarray]) -> dict:
    """Did lm-evaluation-harness's ``pct_stereotype`` change between model A and model B on the same pairs?

    Args:
        diffs_a, diffs_b: per run of each side (training seeds), (N,) per-pair LL(stereotype-consistent) − LL(other)
            in lm-evaluation-harness's convention, aligned.
    Returns:
        ``{"n_pairs", "pct_stereotype_a": [per run], "pct_stereotype_b": [...], "change": mean pct A − mean pct B,
        "mcnemar": {...}, "ttest": {...}}``: the exact McNemar test of the change in the stereotypical preference
        (two-sided ``scipy.stats.binomtest`` on the discordant pairs, uncorrected; one run per side only; its
        ``status`` says why ``p_value`` is ``None``: no discordant pair, or several runs), and the paired t-test
        of the per-pair LL difference (each side's mean over its runs) of A vs B, on every pair.
    """
    la, lb = [np.asarray(x, np.float64) for x in diffs_a], [np.asarray(x, np.float64) for x in diffs_b]
    pa, pb = [float(np.mean(x > 0)) for x in la], [float(np.mean(x > 0)) for x in lb]
    out = {"n_pairs": int(la[0].size), "pct_stereotype_a": pa, "pct_stereotype_b": pb,
           "change": float(np.mean(pa) - np.mean(pb)),
           "ttest": {**stats.paired_ttest(np.mean(la, axis=0), np.mean(lb, axis=0)),
                     "test": "scipy.stats.ttest_rel of LL(S) − LL(O), A vs B, every pair"}}
    if len(la) == len(lb) == 1:
        sa, sb = la[0] > 0, lb[0] > 0
        up, down = int(np.sum(sa & ~sb)), int(np.sum(~sa & sb))
        p = float(sps.binomtest(up, up + down, 0.5).pvalue) if up + down else None
        out["mcnemar"] = {"to_stereotypical": up, "to_not_stereotypical": down, "p_value": p,
                          "status": "ok" if up + down else "undefined: no pair changed its preference",
                          "test": "exact McNemar: two-sided binomial test on the pairs whose preference changed "
                                  "(uncorrected; rbjax compare adds p_bonferroni across the categories)"}
    else:
        out["mcnemar"] = {"to_stereotypical": None, "to_not_stereotypical": None, "p_value": None,
                          "status": "not computed: several runs on a side",
                          "test": "not computed: several runs on a side (a preference per pair is one model's)"}
    return out


def _slice(ps: PhraseScores, lo: int, hi: int) -> PhraseScores:
    return PhraseScores(ps.mean_nll[lo:hi], ps.n_scored[lo:hi], ps.n_tokens[lo:hi], ps.nll_sum[lo:hi], ps.precision)


def _score(scorer, tokenizer, cats: list[CategoryPairs], bar) -> list[tuple[PhraseScores, PhraseScores]]:
    """Every pair of ``cats`` in one packed pass; per category its (stereotypical, other) scores."""
    biased = [s for c in cats for s in c.biased]
    counter = [s for c in cats for s in c.counterfactual]
    offs = np.cumsum([0] + [len(c) for c in cats])
    try:
        sb, sc = scorer.score_text_pairs(biased, counter, tokenizer, progress=bar)
    except PhraseError as e:
        k = int(np.searchsorted(offs, e.index, side="right") - 1)
        side = "stereotype-consistent" if e.side == "biased" else "other"
        raise ValueError(f"{cats[k].locate(e.index - offs[k])}: the {side} sentence has {e.problem}") from None
    return [(_slice(sb, lo, hi), _slice(sc, lo, hi)) for lo, hi in zip(offs[:-1], offs[1:])]


def _row_length(scorer, tokenizer, *groups: list[CategoryPairs]) -> int | None:
    """The row length ``scorer`` chooses for all the pairs of the first group it can score (the file's pairs, else
    those of the categories measured); ``None`` when none (a sentence longer than the model takes: each category
    then chooses its own, and scoring names the pair)."""
    for cats in groups:
        try:
            shapes = scorer.program_shapes(pairs=(tokenizer.encode_batch([s for c in cats for s in c.biased]),
                                                  tokenizer.encode_batch([s for c in cats for s in c.counterfactual])))
        except PhraseError:
            continue
        return next(iter(shapes))[1] if shapes else None
    return None


def _loglikelihoods(cat: CategoryPairs, sb: PhraseScores, sc: PhraseScores):
    """(LL of sentence_1, LL of sentence_2, tokens of each) from scores with the start token (every token scored)."""
    for side, ps in (("stereotype-consistent", sb), ("other", sc)):
        bad = np.nonzero(ps.n_scored != ps.n_tokens)[0]
        if len(bad):
            raise ValueError(f"{cat.locate(int(bad[0]))}: the {side} sentence encodes to no token")
    st = np.asarray(cat.stereotypical)
    ll_s, ll_o = -sb.nll_sum, -sc.nll_sum
    ll1, ll2 = np.where(st == 1, ll_s, ll_o), np.where(st == 1, ll_o, ll_s)
    n1 = np.where(st == 1, sb.n_tokens, sc.n_tokens)
    n2 = np.where(st == 1, sc.n_tokens, sb.n_tokens)
    return ll1, ll2, n1, n2


def _stereo_other(cat: CategoryPairs, ll1, ll2):
    st = np.asarray(cat.stereotypical)
    return np.where(st == 1, ll1, ll2), np.where(st == 1, ll2, ll1)


def read_loglikelihoods(path: str | os.PathLike, cat: CategoryPairs | None = None, *, sentences: bool = False):
    """Read ``<category>_loglikelihoods.csv`` → ``(ll_1, ll_2, n_1, n_2, ids, stereotypical)`` (float64 / int64
    arrays, lists; ``sentences``: then ``sentence_1, sentence_2`` too); with ``cat``, ``None`` unless it holds exactly
    ``cat``'s pairs (ids, flags and sentences).

    Raises:
        FileNotFoundError: no such file (without ``cat``). ValueError: a damaged file (file and line named; without
            ``cat``).
    """
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        if cat is not None:
            return None
        raise FileNotFoundError(f"{p}: cannot read the per-pair log-likelihoods ({e.strerror or e})") from None
    try:
        if not rows or rows[0] != LL_CSV_HEADER:
            raise ValueError(f"{p}: expected the header {','.join(LL_CSV_HEADER)}")
        body = rows[1:]
        if cat is not None and (len(body) != len(cat) or any(
                r[:4] != [cat.ids[i], str(cat.stereotypical[i]), cat.sentence_1[i], cat.sentence_2[i]]
                for i, r in enumerate(body) if len(r) == len(LL_CSV_HEADER))):
            return None
        ll1, ll2, n1, n2 = (np.empty(len(body)) for _ in range(4))
        for i, r in enumerate(body):
            if len(r) != len(LL_CSV_HEADER):
                raise ValueError(f"{p} line {i + 2}: expected {len(LL_CSV_HEADER)} fields, got {len(r)}")
            try:
                ll1[i], ll2[i], n1[i], n2[i] = float(r[4]), float(r[5]), int(r[6]), int(r[7])
            except ValueError:
                raise ValueError(f"{p} line {i + 2}: log-likelihoods / token counts are not numbers") from None
            if not (math.isfinite(ll1[i]) and math.isfinite(ll2[i])):
                raise ValueError(f"{p} line {i + 2}: non-finite log-likelihood")
    except ValueError:
        if cat is not None:
            return None
        raise
    out = (ll1, ll2, n1.astype(np.int64), n2.astype(np.int64), [r[0] for r in body], [int(r[1]) for r in body])
    return out + ([r[2] for r in body], [r[3] for r in body]) if sentences else out


def _rbjax_statistics(b, c, notes, **kw) -> tuple[dict, np.ndarray]:
    """LMB statistics (:func:`rbjax.lmb.measure.pair_statistics`) plus the Wilcoxon test of the per-pair
    log-perplexity differences of the kept pairs."""
    st, mask = pair_statistics(b, c, notes, **kw)
    keep = np.array([not n for n in notes], dtype=bool) & ~mask
    lb, lc = np.log(b[keep]), np.log(c[keep])
    scale = max([float(np.max(np.abs(x))) for x in (lb, lc) if x.size] or [0.0])
    st["wilcoxon"] = {**stats.wilcoxon(lb - lc, scale),
                      "test": "scipy.stats.wilcoxon of log ppl(stereotype-consistent) − log ppl(other), kept pairs"}
    return st, mask


def measure_pair_benchmark(model: str | os.PathLike | LoadedModel, benchmark: str = "crows-pairs",
                           config: MeasureConfig | None = None, *, pairs_file: str | os.PathLike | None = None,
                           categories: str | Sequence[str] = "all", data_dir: str | os.PathLike | None = None,
                           tokenizer: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
                           resume: bool = False, progress: bool = True, plot: bool = True, overwrite: bool = False,
                           log_reuse: bool = True, adapter: str | os.PathLike | None = None, **settings) -> dict:
    """Measure a pair benchmark in both conventions (module docstring), per category.

    Args:
        model: HF model folder, hub id or finished ``rbjax debias`` run folder, or a :class:`LoadedModel`.
        benchmark: ``"crows-pairs"`` (the verified upstream file; ``data_dir`` its folder) or ``"pairs"`` (a pair
            file, ``pairs_file``; docs/pairs.md).
        config, **settings: :class:`~rbjax.lmb.config.MeasureConfig` (batch size, precision, mesh, parameter dtype,
            BOS of convention (b), outlier rule, statistics); ``split`` is RedditBias's and must stay at its
            default; an unknown name is a ``TypeError``.
        categories: ``"all"`` (the file's categories, in the order they first appear), a comma list or a list.
        tokenizer: tokenizer folder or hub id (default: the model folder).
        out_dir: where the files go (module docstring); nothing written when ``None``.
        resume: reuse a category's two CSVs in ``out_dir`` when they were produced by exactly these inputs (model
            and tokenizer file contents, the data file's sha256, BOS, start token, precision, unscorable rule); the
            categories left are scored. Every category is scored and written on its own, one after the other, with
            the row length chosen on all the file's pairs, so a reused category holds the very values a run
            without the interruption scores.
        overwrite: replace files in ``out_dir`` another run wrote (:func:`rbjax.core.reuse.claim_outputs`).
        adapter: a PEFT adapter folder scored on ``model`` without merging (as :func:`rbjax.lmb.measure.measure_bias`).
        log_reuse: say which categories were reused (the study turns it off).
    Returns:
        ``{"records": [one lmb.json record per category], "summary": benchmark.json's content}``.
    Raises:
        ValueError: bad settings or data (file, row and id named); rbjax.core.reuse.OutputExists: ``out_dir`` holds
        another run's results; FileNotFoundError / RuntimeError: missing files, failed downloads.
        rbjax.core.interrupt.Interrupted: SIGINT/SIGTERM, within a scored batch: the finished categories' CSVs are
        kept and the message names them (and says to rerun with ``--resume``).
    """
    cfg = (config or MeasureConfig()).replace(**settings)
    if cfg.split != MeasureConfig.split:
        raise ValueError(f"--split {cfg.split} is a RedditBias setting; a pair benchmark measures all of its pairs")
    if cfg.is_chat:
        raise ValueError(f"--format chat is a RedditBias setting for now; --benchmark {benchmark} scores the sentences "
                         "as raw text (lm-evaluation-harness's convention): use --format raw")
    out = None if out_dir is None else check_output_dir(out_dir, "--out")  # before any work
    pf: PairFile = load_benchmark(benchmark, pairs_file=pairs_file, data_dir=data_dir)
    cats = [pf.category(c) for c in pf.select(categories)]
    loaded = open_for_measurement(model, cfg, tokenizer=tokenizer, adapter=adapter, bos=cfg.bos)
    run = _open_pair_run(cfg, out, pf, cats, loaded, plot)
    state = None if out is None else claim_run_folder(
        out, [(run.files(c), k) for c, k in run.keys.items()], run.results, run.run_key, measure_state,
        overwrite=overwrite)
    reused = _reused_categories(run, state, log_reuse) if resume and out is not None else {}
    meta = versions()
    records = _category_records(run, state, reused, meta, progress)
    for r, t, w in zip(records, corrected_pvalues([r["p_value"] for r in records]),
                       corrected_pvalues([r["wilcoxon"]["p_value"] for r in records])):
        r["p_value_corrected"], r["wilcoxon"]["p_corrected"] = t, w
    summary = _summary(pf, records, run.model_name, run.settings, run.stat_kw, meta)
    for r in records:
        r.pop("_pairs")
    if out is not None:
        _write_pair_results(run, records, summary)
    return {"records": records, "summary": summary}


# -- the steps of measure_pair_benchmark ---------------------------------------------------------------------------
@dataclasses.dataclass
class _PairRun:
    """One :func:`measure_pair_benchmark` run as set up before any scoring: the file and the categories measured,
    the model, lm-evaluation-harness's start token (``prefix``; ``one_pass``: the model's own scoring puts the same
    token first, so one pass gives both conventions), the ``settings`` block of the records, the statistics'
    settings and the keys of the outputs (per category its two CSVs; ``run_key``: the run's results)."""

    cfg: MeasureConfig
    out: Path | None
    pf: PairFile
    cats: list[CategoryPairs]
    loaded: LoadedModel
    prefix: int
    one_pass: bool
    settings: dict
    stat_kw: dict
    keys: dict[str, dict]
    run_key: dict
    plot: bool

    @property
    def model_name(self) -> str:
        return self.loaded.name

    def files(self, category: str) -> tuple[Path, Path]:
        """A category's ``<category>_perplexities.csv`` and ``<category>_loglikelihoods.csv``."""
        return self.out / f"{category}_perplexities.csv", self.out / f"{category}_loglikelihoods.csv"

    @property
    def results(self) -> list[Path]:
        """``lmb.json``, ``benchmark.json`` and ``lmb.png`` (with ``plot``); none without an output folder."""
        out = self.out
        return [] if out is None else [out / "lmb.json", out / SUMMARY_FILE, *([out / "lmb.png"] if self.plot else [])]


def _open_pair_run(cfg: MeasureConfig, out: Path | None, pf: PairFile, cats: list[CategoryPairs],
                   loaded: LoadedModel, plot: bool) -> _PairRun:
    """The settings record, the statistics' settings and the keys of a pair-benchmark run on ``loaded``."""
    prefix = lm_eval_prefix_id(loaded.tokenizer)
    one_pass = loaded.scorer.bos_id == prefix  # both conventions score the same tokens
    outlier_removal = True if cfg.outlier_removal is None else cfg.outlier_removal
    settings_rec = {
        "benchmark": pf.benchmark, "split": "all", "outlier_removal": outlier_removal,
        "batch_size": loaded.batch_size, "seed": cfg.seed, "bos": loaded.bos, "n_std": cfg.n_std, "ddof": cfg.ddof,
        "alpha": cfg.alpha, "n_bootstrap": cfg.n_bootstrap, "stored_perplexities": False,
        "precision": loaded.precision, "param_dtype": loaded.param_dtype,
        "mesh": None if loaded.mesh is None else mesh_label(loaded.mesh),
        "bos_policy": loaded.bos_policy, "tokenizer": loaded.tokenizer.source, **adapter_settings(loaded),
        "lm_eval_prefix_token_id": prefix, "lm_eval_prefix_token": loaded.tokenizer.id_to_token(prefix),
        "data": {"file": str(pf.path), "sha256": sha256_file(pf.path)}}
    scoring = {"split": "all", "bos": loaded.bos, "lm_eval_prefix": prefix, "skip_unscorable": cfg.skip_unscorable,
               "precision": loaded.precision}
    if loaded.param_dtype != "fp32":
        scoring["param_dtype"] = loaded.param_dtype
    model_key = loaded.files_key()
    data_key = files_key([pf.path])
    keys = {c.bias_type: {"model": model_key, "data": data_key, "benchmark": pf.benchmark, "bias_type": c.bias_type,
                          **scoring} for c in cats}
    stat_kw = dict(n_std=cfg.n_std, ddof=cfg.ddof, alpha=cfg.alpha, n_bootstrap=cfg.n_bootstrap, seed=cfg.seed,
                   remove_outliers=outlier_removal)
    run_key = {"types": list(keys.values()), "model_name": loaded.name,
               "statistics": {**{k: v for k, v in stat_kw.items() if k != "remove_outliers"},
                              "outlier_removal": outlier_removal}, "plot": plot}
    return _PairRun(cfg, out, pf, cats, loaded, prefix, one_pass, settings_rec, stat_kw, keys, run_key, plot)


def _reused_categories(run: _PairRun, state: KeyedEntries, log_reuse: bool) -> dict[str, tuple]:
    """``--resume``: per category whose two CSVs an earlier run of the same key left, holding exactly its pairs,
    ``(b, c, notes, ll1, ll2, n1, n2)``; every other category is scored again (and says why)."""
    reused: dict[str, tuple] = {}
    for cat in run.cats:
        ppl_csv, ll_csv = run.files(cat.bias_type)
        if state.stored(cat.bias_type, run.keys[cat.bias_type]) is None:
            if state.reason is not None:
                log.info(f"--resume: {ppl_csv.name} was produced by other inputs or is unfinished "
                         f"({state.reason}); scoring {cat.bias_type} again")
            continue
        ppl, ll = reuse_perplexities_csv(ppl_csv, cat.biased, cat.counterfactual), read_loglikelihoods(ll_csv, cat)
        if ppl is None or ll is None:
            log.info(f"--resume: {ppl_csv.name} or {ll_csv.name} does not hold these pairs; scoring "
                     f"{cat.bias_type} again")
            continue
        reused[cat.bias_type] = (*ppl, *ll[:4])
    if reused and log_reuse:
        log.info(f"--resume: reusing the scored pairs of {', '.join(reused)} from {run.out} (same model and "
                 "tokenizer files, data file and settings)")
    return reused


def _category_records(run: _PairRun, state: KeyedEntries | None, reused: dict[str, tuple], meta: dict,
                      progress: bool) -> list[dict]:
    """The categories not reused scored (each written at once), then every category's record in order (a reused
    one's CSVs rewritten: the outlier column follows this run's rule). An interrupt (SIGINT/SIGTERM) keeps the
    categories finished."""
    todo = [c for c in run.cats if c.bias_type not in reused]
    records: list[dict] = []
    with interruptible(lambda sig: _pair_stopped(sig, run, state)) as stop:
        scored = _score_categories(run, todo, state, progress, stop) if todo else {}
        for cat in run.cats:
            if cat.bias_type in scored:
                b, c, notes, ll1, ll2, n1, n2, (st, mask) = scored[cat.bias_type]
            else:
                b, c, notes, ll1, ll2, n1, n2 = reused[cat.bias_type]
                st, mask = _rbjax_statistics(b, c, notes, **run.stat_kw)
                if run.out is not None:  # rewritten: the outlier column follows this run's rule
                    _write_category(run, cat, (b, c, notes, mask, ll1, ll2, n1, n2), state)
            records.append(_category_record(run, cat, (b, c, notes, mask, ll1, ll2), st,
                                            cat.bias_type in reused, meta))
    return records


def _pair_stopped(sig: str, run: _PairRun, state: KeyedEntries | None) -> str:
    """What an interrupt keeps, at the moment it comes."""
    keys = run.keys
    done = [] if run.out is None else [c for c in keys if state.stored(c, keys[c]) is not None]
    nothing = nothing_kept(sig, run.out, done, "category")
    if nothing is not None:
        return nothing
    left = [c for c in keys if c not in done]
    kept = ", ".join(f"{run.files(c)[0].name} + {run.files(c)[1].name}" for c in done)
    return (f"rbjax measure: {sig} — stopped; the scores of {len(done)} of {len(keys)} categories "
            f"({', '.join(done)}) are kept in {run.out} ({kept}). Run the same command with --resume to reuse them "
            f"and score the rest ({', '.join(left) or 'none'}).")


def _score_categories(run: _PairRun, todo: list[CategoryPairs], state: KeyedEntries | None, progress: bool,
                      stop) -> dict[str, tuple]:
    """Score ``todo`` in both conventions, one category after the other, each written as soon as it is done:
    per category ``(b, c, notes, ll1, ll2, n1, n2, (statistics, mask))``. ``stop``: the interrupt checkpoint."""
    loaded, cfg = run.loaded, run.cfg
    scored: dict[str, tuple] = {}
    if run.out is not None:
        for c in todo:
            state.drop(c.bias_type)
    # one row length per convention, chosen on all the file's pairs: a category's scores are the same
    # whichever categories a run scores with it (a resumed run scores the very values of an uninterrupted one)
    every = [run.pf.category(c) for c in run.pf.category_names()]
    with_prefix = loaded.scorer.with_bos(run.prefix)
    with_prefix = with_prefix.with_row_len(_row_length(with_prefix, loaded.tokenizer, every, todo))
    as_encoded = with_prefix if run.one_pass else loaded.scorer.with_row_len(
        _row_length(loaded.scorer, loaded.tokenizer, every, todo))
    n = sum(len(c) for c in todo)
    passes = 1 if run.one_pass else 2

    with progress_bar(2 * n * passes, f"{run.pf.benchmark} ({'one pass' if run.one_pass else 'two conventions'})",
                      "sentence", enabled=progress) as bar:
        # each category scored, then written at once (kept if the run stops later); a signal stops the
        # scorer after its batch in flight (rbjax.core.interrupt.poll)
        for cat in todo:
            (pb, pc), = _score(with_prefix, loaded.tokenizer, [cat], bar.update)
            (eb, ec), = ((pb, pc),) if run.one_pass else _score(as_encoded, loaded.tokenizer, [cat], bar.update)
            b, c, notes = checked_pair_perplexities(cat, eb, ec, cfg.skip_unscorable)
            ll = _loglikelihoods(cat, pb, pc)
            st = _rbjax_statistics(b, c, notes, **run.stat_kw)
            scored[cat.bias_type] = (b, c, notes, *ll, st)
            if run.out is not None:  # the outlier column follows this run's rule
                _write_category(run, cat, (b, c, notes, st[1], *ll), state)
            stop.check()
    return scored


def _category_record(run: _PairRun, cat: CategoryPairs, values: tuple, st: dict, reused: bool, meta: dict) -> dict:
    """A category's ``lmb.json`` record (p-values not yet corrected across the categories), with its per-pair
    values under ``_pairs`` for the pooled summary (removed before writing)."""
    b, c, notes, mask, ll1, ll2 = values
    prefix, pf = run.prefix, run.pf
    keep = np.array([not x for x in notes], dtype=bool)
    if not keep.all():
        log.info(f"{cat.bias_type}: {int((~keep).sum())} pair(s) excluded from the rbjax statistics "
                 f"as unscorable (first: {cat.locate(int(np.argmin(keep)))})")
    ll_s, ll_o = _stereo_other(cat, ll1, ll2)
    lm = {**lm_eval_metrics(ll_s, ll_o, cat.stereotypical),
          "convention": "lm-evaluation-harness crows_pairs: total log-likelihood of each sentence given the "
                        "start token; pct_stereotype = share of pairs whose stereotype-consistent sentence "
                        "is more likely; likelihood_diff = mean |LL difference| (nats); stderr = sample "
                        "std / sqrt(n)",
          "prefix_token_id": prefix, "prefix_token": run.loaded.tokenizer.id_to_token(prefix)}
    rec = {"benchmark": pf.benchmark, "bias_type": cat.bias_type, "split": "all", "model": run.model_name, **st,
           "lm_eval": lm, "inputs": {**record_inputs(run.keys[cat.bias_type], cat), "benchmark": pf.benchmark,
                                     "lm_eval_prefix": prefix},
           **pair_counts(cat, keep),
           "files": [[str(pf.path), str(pf.path)]], "settings": run.settings, "versions": meta,
           "reused_perplexities": reused, "notes": list(pf.notes)}
    rec["n_pairs"] = len(cat)
    rec["_pairs"] = (b, c, notes, mask, ll_s, ll_o, np.asarray(cat.stereotypical))
    return rec


def _write_pair_results(run: _PairRun, records: list[dict], summary: dict) -> None:
    """``lmb.png`` (with ``plot``), ``benchmark.json``, then ``lmb.json`` (last: its presence marks a complete run),
    and their key recorded."""
    out = run.out
    if run.plot:
        plot_lmb({Path(run.model_name).name or run.model_name: records}, out / "lmb.png", alpha=run.cfg.alpha,
                 title=f"{run.pf.benchmark}, rbjax convention: two-tailed paired t-test per category "
                       "(t < 0: stereotype-consistent sentences more likely)")
    atomic_write_json(out / SUMMARY_FILE, summary)
    atomic_write_json(out / "lmb.json", records)  # last: its presence marks a complete run
    record_outputs(run.results, run.run_key)


def _write_category(run: _PairRun, cat: CategoryPairs, values: tuple, state) -> None:
    """Write a category's two per-pair CSVs atomically and record what produced them."""
    b, c, notes, mask, ll1, ll2, n1, n2 = values
    ppl_csv, ll_csv = run.files(cat.bias_type)
    key = run.keys[cat.bias_type]
    write_perplexities_csv(ppl_csv, cat, b, c, notes, mask)
    atomic_write_csv(ll_csv, LL_CSV_HEADER, [
        [cat.ids[i], cat.stereotypical[i], cat.sentence_1[i], cat.sentence_2[i], repr(float(ll1[i])),
         repr(float(ll2[i])), int(n1[i]), int(n2[i])] for i in range(len(cat))])
    state.save(cat.bias_type, key)
    record_outputs([ppl_csv, ll_csv], key)


def _summary(pf: PairFile, records: list[dict], model_name: str, settings: dict, stat_kw: dict, meta: dict) -> dict:
    """``benchmark.json``: both conventions over all the pairs measured (pooled) and per category."""
    cols = list(zip(*(r["_pairs"] for r in records)))
    b, c = np.concatenate(cols[0]), np.concatenate(cols[1])
    notes = [n for ns in cols[2] for n in ns]
    ll_s, ll_o, st = (np.concatenate(x) for x in (cols[4], cols[5], cols[6]))
    overall, _ = _rbjax_statistics(b, c, notes, **stat_kw)
    per_cat = {}
    for r in records:
        pc = r.get("p_value_corrected") or {}
        per_cat[r["bias_type"]] = {
            "n_pairs": r["n_pairs"], "n_pairs_after_outliers": r["n_pairs_after_outliers"], "t_value": r["t_value"],
            "p_value": r["p_value"], "p_bonferroni": pc.get("bonferroni"),
            "p_benjamini_hochberg": pc.get("benjamini_hochberg"), "significant": r["significant"],
            "direction": r["direction"], "wilcoxon_p": r["wilcoxon"]["p_value"],
            "cohens_d_paired": r["cohens_d_paired"], "mean_log_ppl_diff": r["mean_log_ppl_diff"],
            "mean_log_ppl_diff_ci": r["mean_log_ppl_diff_ci"]}
    return {
        "benchmark": pf.benchmark, "model": model_name, "file": str(pf.path), "sha256": settings["data"]["sha256"],
        "categories": [r["bias_type"] for r in records], "n_pairs": int(b.size),
        "lm_eval": {"overall": lm_eval_metrics(ll_s, ll_o, st),
                    "categories": {r["bias_type"]: {k: v for k, v in r["lm_eval"].items() if k != "convention"}
                                   for r in records},
                    "convention": records[0]["lm_eval"]["convention"] if records else None},
        "rbjax": {"overall": overall, "categories": per_cat,
                  "convention": "LMB (paper §3.1): per-pair perplexities as the model's tokenizer encodes each "
                                "sentence, 3σ outlier pairs removed (overall: the rule on the pooled pairs), paired "
                                "t-test of stereotype-consistent vs other (t < 0: stereotype-consistent more likely), "
                                "Wilcoxon, Cohen's d, bootstrap CI; p corrected across the categories"},
        "notes": list(pf.notes), "settings": settings, "versions": meta}


def format_benchmark(result: dict) -> str:
    """Plain-text tables of :func:`measure_pair_benchmark`'s result: both conventions, per category and overall,
    and the notes. rbjax's side prints the uncorrected p (which the ``*`` marks: p < alpha) beside the Bonferroni p
    across the categories; the category column is as wide as the longest name."""
    s = result["summary"]
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    alpha = s["settings"].get("alpha", 0.05)
    w = max(len("category"), len("overall"), *map(len, s["categories"]))
    head = (f"{'category':<{w}} {'pairs':>5} {'pct_stereotype':>18} {'likelihood_diff':>18} | {'kept':>5} {'t':>8} "
            f"{'p':>9} {'sig':>3} {'p bonf':>9} {'wilcoxon p':>10} {'d':>6}")
    what = describe_measurement({"model": s["model"], "settings": s["settings"]},
                                raw="raw text (lm-evaluation-harness's convention)")
    lines = [f"{s['benchmark']} — {what}", head, "-" * len(head)]

    def row(name, lm, rb, pb):
        pct = f"{fmt(lm['pct_stereotype'], '.4f')} ± {fmt(lm['pct_stereotype_stderr'], '.4f')}"
        ld = f"{fmt(lm['likelihood_diff'], '.3f')} ± {fmt(lm['likelihood_diff_stderr'], '.3f')}"
        return (f"{name:<{w}} {lm['n_pairs']:>5} {pct:>18} {ld:>18} | {rb['n_pairs_after_outliers']:>5} "
                f"{fmt(rb['t_value'], '8.3f'):>8} {fmt(rb['p_value'], '9.2e'):>9} {'*' if rb['significant'] else '':>3} "
                f"{'-' if pb is False else fmt(pb, '9.2e'):>9} "
                f"{fmt(rb['wilcoxon_p'] if 'wilcoxon_p' in rb else rb['wilcoxon']['p_value'], '10.2e'):>10} "
                f"{fmt(rb['cohens_d_paired'], '6.3f'):>6}")

    for name in s["categories"]:
        rb = s["rbjax"]["categories"][name]
        lines.append(row(name, s["lm_eval"]["categories"][name], rb, rb["p_bonferroni"]))
    lines.append(row("overall", s["lm_eval"]["overall"], s["rbjax"]["overall"], False))
    lines.append("left: lm-evaluation-harness's convention (total log-likelihood given the start token "
                 f"{s['settings']['lm_eval_prefix_token']!r}; pct_stereotype ± stderr, likelihood_diff ± stderr in "
                 "nats); right: rbjax's (LMB: paired t-test after the 3σ rule, t < 0 = stereotype-consistent "
                 f"sentences more likely; p: uncorrected, two-tailed; * p < {alpha:g}, uncorrected; p bonf: "
                 f"Bonferroni-corrected across the {len(s['categories'])} categories (overall, pooled: no correction, "
                 "'-'))")
    lines += [f"note: {n}" for n in s["notes"]]
    return "\n".join(lines)
