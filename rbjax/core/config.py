"""Typed settings whose fields carry their own documentation and command-line spelling.

Every command's settings are a frozen dataclass (:class:`rbjax.train.config.TrainerConfig` and the debiasing
:class:`rbjax.debias.config.TrainConfig`, :class:`rbjax.lmb.config.MeasureConfig`, the dialog tasks' settings);
each field is declared with :func:`field` (default, help, choices, option name) so that the default and help text are
written once and the CLI options are generated from them (:func:`rbjax.commands.options.add_config_arguments`).
:func:`check_types` checks each value against the field's declared type, raising
:class:`rbjax.core.errors.SettingError` that names the field (the CLI shows the flag instead).
"""
from __future__ import annotations

import dataclasses
import math
import typing

from rbjax.core.errors import SettingError

__all__ = ["field", "option_name", "check_types", "replace_settings"]


def field(default, help: str, *, flag: str | None = None, negate: str | None = None,  # noqa: A002
          choices: tuple | None = None, metavar: str | None = None, grid: bool = False):
    """A config field whose help, choices and command-line spelling live with it (the CLI is generated from these
    fields by :func:`rbjax.commands.options.add_config_arguments` and :func:`rbjax.commands.debias.add_training_arguments`).

    ``flag``: the option's name when it is not ``--<field-name>``; ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``); ``grid``: a hyper-parameter of the paper's grid (``rbjax sweep`` takes
    lists of values instead).
    """
    if metavar is None and choices is None and negate is None:
        metavar = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negate": negate,
                                                        "choices": choices, "metavar": metavar, "grid": grid})


def option_name(config_class, field_name: str) -> str:
    """The command-line option of a field of ``config_class`` (``learning_rate`` → ``--lr``, ``dropout`` →
    ``--no-dropout``, ``epochs`` → ``--epochs``)."""
    md = {f.name: f.metadata for f in dataclasses.fields(config_class)}[field_name]
    return md["negate"] or md["flag"] or "--" + field_name.replace("_", "-")


def check_types(cfg) -> None:
    """Each field holds a value of its declared type (ints not bools, finite floats, strings), else
    :class:`SettingError` naming the field."""
    for name, hint in typing.get_type_hints(type(cfg)).items():
        v = getattr(cfg, name)
        args = typing.get_args(hint)
        if v is None and type(None) in args:
            continue
        base = next((a for a in args if a is not type(None)), hint)
        if base is bool:
            ok, words = isinstance(v, bool), "true or false"
        elif base is int:
            ok, words = isinstance(v, int) and not isinstance(v, bool), "an integer"
        elif base is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            words = "a finite number"
        elif base is str:
            ok, words = isinstance(v, str), "a string"
        else:
            continue
        if not ok:
            raise SettingError(name, f"must be {words}, got {v!r}")


def replace_settings(cfg, what: str, **changes):
    """A copy of the settings dataclass ``cfg`` with ``changes`` (checked again by its ``__post_init__``).

    Raises:
        TypeError: a name that is not a field (``what`` names the settings in the message, e.g. "measurement").
    """
    names = [f.name for f in dataclasses.fields(cfg)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"unknown {what} setting(s): {', '.join(unknown)}; the settings are {', '.join(names)}")
    return dataclasses.replace(cfg, **changes)
