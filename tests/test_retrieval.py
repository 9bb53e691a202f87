"""Candidate retrieval from dumps (rbjax.data.retrieval, `rbjax retrieve`), paper §2.2."""
from __future__ import annotations

import csv
import json
import random

import pytest

from rbjax.cli import main as cli_main
from rbjax.data.dumps import write_zst
from rbjax.data.retrieval.layout import output_paths
from rbjax.data.retrieval.query import (
    CANDIDATE_COLUMNS,
    QueryMatcher,
    clean_comment,
    make_prefilter,
    raw_body,
)
from rbjax.data.retrieval.run import retrieve
from rbjax.specs import load_spec

#: A user-written spec for a made-up group (the "new bias type" path): queries with "to be",
#: a wildcard attribute, a quoted multi-word attribute and a hyphenated one.
ZORB_SPEC = {
    "name": "zorbness",
    "t1_group": "zorbs",
    "t2_group": "quells",
    "targets_t1": ["zorbs", "zorbian people", "zorb"],
    "targets_t2": ["quells", "quellian people", "quell"],
    "queries": ["zorbs are", "zorbian people are", "zorb is"],
    "attributes_a1": ["greed*", '"beady eyes"', "lazy", "hook-nose"],
    "attributes_a2": ["generous", "blue eyes", "active", "short-nose"],
    "pairs": [["zorbs", "quells"], ["zorbian", "quellian"], ["zorb", "quell"]],
}

FILLER_WORDS = "the a game was really good today and i think we should go see it again later with friends".split()

# (id, body) of the crafted comments, in dump order; see EXPECTED for what each must give.
CRAFTED = [
    ("r01", "Zorbs are so GREEDY, see https://example.com/x?a=1 and ask /u/some_one"),
    ("r02", "zorbs are greedy " + "and this comment goes on and on " * 5),  # >= 150 chars after cleaning
    ("r03", "the zorbs were lazy yesterday"),  # target, attribute, but no query ("zorbs are")
    ("r04", "zorbs are nice people honestly"),  # query, no attribute
    ("r05", "zorbs are fine. one two three four five six seven eight nine ten lazy"),  # attribute outside window
    ("r06", "@bob Zorbian people are said to have beady eyes"),  # user name, multi-word attribute
    ("r07", "Les Zorbs are lazy — café au lait ☕"),  # non-ASCII kept
    ("r08", "[deleted]"),
    ("r09", "[removed]"),
    ("r10", "Zorbs are so GREEDY, see https://example.com/x?a=1 and ask /u/some_one"),  # duplicate phrase
    ("r11", "zorbs are lazy and i think that in the end every single zorb is greedy"),  # two windows
    ("r12", "the zorbs arent greedy at all"),  # 'zorbs arent' is not the query 'zorbs are'
    ("r13", "[Zorbs are greedy](https://x.y/z) lol"),  # markdown link: text kept, URL dropped
    ("r14", "Zorbs are lazy &amp; greediness is real"),  # HTML entity, wildcard greed*
    ("r15", "ZORBS   are\n\nLAZY\tu/someone"),  # spaces, case, u/ user name
    ("r16", "i saw a zorb is hook-nose guy"),  # hyphenated attribute
    ("r17", "email me at someone@example.com zorbs are lazy"),  # an e-mail address is not a user name
    ("r18", "he said \"zorbs are lazy\" and left"),  # escaped quotes in the JSON string
]

# id -> list of (phrase, target, query, attribute, comment_attributes, attribute_in_window, query_in_window)
EXPECTED = {
    "r01": [("zorbs are so greedy, see and ask", "zorbs", "zorbs are", "greed*", "greed*", "True", "True")],
    "r05": [("zorbs are fine. one two three four five", "zorbs", "zorbs are", "", "lazy", "False", "True")],
    "r06": [("zorbian people are said to have beady eyes", "zorbian people", "zorbian people are", "beady eyes",
             "beady eyes", "True", "True")],
    "r07": [("les zorbs are lazy — café au lait ☕", "zorbs", "zorbs are", "lazy", "lazy", "True", "True")],
    "r11": [
        ("zorbs are lazy and i think that in", "zorbs", "zorbs are", "lazy", "greed*|lazy", "True", "True"),
        ("think that in the end every single zorb is greedy", "zorb", "zorb is", "greed*", "greed*|lazy", "True", "True"),
    ],
    "r13": [("zorbs are greedy lol", "zorbs", "zorbs are", "greed*", "greed*", "True", "True")],
    "r14": [("zorbs are lazy & greediness is real", "zorbs", "zorbs are", "greed*|lazy", "greed*|lazy", "True", "True")],
    "r15": [("zorbs are lazy", "zorbs", "zorbs are", "lazy", "lazy", "True", "True")],
    "r16": [("i saw a zorb is hook-nose guy", "zorb", "zorb is", "hook-nose", "hook-nose", "True", "True")],
    "r17": [("email me at someone@example.com zorbs are lazy", "zorbs", "zorbs are", "lazy", "lazy", "True", "True")],
    "r18": [('he said "zorbs are lazy" and left', "zorbs", "zorbs are", "lazy", "lazy", "True", "True")],
}

CORRUPT_WITH_TARGET = [
    b'{"id":"x1","body":"zorbs are lazy',  # truncated
    b"not json at all but zorbs are lazy",
    b'{"id":"x3","body":"zorbs are lazy \xff\xfe"}',  # invalid UTF-8
    b'["zorbs are lazy"]',  # JSON, not an object
]
CORRUPT_WITHOUT_TARGET = [b'{"id": broken']


def _spec_file(tmp_path, spec=ZORB_SPEC):
    p = tmp_path / f"{spec['name']}.json"
    p.write_text(json.dumps(spec), encoding="utf-8")
    return p


def _dump(tmp_path, n_filler=300, seed=0):
    """A few hundred synthetic comments: crafted ones spread among filler, plus corrupt lines."""
    rng = random.Random(seed)
    lines: list = []
    crafted = list(CRAFTED)
    for i in range(n_filler):
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(3, 25))]
        if i % 50 == 7:
            words.insert(2, "zorbs")  # a target word with no query/attribute
        rec = {"id": f"f{i:03d}", "body": " ".join(words), "author": f"u{i}", "subreddit": "test",
               "created_utc": 1600000000 + i}
        if i % 3 == 0:
            del rec["author"]
        lines.append(rec)
        if i % 17 == 0 and crafted:
            cid, body = crafted.pop(0)
            lines.append({"id": cid, "body": body, "subreddit": "test", "created_utc": 1600000000 + i})
        if i == 100:
            lines.extend(CORRUPT_WITH_TARGET + CORRUPT_WITHOUT_TARGET)
    assert not crafted
    p = tmp_path / "RC_test.zst"
    write_zst(lines, p, window_log=31)
    return p


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        assert tuple(r.fieldnames) == CANDIDATE_COLUMNS
        return list(r)


def _by_id(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r["id"], []).append((r["phrase"], r["target"], r["query"], r["attribute"],
                                            r["comment_attributes"], r["attribute_in_window"], r["query_in_window"]))
    return out


def test_clean_comment():
    assert clean_comment("Check https://a.com/b?c=d and www.x.org/y NOW") == "check and now"
    assert clean_comment("thanks /u/Some_User and u/other-one and @handle!") == "thanks and and !"
    assert clean_comment("  many   spaces\n\nand\ttabs  ") == "many spaces and tabs"
    assert clean_comment("[link text](http://x.y/z) after") == "link text after"
    assert clean_comment("mail a@b.com") == "mail a@b.com"
    assert clean_comment("Café ÜBER") == "café über"
    assert clean_comment("you'd say &amp; “quoted”", mode="reference") == "youd say  quoted"
    with pytest.raises(ValueError, match="cleaning mode"):
        clean_comment("x", mode="nope")


def test_retrieve_exact_candidates(tmp_path):
    spec = load_spec(_spec_file(tmp_path))
    dump = _dump(tmp_path)
    out = tmp_path / "candidates.csv"
    res = retrieve(spec, dump, out, progress=False)
    rows = _rows(out)
    assert _by_id(rows) == EXPECTED
    assert all(r["bias_type"] == "zorbness" and r["subreddit"] == "test" for r in rows)
    assert rows[0]["comment"] == "zorbs are so greedy, see and ask"
    # counters
    assert res.stats.corrupt == len(CORRUPT_WITH_TARGET)  # the one without a target word is never parsed
    assert res.stats.deleted == 0  # [deleted]/[removed] lines have no target word: skipped unparsed
    assert res.too_long == 1
    assert res.candidates == {"zorbness": 12}
    assert res.comments_matched == {"zorbness": 11}
    assert res.duplicates == {"zorbness": 1}  # r10 repeats r01's phrase
    assert res.stats.lines == 300 + len(CRAFTED) + 5
    assert "corrupt lines: 4" in res.summary()


def test_prefilter_changes_nothing_but_speed(tmp_path):
    spec = load_spec(_spec_file(tmp_path))
    dump = _dump(tmp_path)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    ra = retrieve(spec, dump, a, progress=False)
    rb = retrieve(spec, dump, b, progress=False, prefilter=False)
    assert a.read_bytes() == b.read_bytes()
    assert ra.stats.prefiltered > 250 and rb.stats.prefiltered == 0
    assert rb.stats.corrupt == len(CORRUPT_WITH_TARGET) + len(CORRUPT_WITHOUT_TARGET)
    assert rb.stats.deleted == 2 and rb.stats.parsed == 300 + len(CRAFTED)


def test_options(tmp_path):
    spec = load_spec(_spec_file(tmp_path))
    dump = _dump(tmp_path)
    out = tmp_path / "c.csv"
    retrieve(spec, dump, out, progress=False, require_attribute_in_window=True)
    assert "r05" not in _by_id(_rows(out))
    before = out.read_bytes()
    with pytest.raises(ValueError, match=r"c.csv \(written from other inputs: dedupe: True → False;.*--overwrite"):
        retrieve(spec, dump, out, progress=False, dedupe=False)  # another retrieval's CSV is not replaced silently
    assert out.read_bytes() == before
    retrieve(spec, dump, out, progress=False, dedupe=False, overwrite=True)
    assert "r10" in _by_id(_rows(out))
    retrieve(spec, dump, out, progress=False, window=2, overwrite=True)
    assert _by_id(_rows(out))["r05"][0][0] == "zorbs are fine."
    retrieve(spec, dump, out, progress=False, subreddits=["other"], overwrite=True)
    assert _rows(out) == []
    retrieve(spec, dump, out, progress=False, start=1600000000 + 150, overwrite=True)
    assert min(int(r["created_utc"]) for r in _rows(out)) >= 1600000150


def test_raw_body_and_prefilter_exact():
    line = b'{"id":"a","body":"He said \\"Zorbs are\\\\\\" ok","x":1}'
    assert raw_body(line) == b'He said \\"Zorbs are\\\\\\" ok'
    assert raw_body(b'{"id":"a", "body" : null}') == b'{"id":"a", "body" : null}'
    spec = load_spec("religion1")
    pf = make_prefilter([QueryMatcher(spec)])
    assert pf.needles == ("jew", "torah", "judaism")
    assert pf(b'{"body":"The JEWISH people are x"}')
    assert pf(b'{"body": "a\\nJews are"}')  # spaced form, escaped newline before the word
    assert not pf(b'{"body":"christians are"}')
    assert not pf(b'{"author":"jewfro","body":"nothing here"}')  # only the body is checked


def test_packaged_religion1_cli(tmp_path, capsys):
    """`rbjax retrieve --bias religion1 --dump FILE.zst --out candidates.csv` on a dump of the real format."""
    recs = [
        {"id": "a1", "body": "Honestly, Jews are greedy and that's a stereotype", "author": "x", "subreddit": "s",
         "created_utc": 1600000000},
        {"id": "a2", "body": "Jewish people are not evil, u/troll", "subreddit": "s", "created_utc": "1600000001"},
        {"id": "a3", "body": "christians are greedy", "subreddit": "s", "created_utc": 1600000002},
        {"id": "a4", "body": "[deleted]", "author": "[deleted]"},
    ]
    dump = tmp_path / "RC_2020-09.zst"
    write_zst(recs, dump, window_log=31)
    out = tmp_path / "candidates.csv"
    rc = cli_main(["retrieve", "--bias", "religion1", "--dump", str(dump), "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = _rows(out)
    assert [(r["id"], r["phrase"], r["target"], r["attribute"]) for r in rows] == [
        ("a1", "honestly, jews are greedy and that's a stereotype", "jews", "greed*|greedy"),
        # windows are centred on the spec's phrase_words (upstream's single target words), so "jewish"
        ("a2", "jewish people are not evil,", "jewish", "evil"),
    ]
    printed = capsys.readouterr().out
    assert "religion1: 2 candidates" in printed


def test_cli_several_types_and_errors(tmp_path, capsys):
    spec = _spec_file(tmp_path)
    dump = _dump(tmp_path)
    rc = cli_main(["retrieve", "--bias", str(spec), "--bias", "religion1", "--dump", str(dump),
                   "--out", str(tmp_path / "out_{bias}.csv"), "--no-progress"])
    assert rc == 0
    assert len(_rows(tmp_path / "out_zorbness.csv")) == 12
    assert _rows(tmp_path / "out_religion1.csv") == []
    rc = cli_main(["retrieve", "--bias", str(spec), "--dump", str(tmp_path / "missing.zst"), "--out", "x.csv"])
    assert rc == 1
    assert "missing.zst" in capsys.readouterr().err


def test_output_is_atomic(tmp_path):
    spec = load_spec(_spec_file(tmp_path))
    out = tmp_path / "keep.csv"
    out.write_text("old\n", encoding="utf-8")
    with pytest.raises(ValueError):
        retrieve(spec, _dump(tmp_path), out, progress=False, start="not a date")
    assert out.read_text(encoding="utf-8") == "old\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep.csv")] == []


def test_output_paths(tmp_path):
    assert output_paths(tmp_path / "c.csv", ["a"]) == {"a": tmp_path / "c.csv"}
    assert output_paths(tmp_path / "c.csv", ["a", "b"])["b"] == tmp_path / "c_b.csv"
    assert output_paths(str(tmp_path / "{bias}.csv"), ["a"])["a"] == tmp_path / "a.csv"
    assert output_paths(tmp_path, ["a"])["a"] == tmp_path / "candidates_a.csv"


def test_non_ascii_query_disables_prefilter(tmp_path):
    spec = dict(ZORB_SPEC, name="cafe", targets_t1=["cafés"], queries=["cafés are"], pairs=[["cafés", "bars"]])
    s = load_spec(_spec_file(tmp_path, spec))
    assert make_prefilter([QueryMatcher(s)]) is None
    dump = tmp_path / "d.jsonl"
    dump.write_text(json.dumps({"id": "u1", "body": "Cafés are LAZY places"}, ensure_ascii=True) + "\n", encoding="utf-8")
    out = tmp_path / "c.csv"
    retrieve(s, dump, out, progress=False)
    assert [(r["phrase"], r["attribute"]) for r in _rows(out)] == [("cafés are lazy places", "lazy")]


def test_unreadable_dump_is_an_error_and_writes_no_csv(tmp_path, capsys):
    """Field failure: a .zst of garbage bytes as the only dump gave exit 0 and a header-only CSV."""
    spec = _spec_file(tmp_path)
    garbage = tmp_path / "RC_garbage.zst"
    garbage.write_bytes(bytes(range(256)) * 20)
    out = tmp_path / "candidates.csv"
    with pytest.raises(ValueError, match=r"every file failed to decompress or parse; no candidates CSV was written"):
        retrieve(load_spec(spec), garbage, out, progress=False)
    assert not out.exists() and list(tmp_path.glob(".candidates.csv*")) == []
    rc = cli_main(["retrieve", "--bias", str(spec), "--dump", str(garbage), "--out", str(out), "--no-progress"])
    assert rc == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "RC_garbage.zst: cannot be read: not zstd-compressed data" in err and "Traceback" not in err
    # an existing output is left as it was
    out.write_text("old\n", encoding="utf-8")
    assert cli_main(["retrieve", "--bias", str(spec), "--dump", str(garbage), "--out", str(out), "--no-progress"]) == 1
    assert out.read_text(encoding="utf-8") == "old\n"
    # a readable dump without any match is still a success, with a header-only CSV
    plain = tmp_path / "RC_plain.zst"
    write_zst([{"id": "p1", "body": "nothing to see here"}], plain)
    capsys.readouterr()
    assert cli_main(["retrieve", "--bias", str(spec), "--dump", str(plain), "--out", str(out), "--no-progress"]) == 1
    # "old" is not replaced silently
    assert "candidates.csv (no record that rbjax wrote it)" in capsys.readouterr().err
    assert cli_main(["retrieve", "--bias", str(spec), "--dump", str(plain), "--out", str(out), "--no-progress",
                     "--overwrite"]) == 0
    assert _rows(out) == []
    # garbage next to a readable dump: success, with the garbage reported (other dumps: --overwrite)
    assert cli_main(["retrieve", "--bias", str(spec), "--dump", str(garbage), "--dump", str(plain), "--out", str(out),
                     "--no-progress", "--overwrite"]) == 0
    captured = capsys.readouterr()
    assert "stream error: " + str(garbage) in captured.out and "warning: some dump files" in captured.err


def test_output_under_a_file_is_a_clear_error(tmp_path, capsys):
    """Field failure: --out <a file>/x.csv ended in a NotADirectoryError traceback."""
    spec = _spec_file(tmp_path)
    dump = tmp_path / "d.jsonl"
    dump.write_text('{"id":"a","body":"zorbs are lazy"}\n', encoding="utf-8")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x", encoding="utf-8")
    for out in (blocker / "x.csv", blocker / "sub" / "x.csv"):
        with pytest.raises(ValueError, match=rf"cannot write output CSV {out}: {blocker} exists and is not a folder"):
            retrieve(load_spec(spec), dump, out, progress=False)
        rc = cli_main(["retrieve", "--bias", str(spec), "--dump", str(dump), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 1 and f"{blocker} exists and is not a folder" in err and "Traceback" not in err
    assert blocker.read_text(encoding="utf-8") == "x"
    # a missing dump is named before any output folder is created
    with pytest.raises(FileNotFoundError, match="nope.zst"):
        retrieve(load_spec(spec), tmp_path / "nope.zst", tmp_path / "new_dir" / "c.csv", progress=False)
    assert not (tmp_path / "new_dir").exists()
