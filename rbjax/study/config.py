"""The study file: the paper's §5 setup as one TOML file (``experiments/paper.toml``, ``experiments/tiny.toml``).

::

    [study]
    name = "RedditBias §5 on DialoGPT-small"
    model = "microsoft/DialoGPT-small"      # HF folder or hub id, or a [study.random_model] table
    tokenizer = ""                          # default: the model folder
    data_dir = ""                           # RedditBias data (default: $RBJAX_DATA_DIR or the verified download)
    bias_types = ["religion1", "religion2", "race", "gender", "queerness"]   # measured everywhere
    debias_types = []                       # debiased (default: bias_types)
    methods = ["lmd", "add", "hd", "cda"]
    seeds = [42]                            # training seeds (`rbjax run --seeds N` → 42, 43, …)
    semantics = "paper"

    [training]      # TrainConfig fields shared by every run (epochs, block_size, max_steps, learning_rate, …)
    [sweep]         # the grid and the selection on the valid split
    methods = ["lmd", "add", "hd"]           # methods with a grid; the others train once with their defaults
    batch_size = [4, 8, 16]  …  selection = "default" | "reference"; lmp_tolerance; dev_max_pairs; n_bootstrap;
    grid_chunk; executor = "local" | "ray"; ray_address
    [measure]       # split = "test", n_bootstrap
    [dialog]        # tasks = ["lmp", "dst", "crg"] and each task's settings (lmp = {...}, dst = {...}, crg = {...})

Relative paths in the file are resolved against the study file's folder, paths given with ``--set`` against the
current folder. ``--set key=value`` (TOML value syntax; plain words are strings) overrides any field, e.g. ``--set study.data_dir=../shared/redditbias --set training.max_steps=2``.
"""
from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from rbjax.core.io import read_toml
from rbjax.core.mesh import mesh_product, parse_mesh
from rbjax.data.redditbias import expand_bias_types
from rbjax.debias.config import METHODS, TrainConfig
from rbjax.debias.sweep import PAPER_GRID

__all__ = ["StudyConfig", "load_study", "parse_override"]

SECTIONS = ("study", "training", "sweep", "measure", "dialog")
STUDY_KEYS = {"name", "model", "random_model", "tokenizer", "data_dir", "bias_types", "debias_types", "methods",
              "seeds", "semantics", "precision", "mesh"}
SWEEP_KEYS = {"methods", "batch_size", "grad_accum", "lambda_lm", "lambda_d", "selection", "lmp_tolerance",
              "dev_max_pairs", "n_bootstrap", "grid_chunk", "executor", "ray_address", "max_points"}
MEASURE_KEYS = {"split", "n_bootstrap", "batch_size"}
DIALOG_KEYS = {"tasks", "lmp", "dst", "crg"}
#: the fields each section takes ([training] takes TrainConfig's fields, checked against the dataclass)
SECTION_KEYS = {"study": STUDY_KEYS, "sweep": SWEEP_KEYS, "measure": MEASURE_KEYS, "dialog": DIALOG_KEYS}
DIALOG_TASKS = ("lmp", "dst", "crg")


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
    recorded with the results; ``path`` is the file it came from."""

    raw: dict
    path: Path

    # ---------------------------------------------------------------------------------------------- accessors
    @property
    def study(self) -> dict:
        return self.raw.get("study", {})

    @property
    def name(self) -> str:
        return str(self.study.get("name") or self.path.stem)

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
        return self._resolve(self.study.get("model"))

    @property
    def random_model(self) -> dict | None:
        return self.study.get("random_model")

    @property
    def tokenizer(self) -> str | None:
        return self._resolve(self.study.get("tokenizer"))

    @property
    def data_dir(self) -> str | None:
        return self._resolve(self.study.get("data_dir"))

    @property
    def bias_types(self) -> list[str]:

        return expand_bias_types(self.study.get("bias_types", "all"))

    @property
    def debias_types(self) -> list[str]:

        d = self.study.get("debias_types")
        return expand_bias_types(d) if d else self.bias_types

    @property
    def methods(self) -> list[str]:
        return list(self.study.get("methods", ["lmd", "add", "hd", "cda"]))

    @property
    def seeds(self) -> list[int]:
        s = self.study.get("seeds", [42])
        return [int(x) for x in (s if isinstance(s, list) else [s])]

    @property
    def semantics(self) -> str:
        return str(self.study.get("semantics", "paper"))

    @property
    def precision(self) -> str:
        return str(self.study.get("precision", "fp32"))

    @property
    def mesh(self) -> str | None:
        """``[study] mesh = "data=2,fsdp=4"``: the device mesh of every training and scoring stage (docs/scale.md)."""
        m = self.study.get("mesh")
        return None if m is None else str(m)

    @property
    def training(self) -> dict:
        return dict(self.raw.get("training", {}))

    @property
    def sweep(self) -> dict:
        d = {"methods": ["lmd", "add", "hd"], "selection": "default", "lmp_tolerance": 0.10, "n_bootstrap": 1000,
             "executor": "local"}
        d.update(self.raw.get("sweep", {}))
        return d

    @property
    def measure(self) -> dict:
        d = {"split": "test", "n_bootstrap": 10000, "batch_size": 64}
        d.update(self.raw.get("measure", {}))
        return d

    @property
    def dialog(self) -> dict:
        d = {"tasks": list(DIALOG_TASKS)}
        d.update(self.raw.get("dialog", {}))
        return d

    def grid(self) -> dict:

        return {k: tuple(self.sweep.get(k, v)) for k, v in PAPER_GRID.items()}

    def with_seeds(self, n: int) -> "StudyConfig":
        """The same study with ``n`` training seeds: the first configured seed and the ``n − 1`` following ones."""
        if n < 1:
            raise ValueError(f"--seeds must be >= 1, got {n}")
        raw = copy.deepcopy(self.raw)
        first = self.seeds[0]
        raw.setdefault("study", {})["seeds"] = list(range(first, first + n))
        return StudyConfig(raw, self.path)

    # ---------------------------------------------------------------------------------------------- checking
    def validate(self) -> None:
        """Raise ValueError naming the file and the field for anything that cannot run."""

        where = str(self.path)
        for sec in self.raw:
            if sec not in SECTIONS:
                raise ValueError(f"{where}: unknown section [{sec}] (expected {', '.join(SECTIONS)})")
        for sec, keys in SECTION_KEYS.items():
            extra = set(self.raw.get(sec, {})) - keys
            if extra:
                raise ValueError(f"{where}: unknown field(s) {sorted(extra)} in [{sec}]")
        if self.mesh is not None:
            try:
                parse_mesh(self.mesh, mesh_product(self.mesh), flag="[study] mesh")
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
        if not self.model and not self.random_model:
            raise ValueError(f"{where}: [study] needs model (an HF folder or hub id) or a random_model table")
        if self.model and self.random_model:
            raise ValueError(f"{where}: [study] has both model and random_model; keep one")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"{where}: unknown method(s) {bad} in [study] methods (expected {', '.join(METHODS)})")
        if not self.seeds:
            raise ValueError(f"{where}: [study] seeds is empty")
        self.bias_types, self.debias_types  # noqa: B018 (raise on unknown bias types)
        if self.sweep["selection"] not in ("default", "reference"):
            raise ValueError(f"{where}: [sweep] selection must be 'default' or 'reference'")
        if self.sweep["executor"] not in ("local", "ray"):
            raise ValueError(f"{where}: [sweep] executor must be 'local' or 'ray'")
        bad = [t for t in self.dialog["tasks"] if t not in DIALOG_TASKS]
        if bad:
            raise ValueError(f"{where}: unknown dialog task(s) {bad} (expected {', '.join(DIALOG_TASKS)})")

        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        extra = set(self.training) - fields
        if extra:
            raise ValueError(f"{where}: unknown field(s) {sorted(extra)} in [training] (TrainConfig fields)")


def _check_override(text: str, keys: list[str], value: Any, raw: dict) -> None:
    """A ``--set`` names a known section and field, and a number or a switch gets a number or a switch.

    Raises:
        ValueError: naming the ``--set`` argument (not the study file, which is not at fault).
    """

    sec = keys[0]
    if sec not in SECTIONS:
        raise ValueError(f"--set {text!r}: unknown section [{sec}] (expected {', '.join(SECTIONS)})")
    if len(keys) < 2:
        raise ValueError(f"--set {text!r}: name a field of [{sec}], e.g. {sec}.<field>=VALUE")
    train_defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    known = set(train_defaults) if sec == "training" else SECTION_KEYS[sec]
    if keys[1] not in known:
        raise ValueError(f"--set {text!r}: unknown field {keys[1]!r} in [{sec}] (known: {', '.join(sorted(known))})")
    current: Any = raw
    for k in keys:
        current = current.get(k) if isinstance(current, dict) else None
    if current is None and sec == "training" and len(keys) == 2:
        current = train_defaults[keys[1]]
    if value is None or value == "":
        return
    is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(current, bool):
        ok, words = isinstance(value, bool), "true or false"
    elif isinstance(current, int):
        ok, words = is_num and isinstance(value, int), "an integer"
    elif isinstance(current, float):
        ok, words = is_num, "a number"
    else:
        return  # strings, lists, tables and unset fields: checked by validate() / the stage that reads them
    if not ok:
        raise ValueError(f"--set {text!r}: {'.'.join(keys)} must be {words}, got {value!r}")


def load_study(path: str | Path, overrides: list[str] | None = None) -> StudyConfig:
    """Read and validate a study file, applying ``--set`` overrides.

    Raises:
        FileNotFoundError: no such file. ValueError: invalid TOML or fields (file and field named).
    """

    p = Path(path)
    raw = read_toml(p, "study file")
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
        d[keys[-1]] = value
    cfg = StudyConfig(raw, p.resolve())
    cfg.validate()
    return cfg
