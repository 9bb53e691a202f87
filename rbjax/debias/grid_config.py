"""Grid configuration files for ``rbjax sweep --grid-config`` (TOML; experiments/grids/*.toml holds the paper's).

A file names the grid's axes and the settings shared by every point::

    description = "LMD, the paper's grid (§5.1)"     # optional
    methods = ["lmd"]                                 # optional: the methods this file is for (default: all)

    [grid]                                            # axes of rbjax.debias.sweep.PAPER_GRID (any subset)
    batch_size = [4, 8, 16]
    grad_accum = [1, 5, 8]
    lambda_lm = [0.001, 0.01]
    lambda_d = [10, 50, 100]

    [settings]                                        # any DebiasRun setting but method, bias_type, out_dir and
    epochs = 2                                        # the grid's own (batch_size, grad_accum, lambda_lm, lambda_d)
    learning_rate = 5e-5

Precedence (:func:`merge`): rbjax's one rule, :func:`rbjax.core.config.precedence` — an option given on the command
line wins over the file (given: written, even with its default value, e.g. ``--lr 5e-5``), the file wins over the
defaults; an axis missing from the file comes from the command line (default: the paper's). With several files (or a
folder of them), each method takes the file that names it in ``methods``, else the one file without ``methods``.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Collection

from rbjax.core.config import leaves, precedence
from rbjax.core.errors import SettingError
from rbjax.core.io import read_toml
from rbjax.debias.config import METHODS, DebiasRun

__all__ = ["GridConfig", "load_grid_config", "load_grid_configs", "config_for_method", "merge"]

AXES = ("batch_size", "grad_accum", "lambda_lm", "lambda_d")
#: DebiasRun settings a file may not set: the command chooses them, or the grid does
NOT_SETTINGS = ("method", "bias_type", "out_dir") + AXES


@dataclasses.dataclass(frozen=True)
class GridConfig:
    """A parsed grid file. ``methods``: the methods it applies to (empty: all). ``grid``: axis → values.
    ``settings``: DebiasRun setting → value."""

    path: str
    methods: tuple[str, ...]
    grid: dict[str, tuple]
    settings: dict[str, Any]
    description: str = ""


def _axis(path: Path, name: str, values) -> tuple:
    where = f"{path}: [grid] {name}"
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: expected a non-empty list of numbers, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{where}: {v!r} is not a finite number")
        if name in ("batch_size", "grad_accum"):
            if v != int(v) or v < 1:
                raise ValueError(f"{where}: {v!r} is not a positive integer")
            out.append(int(v))
        else:
            if v < 0:
                raise ValueError(f"{where}: {v!r} is negative")
            out.append(float(v))
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: repeated values {values!r}")
    return tuple(out)


def load_grid_config(path: str | Path) -> GridConfig:
    """Read and check one grid file.

    Raises:
        FileNotFoundError: no such file. ValueError: not TOML, an unknown key or table, a bad axis or setting (the
        message names the file and the key).
    """

    path = Path(path)
    doc = read_toml(path, "--grid-config file")
    unknown = sorted(set(doc) - {"description", "methods", "grid", "settings"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; expected description, methods, [grid], [settings]")
    methods = doc.get("methods", [])
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or any(m not in METHODS for m in methods):
        raise ValueError(f"{path}: methods must be a list of {', '.join(METHODS)}, got {doc.get('methods')!r}")
    grid_t = doc.get("grid", {})
    if not isinstance(grid_t, dict):
        raise ValueError(f"{path}: grid must be a table ([grid])")
    bad = sorted(set(grid_t) - set(AXES))
    if bad:
        raise ValueError(f"{path}: [grid] has unknown axis/axes {bad}; the axes are {', '.join(AXES)}")
    grid = {k: _axis(path, k, v) for k, v in grid_t.items()}
    settings = doc.get("settings", {})
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: settings must be a table ([settings])")
    fields = {leaf.name for leaf in leaves(DebiasRun)}
    for k in settings:
        if k in AXES:
            raise ValueError(f"{path}: [settings] {k} is a grid axis: list its values under [grid]")
        if k in NOT_SETTINGS:
            raise ValueError(f"{path}: [settings] {k} is chosen on the command line (--{k.replace('_', '-')}), "
                             "not in a grid file")
        if k not in fields:
            raise ValueError(f"{path}: [settings] {k} is not a training setting (see `rbjax sweep --help`)")
    try:  # the types and ranges, checked now rather than after the first chunk
        DebiasRun.from_flat({"method": methods[0] if methods else "hd", **settings})
    except SettingError as e:  # names the key as written in the file
        raise ValueError(f"{path}: [settings] {e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: [settings]: {e}") from None
    return GridConfig(str(path), tuple(methods), grid, dict(settings), str(doc.get("description", "")))


def load_grid_configs(paths) -> list[GridConfig]:
    """Files and folders (every ``*.toml`` in a folder, sorted) → grid configs.

    Raises:
        ValueError: two files claim the same method, or more than one file has no ``methods``.
    """
    files: list[Path] = []
    for p in paths or []:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.glob("*.toml"))
            if not found:
                raise FileNotFoundError(f"--grid-config {p}: folder without *.toml files")
            files.extend(found)
        else:
            files.append(p)
    cfgs = [load_grid_config(f) for f in files]
    owner: dict[str, str] = {}
    generic = [c.path for c in cfgs if not c.methods]
    if len(generic) > 1:
        raise ValueError(f"--grid-config: {', '.join(generic)} all apply to every method; give `methods` in each")
    for c in cfgs:
        for m in c.methods:
            if m in owner:
                raise ValueError(f"--grid-config: {owner[m]} and {c.path} both name method {m!r}")
            owner[m] = c.path
    return cfgs


def config_for_method(cfgs: list[GridConfig], method: str) -> GridConfig | None:
    """The file for ``method``: the one naming it, else the one without ``methods``, else ``None``."""
    for c in cfgs:
        if method in c.methods:
            return c
    return next((c for c in cfgs if not c.methods), None)


def merge(gc: GridConfig | None, cli_grid: dict[str, tuple],
          given: Collection[str]) -> tuple[dict[str, tuple], dict[str, Any]]:
    """``(grid, settings overrides)`` for one method, by :func:`rbjax.core.config.precedence` (command line > file >
    default).

    Args:
        gc: the method's file (or None). cli_grid: the axes as parsed from the command line (the values written, or
        their defaults). given: the names written on the command line (:func:`rbjax.commands.options.given_options`;
        an axis by its name, ``batch_size``, a setting by its DebiasRun name), whatever their values.

    Returns:
        the grid's axes, and the file's settings that the command line does not give (they replace the parsed
        defaults).
    """
    if gc is None:
        return dict(cli_grid), {}
    grid = precedence(cli_grid, gc.grid, {k: cli_grid[k] for k in AXES if k in given})
    settings = {k: v for k, v in gc.settings.items() if k not in given}
    return {k: grid[k] for k in AXES}, settings
