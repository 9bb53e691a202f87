"""DSTC-7 CRG data (rbjax.dialog.crg_data): the TSV reader and its errors, the offline test contexts of RedditBias's
response_hyp.txt, and the fine-tuning examples (exact ids and loss mask, the reference's truncation rule)."""
import json

import numpy as np
import pytest

from rbjax.dialog import crg_data
from rbjax.model.tokenizer import load_tokenizer

EOS = 50256


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def _row(h="a1", ctx="START EOS hello there", resp="hi !", score="3", turn="2"):
    return "\t".join([h, "AskReddit", "c1", score, turn, ctx, resp])


# ------------------------------------------------------------------------------------------------ TSV
def test_read_tsv_fields_markers_and_placeholders(tmp_path):
    p = tmp_path / "convos.txt"
    p.write_text(_row() + "\n\n" + _row("b2", "START EOS what ? EOS nothing", "__UNDISCLOSED__", "-1", "3") + "\n"
                 + _row("c3", resp="") + "\r\n", encoding="utf-8")
    rows = crg_data.read_dstc7_tsv(p)
    assert [r.hash for r in rows] == ["a1", "b2", "c3"] and [r.line for r in rows] == [1, 3, 4]
    assert rows[0] == crg_data.DSTC7Row("a1", "AskReddit", "c1", 3, 2, "START EOS hello there", "hi !", 1)
    assert rows[1].context == "START EOS what ? EOS nothing"  # markers kept as text, as the reference feeds them
    assert rows[1].score == -1 and rows[1].response is None and rows[2].response is None


@pytest.mark.parametrize("line, problem", [
    ("a1\tsub\tc1\t3\t2\tcontext only", "line 2: expected 7 tab-separated fields (hash, subreddit, conv_id, score, "
                                        "turn, context, response), got 6"),
    (_row(score="many"), "line 2: score (field 4) must be an integer, got 'many'"),
    (_row(turn="2.5"), "line 2: turn (field 5) must be an integer, got '2.5'"),
    (_row(h=" "), "line 2: empty hash (field 1)"),
])
def test_malformed_rows_name_file_and_line(tmp_path, line, problem):
    p = tmp_path / "bad.txt"
    p.write_text(_row() + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.txt") as e:
        crg_data.read_dstc7_tsv(p)
    assert problem in str(e.value)


def test_tsv_training_rows_need_a_response_and_other_errors(tmp_path):
    p = tmp_path / "train.txt"
    p.write_text(_row() + "\n" + _row("b2", resp="__UNDISCLOSED__") + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--train-file .*train.txt line 2: no response"):
        crg_data.read_dstc7_tsv(p, need_response=True, what="--train-file")
    (tmp_path / "latin1.txt").write_bytes(_row().encode() + b"\n" + _row(ctx="caf\xe9").encode("latin-1") + b"\n")
    with pytest.raises(ValueError, match="not UTF-8 text \\(line 2"):
        crg_data.read_dstc7_tsv(tmp_path / "latin1.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no row"):
        crg_data.read_dstc7_tsv(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="no such file"):
        crg_data.read_dstc7_tsv(tmp_path / "missing.txt")


# ------------------------------------------------------------------------------------------------ offline contexts
def test_response_hyp_contexts(redditbias_dir):
    from rbjax.core.io import sha256_file
    from rbjax.data.redditbias import manifest

    path = redditbias_dir / crg_data.RESPONSE_HYP
    assert manifest()["files"][crg_data.RESPONSE_HYP]["sha256"] == sha256_file(path)  # downloadable, verified, for users
    ex = crg_data.read_response_hyp(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert len(ex) == 1472 and [k for k, _ in ex] == list(raw)
    assert ex[0] == ("6b1784c492ebd87f3b3369e19a67028858f9a2e2fe71026a4f97ae92",
                     "START EOS til a registered sex offender who had already committed two murders was selected as "
                     "a contestant on the dating game in 1978.")
    # the text after the marker (a generated hypothesis in 733 records) is not part of the context
    assert ex[3][1].endswith("than * sideshow bob *.") and raw[ex[3][0]].endswith("__UNDISCLOSED__dude...")
    assert sum(1 for v in raw.values() if not v.endswith(crg_data.UNDISCLOSED)) == 733
    assert all(crg_data.UNDISCLOSED not in c and c.strip() for _, c in ex)


def test_response_hyp_errors(tmp_path):
    p = tmp_path / "r.txt"
    p.write_text(json.dumps({"k1": "ctx__UNDISCLOSED__", "k2": "no marker"}))
    with pytest.raises(ValueError, match="record 'k2' is not a string with the __UNDISCLOSED__ marker"):
        crg_data.read_response_hyp(p)
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        crg_data.read_response_hyp(p)


# ------------------------------------------------------------------------------------------------ examples
def test_example_ids_by_hand():
    # fits: ctx + eos + resp + eos, the loss starts after the separator
    assert crg_data.crg_example([1, 2, 3], [70, 80], 99, block_size=10) == ([1, 2, 3, 99, 70, 80, 99], 3)
    # exactly block_size tokens: nothing is cut
    assert crg_data.crg_example([1, 2, 3, 4, 5, 6], [70, 80], 99, block_size=10) == ([1, 2, 3, 4, 5, 6, 99, 70, 80, 99], 6)
    # too long, short response: the context is cut from the left (its end, next to the response, is kept)
    ids, n = crg_data.crg_example(list(range(1, 11)), [70, 80], 99, block_size=10)
    assert ids == [5, 6, 7, 8, 9, 10, 99, 70, 80, 99] and n == 6
    # a response of block_size - 2 or more keeps the whole context and is cut (the reference's rule)
    ids, n = crg_data.crg_example([1, 2], list(range(70, 80)), 99, block_size=10)
    assert ids == [1, 2, 99, 70, 71, 72, 73, 74, 75, 99] and n == 2
    # ... and a context that alone overflows then drops the example
    assert crg_data.crg_example(list(range(1, 10)), list(range(70, 78)), 99, block_size=10) is None
    with pytest.raises(ValueError, match="block_size must be >= 3"):
        crg_data.crg_example([1], [2], 99, block_size=2)


def test_build_arrays_exact_ids_and_loss_mask(tok):
    rows = [crg_data.DSTC7Row("a", "s", "c", 1, 2, "START EOS is it raining ?", "yes , all day .", 1),
            crg_data.DSTC7Row("b", "s", "c", 1, 2, " ".join(f"word{i}" for i in range(40)), "sure", 2)]
    arrays, stats = crg_data.build_crg_arrays(rows, tok, block_size=32)
    ctx0, resp0 = tok.encode(rows[0].context), tok.encode(rows[0].response)
    ids0 = ctx0 + [EOS] + resp0 + [EOS]
    n0 = len(ids0)
    assert arrays["input_ids"].shape == (2, 32) and arrays["input_ids"].dtype == np.int32
    assert arrays["input_ids"][0, :n0].tolist() == ids0 and (arrays["input_ids"][0, n0:] == EOS).all()
    assert arrays["attention_mask"][0].tolist() == [1] * n0 + [0] * (32 - n0)
    # the loss covers the response tokens and the final <eos>: never the context or its separator
    assert arrays["loss_mask"][0].tolist() == [0] * (len(ctx0) + 1) + [1] * (len(resp0) + 1) + [0] * (32 - n0)
    # a long context is cut from the left to fill exactly 32 tokens
    ctx1, resp1 = tok.encode(rows[1].context), tok.encode(rows[1].response)
    assert len(ctx1) > 32
    keep = 32 - 2 - len(resp1)
    assert arrays["input_ids"][1].tolist() == ctx1[-keep:] + [EOS] + resp1 + [EOS]
    assert arrays["loss_mask"][1].tolist() == [0] * (keep + 1) + [1] * (len(resp1) + 1)
    assert stats == {"n_rows": 2, "n_examples": 2, "n_dropped_too_long": 0, "n_context_cut": 1, "n_response_cut": 0,
                     "n_tokens": n0 + 32, "n_loss_tokens": len(resp0) + 1 + len(resp1) + 1}
    with pytest.raises(ValueError, match="line 7 \\(hash z\\): no response"):
        crg_data.build_crg_arrays([crg_data.DSTC7Row("z", "s", "c", 1, 2, "ctx", None, 7)], tok)


def test_reference_sets_are_line_aligned(tmp_path):
    a, b = tmp_path / "ref0.txt", tmp_path / "ref1.txt"
    a.write_text("one\ntwo\nthree\n")
    b.write_text("uno\ndos\n")
    assert crg_data.read_reference_sets([a], 3) == [["one", "two", "three"]]
    with pytest.raises(ValueError, match="ref1.txt has 2 lines but there are 3 test examples"):
        crg_data.read_reference_sets([a, b], 3)
