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

__all__ = ["add_config_arguments", "config_values", "negated_help"]


def _fields(config_class, names: Iterable[str] | None):
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    if names is None:
        return list(fields.values())
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise TypeError(f"{config_class.__name__} has no field(s) {', '.join(unknown)}")
    return [fields[n] for n in names]


def negated_help(help_text: str) -> str:
    """The help of a ``--no-...`` switch, from the help of the setting it turns off (which describes the setting
    when on: "dropout 0.1 during training" → "turn off: dropout 0.1 during training (on by default)")."""
    return f"turn off: {help_text} (on by default)"


def option_spec(config_class, f: dataclasses.Field, *, unset_default: bool = False, default=dataclasses.MISSING,
                help: str | None = None) -> tuple[list[str], dict]:  # noqa: A002
    """The option of the field ``f`` of ``config_class``: ``(names, add_argument keywords)`` — spelling, help,
    choices and metavar from the field's metadata, type from its annotation (a ``tuple[T, ...]`` takes one or more
    values), ``dest`` the field's name.

    ``unset_default``: the option's default is ``None`` ("not given": the caller fills in a default of its own, e.g.
    each dialog task's), not the field's. ``default``, ``help``: a nested setting's own (:class:`rbjax.core.config.Leaf`),
    instead of the field's.

    Raises:
        TypeError: a ``--no-...`` field whose default is not ``True``.
    """
    md = f.metadata
    hint = typing.get_type_hints(config_class)[f.name]
    args = typing.get_args(hint)
    base = next((a for a in args if a is not type(None)), hint)
    flag = option_name(config_class, f.name)
    default = f.default if default is dataclasses.MISSING else default
    text = md["help"] if help is None else help
    kw: dict = {"dest": f.name, "help": text, "default": None if unset_default else default}
    if md["negate"]:
        if default is not True:
            raise TypeError(f"{config_class.__name__}.{f.name}: a --no-... switch needs the default True")
        # the field's help describes the setting (on); the switch turns it off, and its help says so
        kw.update(action="store_false", help=negated_help(text))
    elif base is bool:
        # False by default: a switch; True or None (automatic) by default: --name/--no-name
        kw["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
    else:
        if typing.get_origin(base) is tuple:
            kw.update(nargs="+", type=typing.get_args(base)[0])
        else:
            kw["type"] = base
        if md["choices"]:
            kw["choices"] = list(md["choices"])
        elif md["metavar"]:
            kw["metavar"] = md["metavar"]
    names = [flag] if not md["flag"] or md["negate"] else [flag, "--" + f.name.replace("_", "-")]
    return names, kw


def add_config_arguments(group, config_class, names: Iterable[str] | None = None) -> None:
    """Add one option per field of ``config_class`` (``names``: these fields, in this order; default: all), as
    :func:`option_spec` describes it.

    Raises:
        TypeError: a name that is not a field, or a ``--no-...`` field whose default is not ``True``.
    """
    for f in _fields(config_class, names):
        flags, kw = option_spec(config_class, f)
        group.add_argument(*flags, **kw)


def config_values(args, config_class, names: Iterable[str] | None = None) -> dict:
    """The values of :func:`add_config_arguments`'s options in ``args`` (``{field name: value}``)."""
    return {f.name: getattr(args, f.name) for f in _fields(config_class, names) if hasattr(args, f.name)}
