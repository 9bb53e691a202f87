"""Command-line options generated from a settings dataclass (:func:`rbjax.core.config.field`), so that a default,
its help and its choices are written once, in the dataclass.

Each field becomes one option whose destination is the field's name: a value option (``--n-std X``, typed and
checked by argparse), a ``--name`` switch (a ``bool`` defaulting to ``False``), a ``--no-name`` switch (a field
declared with ``negate``, defaulting to ``True``), or ``--name/--no-name`` (a ``bool | None`` field: ``None`` = the
automatic choice). :func:`config_values` reads them back.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Iterable

from rbjax.core.config import option_name

__all__ = ["add_config_arguments", "config_values"]


def _fields(config_class, names: Iterable[str] | None):
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    if names is None:
        return list(fields.values())
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise TypeError(f"{config_class.__name__} has no field(s) {', '.join(unknown)}")
    return [fields[n] for n in names]


def add_config_arguments(group, config_class, names: Iterable[str] | None = None) -> None:
    """Add one option per field of ``config_class`` (``names``: these fields, in this order; default: all).

    Raises:
        TypeError: a name that is not a field, or a ``--no-...`` field whose default is not ``True``.
    """
    hints = typing.get_type_hints(config_class)
    for f in _fields(config_class, names):
        md = f.metadata
        flag = option_name(config_class, f.name)
        args = typing.get_args(hints[f.name])
        base = next((a for a in args if a is not type(None)), hints[f.name])
        if md["negate"]:
            if f.default is not True:
                raise TypeError(f"{config_class.__name__}.{f.name}: a --no-... switch needs the default True")
            group.add_argument(flag, dest=f.name, action="store_false", help=md["help"])
        elif base is bool and type(None) in args:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                               help=md["help"])
        elif base is bool:
            if f.default is not False:
                raise TypeError(f"{config_class.__name__}.{f.name}: a switch needs the default False (or negate=)")
            group.add_argument(flag, dest=f.name, action="store_true", help=md["help"])
        else:
            kw = dict(dest=f.name, type=base, default=f.default, help=md["help"])
            if md["choices"]:
                kw["choices"] = list(md["choices"])
            if md["metavar"] and not md["choices"]:
                kw["metavar"] = md["metavar"]
            names_ = [flag] if not md["flag"] else [flag, "--" + f.name.replace("_", "-")]
            group.add_argument(*names_, **kw)


def config_values(args, config_class, names: Iterable[str] | None = None) -> dict:
    """The values of :func:`add_config_arguments`'s options in ``args`` (``{field name: value}``)."""
    return {f.name: getattr(args, f.name) for f in _fields(config_class, names) if hasattr(args, f.name)}
