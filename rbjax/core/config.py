"""Typed settings whose fields carry their own documentation and command-line spelling.

Every command's settings are a frozen dataclass (:class:`rbjax.train.config.TrainerConfig` and the debiasing
:class:`rbjax.debias.config.DebiasRun`, :class:`rbjax.lmb.config.MeasureConfig`, the dialog tasks' settings, and the
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

__all__ = ["field", "option_name", "check_types", "check_value", "replace_settings", "precedence", "section", "Leaf",
           "leaves", "leaf_hints", "from_flat", "to_flat", "replace_flat"]


def field(default, help: str, *, flag: str | None = None, negate: str | None = None,  # noqa: A002
          choices: tuple | None = None, metavar: str | None = None, repeat: bool = False,
          parse: Callable[[str], Any] | None = None, alias: bool = True, positional: bool = False):
    """A config field whose help, choices and command-line spelling live with it (the CLI is generated from these
    fields by :func:`rbjax.commands.options.add_config_arguments` and :func:`rbjax.commands.debias.add_training_arguments`).

    ``flag``: the option's name when it is not ``--<field-name>`` (``--<field-name>`` is then accepted too, unless
    ``alias`` is False: ``--lr`` and ``--learning-rate``); ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``), or by the switch it names (``--keep-duplicates``; ``help`` then
    describes the setting when on, and the switch's help is generated from it); ``repeat``: a
    ``tuple[T, ...]`` field whose option is written once per value (``--subreddit a --subreddit b``) rather than
    once with several values; ``parse``: the option's conversion of the text the user writes, when it is not the
    field's type (e.g. ``LABEL_A,LABEL_B`` for a pair of names); ``repeat="extend"``: both (``--dump a b --dump c``).
    ``positional``: the option is a positional argument of the command (named by ``metavar``; a ``tuple[T, ...]``
    field takes one or more), always required — a setting of the command line only (a command's folders and files).
    """
    if metavar is None and choices is None and negate is None:
        metavar = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negate": negate,
                                                        "choices": choices, "metavar": metavar,
                                                        "repeat": repeat, "parse": parse, "alias": alias,
                                                        "positional": positional})


def option_name(config_class, field_name: str) -> str:
    """The command-line option of a setting of ``config_class`` (``learning_rate`` → ``--lr``, ``dropout`` →
    ``--no-dropout``, ``epochs`` → ``--epochs``); a setting of a nested section is found by its flat name
    (:func:`leaves`)."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    f = fields.get(field_name)
    if f is None or _is_section(f):
        f = {leaf.name: leaf.field for leaf in leaves(config_class)}[field_name]
    md = f.metadata
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


# ------------------------------------------------------------------------------------------------ nested settings
def section(config_class, *, expose: tuple[str, ...] | None = None, helps: dict[str, str] | None = None,
            **defaults):
    """A field holding a nested settings dataclass (levanter's ``TrainLmConfig(trainer=…, optimizer=…)``): its
    default is ``config_class(**defaults)``.

    ``expose``: the nested fields that are settings of the outer class (options, study keys, :func:`from_flat`
    names); the others keep the section's defaults (e.g. a dialog task fixes the trainer's checkpoint count).
    Default: all of them. ``helps``: help texts that say more in this context than the section's own (e.g. the
    debiasing methods' default batch sizes).
    """
    return dataclasses.field(default_factory=lambda: config_class(**defaults),
                             metadata={"section": config_class, "expose": expose, "defaults": dict(defaults),
                                       "helps": dict(helps or {})})


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One setting of a (nested) settings class: its flat ``name`` (the field's name, unique in the tree), the
    ``path`` of section names that leads to it, the dataclass ``field`` and the class that declares it (``owner``:
    its flag and type), its effective ``default`` (a section may set its own) and ``help`` (likewise)."""

    name: str
    path: tuple[str, ...]
    field: dataclasses.Field
    owner: type
    default: Any
    help: str


def _is_section(f: dataclasses.Field) -> bool:
    return "section" in f.metadata


def leaves(config_class) -> list[Leaf]:
    """Every setting of ``config_class``, nested sections walked depth-first in declaration order.

    Raises:
        TypeError: two settings share a name (flat names must be unique: they are the options and study keys).
    """
    out: list[Leaf] = []

    def walk(cls, path, expose, overrides, helps):
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if _is_section(f):
                md = f.metadata
                walk(md["section"], path + (f.name,), md["expose"], md["defaults"], md["helps"])
                continue
            if expose is not None and f.name not in expose:
                continue
            default = overrides[f.name] if f.name in overrides else f.default
            out.append(Leaf(f.name, path, f, cls, default, helps.get(f.name, f.metadata.get("help", ""))))

    walk(config_class, (), None, {}, {})
    seen: dict[str, Leaf] = {}
    for leaf in out:
        if leaf.name in seen:
            raise TypeError(f"{config_class.__name__}: two settings are named {leaf.name!r} "
                            f"({'.'.join(seen[leaf.name].path + (leaf.name,))} and "
                            f"{'.'.join(leaf.path + (leaf.name,))})")
        seen[leaf.name] = leaf
    return out


def leaf_hints(config_class) -> dict[str, Any]:
    """``{flat name: type hint}`` of every setting of ``config_class`` (:func:`leaves`), for :func:`check_value`."""
    return {leaf.name: typing.get_type_hints(leaf.owner)[leaf.name] for leaf in leaves(config_class)}


def from_flat(config_class, values: Mapping[str, Any] | None = None, /, **kw):
    """An instance of the nested settings class ``config_class`` from flat setting names (:func:`leaves`): each
    value goes to the section that declares it, every other setting keeps its (section's) default.

    Raises:
        TypeError: a name that is not a setting of ``config_class`` (the settings are listed).
        rbjax.core.errors.SettingError: a bad value (from the sections' checks).
    """
    given = {**(values or {}), **kw}
    known = {leaf.name: leaf for leaf in leaves(config_class)}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"unknown {config_class.__name__} setting(s): {', '.join(unknown)}; the settings are "
                        f"{', '.join(known)}")
    return _build(config_class, (), given, known, {})


def _build(cls, path, given, known, defaults):
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if _is_section(f):
            md = f.metadata
            kw[f.name] = _build(md["section"], path + (f.name,), given, known, md["defaults"])
        elif f.name in given and known.get(f.name) is not None and known[f.name].path == path:
            kw[f.name] = given[f.name]
        elif f.name in defaults:
            kw[f.name] = defaults[f.name]
    return cls(**kw)


def to_flat(cfg) -> dict[str, Any]:
    """``{flat name: value}`` of a (nested) settings instance: what result files record and study files hold."""
    out: dict[str, Any] = {}
    for leaf in leaves(type(cfg)):
        v = cfg
        for p in leaf.path:
            v = getattr(v, p)
        out[leaf.name] = getattr(v, leaf.name)
    return out


def replace_flat(cfg, **changes):
    """A copy of the nested settings ``cfg`` with ``changes`` given by flat name (checked again by each section).

    Raises:
        TypeError: a name that is not a setting.
    """
    known = {leaf.name: leaf for leaf in leaves(type(cfg))}
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise TypeError(f"unknown {type(cfg).__name__} setting(s): {', '.join(unknown)}; the settings are "
                        f"{', '.join(known)}")

    def rebuild(obj, path):
        kw = {}
        for f in dataclasses.fields(obj):
            if _is_section(f):
                sub = rebuild(getattr(obj, f.name), path + (f.name,))
                if sub is not getattr(obj, f.name):
                    kw[f.name] = sub
            elif f.name in changes and known[f.name].path == path:
                kw[f.name] = changes[f.name]
        return dataclasses.replace(obj, **kw) if kw else obj

    return rebuild(cfg, ())
