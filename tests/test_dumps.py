"""Streaming reader for Reddit comment dumps (rbjax.data.dumps)."""
from __future__ import annotations

import bz2
import gzip
import io
import json

import pytest
import zstandard

from rbjax.data.dumps import DumpStats, UnreadableDumpsError, iter_lines, iter_records, parse_time, write_zst

THREE = [
    '{"id":"c1","body":"plain text one"}',
    '{"id":"c2","body":"[deleted]","author":"[deleted]"}',
    '{"id":"c3","body":"café text three"}',
]


def _long_window_zst(path, lines):
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=31)
    cctx = zstandard.ZstdCompressor(compression_params=params)
    # streamed (size unknown), like the dumps: the frame keeps its 2 GiB window
    with open(path, "wb") as fh, cctx.stream_writer(fh) as w:
        w.write(("\n".join(lines) + "\n").encode("utf-8"))


def test_long_window_dump_reads_back(tmp_path):
    """Field failure: monthly dumps use `zstd --long=31`; a default decompressor refuses them."""
    p = tmp_path / "RC_2019-05.zst"
    _long_window_zst(p, THREE)
    # the failure being fixed: a default decompressor stops on this frame
    with open(p, "rb") as fh, pytest.raises(zstandard.ZstdError, match="Frame requires too much memory"):
        zstandard.ZstdDecompressor().stream_reader(fh).read()
    # the documented way reads it: max_window_size=2**31, stream_reader + TextIOWrapper
    with open(p, "rb") as fh:
        reader = zstandard.ZstdDecompressor(max_window_size=2**31).stream_reader(fh)
        got = [json.loads(line) for line in io.TextIOWrapper(reader, encoding="utf-8")]
    assert [r["id"] for r in got] == ["c1", "c2", "c3"]
    # our reader: 3 records in order, records without author do not raise
    stats = DumpStats()
    recs = list(iter_records(p, drop_deleted=False, stats=stats))
    assert [r["id"] for r in recs] == ["c1", "c2", "c3"]
    assert stats.corrupt == 0 and stats.errors == []
    # after dropping [deleted]/[removed] bodies, 2 remain; c3's body is exact
    kept = list(iter_records(p))
    assert [r["id"] for r in kept] == ["c1", "c3"]
    assert kept[1]["body"] == "café text three"


def test_write_zst_with_long_window_roundtrip(tmp_path):
    p = tmp_path / "a.zst"
    write_zst(THREE, p, window_log=31)
    assert [r["id"] for r in iter_records(p, drop_deleted=False)] == ["c1", "c2", "c3"]


def test_corrupt_lines_counted_not_fatal(tmp_path):
    p = tmp_path / "c.zst"
    lines = [
        b'{"id":"a","body":"one"}',
        b'{"id":"b","body":"two"',  # truncated
        b"not json at all",
        b'{"id":"c","body":"bad \xff\xfe utf8"}',  # invalid UTF-8
        b"[1, 2, 3]",  # JSON, not an object
        b"",  # blank: not a line
        b"   ",  # whitespace only: not a line
        b'{"id":"d","body":"three","author":"x"}',
        b'{"id":"e"}',  # no body (e.g. a submission object)
        b'{"id":"f","body":null}',
    ]
    write_zst(lines, p)
    stats = DumpStats()
    recs = list(iter_records(p, stats=stats))
    assert [r["id"] for r in recs] == ["a", "d"]
    assert stats.corrupt == 4
    assert stats.no_body == 2
    assert stats.lines == 8
    assert len(stats.corrupt_examples) == 4
    assert stats.corrupt_examples[0].startswith(f"{p}:2: invalid JSON")
    assert f"{p}:4: not UTF-8" in stats.corrupt_examples[2]
    assert "not an object" in stats.corrupt_examples[3]
    assert "corrupt lines: 4" in stats.summary()


def test_truncated_stream_reported_not_fatal(tmp_path):
    p = tmp_path / "t.zst"
    write_zst(({"id": f"x{i}", "body": f"comment number {i} " * 5} for i in range(5000)), p)
    data = p.read_bytes()
    cut = tmp_path / "cut.zst"
    cut.write_bytes(data[: len(data) // 2])
    good = tmp_path / "good.jsonl"
    good.write_text('{"id":"after","body":"next file"}\n', encoding="utf-8")
    stats = DumpStats()
    recs = list(iter_records([cut, good], stats=stats))
    assert 0 < len(recs) < 5001
    assert recs[-1]["id"] == "after"  # the next file is still read
    assert len(stats.errors) == 1 and "damaged or truncated" in stats.errors[0]
    assert stats.unreadable == []  # records came out of cut.zst: it is damaged, not unreadable


def _blocks(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte ranges of the blocks of a single-frame zstd file (RFC 8878 §3.1.1.2)."""
    pos, out = zstandard.frame_header_size(data), []
    while True:
        h = int.from_bytes(data[pos : pos + 3], "little")
        size = 1 if (h >> 1) & 3 == 1 else h >> 3
        out.append((pos, pos + 3 + size))
        pos += 3 + size
        if h & 1:
            return out


def _multi_block(tmp_path):
    recs = [{"id": f"x{i}", "body": f"comment number {i} " * 5} for i in range(5000)]
    p = tmp_path / "t.zst"
    write_zst(recs, p)
    text = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in recs)
    data = p.read_bytes()
    blocks = _blocks(data)
    assert len(blocks) >= 4 and zstandard.ZstdDecompressor().decompressobj().decompress(data) == text
    return recs, text, data, blocks


def test_truncated_zst_streams_every_complete_block(tmp_path):
    """Field failure: a cut .zst reported 'truncated after line 0'. Every line of the complete
    blocks before the cut comes out; the message says how many and why the rest is lost."""
    recs, text, data, blocks = _multi_block(tmp_path)
    cut = tmp_path / "cut.zst"
    cut.write_bytes(data[: (blocks[2][0] + blocks[2][1]) // 2])  # in the middle of the third block
    n_lines = text[: 2 * (128 << 10)].count(b"\n")  # two complete blocks of 128 KiB of text
    stats = DumpStats()
    got = list(iter_records(cut, stats=stats))
    assert [r["id"] for r in got] == [r["id"] for r in recs[:n_lines]]
    assert stats.corrupt == 1 and "incomplete line where the compressed data breaks off" in stats.corrupt_examples[0]
    (err,) = stats.errors
    assert f"after line {n_lines:,}: input ends in the middle of a zstd frame" in err
    assert f"the {n_lines:,} lines before that point were read" in err
    assert "zstd decodes whole blocks of up to 128 KiB" in err


def test_damaged_zst_keeps_the_blocks_before_the_damage(tmp_path):
    """A damaged block used to lose the text of every block decoded in the same 128 KiB read."""
    recs, text, data, blocks = _multi_block(tmp_path)
    bad = bytearray(data)
    start = blocks[2][0]
    bad[start : start + 2] = bytes(b ^ 0xFF for b in bad[start : start + 2])  # the third block's header
    p = tmp_path / "bad.zst"
    p.write_bytes(bytes(bad))
    stats = DumpStats()
    n_lines = text[: 2 * (128 << 10)].count(b"\n")
    assert [r["id"] for r in iter_records(p, stats=stats)] == [r["id"] for r in recs[:n_lines]]
    assert len(stats.errors) == 1 and f"after line {n_lines:,}" in stats.errors[0]


def test_truncated_in_first_block_says_nothing_was_decodable(tmp_path):
    p = tmp_path / "small.zst"
    write_zst(({"id": f"x{i}", "body": "some text"} for i in range(50)), p)
    cut = tmp_path / "smallcut.zst"
    cut.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    stats = DumpStats()
    with pytest.raises(UnreadableDumpsError) as e:
        list(iter_records(cut, stats=stats))
    msg = str(e.value)
    assert "every file failed to decompress or parse" in msg and "smallcut.zst" in msg
    assert "no complete line could be decoded before that point" in msg
    assert "zstd decodes whole blocks" in msg
    assert e.value.stats is stats and len(stats.unreadable) == 1


@pytest.mark.parametrize("suffix,name", [(".zst", "zstd"), (".gz", "gzip"), (".bz2", "bzip2"), (".xz", "xz")])
def test_not_compressed_at_all_is_unreadable(tmp_path, suffix, name):
    """Field failure: garbage bytes named .zst gave an empty, successful read."""
    p = tmp_path / f"garbage{suffix}"
    p.write_bytes(b"this is not compressed\n" + bytes(range(256)))
    with pytest.raises(UnreadableDumpsError, match=rf"garbage\{suffix}: cannot be read: not {name}-compressed data"):
        list(iter_records(p))
    # with a readable file next to it, the garbage is reported and the read succeeds
    good = tmp_path / "good.jsonl"
    good.write_text('{"id":"g","body":"fine"}\n', encoding="utf-8")
    stats = DumpStats()
    assert [r["id"] for r in iter_records([p, good], stats=stats)] == ["g"]
    assert len(stats.unreadable) == 1 and len(stats.errors) == 1 and str(p) in stats.errors[0]


@pytest.mark.parametrize("use_prefilter", [False, True])
def test_only_corrupt_lines_is_unreadable_even_behind_a_prefilter(tmp_path, use_prefilter):
    p = tmp_path / "junk.jsonl"
    p.write_bytes(b"hello world\n\x00\x01 binary\n[1, 2]\n")
    pf = (lambda line: b"zorbs" in line) if use_prefilter else None
    stats = DumpStats()
    with pytest.raises(UnreadableDumpsError, match=r"junk.jsonl: none of its 3 lines is a JSON object \(first: "):
        list(iter_records(p, prefilter=pf, stats=stats))
    assert stats.corrupt == 3 and stats.prefiltered == 0


def test_readable_without_records_is_not_an_error(tmp_path):
    empty = tmp_path / "empty.zst"
    write_zst([], empty)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    subs = tmp_path / "subs.jsonl"  # JSON objects, but no comment body
    subs.write_text('{"id":"s1","title":"a submission"}\n', encoding="utf-8")
    stats = DumpStats()
    assert list(iter_records([empty, tmp_path / "empty.jsonl", subs], stats=stats)) == []
    assert stats.unreadable == [] and stats.no_body == 1
    # behind a prefilter that rejects everything: still readable (the skipped lines are JSON objects)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"id":"a","body":"x"}\nnot json\n{"id":"b","body":"y"}\n', encoding="utf-8")
    stats = DumpStats()
    assert list(iter_records(ok, prefilter=lambda line: False, stats=stats)) == []
    assert stats.unreadable == [] and stats.prefiltered == 3 and stats.corrupt == 0


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".ndjson", ".gz", ".bz2", ".zst"])
def test_formats(tmp_path, suffix):
    text = ("\n".join(THREE) + "\n").encode("utf-8")
    p = tmp_path / f"d{suffix}"
    if suffix == ".gz":
        p.write_bytes(gzip.compress(text))
    elif suffix == ".bz2":
        p.write_bytes(bz2.compress(text))
    elif suffix == ".zst":
        p.write_bytes(zstandard.ZstdCompressor().compress(text))
    else:
        p.write_bytes(text)
    assert [r["id"] for r in iter_records(p)] == ["c1", "c3"]


def test_json_array_file(tmp_path):
    p = tmp_path / "arr.json"
    p.write_text(json.dumps([json.loads(x) for x in THREE] + [5]), encoding="utf-8")
    stats = DumpStats()
    assert [r["id"] for r in iter_records(p, stats=stats)] == ["c1", "c3"]
    assert stats.corrupt == 1


def test_crlf_and_no_final_newline(tmp_path):
    p = tmp_path / "crlf.jsonl"
    p.write_bytes("\r\n".join(THREE).encode("utf-8"))
    assert [r["body"] for r in iter_records(p)] == ["plain text one", "café text three"]


def test_multi_frame_zst(tmp_path):
    p = tmp_path / "m.zst"
    c = zstandard.ZstdCompressor()
    p.write_bytes(c.compress(b'{"id":"f1","body":"a"}\n') + c.compress(b'{"id":"f2","body":"b"}\n'))
    assert [r["id"] for r in iter_records(p)] == ["f1", "f2"]


def test_date_and_subreddit_filters(tmp_path):
    recs = [
        {"id": "a", "body": "x", "created_utc": 1577836799, "subreddit": "AskReddit"},  # 2019-12-31 23:59:59
        {"id": "b", "body": "x", "created_utc": 1577836800, "subreddit": "askreddit"},  # 2020-01-01
        {"id": "c", "body": "x", "created_utc": "1580515199", "subreddit": "news"},  # 2020-01-31, as a string
        {"id": "d", "body": "x", "created_utc": 1580515200, "subreddit": "AskReddit"},  # 2020-02-01
        {"id": "e", "body": "x", "subreddit": "AskReddit"},  # no date
    ]
    p = tmp_path / "f.zst"
    write_zst(recs, p)
    stats = DumpStats()
    got = [r["id"] for r in iter_records(p, start="2020-01-01", end="2020-02-01", stats=stats)]
    assert got == ["b", "c"]
    assert stats.out_of_range == 3
    got = [r["id"] for r in iter_records(p, subreddits=["r/askreddit"])]
    assert got == ["a", "b", "d", "e"]
    got = [r["id"] for r in iter_records(p, start=1577836800, subreddits=["AskReddit"])]
    assert got == ["b", "d"]


def test_parse_time():
    assert parse_time("2020-01-01") == 1577836800
    assert parse_time("1577836800") == 1577836800
    assert parse_time("2020-01-01T01:00:00+01:00") == 1577836800
    assert parse_time(None) is None
    with pytest.raises(ValueError, match="cannot read date"):
        parse_time("last tuesday")
    with pytest.raises(ValueError, match="empty date range"):
        list(iter_records(__file__, start="2020-02-01", end="2020-01-01"))


def test_missing_file_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.zst"):
        list(iter_records(tmp_path / "nope.zst"))


def test_prefilter_skips_unparsed(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id":"a","body":"keep me"}\n{"id":"b","body":"drop"}\n{broken but no keyword\n', encoding="utf-8")
    stats = DumpStats()
    got = list(iter_records(p, prefilter=lambda b: b"keep" in b, stats=stats))
    assert [r["id"] for r in got] == ["a"]
    assert stats.prefiltered == 2 and stats.corrupt == 0 and stats.parsed == 1


def test_chunk_boundaries_and_long_lines(tmp_path, monkeypatch):
    import rbjax.data.dumps as d

    monkeypatch.setattr(d, "CHUNK_SIZE", 7)  # lines straddle many chunks
    monkeypatch.setattr(d, "MAX_LINE_BYTES", 200)
    recs = [{"id": str(i), "body": "w" * (i * 3)} for i in range(1, 30)]
    lines = [json.dumps(r) for r in recs]
    lines.insert(10, '{"id":"huge","body":"' + "z" * 500 + '"}')
    p = tmp_path / "b.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stats = DumpStats()
    got = list(iter_records(p, stats=stats))
    assert [r["id"] for r in got] == [r["id"] for r in recs]
    assert stats.corrupt == 1 and stats.corrupt_examples[0].startswith(f"{p}:11: line longer than 200 bytes")
    nums = [n for n, _ in iter_lines(p)]
    assert nums == [i for i in range(1, 31) if i != 11]


def test_expand_paths_globs_order_and_repeats(tmp_path):
    from rbjax.data.dumps import expand_paths

    for name in ("RC_2019-02.zst", "RC_2019-01.zst", "RC_2018-12.zst", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "RC_dir.zst").mkdir()
    got = expand_paths([tmp_path / "RC_2019-*.zst", tmp_path / "RC_2018-12.zst", str(tmp_path / "RC_2019-01.zst")])
    assert [p.name for p in got] == ["RC_2019-01.zst", "RC_2019-02.zst", "RC_2018-12.zst"]  # sorted, repeat dropped
    assert [p.name for p in expand_paths(tmp_path / "RC_*.zst")] == ["RC_2018-12.zst", "RC_2019-01.zst",
                                                                      "RC_2019-02.zst"]  # the folder is skipped
    with pytest.raises(FileNotFoundError, match=r"no dump file matches '.*RC_2020-\*\.zst'"):
        expand_paths([tmp_path / "RC_2019-01.zst", tmp_path / "RC_2020-*.zst"])
    with pytest.raises(FileNotFoundError, match="dump file not found: .*missing.zst"):
        expand_paths(tmp_path / "missing.zst")
    with pytest.raises(ValueError, match="is a folder"):
        expand_paths(tmp_path / "RC_dir.zst")
    with pytest.raises(ValueError, match="no dump file given"):
        expand_paths([])


def test_decoder_memory_reads_the_frame_window(tmp_path):
    from rbjax.data.dumps import decoder_memory

    write_zst(THREE, tmp_path / "long.zst", window_log=31)
    write_zst(THREE, tmp_path / "short.zst", window_log=20)
    (tmp_path / "bad.zst").write_bytes(b"garbage, not zstd")
    (tmp_path / "a.jsonl").write_text(THREE[0] + "\n", encoding="utf-8")
    assert decoder_memory(tmp_path / "long.zst") == 2**31  # like the monthly dumps (zstd --long=31)
    assert decoder_memory(tmp_path / "short.zst") == 2**20
    assert decoder_memory(tmp_path / "bad.zst") == 2**31  # unknown: assume the largest window
    assert decoder_memory(tmp_path / "a.jsonl") < 2**21


def test_stats_add_and_round_trip(tmp_path):
    a = DumpStats(files=1, lines=5, corrupt=9, corrupt_examples=[f"a:{i}" for i in range(9)], errors=["a: cut"])
    b = DumpStats(files=1, lines=7, corrupt=3, corrupt_examples=["b:1", "b:2", "b:3"], unreadable=["b: bad"])
    total = DumpStats().add(a).add(b)
    assert (total.files, total.lines, total.corrupt) == (2, 12, 12)
    assert total.corrupt_examples == [f"a:{i}" for i in range(9)] + ["b:1"]  # first ten, in file order
    assert total.errors == ["a: cut"] and total.unreadable == ["b: bad"]
    assert DumpStats.from_dict(json.loads(json.dumps(total.to_dict()))) == total
