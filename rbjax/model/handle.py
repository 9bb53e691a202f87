"""One model handle: a model and its tokenizer, where they came from, their content key and their checks.

Every command and the study load a model through :class:`ModelHandle`:

* :meth:`ModelHandle.open` — an HF folder, a hub id (downloaded into the HF cache), or a finished ``rbjax debias``
  run folder (its exported ``model/``; a Self-Debias run folder: its base model, with :attr:`ModelHandle.self_debias`
  set — the scorers and the sampler then rescale the next-token distribution); nothing is read until :meth:`load`.
* :meth:`ModelHandle.from_params` — parameters already in memory (a sweep point, a run that just finished).

Content keys, one name per concept: :meth:`files_key` is ``{file: sha256}`` of ``config.json``, of *every* weight
file — a sharded checkpoint's shards are the files named by ``model.safetensors.index.json``'s ``weight_map`` — and
of the tokenizer files in the folder (:func:`rbjax.model.hf.model_files_key`), and :attr:`digest` the one sha256 over
it (parameters in memory: the digest given, else :func:`rbjax.core.keys.tree_digest` of them). The tokenizer has its
own pair, :meth:`tokenizer_files_key` and :attr:`tokenizer_digest`, since ``--tokenizer`` may point elsewhere.

Checks at load (:meth:`load`): the tokenizer's vocabulary fits in the model's embedding (a larger one would index
past it), and every special token id the model config or the tokenizer names (bos, eos, pad) lies inside the model
vocabulary (:class:`SpecialTokenError`: a tiny config whose default eos 50256 is outside a 64-token vocabulary made
``generate`` return zeros through NaN).

BOS policy (:meth:`bos_id`): by default a text is scored as the model's own tokenizer encodes it — a BOS before it
when the tokenizer adds one (``Tokenizer.adds_bos``: Llama, Mistral, Gemma), none otherwise (GPT-2, DialoGPT, Qwen2,
Pythia); ``bos=True``/``False`` (``--bos``/``--no-bos``) overrides. With a BOS every token of the text is predicted
(from the BOS on); without one the first token is context only (docs/lmb.md).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from rbjax.core.digests import files_key
from rbjax.core.keys import digest, tree_digest
from rbjax.model.chat import end_of_turn_id
from rbjax.model.hf import (TOKENIZER_FILES, WEIGHT_FILES, _looks_like_hub_id, hub_config_folder, load_pretrained,
                            model_files_key, read_generation_config, read_model_config, resolve_model_dir)
from rbjax.model.registry import family_of_config
from rbjax.model.self_debias import SelfDebiasSettings
from rbjax.model.tokenizer import load_tokenizer

__all__ = ["ModelHandle", "SpecialTokenError", "VocabularyError", "model_files_key", "tokenizer_files_key",
           "is_run_folder", "has_tokenizer_files", "MODEL_HELP", "TOKENIZER_HELP"]

#: the help of every ``--model`` (what :meth:`ModelHandle.open` accepts) and ``--tokenizer``
MODEL_HELP = ("HF model folder (GPT-2/DialoGPT, Llama/Mistral/Qwen2, GPT-NeoX, Gemma 2), hub id (e.g. "
              "microsoft/DialoGPT-small, Qwen/Qwen2.5-0.5B-Instruct) or finished `rbjax debias` run folder (its model/)")
TOKENIZER_HELP = "tokenizer folder or hub id (default: the model folder)"

#: files that mark a finished or unfinished ``rbjax debias`` run folder
RUN_FOLDER_MARKS = ("results.json", "checkpoints", "metrics.jsonl", "model")


class VocabularyError(ValueError):
    """The tokenizer has more tokens than the model's embedding has rows."""


class SpecialTokenError(ValueError):
    """A special token id (bos, eos, pad) of the model config or the tokenizer lies outside the model vocabulary."""


def tokenizer_files_key(folder: str | os.PathLike) -> dict:
    """``{file name: sha256}`` of the tokenizer files in ``folder`` (:data:`rbjax.model.hf.TOKENIZER_FILES`)."""
    return files_key(Path(folder) / f for f in TOKENIZER_FILES)


def has_tokenizer_files(folder: str | os.PathLike) -> bool:
    p = Path(folder)
    return (p / "tokenizer.json").exists() or ((p / "vocab.json").exists() and (p / "merges.txt").exists())


def is_run_folder(p: Path) -> bool:
    """A folder without weights of its own that looks like an ``rbjax debias`` run folder."""
    has_weights = any((p / w).exists() for w in WEIGHT_FILES) or any(p.glob("model-*.safetensors"))
    return p.is_dir() and not has_weights and any((p / n).exists() for n in RUN_FOLDER_MARKS)


def _run_results(p: Path) -> dict | None:
    try:
        res = json.loads((p / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) else None


def _self_debias_base(p: Path, res: dict) -> tuple[Path, SelfDebiasSettings, dict]:
    """``(base model folder, settings, base files key)`` of a finished Self-Debias run folder (it holds no weights:
    the base's files are checked against the key it recorded).

    Raises:
        ValueError: an unfinished or malformed run, or a base whose files changed since the run was made.
    """
    if res.get("status") != "done":
        raise ValueError(f"{p}: an unfinished Self-Debias run (results.json status: {res.get('status')}); run "
                         "`rbjax debias --method self-debias` again")
    try:
        base = res["base_model"]
        settings = SelfDebiasSettings.from_dict(res["self_debias"])
        recorded = base["files_key"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p / 'results.json'}: not a readable Self-Debias run ({e})") from None
    folder = Path(base["folder"]) if base.get("folder") and Path(base["folder"]).is_dir() else \
        resolve_model_dir(base["source"])
    if model_files_key(folder) != recorded:
        raise ValueError(f"{p}: the files of its base model {folder} differ from those the Self-Debias run was made "
                         "with; run `rbjax debias --method self-debias` again (with --overwrite)")
    return folder, settings, recorded


def _run_model_folder(p: Path, got: dict | None) -> Path:
    """The exported ``model/`` of a finished run folder ``p`` (``got``: its ``results.json``, read once by the
    caller; ``None`` when unreadable or absent)."""
    status = None
    if (p / "results.json").exists():
        status = "unreadable" if got is None else got.get("status")
    if not (p / "model" / "config.json").exists() or status not in ("done", None):
        raise ValueError(f"{p}: a debiasing run folder without a finished, exported model ({p / 'model'}"
                         f"{'' if (p / 'model').exists() else ' is missing'}; results.json status: "
                         f"{status or 'absent'}); finish the run (the same `rbjax debias` command resumes "
                         "it, without --no-export) or pass the HF model folder itself")
    return p / "model"


class ModelHandle:
    """A model and its tokenizer (module docstring).

    It is the one place that turns ``--model`` into files: a command opens one handle and hands it to the memory
    plan (:func:`rbjax.model.memory.plan_for_model`), the content keys and the loader, so ``config.json`` is read
    once (:meth:`model_config`) and a hub id is downloaded once, and only when weights are needed (a plan of a hub
    model fetches its ``config.json`` alone).

    Attributes:
        name: the model as given (folder, hub id, run folder, or a display name for parameters in memory).
        folder: the HF folder read (``None`` for parameters in memory); of a hub id, the download (made when first
            asked for). run_folder: the ``rbjax debias`` run folder it came from, or ``None``. hub_id: the hub id,
            or ``None``. tokenizer_source: the tokenizer folder / hub id.
    """

    def __init__(self, name: str, folder: Path | None, run_folder: Path | None, tokenizer_source: str | None,
                 hub_id: str | None = None):
        self.name, self._folder, self.run_folder, self.hub_id = str(name), folder, run_folder, hub_id
        self.tokenizer_source = tokenizer_source
        #: the :class:`rbjax.model.self_debias.SelfDebiasSettings` of a Self-Debias run folder (scorers and the sampler
        #: rescale with them), else ``None``
        self.self_debias: SelfDebiasSettings | None = None
        #: set by a consumer that applies :attr:`self_debias` (the scorers of ``measure`` and of ``evaluate``'s LMP,
        #: ``evaluate``'s CRG generation): :meth:`load` refuses a
        #: Self-Debias model to every other, which would otherwise use the plain base model
        self.self_debias_accepted = False
        self._config = self._params = self._tokenizer = None
        self._files_key: dict | None = None
        self._tok_key: dict | None = None

    @property
    def loaded(self) -> bool:
        """Whether the weights have been read (:meth:`load`)."""
        return self._params is not None

    @property
    def folder(self) -> Path | None:
        """The model's HF folder; of a hub id, downloaded (weights included) on first use
        (:func:`rbjax.model.hf.resolve_model_dir`)."""
        if self._folder is None and self.hub_id is not None:
            self._folder = resolve_model_dir(self.hub_id)
        return self._folder

    def model_config(self):
        """The family config from ``config.json`` alone — read once, and shared with :meth:`load` — for plans and
        cost estimates before any weight is read (of a hub id not yet downloaded, only its ``config.json`` is
        fetched).

        Raises:
            FileNotFoundError: no ``config.json``. ValueError: a malformed config or one rbjax does not implement.
            RuntimeError: a hub id whose ``config.json`` cannot be fetched.
        """
        if self._config is None:
            where = self._folder if self._folder is not None or self.hub_id is None else hub_config_folder(self.hub_id)
            self._config = read_model_config(where)
        return self._config

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, model: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> "ModelHandle":
        """A handle on an HF folder, a hub id or a finished ``rbjax debias`` run folder (its ``model/``);
        ``tokenizer`` defaults to the model folder. Nothing but the location is resolved here.

        Raises:
            FileNotFoundError: no such folder (and not a hub id).
            ValueError: a run folder without a finished, exported model.
            RuntimeError: a hub id that cannot be downloaded.
        """
        p = Path(model).expanduser()
        run_folder = hub_id = None
        tok = str(tokenizer) if tokenizer is not None else None
        run = p.is_dir() and is_run_folder(p)
        res = _run_results(p) if run else None  # read once: the Self-Debias check and the run-folder rule
        if res is not None and res.get("method") == "self-debias":  # the base model, rescaled at decoding time
            folder, settings, base_key = _self_debias_base(p, res)
            if tokenizer is None and res.get("tokenizer"):
                tok = str(res["tokenizer"])
            self = cls(str(model), folder, p, tok)
            self.self_debias = settings
            self._files_key = {"base": base_key, "self_debias": settings.to_dict()}
            return self
        if run:
            run_folder, folder = p, _run_model_folder(p, res)
        elif not p.exists() and _looks_like_hub_id(str(model)):
            folder, hub_id = None, str(model)  # downloaded when first needed (the folder property)
        else:
            folder = resolve_model_dir(model)
        return cls(str(model), folder, run_folder, tok, hub_id=hub_id)

    @classmethod
    def from_params(cls, params, config, tokenizer, *, name: str, digest: str | None = None) -> "ModelHandle":
        """Parameters already in memory: ``params`` of ``config``, a loaded ``tokenizer``, a display ``name`` and
        their content ``digest`` (:attr:`digest`; default: :func:`rbjax.core.keys.tree_digest` of the params,
        computed when first asked for; or e.g. the digest of the files they were exported to).

        Raises:
            VocabularyError, SpecialTokenError: as :meth:`load`.
        """
        self = cls(name, None, None, str(getattr(tokenizer, "source", "")))
        self._config, self._params, self._tokenizer = config, params, tokenizer
        if digest is not None:
            self._files_key = digest
        self._check()
        return self

    # -- loading -----------------------------------------------------------------------------------------------
    def load(self, mesh=None):
        """``(config, params, tokenizer)``, read on the first call (params: float32 numpy arrays; with a ``mesh``
        that splits parameters, float32 ``jax.Array``s read slice by slice straight into its devices:
        :func:`rbjax.model.hf.load_pretrained`). Later calls return what the first one read.

        Raises:
            ValueError: a Self-Debias run folder whose consumer did not set :attr:`self_debias_accepted`.
            FileNotFoundError: no tokenizer files (pass a tokenizer); whatever the weight loader raises.
            VocabularyError: the tokenizer has more tokens than the model.
            SpecialTokenError: a bos/eos/pad id outside the model vocabulary.
        """
        if self.self_debias is not None and not self.self_debias_accepted:
            raise ValueError(f"{self.name}: a Self-Debias run folder (inference-time only: it rescales the base "
                             "model's next-token distribution when scoring and generating); this command does not "
                             "apply that rescaling, so it would evaluate the plain base model. Use rbjax measure "
                             "(RedditBias LMB, pair benchmarks, BBQ) or rbjax evaluate --task lmp / crg, or the base "
                             "model itself")
        if self._params is None:
            self._config, self._params = load_pretrained(self.folder, mesh=mesh, config=self._config)
            self._load_tokenizer()
            self._check()
        return self._config, self._params, self.tokenizer

    def _load_tokenizer(self) -> None:
        src = self.tokenizer_source if self.tokenizer_source is not None else str(self.folder)
        try:
            self._tokenizer = load_tokenizer(src, expected_vocab_size=None)
        except FileNotFoundError as e:
            if self.tokenizer_source is None:
                raise FileNotFoundError(
                    f"{self.folder}: the model folder has no tokenizer files; pass --tokenizer (a folder with "
                    "tokenizer.json, or the GPT-2 vocab.json and merges.txt, or a hub id such as "
                    "microsoft/DialoGPT-small)") from None
            # the tokenizer given (--tokenizer): what is wrong with it, never "pass --tokenizer"
            why = str(e).removeprefix(f"{Path(src).expanduser()}: ")
            raise FileNotFoundError(f"--tokenizer {src}: {why}") from None

    @property
    def config(self):
        """The family config (:meth:`model_config`: no weights are read for it)."""
        return self.model_config()

    @property
    def params(self):
        if self._params is None:
            self.load()
        return self._params

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._load_tokenizer()
        return self._tokenizer

    def tokenizer_folder(self) -> Path | None:
        """The folder the tokenizer was read from when it holds tokenizer files (what an export copies), else
        ``None`` (a tokenizer held in memory)."""
        src = Path(str(getattr(self.tokenizer, "source", "")))
        return src if src.is_dir() and has_tokenizer_files(src) else None

    @property
    def family(self):
        """The :class:`rbjax.model.registry.Family` of the model."""
        return family_of_config(self.config)

    def _check(self) -> None:
        cfg, tok = self._config, self._tokenizer
        V = cfg.vocab_size
        where = self.folder if self.folder is not None else self.name
        if tok.vocab_size > V:
            raise VocabularyError(f"the tokenizer ({tok.source}) has {tok.vocab_size} tokens but the model "
                                  f"({where}) only {V}")
        special = family_of_config(cfg).special_tokens(cfg)
        named = [("config.json", k, v) for k, v in special.items()]
        named += [(f"tokenizer {tok.source}", k, getattr(tok, f"{k}_id", None)) for k in ("bos", "eos", "pad")]
        for src, k, v in named:
            bad = [int(i) for i in (v if isinstance(v, (tuple, list)) else [v])
                   if i is not None and not 0 <= int(i) < V]  # eos may be a list (Llama 3)
            if bad:
                v = bad[0]
                raise SpecialTokenError(f"{where}: the {k} token id {v} of the {src} is outside the model "
                                        f"vocabulary [0, {V}); fix {k}_token_id / the tokenizer's {k}_token")
        if tok.eos_id is None and special.get("eos") is not None:
            # a tokenizer.json without tokenizer_config.json: the model's eos ends turns and generations (CRG, DST)
            e = special["eos"]
            tok.eos_id = int(e[0] if isinstance(e, (tuple, list)) else e)

    # -- BOS policy --------------------------------------------------------------------------------------------
    def bos_id(self, bos: bool | None = None) -> int | None:
        """The token to put before every scored text, or ``None`` (module docstring).

        Args:
            bos: ``None``: as the model's tokenizer encodes a text (``tokenizer.adds_bos``); ``True``: always
                (``--bos``); ``False``: never (``--no-bos``).
        Raises:
            SpecialTokenError: ``bos=True`` but neither the tokenizer nor the config names a BOS token.
        """
        tok = self.tokenizer
        use = tok.adds_bos if bos is None else bool(bos)
        if not use:
            return None
        b = tok.bos_id
        if b is None:
            b = family_of_config(self.config).special_tokens(self.config).get("bos")
            b = b[0] if isinstance(b, (tuple, list)) else b
        if b is None:
            raise SpecialTokenError(f"{self.name}: --bos, but neither the tokenizer ({tok.source}) nor config.json "
                                    "names a BOS token")
        return int(b)

    def self_debias_prefix_ids(self) -> list[list[int]]:
        """The token ids of each Self-Debias prefix, each tokenised on its own without special tokens
        (:attr:`self_debias`; docs/debiasing.md).

        Raises:
            ValueError: not a Self-Debias model, or a prefix that encodes to no token.
        """
        if self.self_debias is None:
            raise ValueError(f"{self.name}: not a Self-Debias model")
        out = []
        for i, text in enumerate(self.self_debias.prefixes):
            ids = [int(t) for t in self.tokenizer.encode(text)]
            if not ids:
                raise ValueError(f"{self.name}: Self-Debias prefix {i + 1} ({text!r}) encodes to no token")
            out.append(ids)
        return out

    def resolve_bos(self, bos: bool | None) -> bool:
        """``bos`` with ``None`` replaced by what the model's tokenizer does (recorded in results)."""
        return self.tokenizer.adds_bos if bos is None else bool(bos)

    # -- generation ----------------------------------------------------------------------------------------------
    def end_token_ids(self, template=None) -> tuple[int, ...]:
        """Every token a generation stops at, sorted: ``config.json``'s ``eos_token_id`` (an id or a list),
        ``generation_config.json``'s ``eos_token_id`` (an id or a list: Llama-3-Instruct lists ``<|eot_id|>`` only
        there; what ``transformers``' ``generate`` stops at) and, with a chat ``template``
        (:class:`rbjax.model.chat_template.ChatTemplate`), the token it ends an assistant turn with
        (:func:`rbjax.model.chat.end_of_turn_id`).

        Raises:
            ValueError: an unreadable ``generation_config.json``, or an id in it outside the model vocabulary.
            SpecialTokenError: no end token at all.
        """
        ids: set[int] = set()

        def add(v, where):
            for i in (v if isinstance(v, (tuple, list)) else [v]):
                if i is None:
                    continue
                if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.config.vocab_size:
                    raise ValueError(f"{where}: eos_token_id {i!r} is not an id of the model vocabulary "
                                     f"[0, {self.config.vocab_size})")
                ids.add(int(i))

        add(family_of_config(self.config).special_tokens(self.config).get("eos"), "config.json")
        if self.folder is not None:
            gen = read_generation_config(self.folder)
            if gen is not None:
                add(gen.get("eos_token_id"), f"{self.folder}/generation_config.json")
        if template is not None:
            add(end_of_turn_id(self.tokenizer, template), f"the chat template ({template.source})")
        if not ids:
            raise SpecialTokenError(f"{self.name}: no end token: config.json and generation_config.json name no "
                                    "eos_token_id (and no chat template ends a turn with a special token)")
        return tuple(sorted(ids))

    # -- keys --------------------------------------------------------------------------------------------------
    def files_key(self) -> dict | str:
        """``{file: sha256}`` of the model folder (:func:`model_files_key`); for parameters in memory, their digest
        (a string); for a Self-Debias run folder ``{"base": the base's key, "self_debias": its settings}`` (another
        model than the base: its scores are reused under another key)."""
        if self._files_key is None:
            self._files_key = (model_files_key(self.folder) if self.folder is not None
                               else tree_digest(self._params))
        return self._files_key

    @property
    def digest(self) -> str:
        """sha256 over :meth:`files_key` (the in-memory key itself when it is already a digest string)."""
        k = self.files_key()
        return k if isinstance(k, str) else digest(k)

    def tokenizer_files_key(self) -> dict:
        """``{file: sha256}`` of the tokenizer files (:func:`tokenizer_files_key` of the folder the tokenizer was read
        from: the tokenizer is loaded for it, so a hub id and its downloaded folder give the same key;
        ``{"source": …}`` for a tokenizer that does not come from a folder)."""
        if self._tok_key is None:
            src = Path(str(getattr(self.tokenizer, "source", "")))
            self._tok_key = tokenizer_files_key(src) if src.is_dir() else {"source": str(src)}
        return self._tok_key

    @property
    def tokenizer_digest(self) -> str:
        """sha256 over :meth:`tokenizer_files_key`."""
        return digest(self.tokenizer_files_key())

    def describe(self) -> dict:
        return {"source": self.name, "folder": None if self.folder is None else str(self.folder),
                "run_folder": None if self.run_folder is None else str(self.run_folder),
                "files_digest": self.digest,
                **({} if self.self_debias is None else {"self_debias": self.self_debias.to_dict()}),
                "tokenizer": self.tokenizer_source if self.tokenizer_source is not None else str(self.folder),
                "tokenizer_digest": self.tokenizer_digest}

    def __repr__(self) -> str:
        return f"ModelHandle({self.name!r}, folder={self._folder!s})"
