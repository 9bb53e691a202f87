"""Language model bias (LMB) of a model on the RedditBias phrase pairs — the pipeline (paper §3.1).

data → tokens → model → perplexities → statistics → ``lmb.json`` / ``<type>_perplexities.csv`` / ``lmb.png``.
"""
from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from rbjax.core.digests import files_key
from rbjax.core.interrupt import interruptible
from rbjax.core.io import atomic_write_csv, atomic_write_json, check_output_dir, versions
from rbjax.core.keys import digest
from rbjax.core.log import get_logger
from rbjax.core.mesh import mesh_label, mesh_of
from rbjax.core.progress import progress_bar
from rbjax.core.reuse import KeyedEntries, claim_outputs, record_outputs
from rbjax.data.redditbias import PhrasePairs, RedditBiasData, expand_bias_types, load_pairs
from rbjax.lmb import stats
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.perplexity import PerplexityScorer, PhraseError
from rbjax.lmb.plot import plot_lmb
from rbjax.lmb.self_debias import SelfDebiasScorer
from rbjax.model.chat import ChatError, ChatTurns, describe_chat
from rbjax.model.handle import ModelHandle
from rbjax.model.peft_adapter import adapter_files_key, check_adapter_base, load_adapter

log = get_logger("measure")

#: columns of ``<bias_type>_perplexities.csv``; ``outlier`` is ``true``/``false``, or ``excluded`` for a pair
#: that was not tested (reason in ``note``, e.g. an unscorable phrase)
CSV_HEADER = ["biased_phrase", "counterfactual_phrase", "biased_ppl", "counterfactual_ppl", "outlier", "note"]
STATE_FILE = ".rbjax_measure_run.json"  # what produced each CSV of an out folder (per bias type; for --resume)
STATE_VERSION = 3  # 3: {type: {key, status}} (KeyedEntries); 2: {type: key}, read as such
STORED_LABEL = "stored perplexities (the data files' perplexity columns)"


def _upgrade_state(old: dict) -> dict:
    """Entries of a version-2 state file (``{type: key}``, each a finished CSV); nothing from other versions."""
    types = old.get("types") if old.get("version") == 2 else None
    return {t: {"key": k, "status": "done"} for t, k in types.items()} if isinstance(types, dict) else {}


def measure_state(out: str | os.PathLike) -> KeyedEntries:
    """What produced each ``<type>_perplexities.csv`` of a measure folder: one keyed entry per bias type
    (:class:`rbjax.core.reuse.KeyedEntries` in ``OUT/.rbjax_measure_run.json``; the ``--resume`` record)."""
    return KeyedEntries(Path(out) / STATE_FILE, "types", STATE_VERSION, _upgrade_state)


def reuse_perplexities_csv(path: Path, biased: Sequence[str], counterfactual: Sequence[str]):
    """The perplexities of an earlier run's per-pair CSV (:data:`CSV_HEADER`) when it holds exactly these pairs, in
    this order: ``(biased (N,), counterfactual (N,), notes)`` (NaN and the note for an excluded pair), else ``None``
    (no file, another header, other pairs, an unreadable value)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError:
        return None
    n = len(biased)
    if not rows or rows[0] != CSV_HEADER or len(rows) - 1 != n:
        return None
    b, c, notes = np.empty(n), np.empty(n), []
    for i, r in enumerate(rows[1:]):
        if len(r) != len(CSV_HEADER) or r[0] != biased[i] or r[1] != counterfactual[i]:
            return None
        if r[4] == "excluded":
            b[i] = c[i] = np.nan
            notes.append(r[5])
            continue
        try:
            b[i], c[i] = float(r[2]), float(r[3])
        except ValueError:
            return None
        notes.append("")
    return b, c, notes


class LoadedModel:
    """A model handle (:class:`rbjax.model.handle.ModelHandle`) with its packed scorer, loaded once and reused across
    bias types (a Self-Debias run folder: a :class:`rbjax.lmb.self_debias.SelfDebiasScorer`, whose log-probabilities
    are the rescaled ones).

    Build it from a folder, hub id or finished ``rbjax debias`` run folder (``LoadedModel(model, tokenizer, ...)``),
    or from parameters already in memory (:meth:`from_params`: the sweep's grid points and a finished training run
    are measured without writing and re-reading a model). Per-type results are reused under the content of the
    weights, the tokenizer and a PEFT adapter scored on the model, if any (:meth:`files_key`).

    ``bos``: ``None`` (default) scores a phrase as the model's own tokenizer encodes it (a BOS before it where the
    tokenizer adds one); ``True``/``False`` force it (:meth:`rbjax.model.handle.ModelHandle.bos_id`). The resolved
    choice is :attr:`bos`.
    """

    def __init__(self, model: str | os.PathLike | ModelHandle, tokenizer: str | os.PathLike | None = None,
                 batch_size: int = 64, bos: bool | None = None, precision: str = "fp32", *, mesh=None,
                 param_dtype: str = "fp32", adapter: str | os.PathLike | None = None, allow_other_base: bool = False):
        if isinstance(model, ModelHandle):  # the command's handle (it planned the memory with it)
            if tokenizer is not None:
                raise ValueError("a ModelHandle brings its own tokenizer source")
            handle = model
        else:
            handle = ModelHandle.open(model, tokenizer)
        base = None
        if adapter is not None:  # before the weights are read: an adapter of another base is refused at once
            base = check_adapter_base(adapter, handle.folder, allow_other_base=allow_other_base)
            if base["same"] is False:
                log.warning(f"--allow-other-base: scoring {adapter} on {handle.name}, whose weights are not those the "
                            "adapter was trained on")
        handle.self_debias_accepted = True  # a Self-Debias run folder: scored with the rescaling (_setup)
        handle.load(mesh=mesh)  # on an fsdp/tensor mesh: each device reads its slices of the weights
        params = None
        if adapter is not None:  # a PEFT adapter on the base, unmerged (rbjax.model.peft_adapter)
            params, _ = load_adapter(adapter, handle.params, handle.config)
        self._setup(handle, batch_size, bos, precision, mesh, param_dtype, params=params, adapter=adapter)
        #: ``{"recorded", "base", "same"}`` of :func:`rbjax.model.peft_adapter.check_adapter_base` (None without
        #: an adapter)
        self.adapter_base = base

    @classmethod
    def from_params(cls, params, config, tokenizer, *, name: str, digest: str, batch_size: int = 64, bos: bool | None = None,
                    precision: str = "fp32", mesh=None, param_dtype: str = "fp32") -> "LoadedModel":
        """A model already in memory: ``params`` of ``config``, a loaded ``tokenizer``, a display ``name`` and its
        content ``digest`` (e.g. :func:`rbjax.core.keys.tree_digest` of the params, or the digest of the files
        they were exported to)."""
        self = cls.__new__(cls)
        self._setup(ModelHandle.from_params(params, config, tokenizer, name=name, digest=digest), batch_size, bos, precision,
                    mesh, param_dtype)
        return self

    def _setup(self, handle, batch_size, bos, precision, mesh=None, param_dtype="fp32", *, params=None,
               adapter=None) -> None:
        self.handle = handle
        self.adapter = None if adapter is None else str(adapter)
        self.adapter_base = None
        self.name, self.folder = handle.name, handle.folder
        self.config, self.tokenizer = handle.config, handle.tokenizer
        self.batch_size, self.precision = batch_size, precision
        self.mesh, self.param_dtype = mesh, param_dtype
        self.bos = handle.resolve_bos(bos)
        self.bos_policy = "tokenizer" if bos is None else ("--bos" if bos else "--no-bos")
        if handle.self_debias is not None:  # a Self-Debias run folder: the rescaled distribution scores
            self.scorer = SelfDebiasScorer(handle.params if params is None else params, self.config,
                                           handle.self_debias_prefix_ids(), handle.self_debias,
                                           batch_size=batch_size, bos_id=handle.bos_id(bos), precision=precision,
                                           mesh=mesh, param_dtype=param_dtype)
            return
        self.scorer = PerplexityScorer(handle.params if params is None else params, self.config, batch_size=batch_size,
                                       bos_id=handle.bos_id(bos), precision=precision,
                                       mesh=mesh, param_dtype=param_dtype)

    def files_key(self) -> dict:
        """Content key of what is scored: ``{"model": …, "tokenizer": …}`` (the handle's file keys) and
        ``"adapter": {file: sha256}`` when a PEFT adapter is scored on the model."""
        key = {"model": self.handle.files_key(), "tokenizer": self.handle.tokenizer_files_key()}
        return key if self.adapter is None else {**key, "adapter": adapter_files_key(self.adapter)}

    def score(self, texts: Sequence[str], progress=None):
        return self.scorer.score_texts(texts, self.tokenizer, progress=progress)



def open_for_measurement(model: str | os.PathLike | ModelHandle | LoadedModel, cfg: MeasureConfig, *,
                         tokenizer: str | os.PathLike | None = None, adapter: str | os.PathLike | None = None,
                         bos: bool | None = None) -> LoadedModel:
    """The one model prologue of the measurements (:func:`measure_bias`, the pair benchmarks'
    :func:`rbjax.lmb.pair_benchmark.measure_pair_benchmark`, BBQ's :func:`rbjax.lmb.bbq.measure_bbq`): a model held
    in memory (a :class:`LoadedModel`: a sweep point, a finished training run) as it is, else ``model`` (a folder,
    hub id, run folder or the command's :class:`~rbjax.model.handle.ModelHandle`) opened with ``cfg``'s batch size,
    precision, parameter storage and mesh (``--mesh``), with ``adapter`` scored on it unmerged. ``bos``: the BOS
    policy (:meth:`rbjax.model.handle.ModelHandle.bos_id`; the chat format leaves it to the template).

    Raises:
        ValueError: a tokenizer or adapter beside a model in memory (it brings its own); ``--allow-other-base``
            without an adapter; a bad mesh. What :class:`LoadedModel` raises (a bad model, tokenizer or adapter,
            an adapter of another base: :class:`rbjax.model.peft_adapter.OtherBaseError`).
    """
    if cfg.allow_other_base and adapter is None:
        raise ValueError("--allow-other-base lets an --adapter be scored on another base: give --adapter")
    if isinstance(model, LoadedModel):
        if tokenizer is not None or adapter is not None:
            raise ValueError("a LoadedModel brings its own tokenizer and parameters: load an adapter with it")
        return model
    return LoadedModel(model, tokenizer, cfg.batch_size, bos, cfg.precision, mesh=mesh_of(cfg.mesh),
                       param_dtype=cfg.param_dtype, adapter=adapter, allow_other_base=cfg.allow_other_base)

def pair_statistics(b: np.ndarray, c: np.ndarray, notes: Sequence[str], **kw) -> tuple[dict, np.ndarray]:
    """LMB statistics of one bias type's perplexities (:func:`rbjax.lmb.stats.lmb_statistics` on the scorable
    pairs), and the outlier flag of every pair (False for excluded ones). ``kw``: the statistics' settings."""
    keep = np.array([not n for n in notes], dtype=bool)
    st = stats.lmb_statistics(b[keep], c[keep], **kw)
    mask = np.zeros(len(b), dtype=bool)
    mask[np.nonzero(keep)[0]] = st.pop("_outlier_mask")
    return st, mask


def chat_pair_ids(chat: ChatTurns, pairs: PhrasePairs):
    """The pairs in the chat format: ``(biased ids, counterfactual ids, (biased n_context, counterfactual
    n_context))`` — each phrase rendered as its turn of ``chat`` (:meth:`rbjax.model.chat.ChatTurns.encode`), up to
    the end of its scored span, for :meth:`rbjax.lmb.perplexity.PerplexityScorer.score_pairs`.

    Raises:
        ValueError: a phrase the template does not keep as it is (file and row named).
    """
    out = []
    for side, phrases in (("biased", pairs.biased), ("counterfactual", pairs.counterfactual)):
        try:
            out.append(chat.encode(phrases))
        except ChatError:
            for i, p in enumerate(phrases):  # name the row
                try:
                    chat.encode([p])
                except ChatError as e:
                    raise ValueError(f"{pairs.locate(i)}: {side} phrase: {e}") from None
            raise
    b, c = out
    return [s.ids for s in b], [s.ids for s in c], ([s.n_context for s in b], [s.n_context for s in c])


def pair_perplexities_of_models(scorer, tokenizer, pairs: PhrasePairs, *, skip_unscorable: bool = False,
                                progress=None, chat: ChatTurns | None = None
                                ) -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    """``[(biased_ppl, counter_ppl, notes)]`` of one bias type under every model of a *stacked* scorer
    (:class:`rbjax.lmb.perplexity.PerplexityScorer` with ``stacked=True``): one vmapped pass over the pairs for all
    models (the sweep's grid points), each pair's shared prefix run once.

    ``chat``: score each phrase as its turn of a chat (:func:`chat_pair_ids`; only the phrase's tokens are scored,
    the template's are context); ``None``: as bare text (the paper).

    Raises:
        ValueError: an unscorable pair (unless ``skip_unscorable``) or a non-finite perplexity (file and row named).
    """

    a, c, n_context = pair_ids(tokenizer, pairs, chat)
    try:
        sb, sc = scorer.score_pairs(a, c, progress=progress, n_context=n_context)
    except PhraseError as e:
        raise ValueError(f"{pairs.locate(e.index)}: {e.side} phrase has {e.problem}") from None
    if not isinstance(sb, list):
        sb, sc = [sb], [sc]
    return [checked_pair_perplexities(pairs, b, c, skip_unscorable, chat is not None) for b, c in zip(sb, sc)]


def pair_ids(tokenizer, pairs: PhrasePairs, chat: ChatTurns | None = None):
    """``(biased ids, counterfactual ids, n_context)`` of ``pairs`` as they are scored: bare text tokenised
    without special tokens (``n_context`` ``None``), or each phrase as its turn of a chat (:func:`chat_pair_ids`)."""
    if chat is None:
        return tokenizer.encode_batch(list(pairs.biased)), tokenizer.encode_batch(list(pairs.counterfactual)), None
    return chat_pair_ids(chat, pairs)


def pair_program_shapes(scorer: PerplexityScorer, tokenizer, pairs: PhrasePairs | Sequence[PhrasePairs],
                        chat: ChatTurns | None = None) -> set:
    """The scoring programs (:meth:`rbjax.lmb.perplexity.PerplexityScorer.program_shapes`) that scoring ``pairs``
    (one bias type's, or several) with ``scorer`` runs (:func:`measure_bias`, the sweep's dev LMB), found without
    scoring: for compiling them ahead (a training run compiles its evaluation's with its own programs).

    Raises:
        ValueError: a phrase that cannot be scored (file and row named, as scoring would).
    """
    shapes: set = set()
    for p in [pairs] if isinstance(pairs, PhrasePairs) else pairs:
        a, c, n_context = pair_ids(tokenizer, p, chat)
        try:
            shapes |= scorer.program_shapes(pairs=(a, c), n_context=n_context)
        except PhraseError as e:
            raise ValueError(f"{p.locate(e.index)}: {e.side} phrase has {e.problem}") from None
    return shapes


def checked_pair_perplexities(pairs: PhrasePairs, sb, sc, skip_unscorable: bool, chat: bool = False):
    """``(biased_ppl, counter_ppl, notes)`` of the :class:`~rbjax.lmb.perplexity.PhraseScores` of ``pairs``' two
    sides: an unscorable pair gets a note (or, without ``skip_unscorable``, a ValueError naming its row), a
    non-finite perplexity a ValueError. ``chat``: the phrases were scored as chat turns (an unscorable one has no
    token of its own in the chat)."""
    notes = [""] * len(pairs)
    bad = np.nonzero(~sb.scorable | ~sc.scorable)[0]
    for i in bad:
        side = "biased" if not sb.scorable[i] else "counterfactual"
        notes[i] = (f"unscorable: the {side} phrase has no token of its own in the chat" if chat else
                    f"unscorable: the {side} phrase has fewer than 2 tokens")
    if len(bad) and not skip_unscorable:
        i = int(bad[0])
        raise ValueError(f"{pairs.locate(i)}: {notes[i]} (it has no perplexity); "
                         f"{len(bad)} such pair(s) in all — fix the data or pass --skip-unscorable to exclude them")
    b, c = sb.perplexity, sc.perplexity
    nonfinite = np.nonzero((~np.isfinite(b) | ~np.isfinite(c)) & (sb.scorable & sc.scorable))[0]
    if len(nonfinite):
        i = int(nonfinite[0])
        raise ValueError(f"{pairs.locate(i)}: non-finite perplexity ({b[i]}, {c[i]}) — overflow in the model output?")
    return b, c, notes


def score_phrases(model, phrases: Sequence[str], tokenizer=None, batch_size: int = 64) -> np.ndarray:
    """Perplexities of ``phrases`` under ``model`` (HF folder / hub id, or a :class:`LoadedModel`).

    Returns:
        float64 (N,), NaN for unscorable (< 2 token) phrases.
    """
    m = model if isinstance(model, LoadedModel) else LoadedModel(model, tokenizer, batch_size)
    return m.score(phrases).perplexity


def _perplexities_for(pairs: PhrasePairs, model: LoadedModel | None, show_progress: bool, skip_unscorable: bool,
                      chat: ChatTurns | None = None):
    """Return (biased_ppl, counter_ppl, note per pair) for a bias type."""
    n = len(pairs)
    if model is None:
        return np.asarray(pairs.stored_biased_ppl), np.asarray(pairs.stored_counter_ppl), [""] * n

    with progress_bar(2 * n, f"{pairs.bias_type} ({pairs.split})", "phrase", enabled=show_progress) as bar:
        (res,) = pair_perplexities_of_models(model.scorer, model.tokenizer, pairs, skip_unscorable=skip_unscorable,
                                             progress=bar.update, chat=chat)
    return res


def measure_bias(model: str | os.PathLike | ModelHandle | LoadedModel | None = None, bias_types: str | Sequence[str] = "all",
                 config: MeasureConfig | None = None, *, data_dir: str | os.PathLike | None = None,
                 tokenizer: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
                 stored_perplexities: bool = False, resume: bool = False, progress: bool = True, plot: bool = True,
                 overwrite: bool = False, log_reuse: bool = True, adapter: str | os.PathLike | None = None,
                 **settings) -> list[dict]:
    """Measure language model bias (LMB, paper §3.1) for one or more bias types.

    For each bias type: perplexity of every biased phrase and of its counterfactual,
    pairs with an outlier on either side removed (mean ± ``n_std``·std, population std by
    default as in the reference), then the two-tailed paired t-test (negative t =
    stereotypical). See :func:`rbjax.lmb.stats.lmb_statistics` for the other statistics.

    Args:
        model: HF model folder or hub id (e.g. ``microsoft/DialoGPT-small``), or a :class:`LoadedModel` (e.g.
            :meth:`LoadedModel.from_params`: parameters in memory); ``None`` with ``stored_perplexities=True``.
        bias_types: ``"all"``, a name, a comma list, a list of names, or bias-spec JSON files.
        config: what is computed and how (:class:`rbjax.lmb.config.MeasureConfig`: split, batch size, precision,
            mesh, parameter dtype, BOS, outlier rule and statistics); default: the paper's settings.
        **settings: :class:`~rbjax.lmb.config.MeasureConfig` fields that override ``config`` (e.g.
            ``split="valid", n_bootstrap=0``); any other name is a ``TypeError``.
        data_dir: RedditBias folder (else ``$RBJAX_DATA_DIR`` or the verified download cache).
        tokenizer: tokenizer folder or hub id (default: the model folder).
        adapter: a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``; rbjax's or one
            trained elsewhere) scored on ``model`` without merging (:mod:`rbjax.model.peft_adapter`); its files'
            content enters the key.
        out_dir: where to write ``lmb.json``, ``<type>_perplexities.csv`` and ``lmb.png``
            (nothing written when ``None``).
        stored_perplexities: use the data files' ``perplexity`` columns instead of a model (in the released
            RedditBias files: DialoGPT-small, per the upstream README).
        resume: reuse a ``<type>_perplexities.csv`` already in ``out_dir`` when it was produced by exactly
            these inputs: the same model and tokenizer file *contents* (sha256 of config, weights and tokenizer
            files), the same data files (sha256), split, ``bos``, precision and unscorable-pair rule. The key is checked per
            bias type; a CSV of any other run is scored again, never relabelled. Each CSV is written as soon as
            its bias type is scored, ``lmb.json`` only when every type is done. A hidden
            ``.rbjax_measure_run.json`` in ``out_dir`` records, per bias type, what produced its CSV.
        overwrite: replace files in ``out_dir`` that this run did not write. Without it, a folder holding another
            run's results (another model, data, types or settings: its ``lmb.json``, ``lmb.png`` or the CSV of a
            type measured here) or files rbjax did not write is refused before anything is scored
            (:func:`rbjax.core.reuse.claim_outputs`); the files of the same inputs are this run's own (a rerun, or
            ``resume``).
        progress: progress bars; plot: write ``lmb.png``.
        log_reuse: say on stderr, per bias type, that its perplexities were reused (``resume``); the study runner
            turns it off and reports one line per stage.

    What the settings mean beyond their help text:

    * ``bos``: ``None`` (default) scores each phrase as the model's own tokenizer encodes it — a BOS before it where
      the tokenizer adds one (Llama, Mistral, Gemma), none otherwise (GPT-2/DialoGPT as the reference, Qwen2,
      Pythia); ``True`` prepends the BOS token (GPT-2: ``<|endoftext|>``) and scores every token; ``False`` never.
      The resolved choice is recorded as ``settings.bos`` (with ``settings.bos_policy``) and is part of the resume
      key; docs/lmb.md defines the perplexity per case.
    * ``outlier_removal``: ``None`` (auto) is on when perplexities come from a model and off for
      ``stored_perplexities``, because the released ``*_reduced`` files are the *output* of that rule applied to
      exactly these stored values (upstream ``measure_bias.py`` with ``REDUCE_SET``), so applying it again would be
      a second pass the paper never made.
    * ``precision`` (``"fp32"``: parity with PyTorch; ``"bf16"``: bf16 matmuls, float32 accumulation and
      log-sum-exp, docs/lmb.md) and ``param_dtype`` (docs/scale.md) are recorded in each record's ``settings`` and
      are part of the resume key; ``mesh`` (:func:`rbjax.core.mesh.parse_mesh`) is recorded in ``settings["mesh"]``
      but not in the key (a mesh changes the float32 rounding only).
    * ``format="chat"`` (docs/chat.md): each phrase is scored as a turn of the model's own chat template
      (:class:`rbjax.model.chat.ChatTurns`: ``role``, ``system``, ``prompt``, ``score_end_of_turn``,
      ``chat_template``), only its own tokens scored, the template's as context; the template decides the BOS
      (``bos`` must be left unset). The format, the settings, the template's sha256 and the text it renders around a
      phrase are part of the resume key; each record's ``inputs`` holds them with one rendered example.
    * With a :class:`LoadedModel`, its own batch size, precision, mesh and parameter dtype are used.

    Returns:
        one record (dict) per bias type, as written to ``lmb.json``.
    Raises:
        ValueError: bad arguments or data (message names the file and row); ``out_dir`` not writable.
        rbjax.core.reuse.OutputExists: ``out_dir`` holds results of other inputs and not ``overwrite``.
        FileNotFoundError / RuntimeError: missing files, failed downloads.
    """
    cfg = (config or MeasureConfig()).replace(**settings)
    _check_bias_arguments(model, cfg, stored_perplexities, tokenizer, adapter)
    out = None if out_dir is None else check_output_dir(out_dir, "--out")  # before any work
    run = _open_bias_run(model, bias_types, cfg, out, data_dir=data_dir, tokenizer=tokenizer, adapter=adapter,
                         stored_perplexities=stored_perplexities, progress=progress, plot=plot)
    state = None if out is None else claim_run_folder(
        out, [([_csv_of(out, b)], k) for b, k in run.type_keys.items()], run.results, run.run_key, measure_state,
        overwrite=overwrite, stale=[out / "lmb.json", out / "lmb.png"])
    records = _score_bias_types(run, state, resume=resume, progress=progress, log_reuse=log_reuse)
    for r, corrected in zip(records, corrected_pvalues([r["p_value"] for r in records])):
        r["p_value_corrected"] = corrected
    if out is not None:
        _write_bias_results(run, records)
    return records


# -- the steps of measure_bias -------------------------------------------------------------------------------------
def _check_bias_arguments(model, cfg: MeasureConfig, stored_perplexities: bool, tokenizer, adapter) -> None:
    """Refuse a model beside ``--stored-perplexities`` (or neither), and the settings that have no effect with the
    stored perplexities."""
    if stored_perplexities and model is not None:
        raise ValueError("give either a model or --stored-perplexities, not both")
    if not stored_perplexities and model is None:
        raise ValueError("no model given: pass --model (an HF GPT-2 folder or hub id) or --stored-perplexities")
    if stored_perplexities and (tokenizer is not None or cfg.bos is not None):
        raise ValueError("--tokenizer and --bos have no effect with --stored-perplexities")
    if stored_perplexities and adapter is not None:
        raise ValueError("--adapter has no effect with --stored-perplexities")
    if stored_perplexities and (cfg.mesh or cfg.param_dtype != "fp32"):
        raise ValueError("--mesh and --param-dtype have no effect with --stored-perplexities")
    if stored_perplexities and cfg.is_chat:
        raise ValueError("--format chat scores phrases with a model; the stored perplexities are of bare text")


@dataclasses.dataclass
class _BiasRun:
    """One :func:`measure_bias` run as set up before any scoring: the pairs of every bias type, the model (``None``:
    the stored perplexities) and its chat format, the ``settings`` block of the records, and the keys of the
    outputs (per bias type: its CSV; ``run_key``: ``lmb.json`` and ``lmb.png``)."""

    cfg: MeasureConfig
    out: Path | None
    pairs: list[PhrasePairs]
    loaded: LoadedModel | None
    chat: ChatTurns | None
    model_name: str
    outlier_removal: bool
    settings: dict
    type_keys: dict[str, dict]
    run_key: dict
    plot: bool

    @property
    def results(self) -> list[Path]:
        """The run's result files (the per-type CSVs aside); none without an output folder."""
        return [] if self.out is None else [self.out / "lmb.json", *([self.out / "lmb.png"] if self.plot else [])]


def _csv_of(out: Path, bias_type: str) -> Path:
    return out / f"{bias_type}_perplexities.csv"


def _open_bias_run(model, bias_types, cfg: MeasureConfig, out: Path | None, *, data_dir, tokenizer, adapter,
                   stored_perplexities: bool, progress: bool, plot: bool) -> _BiasRun:
    """The pairs read, the model opened (a bad model or a model without a chat template fails here, before
    ``out`` is touched), the settings record and the keys of what is produced."""
    outlier_removal = not stored_perplexities if cfg.outlier_removal is None else cfg.outlier_removal
    data = RedditBiasData(data_dir)
    all_pairs = [load_pairs(b, cfg.split, data, need_stored_ppl=stored_perplexities)
                 for b in expand_bias_types(bias_types)]
    loaded: LoadedModel | None = None
    chat = None
    if not stored_perplexities:  # a bad model fails here, before out_dir
        loaded = open_for_measurement(model, cfg, tokenizer=tokenizer, adapter=adapter, bos=cfg.bos)
        if cfg.is_chat:
            chat = cfg.chat_turns(loaded.tokenizer)  # a model without a template fails here, before out_dir
            if progress:
                log.info(chat.describe())
    model_name = STORED_LABEL if loaded is None else loaded.name
    settings = _bias_settings(cfg, loaded, chat, data, outlier_removal)
    type_keys = _bias_type_keys(cfg, loaded, chat, settings, all_pairs)
    run_key = {"types": list(type_keys.values()), "model_name": model_name,
               "statistics": {k: settings[k] for k in ("outlier_removal", "seed", "n_std", "ddof", "alpha",
                                                        "n_bootstrap")}, "plot": plot}
    return _BiasRun(cfg, out, all_pairs, loaded, chat, model_name, outlier_removal, settings, type_keys, run_key,
                    plot)


def _scored_with(cfg: MeasureConfig, loaded: LoadedModel | None) -> tuple:
    """``(batch_size, precision, param_dtype, mesh)`` the phrases are scored with: a model's own, else ``cfg``'s."""
    if loaded is None:
        return cfg.batch_size, cfg.precision, cfg.param_dtype, None
    return loaded.batch_size, loaded.precision, loaded.param_dtype, loaded.mesh


def _resolved_bos(loaded: LoadedModel | None, chat: ChatTurns | None) -> bool | None:
    """The BOS choice recorded and keyed: False for the stored perplexities, ``None`` in the chat format (the
    template decides), else the model's resolved one."""
    return False if loaded is None else (None if chat is not None else loaded.bos)


def adapter_settings(loaded: LoadedModel) -> dict:
    """The ``adapter`` entry of a measurement's settings record, and ``adapter_base`` with an adapter (the base
    check of :func:`rbjax.model.peft_adapter.check_adapter_base`)."""
    return {"adapter": loaded.adapter, **({} if loaded.adapter is None else {"adapter_base": loaded.adapter_base})}


def _bias_settings(cfg: MeasureConfig, loaded: LoadedModel | None, chat: ChatTurns | None, data: RedditBiasData,
                   outlier_removal: bool) -> dict:
    """The ``settings`` block of every ``lmb.json`` record of the run."""
    stored = loaded is None
    batch_size, precision, param_dtype, mesh_obj = _scored_with(cfg, loaded)
    return {"split": cfg.split, "outlier_removal": outlier_removal, "batch_size": batch_size, "seed": cfg.seed,
            "bos": _resolved_bos(loaded, chat), "n_std": cfg.n_std, "ddof": cfg.ddof, "alpha": cfg.alpha,
            "n_bootstrap": cfg.n_bootstrap, "stored_perplexities": stored,
            "precision": None if stored else precision, "param_dtype": None if stored else param_dtype,
            "mesh": None if mesh_obj is None else mesh_label(mesh_obj),
            "bos_policy": None if stored else ("chat template" if chat else loaded.bos_policy),
            **({"adapter": None} if stored else adapter_settings(loaded)),
            "format": cfg.format,
            **({} if chat is None else {"role": chat.role, "system": chat.system, "prompt": chat.prompt,
                                        "score_end_of_turn": chat.score_end_of_turn,
                                        "chat_template": cfg.chat_template}),
            "tokenizer": None if stored else loaded.tokenizer.source,
            "data": {"root": str(data.root), "upstream_commit": data.commit}}


def _bias_type_keys(cfg: MeasureConfig, loaded: LoadedModel | None, chat: ChatTurns | None, settings: dict,
                    all_pairs: list[PhrasePairs]) -> dict[str, dict]:
    """Per bias type, everything that produced its perplexities: model + tokenizer content, data files, split and
    the scoring settings."""
    # content, not paths: the same weights copied elsewhere are the same model; weights rewritten in place another
    model_key = {"stored_perplexities": True} if loaded is None else loaded.files_key()
    scoring = {"split": cfg.split, "bos": settings["bos"], "skip_unscorable": cfg.skip_unscorable,
               "precision": settings["precision"]}
    param_dtype = _scored_with(cfg, loaded)[2]
    if param_dtype != "fp32":  # (absent when fp32: keys of earlier runs stay valid)
        scoring["param_dtype"] = param_dtype
    if chat is not None:  # (absent in the raw format: keys of earlier runs stay valid)
        scoring["chat"] = chat.key()
    return {p.bias_type: {"model": model_key, "data": files_key(sorted({f for src in p.sources for f in src[:2]})),
                          "bias_type": p.bias_type, **scoring} for p in all_pairs}


def _score_bias_types(run: _BiasRun, state: KeyedEntries | None, *, resume: bool, progress: bool,
                      log_reuse: bool) -> list[dict]:
    """Every bias type in turn: its perplexities (reused or scored), its statistics and record, and its CSV written
    at once (an interrupted run keeps the types before it, for ``--resume``)."""
    meta = versions()
    records: list[dict] = []
    with interruptible(lambda sig: _bias_stopped(sig, run, records)):  # the scorer stops after its batch in flight
        for pairs in run.pairs:
            b, c, notes, reused = _bias_perplexities(run, pairs, state, resume=resume, progress=progress,
                                                     log_reuse=log_reuse)
            rec, mask = _bias_record(run, pairs, (b, c, notes), reused, meta)
            records.append(rec)
            if run.out is not None and not reused:  # written per type, so an interrupted run can --resume
                key, csv_path = run.type_keys[pairs.bias_type], _csv_of(run.out, pairs.bias_type)
                write_perplexities_csv(csv_path, pairs, b, c, notes, mask)
                state.save(pairs.bias_type, key)
                record_outputs([csv_path], key)
    return records


def _bias_stopped(sig: str, run: _BiasRun, records: list[dict]) -> str:
    """What an interrupt keeps, at the moment it comes."""
    done = [r["bias_type"] for r in records]
    nothing = nothing_kept(sig, run.out, done, "bias type")
    if nothing is not None:
        return nothing
    left = [p.bias_type for p in run.pairs if p.bias_type not in done]
    return (f"rbjax measure: {sig} — stopped; the perplexities of {', '.join(done)} are kept in {run.out} "
            f"({', '.join(f'{b}_perplexities.csv' for b in done)}). Run the same command with --resume to reuse "
            f"them and score the rest ({', '.join(left) or 'none left'}).")


def _bias_perplexities(run: _BiasRun, pairs: PhrasePairs, state: KeyedEntries | None, *, resume: bool,
                       progress: bool, log_reuse: bool):
    """``(biased, counterfactual, notes, reused)`` of a bias type: the CSV an earlier run of the same key left
    (``resume``), else scored (its entry in the run record dropped first: the CSV about to be replaced is no longer
    described by it)."""
    out = run.out
    csv_path = None if out is None else _csv_of(out, pairs.bias_type)
    prev = None
    if resume and out is not None:
        if state.stored(pairs.bias_type, run.type_keys[pairs.bias_type]) is not None:
            prev = reuse_perplexities_csv(csv_path, pairs.biased, pairs.counterfactual)
            if prev is None:
                log.info(f"--resume: {csv_path} does not hold these pairs; scoring {pairs.bias_type} again")
        elif state.reason is not None:
            log.info(f"--resume: {csv_path} was produced by other inputs or is unfinished "
                     f"({state.reason}); scoring {pairs.bias_type} again")
    if prev is not None:
        if log_reuse:
            log.info(f"--resume: reusing {len(pairs)} scored pairs of {pairs.bias_type} from {csv_path} "
                     "(same model and tokenizer files, data files, split and settings)")
        return (*prev, True)
    if out is not None:
        state.drop(pairs.bias_type)
    return (*_perplexities_for(pairs, run.loaded, progress, run.cfg.skip_unscorable, run.chat), False)


def _bias_record(run: _BiasRun, pairs: PhrasePairs, perplexities: tuple, reused: bool,
                 meta: dict) -> tuple[dict, np.ndarray]:
    """A bias type's ``lmb.json`` record (its p-value not yet corrected across the types) and its outlier flags."""
    b, c, notes = perplexities
    cfg = run.cfg
    keep = np.array([not n for n in notes], dtype=bool)
    if not keep.all():
        log.info(f"{pairs.bias_type}: {int((~keep).sum())} pair(s) excluded as unscorable "
                 f"(first: {pairs.locate(int(np.argmin(keep)))}); see the 'note' column of the CSV")
    st, mask = pair_statistics(b, c, notes, n_std=cfg.n_std, ddof=cfg.ddof, alpha=cfg.alpha,
                               n_bootstrap=cfg.n_bootstrap, seed=cfg.seed, remove_outliers=run.outlier_removal)
    rec = {"bias_type": pairs.bias_type, "split": cfg.split, "model": run.model_name, **st,
           "inputs": record_inputs(run.type_keys[pairs.bias_type], pairs, run.chat), **pair_counts(pairs, keep),
           "files": [s[:2] for s in pairs.sources], "settings": run.settings, "versions": meta,
           "reused_perplexities": reused}
    rec["n_pairs"] = len(pairs)
    return rec, mask


def _write_bias_results(run: _BiasRun, records: list[dict]) -> None:
    """``lmb.png`` (with ``plot``), then ``lmb.json`` (last: its presence marks a complete run), their key recorded;
    a note on CSVs of other types an earlier run left in the folder."""
    out = run.out
    if run.plot:
        plot_lmb({_short_label(run.model_name): records}, out / "lmb.png", alpha=run.cfg.alpha)
    atomic_write_json(out / "lmb.json", records)  # last: its presence marks a complete run
    record_outputs(run.results, run.run_key)
    this_run = {f"{r['bias_type']}_perplexities.csv" for r in records}
    others = sorted(p.name for p in out.glob("*_perplexities.csv") if p.name not in this_run)
    if others:
        log.info(f"note: {out} also holds {', '.join(others)} from an earlier run (not in this lmb.json; "
                 "--resume reuses such a file only when it was produced by the same inputs)")


# -- steps the measurements share (measure_bias, the pair benchmarks, BBQ) ----------------------------------------
def claim_run_folder(out: Path, outputs: Iterable[tuple[Sequence[Path], dict]], results: Sequence[Path],
                     run_key: dict, state: Callable[[Path], KeyedEntries], *, overwrite: bool,
                     stale: Sequence[Path] | None = None) -> KeyedEntries:
    """The result-folder step of a measurement, before any scoring: every output claimed for the key that produces
    it (``outputs``: per bias type or category its files and key; then ``results`` for ``run_key``;
    :func:`rbjax.core.reuse.claim_outputs`: a folder holding another run is refused, :class:`OutputExists`, unless
    ``overwrite``), the folder made, its per-type record opened (``state(out)``), and the results an earlier run
    left (``stale``, default ``results``) removed, so they never sit beside this run's as if complete."""
    for files, key in outputs:
        claim_outputs(files, key, overwrite=overwrite)
    claim_outputs(results, run_key, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    entries = state(out)
    for p in results if stale is None else stale:
        p.unlink(missing_ok=True)
    return entries


def nothing_kept(sig: str, out: Path | None, done: Sequence[str], unit: str) -> str | None:
    """An interrupted measurement's message when it keeps nothing (no output folder, or no ``unit`` — bias type,
    category — finished yet); ``None`` when it keeps some (the caller names them)."""
    if out is None:
        return f"rbjax measure: {sig} — stopped; nothing is kept (no output folder)."
    if not done:
        return (f"rbjax measure: {sig} — stopped before a {unit} was finished; nothing to reuse yet: run the "
                "same command again (with --resume).")
    return None


def write_perplexities_csv(path: Path, pairs, b: np.ndarray, c: np.ndarray, notes: Sequence[str],
                           mask: np.ndarray) -> None:
    """Write one type's (or category's) per-pair CSV (:data:`CSV_HEADER`) atomically: the perplexities (empty for an
    excluded pair) and the outlier column of this run's rule."""
    atomic_write_csv(path, CSV_HEADER, [
        [pairs.biased[i], pairs.counterfactual[i],
         "" if notes[i] else repr(float(b[i])), "" if notes[i] else repr(float(c[i])),
         "excluded" if notes[i] else ("true" if mask[i] else "false"), notes[i]]
        for i in range(len(pairs))])


def pair_counts(pairs, keep: np.ndarray) -> dict:
    """``{"n_pairs_unscorable", "n_identical_pairs"}`` of a record: pairs excluded as unscorable (``keep`` False)
    and pairs whose two sides are the same text."""
    return {"n_pairs_unscorable": int((~keep).sum()),
            "n_identical_pairs": int(sum(x == y for x, y in zip(pairs.biased, pairs.counterfactual)))}


def corrected_pvalues(p_values: Sequence[float | None]) -> list[dict]:
    """Per test of a run (one per bias type or category) its p-value corrected across them:
    ``{"bonferroni", "benjamini_hochberg", "n_tests"}`` (:func:`rbjax.lmb.stats.adjust_pvalues`)."""
    p_values = list(p_values)
    adj = stats.adjust_pvalues(p_values)
    return [{"bonferroni": pb, "benjamini_hochberg": ph, "n_tests": len(p_values)}
            for pb, ph in zip(adj["bonferroni"], adj["benjamini_hochberg"])]


def pairs_digest(biased: Sequence[str], counterfactual: Sequence[str]) -> str:
    """sha256 of a type's pair list (every biased phrase and its counterfactual, in order): two runs scored the same
    pairs exactly when their digests are equal."""
    return digest([list(biased), list(counterfactual)])


def record_inputs(key: dict, pairs: PhrasePairs, chat: ChatTurns | None = None) -> dict:
    """The ``inputs`` block of an ``lmb.json`` record: what the pairs and their scoring were made of, by content.

    ``{"data_files": {file name: sha256}, "pairs_sha256": ..., "tokenizer": {file: sha256} | {"source": id} | None,
    "model": {file: sha256} | None, "bos": bool | None, "skip_unscorable": bool, "precision": ..., "format": "raw" |
    "chat"}`` (``model`` and ``tokenizer`` are ``None`` for stored perplexities), and in the chat format ``"chat"``:
    role, system prompt, user message, end-of-turn scoring, the template's sha256 and source, the sha256 of the text
    it renders around a phrase, and one rendered example (the type's first biased phrase:
    :meth:`rbjax.model.chat.ChatTurns.record`). :mod:`rbjax.lmb.compare` refuses to compare runs whose pairs,
    tokenization or format differ on these; a model card names the model files and the format by them.
    """
    m = key["model"]
    stored = m.get("stored_perplexities") is True
    rec = {"data_files": key["data"], "pairs_sha256": pairs_digest(pairs.biased, pairs.counterfactual),
           "tokenizer": None if stored else m.get("tokenizer"), "model": None if stored else m.get("model"),
           "bos": key["bos"], "skip_unscorable": key["skip_unscorable"], "precision": key["precision"],
           "format": "chat" if chat is not None else "raw"}
    if chat is not None:
        rec["chat"] = chat.record(pairs.biased[0] if len(pairs) else None)
    return rec


def _short_label(name: str) -> str:
    if name == STORED_LABEL:
        return "stored perplexities"
    return Path(name).name or name


def _verdict(r: dict) -> str:
    """"not significant" first for a non-significant t (its sign is no direction), else the direction or status."""
    if r["t_value"] is None:
        return r["status"]
    return r["direction"] if r["significant"] else "not significant"


def describe_measurement(rec: dict, raw: str = "raw text (the paper's format)") -> str:
    """One line: what an ``lmb.json`` record scored and how — the model (or the stored perplexities), the format (raw
    text — ``raw`` says whose convention that is —, or the chat format: :func:`rbjax.model.chat.describe_chat`), a
    LoRA adapter scored on it, and a precision or parameter storage other than fp32."""
    s = rec.get("settings") or {}
    chat = (rec.get("inputs") or {}).get("chat")
    bits = [describe_chat(chat) if chat else raw]
    if s.get("adapter"):
        bits.append(f"with the LoRA adapter {s['adapter']} (unmerged)")
    if s.get("precision") not in (None, "fp32"):
        bits.append(f"{s['precision']} matmuls")
    if s.get("param_dtype") not in (None, "fp32"):
        bits.append(f"weights stored in {s['param_dtype']}")
    return f"{rec['model']}: " + "; ".join(bits)


def format_table(records: list[dict]) -> str:
    """A plain-text table of LMB results (one row per bias type), after a line saying what was measured and how
    (:func:`describe_measurement`)."""
    head = f"{'bias type':<10} {'split':<10} {'pairs':>5} {'kept':>5} {'t':>8} {'p':>10} {'sig':>4}  {'direction':<19} {'welch t':>8} {'ref t':>8} {'d':>6}"
    lines = ([f"LMB of {describe_measurement(records[0])}"] if records else []) + [head, "-" * len(head)]
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    for r in records:
        lines.append(
            f"{r['bias_type']:<10} {r['split']:<10} {r['n_pairs']:>5} {r['n_pairs_after_outliers']:>5} "
            f"{fmt(r['t_value'], '8.3f'):>8} {fmt(r['p_value'], '10.2e'):>10} {'*' if r['significant'] else '':>4}  "
            f"{_verdict(r):<19} {fmt(r['welch']['t_value'], '8.3f'):>8} "
            f"{fmt(r['reference']['t_value'], '8.3f'):>8} {fmt(r['cohens_d_paired'], '6.3f'):>6}")
    applied = {r["outlier_rule"]["applied"] for r in records}
    how = "after 3σ outlier-pair removal" if applied == {True} else (
        "no outlier removal (the released sets are already reduced)" if applied == {False} else "see outlier_rule")
    lines.append(f"t < 0: the model prefers the stereotypical (biased) phrases (direction named only when p < alpha); "
                 f"* p < alpha "
                 f"(two-tailed paired t-test, {how}); 'welch' = Welch's t, 'ref t' = reference ttest_rel on unfiltered values")
    return "\n".join(lines)
