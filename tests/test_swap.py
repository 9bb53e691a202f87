"""Counterfactual target swapping: paper (word-level) and reference (official substring rules) modes."""
import csv

import pytest

from rbjax.data.swap import compare_modes, reference_direction, swap_targets, term_regex
from rbjax.specs import BIAS_TYPES, GROUPS, UPSTREAM_NAME, load_spec


@pytest.fixture(scope="module")
def specs():
    return {n: load_spec(n) for n in BIAS_TYPES}


# ------------------------------------------------------------------------------------------------- paper mode
def test_paper_word_boundaries_plurals_case(specs):
    r1, race, g = specs["religion1"], specs["race"], specs["gender"]
    assert swap_targets("jews are greedy", r1) == "christians are greedy"
    assert swap_targets("the jew is", r1) == "the christian is"
    assert swap_targets("jewish people", r1) == "christian people"
    assert swap_targets("Jews are. JEWS are! jews, jews' and jew's", r1) == (
        "Christians are. CHRISTIANS are! christians, christians' and christian's")
    assert swap_targets("jewish-americans are", r1) == "christian-americans are"
    assert swap_targets("the torah is; judaism is", r1) == "the bible is; christianity is"
    assert swap_targets("jewelry and jewishness", r1) == "jewelry and jewishness"  # no partial words
    assert swap_targets("blackmail is black", race) == "blackmail is white"
    assert swap_targets("african-americans and african americans and africans", race) == (
        "americans and americans and americans")
    assert swap_targets("dark-skinned people", race) == "light-skinned people"
    assert swap_targets("my mom and her sisters. she is", g) == "my dad and her brothers. he is"
    assert swap_targets("woman, women and womanhood", g) == "man, men and womanhood"
    assert swap_targets("the moment", g) == "the moment"  # reference makes it "dadent"
    assert swap_targets("the moment", g, "reference") == "the dadent"
    assert swap_targets("no target here", r1) == "no target here"


def test_paper_single_pass_and_directions(specs):
    r1, r2, g, q = specs["religion1"], specs["religion2"], specs["gender"], specs["queerness"]
    # one pass: a produced T2 word is never swapped again
    assert swap_targets("jews and christians", r1) == "christians and christians"
    assert swap_targets("jews and christians", r1, direction="both") == "christians and jews"
    assert swap_targets("christians and the bible", r1, direction="t2_to_t1") == "jews and the torah"
    assert swap_targets("christian people", r1, direction="t2_to_t1") == "jewish people"  # first pair listed
    assert swap_targets("Christianity is", r2, direction="t2_to_t1") == "Islam is"
    assert swap_targets("he and his son", g, direction="both") == "she and his daughter"
    assert swap_targets("gays are", q) == "straights are"
    assert swap_targets("queer person", q) == "heterosexual person"
    for d in ("t2_to_t1", "both"):
        with pytest.raises(ValueError, match="one-directional"):
            swap_targets("straight people", q, direction=d)
    with pytest.raises(ValueError):
        swap_targets("x", r1, mode="reference", direction="both")
    with pytest.raises(ValueError):
        swap_targets("x", r1, mode="substring")
    with pytest.raises(ValueError):
        swap_targets("x", r1, direction="sideways")


def test_both_directions_swap_a_hyphenated_compound_one_way(specs):
    # Field case: a compound is one mention. With terms of both sides it is swapped T1 -> T2 only, never back.
    r1, r2, race = specs["religion1"], specs["religion2"], specs["race"]
    assert swap_targets("the muslim-american community", r2, direction="both") == "the christian-american community"
    assert swap_targets("The American-Muslim and MUSLIM-AMERICANS", r2, direction="both") == (
        "The American-Christian and CHRISTIAN-AMERICANS")
    assert swap_targets("christian-arab", r2, direction="both") == "christian-american"
    assert swap_targets("black-american families", race, direction="both") == "white-american families"
    # the rest of the phrase is still swapped both ways; one-sided compounds are swapped as before
    assert swap_targets("muslim-american and christian people", r2, direction="both") == (
        "christian-american and muslim people")
    assert swap_targets("arab-muslim and christian-american", r2, direction="both") == (
        "american-christian and muslim-arab")
    assert swap_targets("jewish-americans and christians", r1, direction="both") == "christian-americans and jews"
    # the one-direction modes are unchanged
    assert swap_targets("the muslim-american community", r2) == "the christian-american community"
    assert swap_targets("the muslim-american community", r2, direction="t2_to_t1") == "the muslim-arab community"
    # CDA's copies (direction "both" for religion2) use the same rule
    from rbjax.debias.cda import augment

    assert augment(["the muslim-american community"], r2) == ["the muslim-american community",
                                                             "the christian-american community"]


def test_term_regex_wildcards_and_phrases():
    rx = term_regex(["greed*", "beady eyes", "hook-nose"])
    text = "Greedy and greed, beady   eyes, a hook-nose but not ungreedy or beadyeyes"
    assert [m.group(0) for m in rx.finditer(text)] == ["Greedy", "greed", "beady   eyes", "hook-nose"]
    with pytest.raises(ValueError):
        term_regex([])


def _opposites(redditbias_dir, name):
    up = UPSTREAM_NAME[name]
    with open(redditbias_dir / "data" / up / f"{up}_opposites.txt", encoding="utf-8", newline="") as f:
        return [(r[0].lower(), r[1].lower()) for r in csv.reader(f) if r and len(r) > 1 and r[1]]


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_paper_mode_reproduces_app_a_pairs(redditbias_dir, specs, name):
    for a, b in _opposites(redditbias_dir, name):
        assert swap_targets(a, specs[name]) == b
        if specs[name].two_way and name != "race":  # race: "americans" <- africans/african-americans/...
            assert swap_targets(b, specs[name], direction="t2_to_t1").split()[-1] == a.split()[-1]


# --------------------------------------------------------------------------------------------- reference mode
def _column(path):
    with open(path, encoding="utf-8", newline="") as f:
        return [r["comments_processed"] for r in csv.DictReader(f)]


def _released(redditbias_dir, name, split):
    up = UPSTREAM_NAME[name]
    g1, g2 = GROUPS[name]
    d = redditbias_dir / "data" / up
    return (_column(d / f"reddit_comments_{up}_{g1}_biased_{split}_reduced.csv"),
            _column(d / f"reddit_comments_{up}_{g2}_biased_{split}_reduced.csv"))


@pytest.mark.parametrize("name", BIAS_TYPES)
@pytest.mark.parametrize("split", ["test", "valid"])
def test_reference_mode_reproduces_released_t2_files(redditbias_dir, specs, name, split):
    t1, t2 = _released(redditbias_dir, name, split)
    assert len(t1) == len(t2) > 200
    got = [swap_targets(s, specs[name], "reference") for s in t1]
    exact = sum(a == b for a, b in zip(got, t2))
    assert exact == len(t2), f"{name} {split}: {exact}/{len(t2)} exact"  # measured: 100 % on every file


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_reference_mode_reproduces_cda_train_file(redditbias_dir, specs, name):
    up = UPSTREAM_NAME[name]
    lines = (redditbias_dir / "text_files" / up / f"{up}_bias_manual_swapped_targets_train.txt").read_text(
        encoding="utf-8").split("\n")
    lines = lines[:-1] if lines[-1] == "" else lines
    n = len(lines) // 2
    assert [swap_targets(s, specs[name], "reference") for s in lines[:n]] == lines[n:]


# Paper vs reference on the released T1 test phrases (a regression fixture; docs/debiasing.md quotes it).
AGREE_T1_TO_T2 = {"religion1": 233, "religion2": 222, "race": 228, "gender": 246, "queerness": 232}
AGREE_DEFAULT = {"religion1": 237, "religion2": 229, "race": 247, "gender": 246, "queerness": 232}


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_paper_vs_reference_report(redditbias_dir, specs, name):
    t1, t2 = _released(redditbias_dir, name, "test")
    rep = compare_modes(t1, specs[name], "t1_to_t2")
    assert rep.n == len(t1) and rep.n_agree == AGREE_T1_TO_T2[name]
    rep = compare_modes(t1, specs[name])
    assert rep.n_agree == AGREE_DEFAULT[name]
    assert len(rep.disagreements) == rep.n - rep.n_agree
    assert rep.n_changed_paper == rep.n  # every test phrase names a T1 term
    # the reference output equals the released file, so disagreements are exactly paper != released
    assert sum(swap_targets(s, specs[name], "paper", reference_direction(specs[name])) == b
               for s, b in zip(t1, t2)) == AGREE_DEFAULT[name]
    assert rep.summary().startswith(name)


def test_report_known_disagreements(redditbias_dir, specs):
    t1, _ = _released(redditbias_dir, "queerness", "test")
    diffs = dict(compare_modes(t1, specs["queerness"]).word_diffs)
    assert diffs[("homosexuality", "heterosexuality")] == 1  # substring rule reaches into a longer word
    assert diffs[("queercoded", "heterosexualcoded")] == 1
    t1, _ = _released(redditbias_dir, "gender", "test")
    assert dict(compare_modes(t1, specs["gender"]).word_diffs)[("he", "she")] == 6  # ' she ' rule misses "she" at end
