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
from collections.abc import Mapping
from typing import Any

from rbjax.core.errors import SettingError

__all__ = ["field", "option_name", "check_types", "replace_settings", "section", "Leaf", "leaves", "from_flat",
           "to_flat", "replace_flat"]


def field(default, help: str, *, flag: str | None = None, negate: str | None = None,  # noqa: A002
          choices: tuple | None = None, metavar: str | None = None):
    """A config field whose help, choices and command-line spelling live with it (the CLI is generated from these
    fields by :func:`rbjax.commands.options.add_config_arguments` and :func:`rbjax.commands.debias.add_training_arguments`).

    ``flag``: the option's name when it is not ``--<field-name>``; ``negate``: a boolean switched off by
    ``--no-<name>`` (e.g. ``--no-dropout``; ``help`` then describes the setting when on, and the switch's help is
    generated from it).
    """
    if metavar is None and choices is None and negate is None:
        metavar = {int: "N", float: "X", str: "TEXT"}.get(type(default), "VALUE")
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "negate": negate,
                                                        "choices": choices, "metavar": metavar})


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


def _sections(config_class) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(config_class) if _is_section(f)]


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
