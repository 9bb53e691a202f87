"""Generate the packaged bias specifications ``rbjax/specs/<name>.json`` (provenance script).

Run from the repository root::

    python experiments/make_specs.py [--shared ../shared] [--check]

What comes from where
---------------------
* ``queries``, ``targets_t1``, ``targets_t2``: ``data/<type>/<type>_opposites.txt`` of umanlp/RedditBias @ 61f9ae9
  (the paper's App. A target lists). ``queries`` is the T1 column, lower-cased, with "are"/"is"/"should" kept;
  targets are both columns with that trailing verb removed, de-duplicated in file order.
* ``attributes_a1`` / ``attributes_a2``: ``<type>_<T1>.txt`` / ``<type>_<T1>_pos.txt`` (App. A attribute lists),
  lower-cased, quotes removed, ``*`` wildcards kept; an A2 entry ending in a run of >= 4 ``*`` is the paper's
  "unused" marker and becomes ``null``.
* ``pairs``: the word-level T1->T2 pairs read off App. A (the words in which the two columns of
  ``_opposites.txt`` differ), completed with the singular / plural form of each (race also has the unhyphenated
  two-word forms of "african-american(s)"/"afro-american(s)"). They are listed in
  :data:`PAIRS` below, and the script checks that every App. A target pair is covered by them.
  Order matters for the T2->T1 direction of swapping: the first pair listed for a T2 word gives its T1 word.
* ``reference``: the official code's own lists, parsed from ``shared/reference-debias.md`` §5 (token-id
  pairs of LMD, ADD and HD and the zero-padded attribute id rows of ADD/HD, cai:src/transformers/modeling_gpt2.py)
  and the CDA substring swap rules of ``shared/reference-data.md`` §6
  (rb:DataPreparation/reddit_data_replace_target_testset.py:23-101). Every id is checked against the GPT-2
  vocabulary in ``shared/tokenizers/gpt2`` (ids >= 50257 are kept verbatim: they are the code's invalid ids).

The package never reads ``../shared`` at run time; only this script does.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rbjax.specs import BIAS_TYPES, GROUPS, UPSTREAM_NAME, BiasSpec  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Word-level pairs (paper App. A, singular + plural). First pair of a T2 word = its T1 word for T2->T1 swapping.
# ---------------------------------------------------------------------------------------------------------------
PAIRS: dict[str, list[tuple[str, str]]] = {
    "religion1": [
        # "christian" -> "jewish" when swapping back: the adjective is the common use in the data.
        ("jewish", "christian"), ("jew", "christian"), ("jews", "christians"),
        ("judaism", "christianity"), ("torah", "bible"), ("torahs", "bibles"),
    ],
    "religion2": [
        ("muslim", "christian"), ("muslims", "christians"), ("islamic", "christian"),
        ("islam", "christianity"), ("arab", "american"), ("arabs", "americans"),
    ],
    "race": [
        ("black", "white"), ("blacks", "whites"),
        ("african", "american"), ("africans", "americans"),
        ("african-american", "american"), ("african-americans", "americans"),
        ("afro-american", "american"), ("afro-americans", "americans"),
        ("negro", "caucasian"), ("negroes", "caucasians"),
        ("dark-skinned", "light-skinned"),
        # App. A's "African-americans"/"Americans" written without the hyphen (as in the data): a multi-word term,
        # so "african americans" does not become "american americans".
        ("african american", "american"), ("african americans", "americans"),
        ("afro american", "american"), ("afro americans", "americans"),
    ],
    "gender": [
        ("woman", "man"), ("women", "men"), ("mother", "father"), ("mothers", "fathers"),
        ("daughter", "son"), ("daughters", "sons"), ("girl", "boy"), ("girls", "boys"),
        ("wife", "husband"), ("wives", "husbands"), ("niece", "nephew"), ("nieces", "nephews"),
        ("mom", "dad"), ("moms", "dads"), ("grandmother", "grandfather"), ("grandmothers", "grandfathers"),
        ("stepdaughter", "stepson"), ("stepdaughters", "stepsons"), ("bride", "groom"), ("brides", "grooms"),
        ("lady", "gentleman"), ("ladies", "gentlemen"), ("madam", "sir"),
        ("granddaughter", "grandson"), ("granddaughters", "grandsons"), ("hostess", "host"),
        ("hostesses", "hosts"), ("girlfriend", "boyfriend"), ("girlfriends", "boyfriends"),
        ("female", "male"), ("females", "males"), ("aunt", "uncle"), ("aunts", "uncles"),
        ("sister", "brother"), ("sisters", "brothers"), ("she", "he"),
    ],
    "queerness": [
        ("gay", "straight"), ("gays", "straights"), ("lesbian", "straight"), ("lesbians", "straights"),
        ("bisexual", "monosexual"), ("bisexuals", "monosexuals"),
        ("homosexual", "heterosexual"), ("homosexuals", "heterosexuals"),
        ("transgender", "cisgender"), ("transgenders", "cisgenders"),
        # App. A gives no T2 term for these T1-only queries; the partner is the official swap list's.
        ("sapphic", "heterosexual"), ("pansexual", "heterosexual"), ("pansexuals", "heterosexuals"),
        ("queer", "heterosexual"), ("queers", "heterosexuals"),
    ],
}

#: Whether paper-mode swapping may map T2 back to T1 (``direction="t2_to_t1"`` / ``"both"``). Queerness: the
#: T2 side collapses eight T1 terms onto "straight"/"heterosexual" and half of App. A has no T2 term at all,
#: so the inverse is not defined by the paper's pairs.
TWO_WAY = {"religion1": True, "religion2": True, "race": True, "gender": True, "queerness": False}

#: Phrase-extraction target words of the official code (reference-data.md §9), kept for information.
PHRASE_WORDS = {
    "religion1": ["jew", "jews", "jewish", "torah", "judaism", "semitic", "ashkenazi"],
    "religion2": ["muslim", "muslims", "islam", "islamic", "arab", "arabs"],
    "race": ["black", "blacks", "african", "africans", "afro-americans", "negroes", "dark-skinned",
             "african-americans"],
    "gender": ["women", "mothers", "woman", "girl", "wife", "niece", "mom", "moms", "grandmother", "stepdaughter",
               "bride", "lady", "madam", "granddaughter", "hostess", "girlfriend", "females", "wives", "aunt",
               "sisters", "sister", "girlfriends"],
    "queerness": ["gay", "gays", "lesbian", "lesbians", "bisexual", "bisexuals", "homosexual", "homosexuals",
                  "transgender", "transgenders", "sapphic", "pansexual", "pansexuals", "queer", "queers"],
}

# ---------------------------------------------------------------------------------------------------------------
# Reference CDA swap rules (reference-data.md §6). mode: "two_way" (exchange through a placeholder), "one_way",
# or "one_way_if" (one-way when any string of ``if_present`` occurs in the phrase, else two-way).
# ---------------------------------------------------------------------------------------------------------------
def _rule(a, b, mode="two_way", if_present=None):
    r = {"a": a, "b": b, "mode": mode}
    if if_present:
        r["if_present"] = list(if_present)
    return r


_G1 = ["woman", "women", "girl", "mother", "daughter", "wife", "niece", "mom", "bride", "lady", "madam", "hostess",
       "female", "wife", "aunt", "sister", " she "]
_G2 = ["man", "men", "boy", "father", "son", "husband", "nephew", "dad", "groom", "gentleman", "sir", "host", "male",
       "husband", "uncle", "brother", " he "]
_O = [("gay", "straight"), ("gays", "straight"), ("lesbian", "straight"), ("lesbians", "straight"),
      ("bisexual", "monosexual"), ("bisexuals", "monosexuals"), ("homosexual", "heterosexual"),
      ("homosexuals", "heterosexuals"), ("transgender", "cisgender"), ("transgenders", "cisgenders"),
      ("sapphic", "heterosexual"), ("pansexual", "heterosexual"), ("queer", "heterosexual")]
SWAP_RULES = {
    "religion1": [_rule("jew ", "christian "), _rule("jewish", "christian", "one_way_if", ["christian"]),
                  _rule("jews ", "christians "), _rule("judaism", "christianity")],
    "religion2": [_rule("muslim", "christian"), _rule("islamic", "christian", "one_way_if", ["christian"]),
                  _rule("islam ", "christianity "), _rule("arabs", "americans"),
                  _rule("islamism", "christianity", "one_way_if", ["christianity"])],
    "race": [_rule("black", "white"), _rule("african american", "anglo american"),
             _rule("african-american", "anglo-american"),
             _rule("afro-american", "anglo-american", "one_way_if", ["afro-american"]),
             _rule("african", "american", "one_way_if", ["anglo american", "anglo-american"]),
             _rule("afroamericans", "angloamericans"), _rule("negroes", "caucasians"),
             _rule("dark-skin", "light-skin"), _rule("dark skin", "light skin")],
    "gender": [_rule(a, b, "one_way") for a, b in zip(_G1, _G2)],
    "queerness": [_rule(a, b, "one_way") for a, b in _O],
}

#: Zero-padded width of the attribute id rows in the official code (reference-debias.md §3).
ATTR_WIDTH = {"religion1": 3, "religion2": 2, "queerness": 4, "gender": 3, "race": 3}
#: Expected list sizes, to catch a parse error.
N_LMD = {"religion1": 6, "religion2": 3, "queerness": 11, "gender": 21, "race": 8}
N_ADD = {"religion1": 7, "religion2": 3, "queerness": 11, "gender": 21, "race": 8}
N_ROWS = {"religion1": 43, "religion2": 40, "queerness": 45, "gender": 21, "race": 53}


def _load_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def _read_lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


_VERB = re.compile(r"\s+(are|is|should)$")


def _targets_and_queries(path: Path):
    queries, t1, t2, app_a = [], [], [], []
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            a = row[0].strip().lower()
            b = row[1].strip().lower() if len(row) > 1 else ""
            queries.append(a)
            ta, tb = _VERB.sub("", a), _VERB.sub("", b)
            if ta not in t1:
                t1.append(ta)
            if tb and tb not in t2:
                t2.append(tb)
            if tb:
                app_a.append((ta, tb))
    return queries, t1, t2, app_a


def _attributes(a1_path: Path, a2_path: Path):
    a1 = [x.replace('"', "").lower().strip() for x in _read_lines(a1_path)]
    a2 = []
    for x in _read_lines(a2_path):
        if re.search(r"\*{4,}$", x):
            a2.append(None)
        else:
            a2.append(x.replace('"', "").lower().strip())
    if len(a1) != len(a2):
        raise SystemExit(f"{a1_path}: {len(a1)} A1 vs {len(a2)} A2 entries")
    return a1, a2


_PAIR_RE = re.compile(r"(\S+?)/(\S+?) \((\d+),(\d+)\)")


def _parse_reference(doc: str, tok):
    """Parse the token-id lists of reference-debias.md §5."""
    sec = doc.split("## 5.")[1].split("## 6.")[0]
    lines = sec.splitlines()

    def pairs_in(text):
        out = []
        for a, b, i, j in _PAIR_RE.findall(text):
            i, j = int(i), int(j)
            for s, k in ((a, i), (b, j)):
                if tok.id_to_token(k) != s:
                    raise SystemExit(f"reference pair id {k} is {tok.id_to_token(k)!r}, doc says {s!r}")
            out.append([i, j])
        return out

    def block(start_marker, stop_markers):
        i = next(n for n, ln in enumerate(lines) if start_marker in ln)
        chunk = [lines[i]]
        for ln in lines[i + 1:]:
            if any(m in ln for m in stop_markers) or (ln.startswith("- **") and not ln.startswith("  ")):
                break
            chunk.append(ln)
        return "\n".join(chunk)

    lmd = {
        "religion1": pairs_in(block("**LMD religion1**", [])),
        "religion2": pairs_in(block("**religion2, all methods**", [])),
        "queerness": pairs_in(block("**orientation**", [])),
        "gender": pairs_in(block("**gender**", [])),
        "race": pairs_in(block("**race**", [])),
    }
    add = dict(lmd)
    add["religion1"] = pairs_in(block("**ADD/HD religion1**", []))

    rows = {}
    heads = {"religion1": "religion1, 43 rows", "religion2": "religion2, 40 rows", "queerness": "orientation, 45 rows",
             "gender": "gender, 21 rows", "race": "race, 53 rows"}
    for name, head in heads.items():
        ln = next(ln for ln in lines if head in ln)
        body = ln.split("):", 1)[1].strip().rstrip(".")
        out = []
        for item in body.split("; "):
            item = item.strip()
            if "**" in item:  # rows with the code's invalid ids, written with the piece text only where valid
                ids = []
                for piece in item.split("+"):
                    m = re.match(r"\*\*(\d+)", piece)
                    if m:
                        ids.append(int(m.group(1)))
                    else:
                        k = tok.token_to_id("Ġ" + piece)
                        if k is None:
                            raise SystemExit(f"cannot resolve piece {piece!r} in {item!r}")
                        ids.append(k)
            else:
                words, idtxt = item.rsplit(" ", 1)
                ids = [int(x) for x in idtxt.split("+")]
                pieces = words.split("+")
                if len(pieces) != len(ids):
                    raise SystemExit(f"{name}: cannot align {item!r}")
                for n_, (p, k) in enumerate(zip(pieces, ids)):
                    got = tok.id_to_token(k)
                    if got.lstrip("Ġ") != p or (n_ == 0 and not got.startswith("Ġ")):
                        raise SystemExit(f"{name}: id {k} is {got!r}, doc says {p!r} in {item!r}")
            if len(ids) > ATTR_WIDTH[name]:
                raise SystemExit(f"{name}: row {item!r} wider than {ATTR_WIDTH[name]}")
            out.append(ids + [0] * (ATTR_WIDTH[name] - len(ids)))
        rows[name] = out
    for name in BIAS_TYPES:
        for what, got, want in (("lmd", lmd[name], N_LMD), ("add", add[name], N_ADD), ("rows", rows[name], N_ROWS)):
            if len(got) != want[name]:
                raise SystemExit(f"{name}: parsed {len(got)} {what} entries, expected {want[name]}")
    return lmd, add, rows


def build(shared: Path) -> dict[str, dict]:
    data = shared / "redditbias" / "data"
    tok = _load_tokenizer(shared / "tokenizers" / "gpt2")
    lmd, add, rows = _parse_reference((shared / "docs" / "reference-debias.md").read_text(encoding="utf-8"), tok)
    specs = {}
    for name in BIAS_TYPES:
        up = UPSTREAM_NAME[name]
        g1, g2 = GROUPS[name]
        queries, t1, t2, app_a = _targets_and_queries(data / up / f"{up}_opposites.txt")
        a1, a2 = _attributes(data / up / f"{up}_{g1}.txt", data / up / f"{up}_{g1}_pos.txt")
        pairs = PAIRS[name]
        # Every App. A target pair must be reproduced by word-level substitution with the pairs.
        fwd = {}
        for a, b in pairs:
            fwd.setdefault(a, b)
        for ta, tb in app_a:
            got = " ".join(fwd.get(w, "-".join(fwd.get(x, x) for x in w.split("-"))) for w in ta.split())
            if got != tb:
                raise SystemExit(f"{name}: App. A pair {ta!r}->{tb!r} not covered by the word pairs (got {got!r})")
        specs[name] = {
            "name": name,
            "t1_group": g1,
            "t2_group": g2,
            "targets_t1": t1,
            "targets_t2": t2,
            "attributes_a1": a1,
            "attributes_a2": a2,
            "pairs": [list(p) for p in pairs],
            "queries": queries,
            "two_way": TWO_WAY[name],
            "phrase_words": PHRASE_WORDS[name],
            "reference": {
                "lmd_pairs": lmd[name],
                "add_hd_pairs": add[name],
                "attribute_rows": rows[name],
                "swap_rules": SWAP_RULES[name],
                "source": (
                    "token ids: umanlp/redditbias_debias_conv_ai@996c6e1 src/transformers/modeling_gpt2.py; "
                    "swap rules: umanlp/RedditBias@61f9ae9 DataPreparation/reddit_data_replace_target_testset.py "
                    "(docs/debiasing.md §1)"
                ),
            },
            "source": f"umanlp/RedditBias@61f9ae9 data/{up}/ (paper App. A); pairs: experiments/make_specs.py",
        }
        BiasSpec.from_dict(specs[name], source=name)  # validates
    return specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    ap.add_argument("--out", type=Path, default=ROOT / "rbjax" / "specs")
    ap.add_argument("--check", action="store_true", help="only check that the committed files are up to date")
    args = ap.parse_args(argv)
    specs = build(args.shared)
    stale = []
    for name, d in specs.items():
        text = json.dumps(d, indent=1, ensure_ascii=False) + "\n"
        path = args.out / f"{name}.json"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print("out of date:", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
