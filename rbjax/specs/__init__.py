"""Bias specifications (paper §2.1, App. A) as data.

Each bias type has two target sets (T1: the minoritised group the stereotypes are
about, T2: the dominant / counter-target group), two attribute sets (A1:
stereotypical attributes, A2: their counterparts, line-aligned with A1) and the
word-level T1↔T2 term pairs used for counterfactual swapping and debiasing.

The five packaged specifications live next to this file as ``<name>.json``; a
user-written spec is any JSON file with the same schema (see
``docs/spec-format.md``), loaded with :func:`load_spec`.
"""
from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

#: Canonical bias-type names, in the paper's order.
BIAS_TYPES: tuple[str, ...] = ("religion1", "religion2", "race", "gender", "queerness")

#: Accepted aliases -> canonical name. The upstream data folder for queerness is ``orientation``.
ALIASES: dict[str, str] = {"orientation": "queerness", "sexori": "queerness", "queer": "queerness"}

#: Group names as used in the upstream file names: bias type -> (T1 group, T2 group).
GROUPS: dict[str, tuple[str, str]] = {
    "religion1": ("jews", "christians"),
    "religion2": ("muslims", "christians"),
    "race": ("black", "white"),
    "gender": ("female", "male"),
    "queerness": ("lgbtq", "straight"),
}

#: Folder / file-name stem of each bias type in the upstream RedditBias repository.
UPSTREAM_NAME: dict[str, str] = {b: ("orientation" if b == "queerness" else b) for b in BIAS_TYPES}


def canonical_bias_type(name: str) -> str:
    """Return the canonical bias-type name for ``name`` (case-insensitive; ``orientation`` → ``queerness``).

    Raises:
        ValueError: if ``name`` is not a known bias type or alias.
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BIAS_TYPES:
        raise ValueError(
            f"unknown bias type {name!r}; expected one of {', '.join(BIAS_TYPES)} (or 'orientation' for queerness)"
        )
    return key


@dataclasses.dataclass(frozen=True)
class BiasSpec:
    """One bias specification (paper §2.1, App. A).

    Attributes:
        name: bias-type name (``religion1`` … or a user's own name).
        t1_group, t2_group: group names, e.g. ``"jews"``, ``"christians"``.
        targets_t1, targets_t2: target terms of T1 and T2 (words or short phrases, lower-case).
        attributes_a1: stereotypical attributes A1 (lower-case; ``*`` is a retrieval wildcard,
            multi-word attributes are plain strings with spaces).
        attributes_a2: counter attributes A2, aligned with A1 (``None`` where the paper marks
            an entry unused).
        pairs: word-level (t1, t2) term pairs used for counterfactual swapping and as target
            pairs of the debiasing losses (paper App. A; singular and plural forms listed).
        queries: retrieval queries (paper §2.2): T1 target phrases, including the forms of
            "to be" where the paper's query list has them, e.g. ``"jews are"``.
        two_way: whether counterfactual swapping also maps T2 terms back to T1 (paper §4.4).
        phrase_words: the single words the upstream phrase extraction centred its ±7-token
            windows on (e.g. ``jew, jews, jewish, torah, judaism, semitic, ashkenazi``); empty
            for a user spec, where ``targets_t1`` is used.
        reference: the official code's own lists (token-id pairs of LMD/ADD/HD, attribute
            rows, substring swap rules), kept verbatim under their own names; ``{}`` for a
            user spec.
    """

    name: str
    t1_group: str
    t2_group: str
    targets_t1: tuple[str, ...]
    targets_t2: tuple[str, ...]
    attributes_a1: tuple[str, ...]
    attributes_a2: tuple[str | None, ...]
    pairs: tuple[tuple[str, str], ...]
    queries: tuple[str, ...]
    two_way: bool = False
    phrase_words: tuple[str, ...] = ()
    reference: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "BiasSpec":
        required = ["name", "t1_group", "t2_group", "targets_t1", "targets_t2", "attributes_a1", "pairs"]
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"{source}: bias specification is missing field(s) {missing}")
        a1 = tuple(str(a).lower() for a in d["attributes_a1"])
        a2 = d.get("attributes_a2") or [None] * len(a1)
        if len(a2) != len(a1):
            raise ValueError(f"{source}: attributes_a2 has {len(a2)} entries but attributes_a1 has {len(a1)}")
        pairs = []
        for i, p in enumerate(d["pairs"]):
            if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) and x for x in p)):
                raise ValueError(f"{source}: pairs[{i}] must be a [t1, t2] pair of non-empty strings, got {p!r}")
            pairs.append((p[0].lower(), p[1].lower()))
        if not pairs:
            raise ValueError(f"{source}: bias specification has no term pairs")
        return cls(
            name=str(d["name"]),
            t1_group=str(d["t1_group"]),
            t2_group=str(d["t2_group"]),
            targets_t1=tuple(t.lower() for t in d["targets_t1"]),
            targets_t2=tuple(t.lower() for t in d["targets_t2"]),
            attributes_a1=a1,
            attributes_a2=tuple(None if a is None else str(a).lower() for a in a2),
            pairs=tuple(pairs),
            queries=tuple(q.lower() for q in d.get("queries", d["targets_t1"])),
            two_way=bool(d.get("two_way", False)),
            phrase_words=tuple(w.lower() for w in d.get("phrase_words", ())),
            reference=dict(d.get("reference", {})),
        )


def is_spec_path(name_or_path: str | Path) -> bool:
    """True when ``name_or_path`` names a spec file rather than a packaged bias type."""
    s = str(name_or_path)
    return s.endswith(".json") or ("/" in s) or Path(s).is_file()


def layout_names(spec: "BiasSpec") -> tuple[str, str, str]:
    """``(type, T1, T2)`` as used in the released file names: the upstream names for the packaged
    types (``orientation`` for queerness), else the spec's own ``name``, ``t1_group``, ``t2_group``.

    Raises:
        ValueError: a user spec whose name or group cannot be part of a file name.
    """
    if spec.name in BIAS_TYPES:
        g1, g2 = GROUPS[spec.name]
        return UPSTREAM_NAME[spec.name], g1, g2
    for part in (spec.name, spec.t1_group, spec.t2_group):
        if not part or any(c in part for c in "/\\") or part in (".", ".."):
            raise ValueError(f"spec name/group {part!r} cannot be used in a file name")
    return spec.name, spec.t1_group, spec.t2_group


def load_spec(name_or_path: str | Path) -> BiasSpec:
    """Load a packaged bias specification by name, or a user spec from a JSON file.

    Args:
        name_or_path: a bias-type name (``religion1``, ``religion2``, ``race``, ``gender``,
            ``queerness``/``orientation``) or a path to a JSON spec file.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: unknown name, invalid JSON, or a spec missing required fields.
    """
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"bias specification file not found: {p}")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON ({e})") from None
        return BiasSpec.from_dict(d, source=str(p))
    name = canonical_bias_type(str(name_or_path))
    text = resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    return BiasSpec.from_dict(json.loads(text), source=f"rbjax/specs/{name}.json")
