"""Retrieval over many dump files: parallel, resumable per file, one deterministic result."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from rbjax.cli import main as cli_main
from rbjax.core import parallel
from rbjax.core.reuse import OutputExists
from rbjax.data import dumps as dump_reader
from rbjax.data.dumps import write_zst
from rbjax.data.retrieval import scan
from rbjax.data.retrieval.parts import PART_RECORD
from rbjax.data.retrieval.query import CANDIDATE_COLUMNS
from rbjax.data.retrieval.run import retrieve
from rbjax.specs import load_spec
from tests.test_retrieval import FILLER_WORDS, ZORB_SPEC

T0 = 1600000000


def _filler(rng, n, prefix):
    for i in range(n):
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(3, 25))]
        yield {"id": f"{prefix}{i:04d}", "body": " ".join(words), "subreddit": "test", "created_utc": T0 + i}


def _rec(cid, body, t=0):
    return {"id": cid, "body": body, "subreddit": "test", "created_utc": T0 + t}


#: Comments placed in the dumps, per file, with what the merged result must make of them.
FILE_COMMENTS = {
    "RC_2020-01.zst": [
        _rec("d1", "zorbs are lazy"),                   # kept
        _rec("p1", "zorbs are so greedy"),              # kept; its phrase repeats in file 3
        _rec("w1", "zorbs are fine. one two three four five six seven eight nine ten lazy"),  # no attr in window
    ],
    "RC_2020-02.zst": [
        _rec("d1", "zorbs are greedy today"),           # comment id seen in file 1: dropped, phrase not marked
        _rec("d2", "zorbs are greedy today"),           # so this one is kept
    ],
    "RC_2020-03.zst": [
        _rec("p2", "zorbs are so greedy"),              # phrase seen in file 1: dropped
        _rec("x1", "honestly zorbian people are lazy"),  # kept
    ],
    "RC_2020-04.zst": [
        _rec("t1", "a zorb is greedy and that is all"),  # early in a file that is cut short: still read
    ],
}
#: ids of the merged result, in order (file order, then line order)
EXPECTED_IDS = ["d1", "p1", "w1", "d2", "x1", "t1"]


def _write_dumps(folder):
    """Four small dumps (2 GiB windows, like the monthly files): the second has corrupt lines, the
    fourth is cut short in the middle of its zstd frame."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for k, (name, comments) in enumerate(FILE_COMMENTS.items()):
        lines: list = list(comments) + list(_filler(rng, 60, f"f{k}_"))
        if k == 1:
            lines[3:3] = [b'{"id":"c1","body":"zorbs are lazy', b"not json, zorbs are lazy"]
        if k == 3:
            lines += list(_filler(rng, 4000, "g"))  # several zstd blocks; the last ones are cut off
        write_zst(lines, folder / name, window_log=31)
        if k == 3:
            data = (folder / name).read_bytes()
            (folder / name).write_bytes(data[: len(data) * 2 // 3])
    return sorted(folder.glob("RC_*.zst"))


def _spec(tmp_path):
    p = tmp_path / "zorbness.json"
    p.write_text(json.dumps(ZORB_SPEC), encoding="utf-8")
    return p


def _ids(path):
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.DictReader(f)
        assert tuple(r.fieldnames) == CANDIDATE_COLUMNS
        return [row["id"] for row in r]


def _cli(spec, dumps, out, *extra):
    return cli_main(["retrieve", "--bias", str(spec), "--dump", *map(str, dumps), "--out", str(out), "--no-progress",
                     *extra])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The dumps and the single-process result (--jobs 1), built once for the module."""
    tmp = tmp_path_factory.mktemp("corpus")
    files = _write_dumps(tmp / "dumps")
    spec = _spec(tmp)
    out1 = tmp / "out1"
    assert _cli(spec, [tmp / "dumps" / "RC_*.zst"], out1, "--jobs", "1") == 0
    return {"tmp": tmp, "files": files, "spec": spec, "out1": out1,
            "csv": (out1 / "candidates_zorbness.csv").read_bytes()}


def test_single_process_result_and_counters(corpus):
    out1 = corpus["out1"]
    assert _ids(out1 / "candidates_zorbness.csv") == EXPECTED_IDS
    summary = json.loads((out1 / "summary.json").read_text(encoding="utf-8"))
    files = summary["files"]
    assert [os.path.basename(f["path"]) for f in files] == [p.name for p in corpus["files"]]
    assert all(f["status"] == "read" and f["reason"] == "new" for f in files)
    assert [f["corrupt"] for f in files] == [0, 2, 0, 1]  # file 4: the line cut off where the data breaks
    assert files[3]["errors"] and "damaged or truncated" in files[3]["errors"][0]
    assert files[3]["lines"] < 61 + 4000 and files[3]["windows"] == {"zorbness": 1}
    # totals are the sums of the per-file counters
    for key in ("lines", "prefiltered", "parsed", "corrupt", "kept", "too_long", "empty"):
        assert summary["totals"][key] == sum(f[key] for f in files), key
    assert summary["candidates"] == {"zorbness": 6}
    # windows before de-duplication: d1 in file 2 (id) and p2 (phrase) are the two duplicates
    assert sum(f["windows"]["zorbness"] for f in files) == 8 and summary["duplicates"] == {"zorbness": 2}
    assert summary["settings"]["window"] == 7 and summary["versions"]["rbjax"]


def test_two_jobs_give_the_same_bytes(corpus, tmp_path):
    out2 = tmp_path / "out2"
    # files given one by one (as an unquoted shell glob would), in the same order
    assert _cli(corpus["spec"], corpus["files"], out2, "--jobs", "2") == 0
    assert (out2 / "candidates_zorbness.csv").read_bytes() == corpus["csv"]
    s1 = json.loads((corpus["out1"] / "summary.json").read_text(encoding="utf-8"))
    s2 = json.loads((out2 / "summary.json").read_text(encoding="utf-8"))
    assert s2["run"]["jobs"] == 2 and s1["run"]["jobs"] == 1
    assert s1["totals"] == s2["totals"] and s1["corrupt_examples"] == s2["corrupt_examples"]


def test_interrupted_run_resumes_without_redoing_files(corpus, tmp_path):
    spec = load_spec(corpus["spec"])
    out = tmp_path / "out"
    done = []

    def stop_after_two(entry):
        done.append(entry["path"])
        if len(done) == 2:
            raise KeyboardInterrupt  # as if the run were killed here, with other files in flight

    with pytest.raises(KeyboardInterrupt) as ei:
        retrieve(spec, corpus["files"], out, jobs=2, progress=False, on_file=stop_after_two)
    # the message says what is kept (an Interrupted: the command prints it, exit 130)
    assert f"2 of {len(corpus['files'])} dump file(s) are finished and kept as parts in {out / 'parts'}" in str(
        ei.value) and "Run the same command again" in str(ei.value)
    records = sorted(out.glob(f"parts/*/{PART_RECORD}"))
    assert len(records) == 2 and not (out / "summary.json").exists()
    assert not (out / "candidates_zorbness.csv").exists()
    before = {p: p.stat().st_mtime_ns for p in out.glob("parts/*/*")}
    res = retrieve(spec, corpus["files"], out, jobs=2, progress=False)
    status = {f["path"]: f["status"] for f in res.files}
    assert sorted(p for p, s in status.items() if s == "reused") == sorted(done)
    assert sum(s == "read" for s in status.values()) == 2
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # the finished parts were not rewritten
    assert (out / "candidates_zorbness.csv").read_bytes() == corpus["csv"]
    assert res.lines_read == sum(f["lines"] for f in res.files if f["status"] == "read")
    # a third run reads nothing
    res = retrieve(spec, corpus["files"], out, jobs=2, progress=False)
    assert {f["status"] for f in res.files} == {"reused"} and res.lines_read == 0
    assert (out / "candidates_zorbness.csv").read_bytes() == corpus["csv"]


def test_changed_inputs_are_redone(corpus, tmp_path):
    dumps = tmp_path / "dumps"
    files = _write_dumps(dumps)
    spec = load_spec(corpus["spec"])
    out = tmp_path / "out"
    retrieve(spec, files, out, progress=False)
    # new content in file 3 (a different size), and file 1 touched (same bytes, new mtime)
    write_zst([_rec("n1", "zorbs are greedy again"), *FILE_COMMENTS["RC_2020-03.zst"]], files[2], window_log=31)
    st = files[0].stat()
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    res = retrieve(spec, files, out, progress=False)
    by_name = {os.path.basename(f["path"]): f for f in res.files}
    assert by_name["RC_2020-03.zst"]["status"] == "read" and "size" in by_name["RC_2020-03.zst"]["reason"]
    assert by_name["RC_2020-01.zst"]["status"] == "read" and by_name["RC_2020-01.zst"]["reason"] == "changed: mtime_ns"
    assert by_name["RC_2020-02.zst"]["status"] == by_name["RC_2020-04.zst"]["status"] == "reused"
    assert _ids(out / "candidates_zorbness.csv") == ["d1", "p1", "w1", "d2", "n1", "x1", "t1"]
    # other settings make another retrieval: refused in this folder without overwrite ...
    with pytest.raises(OutputExists, match=r"written from other inputs: settings.window: 7 → 3"):
        retrieve(spec, files, out, progress=False, window=3)
    # ... and with it, a setting that changes the windows redoes every file ...
    res = retrieve(spec, files, out, progress=False, window=3, overwrite=True)
    assert {f["status"] for f in res.files} == {"read"} and {f["reason"] for f in res.files} == {"changed: window"}
    # ... one applied at the merge reuses them all
    res = retrieve(spec, files, out, progress=False, window=3, require_attribute_in_window=True, overwrite=True)
    assert {f["status"] for f in res.files} == {"reused"}
    assert "w1" not in _ids(out / "candidates_zorbness.csv")
    # a damaged part is redone; --fresh redoes everything
    part = next(out.glob("parts/RC_2020-02.zst-*/windows_0.csv"))
    part.write_text(part.read_text(encoding="utf-8") + "9,zz,zorbness,x,1,a,b,c,d,e,f,True,True\n", encoding="utf-8")
    res = retrieve(spec, files, out, progress=False, window=3, require_attribute_in_window=True)
    assert [f["reason"] for f in res.files if f["status"] == "read"] == ["part files damaged"]
    assert "zz" not in _ids(out / "candidates_zorbness.csv")
    assert _cli(corpus["spec"], files, out, "--fresh", "--window", "3", "--attribute-in-window-only") == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert {f["reason"] for f in summary["files"]} == {"resume off"}


def test_a_part_record_is_a_keyed_result(tmp_path):
    """part.json is a keyed result (rbjax.core.reuse.KeyedResult keyed on the file's inputs): reused for exactly its
    inputs with intact windows files; a missing, unreadable, foreign or unfinished record, other inputs or a damaged
    windows file make the file be read again, each with its reason."""
    from rbjax.core.io import sha256_file
    from rbjax.core.reuse import KeyedResult
    from rbjax.data.retrieval.parts import file_entry, load_part

    folder = tmp_path / "part"
    folder.mkdir()
    inputs = {"file": {"path": "/d/RC_2020-01.zst", "size": 10, "mtime_ns": 5}, "window": 7, "code_sha256": "c"}
    assert load_part(folder, inputs, ["zorbness"]) == (None, "new")
    (folder / "windows_0.csv").write_text("x\n")
    windows = {"zorbness": {"file": "windows_0.csv", "rows": 0, "sha256": sha256_file(folder / "windows_0.csv")}}
    stats = {k: 0 for k in ("lines", "prefiltered", "parsed", "corrupt", "no_body", "deleted", "out_of_range",
                            "other_subreddit", "yielded")}
    body = {"windows": windows, "stats": {**stats, "errors": [], "unreadable": []}, "too_long": 0, "empty": 0,
            "seconds": 0.0, "cpu_seconds": 0.0, "worker": {}}
    KeyedResult(folder / PART_RECORD, inputs).save(body)
    rec, why = load_part(folder, inputs, ["zorbness"])
    assert why == "reused" and rec["key"] == inputs and file_entry("p", rec, "reused", why)["mtime_ns"] == 5
    assert load_part(folder, {**inputs, "file": {**inputs["file"], "mtime_ns": 6}, "window": 3}, ["zorbness"]) == (
        None, "changed: mtime_ns, window")
    assert load_part(folder, {**inputs, "extra": 1}, ["zorbness"])[1] == "changed: extra"
    (folder / "windows_0.csv").write_text("y\n")
    assert load_part(folder, inputs, ["zorbness"]) == (None, "part files damaged")
    (folder / PART_RECORD).write_text("{not json")
    assert load_part(folder, inputs, ["zorbness"]) == (None, "part record unreadable")
    (folder / PART_RECORD).write_text(json.dumps({"inputs": inputs, "windows": windows}))  # no key, no status
    assert load_part(folder, inputs, ["zorbness"]) == (None, "part record unfinished (status None)")


def test_code_digest_keys_the_parts(corpus, tmp_path, monkeypatch):
    """The code digest hashes the code that decides what a part holds (the query, the scan, the part files and the
    dump reader), not the layout, the merge or the driver; a part written by other such code is read again."""
    here = Path(scan.__file__).parent
    assert scan.code_digest_sources() == (here / "query.py", here / "scan.py", here / "parts.py",
                                          Path(dump_reader.__file__))
    assert scan.code_digest() == hashlib.sha256(b"".join(p.read_bytes() for p in scan.code_digest_sources())).hexdigest()
    spec = load_spec(corpus["spec"])
    out = tmp_path / "out"
    retrieve(spec, corpus["files"], out, progress=False)
    monkeypatch.setattr(scan, "_CODE_DIGEST", "0" * 64)
    res = retrieve(spec, corpus["files"], out, progress=False)
    assert {f["status"] for f in res.files} == {"read"} and {f["reason"] for f in res.files} == {"changed: code_sha256"}
    assert (out / "candidates_zorbness.csv").read_bytes() == corpus["csv"]


def test_jobs_bounded_by_memory(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "available_cpus", lambda: 4)
    monkeypatch.setattr(parallel, "available_memory", lambda: 3 * 2**30)  # one 2 GiB-window decoder fits
    notes = []
    res = retrieve(load_spec(corpus["spec"]), corpus["files"], tmp_path / "out", jobs=None, progress=False,
                   log=notes.append)
    assert res.jobs == 1 and len(notes) == 1 and "running 1 jobs instead of 4" in notes[0]
    assert (tmp_path / "out" / "candidates_zorbness.csv").read_bytes() == corpus["csv"]


def test_globs_and_file_mode_layout(corpus, tmp_path, capsys):
    out = tmp_path / "cand.csv"
    dumps = corpus["tmp"] / "dumps"
    # a pattern and a file it also matches: the file is read once, at its first place
    assert _cli(corpus["spec"], [dumps / "RC_2020-0[12].zst", dumps / "RC_2020-01.zst", dumps / "RC_2020-0[34].zst"],
                out, "--jobs", "2") == 0
    assert out.read_bytes() == corpus["csv"]
    assert (tmp_path / "cand.csv.parts" / "summary.json").is_file()
    printed = capsys.readouterr().out
    assert "zorbness: 6 candidates" in printed and "per file:" in printed and "stream error" in printed
    assert _cli(corpus["spec"], [dumps / "RC_1999-*.zst"], out) == 1
    assert "no dump file matches" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")  # ray.init: fork+exec
def test_ray_executor_gives_the_same_output(corpus, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        out = tmp_path / "out_ray"
        assert _cli(corpus["spec"], [corpus["tmp"] / "dumps" / "RC_*.zst"], out, "--executor", "ray") == 0
        assert (out / "candidates_zorbness.csv").read_bytes() == corpus["csv"]
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert summary["run"]["executor"] == "ray" and {f["status"] for f in summary["files"]} == {"read"}
        assert len({f["worker"]["pid"] for f in summary["files"]}) >= 1
        # resume works the same way: nothing left to read
        assert _cli(corpus["spec"], [corpus["tmp"] / "dumps" / "RC_*.zst"], out, "--executor", "ray") == 0
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert {f["status"] for f in summary["files"]} == {"reused"}
        assert (out / "candidates_zorbness.csv").read_bytes() == corpus["csv"]
    finally:
        ray.shutdown()
