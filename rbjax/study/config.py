"""The study file: the paper's §5 setup as one TOML file (``experiments/paper.toml``, ``experiments/tiny.toml``).

::

    [study]
    name = "RedditBias §5 on DialoGPT-small"
    model = "microsoft/DialoGPT-small"      # HF folder or hub id (any family), or a [study.random_model] table:
                                            # a config.json (model_type picks the family, GPT-2 without) + seed
    tokenizer = ""                          # default: the model folder
    data_dir = ""                           # RedditBias data (default: $RBJAX_DATA_DIR or the verified download)
    bias_types = ["religion1", "religion2", "race", "gender", "queerness"]   # measured everywhere
    debias_types = []                       # debiased (default: bias_types)
    methods = ["lmd", "add", "hd", "cda"]   # also without training: "sentence-debias", "inlp", "self-debias"
    seeds = [42]                            # training seeds (`rbjax run --seeds N` → 42, 43, …)
    semantics = "paper"

    [training]      # DebiasRun fields shared by every run (epochs, block_size, max_steps, learning_rate, …)
    [sweep]         # the grid and the selection on the valid split
    methods = ["lmd", "add", "hd"]           # methods with a grid; the others train once with their defaults
    batch_size = [4, 8, 16]  …  selection = "default" | "reference"; lmp_tolerance; dev_max_pairs; n_bootstrap;
    grid_chunk; executor = "local" | "ray"; ray_address
    k = [1, 2]  inlp_iterations = [10, 80]  decay_constant = [10, 50]   # the small grids of the methods without
                                            # training (each with its method in methods; none by default)
    [measure]       # MeasureConfig fields (split = "test", n_bootstrap, batch_size, bos, …); precision and mesh: [study]
    [dialog]        # tasks = ["lmp", "dst", "crg"] and each task's settings (lmp = {...}, dst = {...}, crg = {...}); mesh: [study]
    [benchmarks]    # pair benchmarks on the baseline and every debiased model (docs/pairs.md): crows_pairs = true,
                    # crows_pairs_dir, crows_pairs_categories = [...] (default all nine), pair_files = ["mine.csv"];
                    # BBQ (docs/bbq.md): bbq = true, bbq_dir (a folder of BBQ .jsonl), bbq_categories = [...]

Each section is a settings dataclass, whose fields are its keys and whose types and ranges are checked in one place:
[study] :class:`StudySettings`, [training] :class:`~rbjax.debias.config.DebiasRun`, [sweep]
:class:`~rbjax.debias.sweep_config.SweepConfig` (and the grid's axes), [measure]
:class:`~rbjax.lmb.config.MeasureConfig`, [dialog] each task's settings class; an error names the file, section and
key (or the ``--set`` that gave the value).

Relative paths in the file are resolved against the study file's folder, paths given with ``--set`` against the
current folder. ``--set key=value`` (TOML value syntax; plain words are strings) overrides any field, e.g.
``--set study.data_dir=../shared/redditbias --set training.max_steps=2``: the one precedence rule of rbjax
(:func:`rbjax.core.config.precedence`), command line > file > default (the section's dataclass).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from rbjax.core.config import check_types, check_value, field, leaf_hints, precedence
from rbjax.core.digests import file_digest
from rbjax.core.errors import SettingError
from rbjax.core.io import read_toml
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.core.precision import PRECISIONS
from rbjax.data.bbq import bbq_files
from rbjax.data.pairs import read_pair_file
from rbjax.data.redditbias import expand_bias_types
from rbjax.debias.config import METHODS, SEMANTICS, DebiasRun
from rbjax.debias.self_debias import METHOD as SELF_DEBIAS
from rbjax.debias.self_debias import SelfDebiasRun
from rbjax.debias.sweep import PAPER_GRID
from rbjax.debias.sweep_config import SweepConfig
from rbjax.debias.training_free import TRAINING_FREE_METHODS, ProjectionRun
from rbjax.dialog.tasks import TASKS as DIALOG_TASKS
from rbjax.dialog.tasks import get_task
from rbjax.lmb.config import MeasureConfig
from rbjax.model.chat import ChatSettings
from rbjax.model.registry import family_of

__all__ = ["StudyConfig", "StudySettings", "BenchmarksSettings", "load_study", "parse_override", "STUDY_METHODS",
           "NO_TRAINING_METHODS", "NO_TRAINING_GRID", "SEED_FREE_METHODS"]

#: the debiasing methods without training (docs/debiasing.md §10–11): run once with their defaults, or over a small
#: grid of their own (:data:`NO_TRAINING_GRID`)
NO_TRAINING_METHODS = (*TRAINING_FREE_METHODS, SELF_DEBIAS)
#: the one grid axis of each method without training: ``[sweep]`` key → (the setting of its run, the values' kind);
#: SentenceDebias's subspace size k, INLP's classifiers at most, Self-Debias's decay constant λ
NO_TRAINING_GRID = {"sentence-debias": ("k", "k", "int"), "inlp": ("inlp_iterations", "iterations", "int"),
                    SELF_DEBIAS: ("decay_constant", "decay_constant", "positive number")}
#: the methods a study takes: the trained ones and those without training
STUDY_METHODS = (*METHODS, *NO_TRAINING_METHODS)
#: the methods whose result does not depend on a seed (SentenceDebias, Self-Debias): run once, under the study's
#: first seed (INLP's seed splits its sets: it runs under every seed)
SEED_FREE_METHODS = ("sentence-debias", SELF_DEBIAS)


@dataclasses.dataclass(frozen=True)
class StudySettings(ChatSettings):
    """The ``[study]`` section: the model, the data, what is measured and debiased, with which methods and seeds, and
    the precision, mesh and format of every stage (frozen; TOML lists may be given for the tuples). The format
    fields (``format``, ``role``, ``system``, ``prompt``, ``score_end_of_turn``, ``chat_template``:
    :class:`rbjax.model.chat.ChatSettings`) make every stage run in chat format: training, the LMB measurements and
    the dialog task CRG (docs/chat.md, "Studies in chat format"). Each field's
    ``metadata["help"]`` is its documentation. The other sections are the settings classes of their stages
    (:class:`~rbjax.debias.config.DebiasRun`, :class:`~rbjax.debias.sweep_config.SweepConfig`,
    :class:`~rbjax.lmb.config.MeasureConfig`, the dialog tasks' settings).

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or not a choice (names the field; a study file
            shows its file, section and key).
    """

    name: str = field("", "the study's name (default: the study file's name)")
    model: str | None = field(None, "HF model folder or hub id (any supported family); a relative path is relative "
                                    "to the study file. Or random_model")
    random_model: dict | None = field(None, "a random model instead of model: a config.json table (model_type picks "
                                            "the family, GPT-2 without one) and its seed")
    tokenizer: str | None = field(None, "tokenizer folder or hub id (default, or empty: the model folder)")
    data_dir: str | None = field(None, "RedditBias data folder (default, or empty: $RBJAX_DATA_DIR, else the "
                                       "verified download)")
    bias_types: str | tuple[str, ...] = field("all", "the bias types every model is measured on: all, or a list of "
                                                     "names or bias-spec files")
    debias_types: str | tuple[str, ...] = field((), "the bias types debiased (default, or empty: bias_types)")
    methods: tuple[str, ...] = field(("lmd", "add", "hd", "cda"), f"debiasing methods ({', '.join(STUDY_METHODS)}; "
                                                                  "the last three without training, no grid)")
    seeds: int | tuple[int, ...] = field((42,), "training seeds (`rbjax run --seeds N`: the first and the N − 1 "
                                                "after it)")
    semantics: str = field("paper", "the methods' semantics: paper or reference (docs/debiasing.md)",
                           choices=SEMANTICS)
    precision: str = field("fp32", "compute precision of every training and scoring stage", choices=PRECISIONS)
    mesh: str | None = field(None, "the device mesh of every training and scoring stage, e.g. data=2,fsdp=4 "
                                   "(docs/scale.md)", metavar="AXIS=N,...")

    def __post_init__(self):
        check_types(self)
        self.check_chat_settings()
        bad = [m for m in self.methods if m not in STUDY_METHODS]
        if bad:
            raise SettingError("methods", f"has unknown method(s) {bad} (expected {', '.join(STUDY_METHODS)})")
        if self.seeds == ():
            raise SettingError("seeds", "is empty: give one seed or more")
        for name, allowed in (("semantics", SEMANTICS), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise SettingError(name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class BenchmarksSettings:
    """The ``[benchmarks]`` section: the pair benchmarks (docs/pairs.md) and BBQ (docs/bbq.md) measured, like
    ``[measure]`` says, on the baseline and on every debiased model (frozen, TOML lists may be given for the tuples).

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type, a CrowS-Pairs setting without ``crows_pairs`` or
            a BBQ setting without ``bbq``.
    """

    crows_pairs: bool = field(False, "measure CrowS-Pairs (folder crows-pairs of each model's stage)")
    crows_pairs_dir: str | None = field(None, "CrowS-Pairs data folder (default: the verified download)")
    crows_pairs_categories: tuple[str, ...] = field((), "CrowS-Pairs categories (default, or empty: all nine)")
    pair_files: tuple[str, ...] = field((), "pair files of one's own (docs/pairs.md; folder pairs-<file stem>)")
    bbq: bool = field(False, "measure BBQ (docs/bbq.md; folder bbq of each model's stage)")
    bbq_dir: str | None = field(None, "a folder of BBQ .jsonl files, one per category (default: the verified "
                                      "download)")
    bbq_categories: tuple[str, ...] = field((), "BBQ categories (file names without .jsonl; default, or empty: all)")

    def __post_init__(self):
        check_types(self)
        for on, names in (("crows_pairs", ("crows_pairs_dir", "crows_pairs_categories")),
                          ("bbq", ("bbq_dir", "bbq_categories"))):
            if not getattr(self, on):
                for name in names:
                    if getattr(self, name):
                        raise SettingError(name, f"is set but {on} is not true")
        for name in ("crows_pairs_categories", "pair_files", "bbq_categories"):
            if not all(getattr(self, name)):
                raise SettingError(name, f"must be a list of names, got {list(getattr(self, name))!r}")


SECTIONS = ("study", "training", "sweep", "measure", "dialog", "benchmarks")
STUDY_KEYS = {f.name for f in dataclasses.fields(StudySettings)}
#: [sweep]: the grid's axes, the methods with a grid, the selection the study goes on with, and SweepConfig's fields
#: (but ``final``: the study retrains nothing, it measures the selected point)
SWEEP_KEYS = ({"methods", "selection", *PAPER_GRID, *(a for a, _, _ in NO_TRAINING_GRID.values())}
              | {f.name for f in dataclasses.fields(SweepConfig)}) - {"final"}
#: the format settings, which [study] sets for every stage (training, measure, dialog)
CHAT_KEYS = {f.name for f in dataclasses.fields(ChatSettings)}
#: [measure] takes MeasureConfig's fields but precision and mesh, which [study] sets for every stage; its format keys
#: (a study trained on raw text, measured in chat format) only when [study] leaves the format raw
MEASURE_KEYS = {f.name for f in dataclasses.fields(MeasureConfig)} - {"precision", "mesh"}
#: the dialog tasks that have a chat format (the others refuse it: a chat-format study leaves them out)
CHAT_DIALOG_TASKS = ("crg",)
DIALOG_KEYS = {"tasks", "lmp", "dst", "crg"}
#: [benchmarks]: CrowS-Pairs (its folder, its categories), pair files and BBQ (its folder, its categories), each
#: measured like [measure] says
BENCHMARK_KEYS = {f.name for f in dataclasses.fields(BenchmarksSettings)}
#: the fields each section takes ([training] takes DebiasRun's settings, checked against the dataclass)
SECTION_KEYS = {"study": STUDY_KEYS, "sweep": SWEEP_KEYS, "measure": MEASURE_KEYS, "dialog": DIALOG_KEYS,
                "benchmarks": BENCHMARK_KEYS}
#: the settings class whose field types a section's keys have (a ``--set`` is checked by it when given; [sweep]'s grid
#: axes, methods and selection, and [dialog], when the section is read)
SECTION_CLASSES = {"study": StudySettings, "training": DebiasRun, "measure": MeasureConfig, "sweep": SweepConfig,
                   "benchmarks": BenchmarksSettings}


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=value"`` → ``(["a", "b"], value)``; the value is read as TOML (``2``, ``["x"]``, ``true``), else kept as
    a string.

    Raises:
        ValueError: no ``=`` or an empty key.
    """
    if "=" not in text:
        raise ValueError(f"--set {text!r}: expected KEY=VALUE (e.g. training.max_steps=2)")
    key, raw = text.split("=", 1)
    path = [k for k in key.strip().split(".") if k]
    if not path:
        raise ValueError(f"--set {text!r}: empty key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


@dataclasses.dataclass
class StudyConfig:
    """A parsed study file (see the module docstring). ``raw`` keeps the whole content (after overrides), which is
    recorded with the results; ``path`` is the file it came from; :attr:`settings` is its [study] section as
    :class:`StudySettings`, which the accessors read (paths resolved against the file's folder, bias types
    expanded)."""

    raw: dict
    path: Path
    #: ``"section.key"`` → the ``--set`` argument that gave it (errors name the --set, not the innocent file)
    overrides: dict = dataclasses.field(default_factory=dict)

    # ---------------------------------------------------------------------------------------------- accessors
    @property
    def study(self) -> dict:
        return self.raw.get("study", {})

    @functools.cached_property
    def settings(self) -> StudySettings:
        """``[study]`` as :class:`StudySettings`.

        Raises:
            rbjax.core.errors.SettingError: see the class (:meth:`validate` names the file, section and key).
        """
        return StudySettings(**self.study)

    @property
    def name(self) -> str:
        return self.settings.name or self.path.stem

    def _resolve(self, value: str | None) -> str | None:
        """A path relative to the study file's folder; hub ids (``org/name`` that does not exist locally) as given."""
        if not value:
            return None
        p = Path(value).expanduser()
        if p.is_absolute():
            return str(p)
        local = (self.path.parent / p)
        if local.exists() or value.startswith("."):
            return str(local.resolve())
        return value

    @property
    def model(self) -> str | None:
        return self._resolve(self.settings.model)

    @property
    def random_model(self) -> dict | None:
        return self.settings.random_model

    def random_model_config(self):
        """The family config of ``[study.random_model]`` (a ``config.json`` table: ``model_type`` picks the family,
        GPT-2 without one; ``seed`` is not part of it), or ``None`` without one.

        Raises:
            ValueError, TypeError: a field the family refuses or cannot read (named, with where it was given).
        """
        if self.random_model is None:
            return None
        where = self.where("study", "random_model")
        spec = {k: v for k, v in self.random_model.items() if k != "seed"}
        return family_of(spec, where).config_from_hf(spec, where)

    @property
    def tokenizer(self) -> str | None:
        return self._resolve(self.settings.tokenizer)

    @property
    def data_dir(self) -> str | None:
        return self._resolve(self.settings.data_dir)

    @property
    def bias_types(self) -> list[str]:
        return expand_bias_types(self.settings.bias_types)

    @property
    def debias_types(self) -> list[str]:
        d = self.settings.debias_types
        return expand_bias_types(d) if d else self.bias_types

    @property
    def methods(self) -> list[str]:
        return list(self.settings.methods)

    @property
    def seeds(self) -> list[int]:
        s = self.settings.seeds
        return [s] if isinstance(s, int) else list(s)

    @property
    def semantics(self) -> str:
        return self.settings.semantics

    @property
    def precision(self) -> str:
        return self.settings.precision

    @property
    def mesh(self) -> str | None:
        """``[study] mesh = "data=2,fsdp=4"``: the device mesh of every training and scoring stage (docs/scale.md)."""
        return self.settings.mesh

    @property
    def training(self) -> dict:
        return dict(self.raw.get("training", {}))

    @property
    def sweep(self) -> dict:
        """[sweep] as given, with the methods, the selection and three SweepConfig defaults always present (the
        stages' keys)."""
        d = {"methods": ["lmd", "add", "hd"], "selection": "default",
             **{k: getattr(SweepConfig, k) for k in ("lmp_tolerance", "n_bootstrap", "executor")}}
        d.update(self.raw.get("sweep", {}))
        return d

    def sweep_config(self) -> SweepConfig:
        """The :class:`SweepConfig` of the study's sweeps: [sweep]'s settings; the selected rule is retrained
        (``final``), without its own evaluation (the study's stages measure it)."""
        fields = {f.name for f in dataclasses.fields(SweepConfig)}
        return SweepConfig(**{k: v for k, v in self.sweep.items() if k in fields}, final=self.sweep["selection"])

    @property
    def measure(self) -> dict:
        """[measure] as given, with the split, bootstrap and batch size always present (the stages' keys)."""
        d = {k: getattr(MeasureConfig, k) for k in ("split", "n_bootstrap", "batch_size")}
        d.update(self.raw.get("measure", {}))
        return d

    def measure_config(self) -> MeasureConfig:
        """The :class:`MeasureConfig` of every measure stage: [measure] with [study]'s precision, mesh and (in a
        chat-format study) format."""
        return MeasureConfig(**self.measure, precision=self.precision, mesh=self.mesh,
                             **(self.chat if self.is_chat else {}))

    @property
    def chat(self) -> dict:
        """[study]'s format settings by name (``chat_template`` resolved against the study file's folder), for
        every stage's settings."""
        st = self.settings
        d = {k: getattr(st, k) for k in CHAT_KEYS}
        d["chat_template"] = self._resolve(d["chat_template"])
        return d

    @property
    def is_chat(self) -> bool:
        return self.settings.is_chat

    def projection_chat(self) -> ChatSettings:
        """The format SentenceDebias and INLP read their sentences in: [study]'s (its scoring-only
        ``score_end_of_turn`` left out: a representation is the mean over a sentence's own tokens)."""
        c = {k: v for k, v in self.chat.items() if k != "score_end_of_turn"}
        return ChatSettings(**c) if self.is_chat else ChatSettings()

    def chat_key(self) -> dict:
        """What the format adds to a stage's key: nothing in the raw format (the keys of raw-format studies are what
        they were), the format settings in the chat format."""
        if not self.is_chat:
            return {}
        c = self.chat
        return {"chat": {**c, "chat_template_sha256": None if c["chat_template"] is None else file_digest(
            c["chat_template"])}}

    def dialog_chat(self, task: str) -> dict:
        """The format settings of dialog task ``task`` (``format``, ``system``, ``chat_template`` in the chat
        format; none in the raw format)."""
        if not self.is_chat or task not in CHAT_DIALOG_TASKS:
            return {}
        c = self.chat
        return {"format": "chat", "system": c["system"], "chat_template": c["chat_template"]}

    @property
    def dialog(self) -> dict:
        d = {"tasks": list(DIALOG_TASKS)}
        d.update(self.raw.get("dialog", {}))
        return d

    def benchmarks(self) -> list[dict]:
        """The benchmarks of ``[benchmarks]``, each ``{"name": stage folder name, "benchmark": "crows-pairs" |
        "pairs" | "bbq", "pairs_file", "data_dir", "categories"}``: CrowS-Pairs (folder ``crows-pairs``) when
        ``crows_pairs`` is true, then every pair file (folder ``pairs-<file stem>``), then BBQ (folder ``bbq``) when
        ``bbq`` is true."""
        b = self.raw.get("benchmarks", {})
        out = []
        if b.get("crows_pairs"):
            out.append({"name": "crows-pairs", "benchmark": "crows-pairs", "pairs_file": None,
                        "data_dir": self._resolve(b.get("crows_pairs_dir")),
                        "categories": list(b.get("crows_pairs_categories") or []) or "all"})
        for f in b.get("pair_files") or []:
            path = self._resolve(str(f))
            out.append({"name": f"pairs-{Path(path).stem}", "benchmark": "pairs", "pairs_file": path,
                        "data_dir": None, "categories": "all"})
        if b.get("bbq"):
            out.append({"name": "bbq", "benchmark": "bbq", "pairs_file": None,
                        "data_dir": self._resolve(b.get("bbq_dir")),
                        "categories": list(b.get("bbq_categories") or []) or "all"})
        return out

    def no_training_grid(self, method: str) -> tuple[str, list] | None:
        """``(the run's setting, its values)`` of a method without training that has a grid (in ``[sweep] methods``,
        its axis given: ``k``, ``inlp_iterations`` or ``decay_constant``), else ``None`` (one run, its defaults)."""
        if method not in NO_TRAINING_GRID or method not in self.sweep["methods"]:
            return None
        key, setting, _ = NO_TRAINING_GRID[method]
        return setting, list(self.sweep[key])

    def grid(self) -> dict:
        g = {k: self.sweep.get(k, v) for k, v in PAPER_GRID.items()}
        return {k: tuple(v) if isinstance(v, list) else v for k, v in g.items()}  # (validate() checks the values)

    def with_seeds(self, n: int) -> "StudyConfig":
        """The same study with ``n`` training seeds: the first configured seed and the ``n − 1`` following ones."""
        if n < 1:
            raise ValueError(f"--seeds must be >= 1, got {n}")
        raw = copy.deepcopy(self.raw)
        first = self.seeds[0]
        raw.setdefault("study", {})["seeds"] = list(range(first, first + n))
        return StudyConfig(raw, self.path, dict(self.overrides))

    # ---------------------------------------------------------------------------------------------- checking
    def where(self, sec: str, key: str | None = None) -> str:
        """Where a value came from, for an error message: the ``--set`` that gave it, else the file, section and key."""
        o = self.overrides.get(f"{sec}.{key}") if key is not None else None
        if o is not None:
            return f"--set {o!r}"
        return f"{self.path}: [{sec}]" + (f" {key}" if key is not None else "")

    def validate(self) -> None:
        """Check every field and value before anything runs (``--dry-run`` included).

        Raises:
            ValueError: naming the file, section and key (or the ``--set``) of the first value that cannot run.
        """

        where = str(self.path)
        for sec in self.raw:
            if sec not in SECTIONS:
                raise ValueError(f"{where}: unknown section [{sec}] (expected {', '.join(SECTIONS)})")
            if not isinstance(self.raw[sec], dict):
                raise ValueError(f"{where}: [{sec}] must be a table")
        study_chat = (self.raw.get("study") or {}).get("format") == "chat"
        for sec in ("training", "measure") if study_chat else ("training",):
            here = sorted(set(self.raw.get(sec, {})) & CHAT_KEYS)
            if here:
                raise ValueError(f"{where}: {', '.join(here)} in [{sec}]: the format of training is set in [study] "
                                 "(format = \"chat\" runs every stage in chat format; [measure] may set its own only "
                                 "when [study] leaves the format raw)")
        for sec, keys in SECTION_KEYS.items():
            extra = set(self.raw.get(sec, {})) - keys
            if extra:
                raise ValueError(f"{where}: unknown field(s) {sorted(extra)} in [{sec}]")
        try:
            self.settings  # noqa: B018 (the [study] section as StudySettings: types and choices)
        except SettingError as e:
            raise ValueError(f"{self.where('study', e.field)}: {e.renamed(f'study.{e.field}')}") from None
        if self.mesh is not None:
            try:
                parse_mesh(self.mesh, mesh_product(self.mesh), flag="[study] mesh")
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if not self.model and not self.random_model:
            raise ValueError(f"{where}: [study] needs model (an HF folder or hub id) or a random_model table")
        if self.model and self.random_model:
            raise ValueError(f"{where}: [study] has both model and random_model; keep one")
        try:
            self.bias_types, self.debias_types  # noqa: B018 (raise on unknown bias types)
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"{self.where('study', 'bias_types')}: {e}") from None
        if self.random_model is not None:
            self._validate_random_model()
        self._validate_training()
        self._validate_sweep()
        self._validate_measure()
        self._validate_dialog()
        self._validate_benchmarks()

    def _validate_random_model(self) -> None:
        rm = self.random_model  # (a table: StudySettings checked it)
        if "seed" in rm and not _is_int(rm["seed"]):
            raise ValueError(f"{self.where('study', 'random_model')}: seed must be an integer, got {rm['seed']!r}")
        where = self.where("study", "random_model")
        try:  # the family its model_type names (GPT-2 without one), as the model stage builds it
            self.random_model_config()
        except (ValueError, TypeError) as e:
            raise ValueError(str(e) if str(e).startswith(where) else f"{where}: {e}") from None

    def _validate_training(self) -> None:
        """[training] as the DebiasRun of every method of the study (types first, then DebiasRun's own checks)."""

        hints = leaf_hints(DebiasRun)
        extra = set(self.training) - set(hints)
        if extra:
            raise ValueError(f"{self.path}: unknown field(s) {sorted(extra)} in [training] (DebiasRun fields)")
        for k, v in self.training.items():
            try:
                check_value(f"training.{k}", hints[k], v)
            except SettingError as e:
                raise ValueError(f"{self.where('training', k)}: {e}") from None
        for m in self.methods:
            if m in NO_TRAINING_METHODS:
                self._validate_no_training(m)
                continue
            kw = {"model": "m", "out_dir": "o", "tokenizer": None, "data_dir": None, "semantics": self.semantics,
                  "precision": self.precision, **self.chat, **self.training}
            kw.update(method=m, bias_type=self.debias_types[0], seed=self.seeds[0])
            try:
                DebiasRun.from_flat(kw)
            except SettingError as e:  # names the field: the key as written (study-level ones in [study])
                sec = "training" if e.field in self.training else "study"
                raise ValueError(f"{self.where(sec, e.field)}: {e}") from None
            except (ValueError, TypeError) as e:
                msg = str(e)
                key = next((k for k in self.training if re.search(rf"\b{re.escape(k)}\b", msg)), None)
                raise ValueError(f"{self.where('training', key)}: {msg}") from None

    def _validate_no_training(self, method: str, **setting) -> None:
        """A method without training ([training] does not apply to it) on every debiased type, with its defaults (or
        ``setting``, a grid point's) and, for SentenceDebias and INLP, the study's format: Self-Debias needs a
        default prefix for each type (a spec file has none)."""
        where = self.where("study", "methods")
        for b in self.debias_types:
            try:
                if method == SELF_DEBIAS:
                    SelfDebiasRun(bias_type=b, model="m", out_dir="o", **setting)
                else:
                    ProjectionRun(method=method, bias_type=b, model="m", out_dir="o", chat=self.projection_chat(),
                                  **setting)
            except (ValueError, FileNotFoundError) as e:
                raise ValueError(f"{where}: {method} on the debiased type {b}: {e}") from None

    def _validate_sweep(self) -> None:
        sw = self.raw.get("sweep", {})
        for k in ("batch_size", "grad_accum", "lambda_lm", "lambda_d"):
            if k not in sw:
                continue
            v = sw[k]
            ints = k in ("batch_size", "grad_accum")
            ok = isinstance(v, list) and v and all(
                (_is_int(x) and x >= 1) if ints else (_is_num(x) and math.isfinite(x) and x >= 0) for x in v)
            if not ok:
                words = "positive integers" if ints else "finite numbers >= 0"
                raise ValueError(f"{self.where('sweep', k)}: sweep.{k} must be a non-empty list of {words}, got {v!r}")
        if "methods" in sw:
            if not isinstance(sw["methods"], list) or any(m not in STUDY_METHODS for m in sw["methods"]):
                raise ValueError(f"{self.where('sweep', 'methods')}: sweep.methods must be a list of "
                                 f"{', '.join(STUDY_METHODS)}, got {sw['methods']!r}")
        methods = self.sweep["methods"]
        for m, (key, setting, kind) in NO_TRAINING_GRID.items():
            if (m in methods) != (key in sw):  # a grid without its values, or values no grid reads
                raise ValueError(f"{self.where('sweep', key if key in sw else 'methods')}: " + (
                    f"sweep.methods has {m}, whose grid is over sweep.{key}: give its values, e.g. "
                    f"{key} = {[1, 2] if kind == 'int' else [10, 50]}" if m in methods else
                    f"sweep.{key} is the grid of {m}, which sweep.methods does not name (add it there)"))
            if key not in sw:
                continue
            v = sw[key]
            ok = isinstance(v, list) and v and len(set(v)) == len(v) and all(
                (_is_int(x) and x >= 1) if kind == "int" else (_is_num(x) and math.isfinite(x) and x > 0) for x in v)
            if not ok:
                words = "distinct integers >= 1" if kind == "int" else "distinct finite numbers > 0"
                raise ValueError(f"{self.where('sweep', key)}: sweep.{key} must be a non-empty list of {words}, "
                                 f"got {v!r}")
            if m in self.methods:
                for x in v:  # every point as its run takes it (SentenceDebias's k is checked against the data later)
                    self._validate_no_training(m, **{setting: x})
        if "selection" in sw and sw["selection"] not in ("default", "reference"):
            raise ValueError(f"{self.where('sweep', 'selection')}: sweep.selection must be 'default' or 'reference', "
                             f"got {sw['selection']!r}")
        try:
            self.sweep_config()
        except SettingError as e:
            raise ValueError(f"{self.where('sweep', e.field)}: {e.renamed(f'sweep.{e.field}')}") from None

    def _validate_measure(self) -> None:
        """[measure] as a :class:`MeasureConfig` (its own checks; errors name the key as written)."""
        try:
            self.measure_config()
        except SettingError as e:
            sec = "measure" if e.field in self.raw.get("measure", {}) else "study"
            raise ValueError(f"{self.where(sec, e.field)}: {e.renamed(f'{sec}.{e.field}')}") from None

    def _validate_dialog(self) -> None:
        d = self.raw.get("dialog", {})
        tasks = d.get("tasks", list(DIALOG_TASKS))
        if not isinstance(tasks, list) or any(t not in DIALOG_TASKS for t in tasks):
            bad = tasks if not isinstance(tasks, list) else [t for t in tasks if t not in DIALOG_TASKS]
            raise ValueError(f"{self.path}: unknown dialog task(s) {bad} (expected {', '.join(DIALOG_TASKS)})")
        for t in DIALOG_TASKS:
            if t not in d:
                continue
            settings = d[t]
            if not isinstance(settings, dict):
                raise ValueError(f"{self.where('dialog', t)}: dialog.{t} must be a table, e.g. {{ max_examples = 8 }}")
            settings = {(f"{t}_train_file" if k == "train_file" else k): v for k, v in settings.items()}
            here = sorted(set(settings) & CHAT_KEYS)
            if here:
                raise ValueError(f"{self.where('dialog', t)}: dialog.{t}.{here[0]}: the format of every stage is set "
                                 "in [study]")
            if "mesh" in settings:
                raise ValueError(f"{self.where('dialog', t)}: dialog.{t}.mesh: the device mesh of every stage is "
                                 "[study] mesh")
            known = [k for k in get_task(t).settings.names() if k != "mesh"]
            unknown = sorted(set(settings) - set(known))
            if unknown:
                raise ValueError(f"{self.where('dialog', t)}: unknown setting(s) {unknown} of dialog.{t} (known: "
                                 f"{', '.join(sorted(k for k in known if k not in ('progress',)))})")
            try:
                get_task(t).settings.from_settings({**settings, **self.dialog_chat(t)})
            except (ValueError, FileNotFoundError) as e:
                raise ValueError(f"{self.where('dialog', t)}: dialog.{t}: {e}") from None
        if self.is_chat:
            raw_only = [t for t in tasks if t not in CHAT_DIALOG_TASKS]
            if raw_only:
                raise ValueError(f"{self.where('dialog', 'tasks')}: [study] format = \"chat\", but the dialog "
                                 f"task(s) {', '.join(raw_only)} have no chat format; set [dialog] tasks = "
                                 f"{list(t for t in tasks if t in CHAT_DIALOG_TASKS)} (docs/chat.md)")


    def _validate_benchmarks(self) -> None:
        """[benchmarks]: its settings (:class:`BenchmarksSettings`), pair files that exist and read, no two with one
        folder name, BBQ's folder and categories; no pair benchmark in a chat-format study (a pair benchmark has no
        chat format; BBQ has one: it is measured in the study's format)."""
        if self.is_chat and any(b["benchmark"] != "bbq" for b in self.benchmarks()):
            raise ValueError(f"{self.where('benchmarks', None)}: [study] format = \"chat\", but a pair benchmark "
                             "has no chat format (rbjax measure --benchmark refuses it); leave crows_pairs and "
                             "pair_files out of [benchmarks] (bbq has a chat format)")
        try:
            BenchmarksSettings(**self.raw.get("benchmarks", {}))
        except SettingError as e:
            raise ValueError(f"{self.where('benchmarks', e.field)}: {e.renamed('benchmarks.' + e.field)}") from None
        names = [x["name"] for x in self.benchmarks()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{self.where('benchmarks', 'pair_files')}: two pair files share the name {dup[0]} "
                             "(their result folders would collide); rename one")
        for x in self.benchmarks():
            if x["benchmark"] == "bbq" and x["data_dir"] is not None:  # the files are read when measured
                try:
                    bbq_files(x["data_dir"], x["categories"], download=False)
                except (ValueError, FileNotFoundError) as e:
                    key = "bbq_categories" if isinstance(e, ValueError) else "bbq_dir"
                    raise ValueError(f"{self.where('benchmarks', key)}: {e}") from None
            if x["benchmark"] != "pairs":
                continue
            try:
                read_pair_file(x["pairs_file"])
            except (ValueError, FileNotFoundError) as e:
                raise ValueError(f"{self.where('benchmarks', 'pair_files')}: {e}") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_override(text: str, keys: list[str], value: Any, raw: dict) -> None:
    """A ``--set`` names a known section and field, and its value has the field's type (the one check,
    :func:`rbjax.core.config.check_value`, against the section's settings class; a key inside a table, e.g.
    ``dialog.lmp.lmp_max_lines`` or ``study.random_model.n_embd``: the type of the file's value, where it is a number
    or a switch). The rest is checked with the whole file (:meth:`StudyConfig.validate`).

    Raises:
        ValueError: naming the ``--set`` argument (not the study file, which is not at fault).
    """

    sec = keys[0]
    if sec not in SECTIONS:
        raise ValueError(f"--set {text!r}: unknown section [{sec}] (expected {', '.join(SECTIONS)})")
    if len(keys) < 2:
        raise ValueError(f"--set {text!r}: name a field of [{sec}], e.g. {sec}.<field>=VALUE")
    known = set(leaf_hints(DebiasRun)) if sec == "training" else SECTION_KEYS[sec]
    if keys[1] not in known:
        raise ValueError(f"--set {text!r}: unknown field {keys[1]!r} in [{sec}] (known: {', '.join(sorted(known))})")
    if len(keys) == 2:
        hint = leaf_hints(SECTION_CLASSES[sec]).get(keys[1]) if sec in SECTION_CLASSES else None
    else:
        current: Any = raw
        for k in keys:
            current = current.get(k) if isinstance(current, dict) else None
        hint = type(current) if type(current) in (bool, int, float) else None
    if hint is not None:
        try:
            check_value(".".join(keys), hint, value)
        except SettingError as e:
            raise ValueError(f"--set {text!r}: {e}") from None


def load_study(path: str | Path, overrides: list[str] | None = None) -> StudyConfig:
    """Read and validate a study file, applying ``--set`` overrides.

    Raises:
        FileNotFoundError: no such file. ValueError: invalid TOML or fields (file and field named).
    """

    p = Path(path)
    raw = read_toml(p, "study file")
    given: dict[str, str] = {}
    for o in overrides or []:
        keys, value = parse_override(o)
        _check_override(o, keys, value, raw)
        if isinstance(value, str) and value and (value.startswith((".", "~")) or Path(value).exists()):
            value = str(Path(value).expanduser().resolve())  # a path on the command line: relative to the cwd
        d = raw
        for k in keys[:-1]:
            d = d.setdefault(k, {})
            if not isinstance(d, dict):
                raise ValueError(f"--set {o!r}: {k} is not a table")
        d.update(precedence({}, d, {keys[-1]: value}))  # the command line beats the file; defaults: the dataclasses
        given[".".join(keys[:2])] = o
    cfg = StudyConfig(raw, p.resolve(), given)
    cfg.validate()
    return cfg
