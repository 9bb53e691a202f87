"""Typed settings whose fields carry their own documentation and command-line spelling.

Every command's settings are a frozen dataclass (:class:`rbjax.train.config.TrainerConfig` and the debiasing
:class:`rbjax.debias.config.TrainConfig`, :class:`rbjax.lmb.config.MeasureConfig`, the dialog tasks' settings, and the
others listed in docs/architecture.md "Settings"); each field is declared with :func:`field` (default, help, choices,
option name) so that the default and help text are written once and the CLI options are generated from them
(:func:`rbjax.commands.options.add_config_arguments`). :func:`check_types` checks each value against the field's
declared type, raising :class:`rbjax.core.errors.SettingError` that names the field (the CLI shows the flag instead,
a study file its section and key). :func:`precedence` is the one rule by which a setting given in several places
is chosen.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from rbjax.core.errors import SettingError

__all__ = ["field", "option_name", "check_types", "check_value", "replace_settings", "precedence"]


def field(default, help: str, *, flag: str | None = None, negate: str | None = None,  # noqa: A002
          choices: tuple | None = None, metavar: str | None = None, grid: bool = False, repeat: bool = False,
          parse: Callable[[str], Any] | None = None, alias: bool = True):
    """A config field whose help, choices and command-line spelling live with it (the CLI is generated from these
    fields by :func:`rbjax.commands.options.add_config_arguments` and :func:`rbjax.commands.debias.add_training_arguments`).

    ``flag``: the option's name when it is not ``--<field-name>`` (``--<field-name>`` is then accepted too, unless
    ``alias`` is False: ``--lr`` and ``--learning-rate``); ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``), or by the switch it names (``--keep-duplicates``); ``grid``: a
    hyper-parameter of the paper's grid (``rbjax sweep`` takes lists of values instead); ``repeat``: a
    ``tuple[T, ...]`` field whose option is written once per value (``--subreddit a --subreddit b``) rather than
    once with several values; ``parse``: the option's conversion of the text the user writes, when it is not the
    field's type (e.g. ``LABEL_A,LABEL_B`` for a pair of names).
    """
    if metavar is None and choices is None and negate is None:
        metavar = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negate": negate,
                                                        "choices": choices, "metavar": metavar, "grid": grid,
                                                        "repeat": repeat, "parse": parse, "alias": alias})


def option_name(config_class, field_name: str) -> str:
    """The command-line option of a field of ``config_class`` (``learning_rate`` → ``--lr``, ``dropout`` →
    ``--no-dropout``, ``epochs`` → ``--epochs``)."""
    md = {f.name: f.metadata for f in dataclasses.fields(config_class)}[field_name]
    return md["negate"] or md["flag"] or "--" + field_name.replace("_", "-")


def _members(hint) -> tuple:
    """The members of a union (``int | None`` → ``(int, NoneType)``), or ``(hint,)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


_WORDS = {bool: ("true or false", "true/false values"), int: ("an integer", "integers"),
          float: ("a finite number", "finite numbers"), str: ("a string", "strings"), dict: ("a table", "tables")}


def _fits(hint, v) -> tuple[bool, Any]:
    """``(whether v is of the type hint, v with a list given for a tuple made a tuple)``; a type this check does not
    know is not checked."""
    members = _members(hint)
    if len(members) > 1:
        for m in members:
            ok, nv = _fits(m, v)
            if ok:
                return True, nv
        return False, v
    if hint is type(None):
        return v is None, v
    if hint is bool:
        return isinstance(v, bool), v
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), v
    if hint is str:
        return isinstance(v, str), v
    if hint is dict or typing.get_origin(hint) is dict:
        return isinstance(v, dict), v
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if not isinstance(v, (list, tuple)):
            return False, v
        item_hints = [args[0]] * len(v) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_hints) != len(v):
            return False, v
        items = [_fits(h, x) for h, x in zip(item_hints, v)]
        nv = tuple(x for _, x in items)
        return all(ok for ok, _ in items), (v if isinstance(v, tuple) and nv == v else nv)
    return True, v


def _words(hint) -> str:
    """What a value of the type hint is, for a message ("an integer", "a list of strings", "a string or a table")."""
    members = [m for m in _members(hint) if m is not type(None)]
    if len(members) > 1:
        return " or ".join(_words(m) for m in members)
    hint = members[0] if members else hint
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_WORDS.get(args[0], ('', 'values'))[1]}"
        kinds = {_WORDS.get(a, ("", "values"))[1] for a in args}
        return f"a list of {len(args)} {kinds.pop() if len(kinds) == 1 else 'values'}"
    return _WORDS.get(typing.get_origin(hint) or hint, ("a value of type " + getattr(hint, "__name__", str(hint)),))[0]


def check_value(name: str, hint, value):
    """``value`` checked against the type ``hint`` of the setting ``name`` (bool, int — not a bool —, finite float —
    an int too —, str, a table (``dict``), ``tuple[T, ...]`` — a list or tuple of T —, ``tuple[T1, T2]``, and unions
    of these, ``None`` where the union allows it).

    Returns:
        the value, a list given for a tuple as a tuple.
    Raises:
        SettingError: naming ``name`` and what the value must be ("must be an integer, got 'one'").
    """
    ok, normalised = _fits(hint, value)
    if not ok:
        raise SettingError(name, f"must be {_words(hint)}, got {value!r}")
    return normalised


def check_types(cfg) -> None:
    """Each field holds a value of its declared type (:func:`check_value`), else :class:`SettingError` naming the
    field; a list given for a ``tuple`` field is stored as a tuple (so a frozen settings object stays hashable and
    compares equal however it was built)."""
    for name, hint in typing.get_type_hints(type(cfg)).items():
        v = getattr(cfg, name)
        nv = check_value(name, hint, v)
        if nv is not v:
            object.__setattr__(cfg, name, nv)


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


def precedence(default: Mapping[str, Any], file: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """rbjax's one precedence rule for a setting that can come from several places: **command line > file >
    default**.

    ``given`` holds only what the user wrote on the command line (``rbjax.commands.options.config_values(...,
    given_only=True)``, a study's ``--set``): an option written with its default value is given, and beats the file;
    an option not written leaves the file's value. A value is never judged by whether it differs from its default.
    ``file``: a settings file's values (a grid file's ``[grid]`` / ``[settings]``, a study file's table);
    ``default``: the values neither gives (the dataclass's defaults, or what the caller starts from).

    Returns:
        a new mapping with the keys of all three, each value from the first of ``given``, ``file``, ``default`` that
        has it.
    """
    return {**default, **file, **given}
