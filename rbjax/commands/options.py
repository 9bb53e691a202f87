"""Command-line options generated from a settings dataclass (:func:`rbjax.core.config.field`), so that a default,
its help and its choices are written once, in the dataclass; and which options the user wrote.

Each field becomes one option whose destination is the field's name: a value option (``--n-std X``, typed and
checked by argparse), a ``--name`` switch (a ``bool`` defaulting to ``False``), a ``--no-name`` switch (a field
declared with ``negate``, defaulting to ``True``), ``--name/--no-name`` (a ``bool | None`` field: ``None`` = the
automatic choice), ``--name A B`` (a ``tuple[T, ...]`` field) or ``--name A --name B`` (one declared with
``repeat``). :func:`config_values` reads them back.

The options record whether the user wrote them (those added by :func:`add_config_arguments` or passed to
:func:`record_given`, and every option of an :class:`OptionParser`, the class of every ``rbjax`` subcommand's parser):
:func:`given_options` names them and ``config_values(..., given_only=True)`` returns only their values — "given"
means written, also when the value written is the default. That is what the one precedence rule,
:func:`rbjax.core.config.precedence` (command line > file > default), is fed with.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from typing import Any, Iterable, Mapping

from rbjax.core.config import option_name

__all__ = ["OptionParser", "add_config_arguments", "config_values", "given_options", "option_spec", "record_given",
           "negated_help"]

#: the attribute of a parsed namespace that holds the destinations of the options written on the command line
GIVEN = "_given_options"


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
    values, or one value per option with ``repeat``; ``parse`` replaces the type), ``dest`` the field's name.

    ``unset_default``: the option's default is ``None`` ("not given": the caller fills in a default of its own, e.g.
    each dialog task's), not the field's. ``default``, ``help``: a nested setting's own (:class:`rbjax.core.config.Leaf`),
    instead of the field's.

    Raises:
        TypeError: a ``--no-...`` field whose default is not ``True``.
    """
    md = f.metadata
    hint = typing.get_type_hints(config_class)[f.name]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if union else hint  # (T | None: T)
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
        if md.get("parse"):
            kw["type"] = md["parse"]
        elif typing.get_origin(base) is tuple:
            kw["type"] = typing.get_args(base)[0]
            if md.get("repeat") == "extend":  # --name A B --name C
                kw.update(action="extend", nargs="+")
            elif md.get("repeat"):
                kw["action"] = "append"
            else:
                kw["nargs"] = "+"
        else:
            kw["type"] = base
        if md["choices"]:
            kw["choices"] = list(md["choices"])
        elif md["metavar"]:
            kw["metavar"] = md["metavar"]
    if md.get("positional"):  # named by the field, required: no option string, no dest keyword, no default
        del kw["dest"], kw["default"]
        return [f.name], kw
    alias = md["flag"] and not md["negate"] and md.get("alias", True)
    names = [flag, "--" + f.name.replace("_", "-")] if alias else [flag]
    return names, kw


#: what a command may change of a shared block's option (:func:`add_config_arguments`'s ``overrides``)
OVERRIDABLE = ("help", "default", "choices", "metavar")


def add_config_arguments(group, config_class, names: Iterable[str] | None = None, *, required: Iterable[str] = (),
                         overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Add one option per field of ``config_class`` (``names``: these fields, in this order; default: all), as
    :func:`option_spec` describes it.

    ``required``: the fields whose option this command cannot do without (a shared block's ``--out``, ``--model``).
    ``overrides``: ``{field: {keyword: value}}``, the few things a command may specialise of a shared block's option
    (:data:`OVERRIDABLE`: its help where the meaning truly differs, e.g. ``--out`` naming a file; its default; a
    narrower set of choices; the metavar); everything else — spelling, type, destination — is the field's.

    Raises:
        TypeError: a name that is not a field (of ``names``, ``required`` or ``overrides``), an override keyword
            not in :data:`OVERRIDABLE`, or a ``--no-...`` field whose default is not ``True``.
    """
    fields = _fields(config_class, names)
    required, overrides = set(required), dict(overrides or {})
    unknown = (required | set(overrides)) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"{config_class.__name__}: required / overrides name field(s) not added: "
                        f"{', '.join(sorted(unknown))}")
    for f in fields:
        change = dict(overrides.get(f.name, {}))
        bad = set(change) - set(OVERRIDABLE)
        if bad:
            raise TypeError(f"{config_class.__name__}.{f.name}: cannot override {', '.join(sorted(bad))} (only "
                            f"{', '.join(OVERRIDABLE)})")
        flags, kw = option_spec(config_class, f, help=change.pop("help", None),
                                default=change.pop("default", dataclasses.MISSING))
        if "choices" in change:
            kw["choices"] = list(change.pop("choices"))
        kw.update(change)
        if f.name in required and not f.metadata.get("positional"):
            kw["required"] = True
        record_given(group.add_argument(*flags, **kw))


def config_values(args, config_class, names: Iterable[str] | None = None, *, given_only: bool = False) -> dict:
    """The values of :func:`add_config_arguments`'s options in ``args`` (``{field name: value}``; a repeated option's
    list as a tuple).

    ``given_only``: only the options written on the command line (:func:`given_options`), for
    :func:`rbjax.core.config.precedence`.
    """
    given = given_options(args) if given_only else None
    out = {}
    for f in _fields(config_class, names):
        if not hasattr(args, f.name) or (given is not None and f.name not in given):
            continue
        v = getattr(args, f.name)
        out[f.name] = tuple(v) if isinstance(v, list) else v
    return out


def given_options(args) -> frozenset[str]:
    """The destinations (field names) of the recording options (see the module docstring) written on the command
    line that ``args`` was parsed from — written, whatever the value (``--lr 5e-5`` is given although 5e-5 is the
    default)."""
    return getattr(args, GIVEN, frozenset())


@functools.cache
def _recording(action_class: type) -> type:
    """``action_class`` that also records its destination as given (:data:`GIVEN`) when the user writes it."""

    def __call__(self, parser, namespace, values, option_string=None):
        action_class.__call__(self, parser, namespace, values, option_string)
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest})

    return type(action_class.__name__, (action_class,), {"__call__": __call__, "_records_given": True})


def record_given(action: argparse.Action) -> argparse.Action:
    """Make the option ``action`` (what ``add_argument`` returned) record, when the user writes it, that it was
    given (:func:`given_options`); returns it."""
    if not getattr(action, "_records_given", False) and not isinstance(
            action, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)):
        action.__class__ = _recording(type(action))
    return action


class OptionParser(argparse.ArgumentParser):
    """An argument parser all of whose options record whether the user wrote them (:func:`given_options`), whoever
    added them (:func:`add_config_arguments` or by hand)."""

    def parse_known_args(self, args=None, namespace=None):
        for action in self._actions:
            record_given(action)
        return super().parse_known_args(args, namespace)
