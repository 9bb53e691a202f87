"""RedditBias data: pair loading and alignment checks, bad input, verified download + cache."""
import csv
import shutil

import pytest

from rbjax.data.redditbias import RedditBiasData, expand_bias_types, load_pair_files, load_pairs, manifest

TEST_PAIRS = {"religion1": 238, "religion2": 236, "race": 254, "gender": 253, "queerness": 235}


def test_pair_counts_and_alignment(redditbias_dir):
    for bt, n in TEST_PAIRS.items():
        p = load_pairs(bt, "test", redditbias_dir, need_stored_ppl=True)
        assert len(p) == len(p.counterfactual) == len(p.stored_biased_ppl) == n
    assert len(load_pairs("orientation", "valid", redditbias_dir)) == 234
    assert len(load_pairs("religion2", "valid+test", redditbias_dir)) == 236 + 235
    assert expand_bias_types("all") == ["religion1", "religion2", "race", "gender", "queerness"]
    assert expand_bias_types("orientation,race,queerness") == ["queerness", "race"]
    with pytest.raises(ValueError, match="unknown bias type 'nationality'"):
        expand_bias_types("nationality")


def _copy_pair(redditbias_dir, tmp_path, bt="race", g=("black", "white")):
    src = [redditbias_dir / f"data/{bt}/reddit_comments_{bt}_{x}_biased_test_reduced.csv" for x in g]
    dst = [tmp_path / s.name for s in src]
    for s, d in zip(src, dst):
        shutil.copy(s, d)
    return dst


def _rewrite(path, fn):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    rows = fn(rows)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def test_misaligned_pairs_name_file_and_row(redditbias_dir, tmp_path):
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)

    def swap_rows(rows):
        rows[5], rows[6] = rows[6], rows[5]
        return rows

    _rewrite(t2, swap_rows)
    with pytest.raises(ValueError, match=r"race_white_biased_test_reduced.csv row 5: misaligned pair"):
        load_pair_files(t1, t2, bias_type="race", split="test")


def test_shuffled_counterfactuals_are_caught_even_with_a_consistent_comments_column(redditbias_dir, tmp_path):
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)

    def shuffle_phrases_only(rows):
        col = rows[0].index("comments_processed")
        rows[8][col], rows[9][col] = rows[9][col], rows[8][col]
        return rows

    _rewrite(t2, shuffle_phrases_only)
    with pytest.raises(ValueError, match=r"white_biased_test_reduced.csv row 8: misaligned pair .* shares too few words"):
        load_pair_files(t1, t2, bias_type="race", split="test")


def test_bad_files(redditbias_dir, tmp_path):
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)
    _rewrite(t2, lambda rows: rows[:-1])
    with pytest.raises(ValueError, match="has 254 rows but .* has 253"):
        load_pair_files(t1, t2, bias_type="race", split="test")
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)
    col = None

    def blank_phrase(rows):
        nonlocal col
        col = rows[0].index("comments_processed")
        rows[3][col] = "  "
        return rows

    _rewrite(t1, blank_phrase)
    with pytest.raises(ValueError, match=r"black_biased_test_reduced.csv row 3: empty phrase"):
        load_pair_files(t1, t2, bias_type="race", split="test")
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)

    def bad_ppl(rows):
        rows[10][rows[0].index("perplexity")] = "inf"
        return rows

    _rewrite(t2, bad_ppl)
    assert len(load_pair_files(t1, t2, bias_type="race", split="test")) == 254  # the column is not used with a model
    with pytest.raises(ValueError, match=r"white_biased_test_reduced.csv row 10: perplexity 'inf' is not a finite"):
        load_pair_files(t1, t2, bias_type="race", split="test", need_stored_ppl=True)
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)
    _rewrite(t1, lambda rows: [[("text" if c == "comments_processed" else c) for c in rows[0]]] + rows[1:])
    with pytest.raises(ValueError, match=r"missing column\(s\) \['comments_processed'\]"):
        load_pair_files(t1, t2, bias_type="race", split="test")
    # an unclosed quote: named at the record where it opens, not reported as a pair-alignment problem
    t1, t2 = _copy_pair(redditbias_dir, tmp_path)
    lines = t1.read_text(encoding="utf-8").split("\n")
    lines[6] = lines[6].replace(",", ',"', 1)
    t1.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(ValueError, match=r"black_biased_test_reduced.csv: malformed CSV in the record starting on "
                                         r"line 7 .*unclosed or stray quote"):
        load_pair_files(t1, t2, bias_type="race", split="test")
    with pytest.raises(FileNotFoundError, match="file not found"):
        load_pair_files(tmp_path / "nope.csv", t2, bias_type="race", split="test")
    with pytest.raises(FileNotFoundError, match="not a RedditBias data folder"):
        RedditBiasData(tmp_path)


def test_download_verifies_checksums_and_caches(redditbias_dir, tmp_path, monkeypatch):
    # the upstream layout served from a local mirror (file:// URL): the real download path, no network
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RBJAX_REDDITBIAS_URL", redditbias_dir.as_uri())
    monkeypatch.delenv("RBJAX_DATA_DIR", raising=False)
    data = RedditBiasData()
    assert data.is_cache and data.commit == manifest()["commit"]
    p = load_pairs("gender", "test", data)
    assert len(p) == 253
    cached = tmp_path / "cache" / "redditbias" / data.commit / "data/gender/reddit_comments_gender_male_biased_test_reduced.csv"
    assert cached.read_bytes() == (redditbias_dir / "data/gender/reddit_comments_gender_male_biased_test_reduced.csv").read_bytes()
    # a corrupted cache entry is detected and fetched again
    cached.write_text("garbage")
    assert len(load_pairs("gender", "test", RedditBiasData())) == 253
    # a mirror serving different bytes is refused, nothing is cached
    mirror = tmp_path / "mirror"
    shutil.copytree(redditbias_dir / "data" / "race", mirror / "data" / "race")
    f = mirror / "data/race/reddit_comments_race_black_biased_test_reduced.csv"
    f.write_bytes(f.read_bytes().replace(b"black", b"BLACK", 1))
    monkeypatch.setenv("RBJAX_REDDITBIAS_URL", mirror.as_uri())
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        load_pairs("race", "test", RedditBiasData())
    assert not (tmp_path / "cache" / "redditbias" / data.commit / "data/race/reddit_comments_race_black_biased_test_reduced.csv").exists()
    # unreachable source: a clear error that says what to do
    monkeypatch.setenv("RBJAX_REDDITBIAS_URL", (tmp_path / "nowhere").as_uri())
    with pytest.raises(RuntimeError, match="--data-dir on the command line, data_dir= in Python"):
        load_pairs("race", "test", RedditBiasData())
