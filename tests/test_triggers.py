"""Host-side triggers of the debiasing losses (rbjax/debias/triggers.py)."""
import numpy as np
import pytest

from rbjax.debias.triggers import TriggerBuilder, pad_occurrences
from rbjax.specs import BIAS_TYPES, UPSTREAM_NAME, load_spec

PAD = 50257


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    t = Tokenizer(models.BPE.from_file(str(tokenizer_dir / "vocab.json"), str(tokenizer_dir / "merges.txt")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    return t


def batch(tok, sentences, extra_pad=0):
    enc = [tok.encode(s).ids for s in sentences]
    L = max(map(len, enc)) + extra_pad
    ids = np.full((len(enc), L), PAD, np.int64)
    am = np.zeros((len(enc), L), bool)
    for b, e in enumerate(enc):
        ids[b, : len(e)] = e
        am[b, : len(e)] = True
    return ids, am, enc


# ------------------------------------------------------------------------------------------------- paper
def test_paper_pair_ids_are_mid_sentence_subwords(tok):
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, tok)
    ids, mask = tb.pair_ids()
    assert ids.shape == mask.shape == (len(spec.pairs), 2, ids.shape[2])
    for p, pair in enumerate(spec.pairs):
        for k, term in enumerate(pair):
            assert tok.decode(ids[p, k][mask[p, k]].tolist()) == " " + term
    assert tb.pair_ids("add_hd")[0].tolist() == ids.tolist()
    with pytest.raises(ValueError):
        tb.pair_ids("hd")


def test_paper_lmd_positions(tok):
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, tok)
    pair_index = {p: i for i, p in enumerate(spec.pairs)}
    s = ["jews are greedy but the jewish people", "my Christian friends and jewelry", "the torah, the bible"]
    ids, am, enc = batch(tok, s)
    r = tb.lmd(ids, am)
    assert r.mask.shape == (3, ids.shape[1], len(spec.pairs))
    # sentence 0: "jews" at token 0 has no predicting state -> skipped; "jewish" is predicted by the state before it
    assert r.unpredicted.tolist() == [1, 0, 0]
    i_jewish = next(i for i, t in enumerate(enc[0]) if tok.decode([t]) == " jew")
    hits0 = {(int(i), int(p)) for i, p in np.argwhere(r.mask[0])}
    assert hits0 == {(i_jewish - 1, pair_index[("jewish", "christian")])}
    # sentence 1: a T2 term fires too, with every pair containing it (|P_t| = 2), case-insensitive;
    # "jewelry" is no term
    hits1 = {(int(i), int(p)) for i, p in np.argwhere(r.mask[1])}
    assert hits1 == {(0, pair_index[("jewish", "christian")]), (0, pair_index[("jew", "christian")])}
    hits2 = {int(p) for _, p in np.argwhere(r.mask[2])}
    assert hits2 == {pair_index[("torah", "bible")]}
    np.testing.assert_array_equal(r.norm, [len(e) for e in enc])
    # padding is never triggered, and extra padding changes nothing
    ids2, am2, _ = batch(tok, s, extra_pad=4)
    np.testing.assert_array_equal(tb.lmd(ids2, am2).mask[:, : ids.shape[1]], r.mask)
    assert tb.lmd(ids2, am2).mask[:, ids.shape[1]:].sum() == 0
    # the mask is never derived from the ids
    with pytest.raises(ValueError, match="attention_mask is required"):
        TriggerBuilder(spec, tok, pad_id=PAD).lmd(ids, None)


def test_paper_multiword_term(tok):
    spec = load_spec("race")
    tb = TriggerBuilder(spec, tok)
    ids, am, enc = batch(tok, ["i think african americans are"])
    r = tb.lmd(ids, am)
    p = spec.pairs.index(("african americans", "americans"))
    assert np.argwhere(r.mask[0]).tolist() == [[1, p]]  # state of " think" predicts " african"


def test_paper_attributes(tok):
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, tok)
    ids, am, enc = batch(tok, ["greedy people with a large nose and red hair", "nothing here", "Greed is loud"])
    o = tb.attributes(ids, am)
    assert o.weights.shape == (3, 8, ids.shape[1]) and o.mask.shape == (3, 8)
    assert o.mask.sum(1).tolist() == [3, 0, 2]
    a1 = spec.attributes_a1
    assert [a1[r] for r in o.rows[0, :3]] == ["greedy", "large nose", "red hair"]
    assert [a1[r] for r in o.rows[2, :2]] == ["greed*", "loud"]
    s, e = o.spans[0, 1]
    assert tok.decode(ids[0, s:e].tolist()) == " large nose" and e - s == 2
    np.testing.assert_allclose(o.weights[0, 1, s:e], [0.5, 0.5])
    np.testing.assert_allclose(o.weights.sum(-1), o.mask)
    assert tb.attributes(ids, am, max_occurrences=3).weights.shape[1] == 3
    with pytest.raises(ValueError):
        tb.attributes(ids, am, max_occurrences=2)
    assert [pad_occurrences(n) for n in (0, 1, 8, 9)] == [8, 8, 8, 16]


def test_paper_needs_right_padding(tok):
    tb = TriggerBuilder(load_spec("religion1"), tok)
    ids, am, _ = batch(tok, ["the jews are", "a jew"])
    left = np.stack([np.roll(ids[1], 1), ids[0]]), np.stack([np.roll(am[1], 1), am[0]])
    with pytest.raises(ValueError, match="right-padded"):
        tb.lmd(*left)
    with pytest.raises(ValueError, match="right-padded"):
        tb.attributes(*left)


def test_paper_needs_tokenizer():
    with pytest.raises(ValueError):
        TriggerBuilder(load_spec("race"))
    with pytest.raises(ValueError):
        TriggerBuilder(load_spec("race"), semantics="code")


# --------------------------------------------------------------------------------------------- reference
EOS = 50256  # DialoGPT's <|endoftext|>: turn separator and, in many pipelines, the pad id


@pytest.mark.parametrize("semantics", ["reference", "paper"])
def test_mask_is_required_when_pad_is_a_real_token(tok, semantics):
    # Field case: pad id = eos id and no mask used to give norm [2, 5] (separators dropped) instead of [3, 6].
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, None if semantics == "reference" else tok, semantics=semantics, pad_id=EOS)
    rows = [tok.encode("hi").ids + [EOS] + tok.encode("hello").ids,
            tok.encode("jews are greedy").ids + [EOS] + tok.encode("ok").ids]
    assert [len(r) for r in rows] == [3, 6]
    ids = np.full((2, 6), EOS, np.int64)
    am = np.zeros((2, 6), bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)], am[b, : len(r)] = r, True
    for call in (lambda: tb.lmd(ids, None), lambda: tb.attributes(ids, None)):
        with pytest.raises(ValueError, match="attention_mask is required"):
            call()
    with pytest.raises(TypeError):
        tb.lmd(ids)  # no default: a caller must decide what is real
    assert tb.lmd(ids, am).norm.tolist() == [3, 6]
    with pytest.raises(ValueError, match="does not match"):
        tb.lmd(ids, am[:, :5])


def test_reference_lmd_fires_on_t1_everywhere():
    spec = load_spec("gender")
    tb = TriggerBuilder(spec, semantics="reference")
    she, he = spec.reference["lmd_pairs"][-2]
    women = spec.reference["lmd_pairs"][0][0]
    ids = np.array([[10, she, 0, 20, PAD, PAD],  # t1 'Ġshe' + "!" (id 0)
                    [10, he, 20, 30, 40, PAD],  # only a t2 id: never fires
                    [women, she, she, 5, 6, 7]])
    r = tb.lmd(ids, attention_mask=ids != PAD)
    p_she = len(spec.reference["lmd_pairs"]) - 2
    assert r.mask[0, :, p_she].tolist() == [1, 1, 0, 1, 0, 0]  # every real position but "!"
    assert r.mask[0].sum() == 3 and r.mask[1].sum() == 0
    assert r.mask[2].sum(0)[[0, p_she]].tolist() == [6, 6]  # two pairs fire once each, however many times
    assert r.norm.tolist() == [4, 5, 6]
    ids_, mask_ = tb.pair_ids()
    assert ids_.shape == (21, 2, 1) and mask_.all()


def test_reference_attribute_rules():
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, semantics="reference")
    rows = spec.reference["attribute_rows"]
    padded = sum(1 for r in rows if 0 in r)
    r_mat = next(i for i, r in enumerate(rows) if r[:2] == [2587, 2569])  # material+istic
    ids = np.array([[5, 0, PAD, PAD],  # "!" fires every zero-padded row
                    [2587, 2569, 7, PAD],  # full window
                    [2569, 2587, 9, 9],  # order-free: a full window from the second piece too
                    [2587, 9, 9, 9]])  # failed window -> zero vector
    o = tb.attributes(ids, ids != PAD)
    assert o.mask[0].sum() == padded
    # a "!" on a single-token row uses h at the "!"; on a multi-piece row the window [!, pad] fails
    single = [n for n in range(padded) if sum(v != 0 for v in rows[o.rows[0, n]]) == 1]
    assert all(o.weights[0, n, 1] == 1.0 for n in single)
    assert all(o.weights[0, n].sum() == 0 for n in range(padded) if n not in single)
    assert o.rows[1, 0] == r_mat and o.weights[1, 0].tolist() == [0.5, 0.5, 0, 0]
    assert o.rows[1, 1] == r_mat and o.weights[1, 1].sum() == 0  # second piece: window [2569, 7] fails
    assert o.weights[2, 0].tolist() == [0.5, 0.5, 0, 0]
    assert o.mask[3].sum() == 1 and o.weights[3, 0].sum() == 0 and o.spans[3, 0].tolist() == [0, 2]


def test_reference_window_cut_at_batch_length():
    spec = load_spec("religion1")
    tb = TriggerBuilder(spec, semantics="reference")
    ids = np.array([[9, 9, 2587], [9, PAD, PAD]])  # "material" is the last column of the padded batch
    o = tb.attributes(ids, ids != PAD)
    assert o.weights[0, 0].tolist() == [0, 0, 1.0]  # window cut to one id: all members -> its mean
    ids2 = np.concatenate([ids, np.full((2, 3), PAD)], axis=1)  # extra padding on our side changes nothing
    np.testing.assert_array_equal(tb.attributes(ids2, ids2 != PAD).weights[:, :, :3], o.weights)


# Measured on the train files (first 36 tokens of each line); docs/debiasing.md §3 lists them.
LMD_COVERAGE = {"religion1": 718, "religion2": 719, "queerness": 720, "gender": 1474, "race": 763}
ADD_TABLE = {  # "!" triggers of single-token rows, genuine single-token hits, genuine full multi-token matches
    "religion1": (756, 601, 95), "religion2": (722, 637, 4), "queerness": (825, 436, 223),
    "gender": (1744, 1316, 24), "race": (1365, 667, 44)}
TRAIN = {"religion2": "religion2_bias_manual_lowercase_train.txt"}


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_reference_counts_on_train_files(redditbias_dir, tok, name):
    up = UPSTREAM_NAME[name]
    path = redditbias_dir / "text_files" / up / TRAIN.get(name, f"{up}_bias_manual_train.txt")
    lines = [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
    spec = load_spec(name)
    tb = TriggerBuilder(spec, semantics="reference")
    enc = [e[:36] for e in (tok.encode(s).ids for s in lines)]
    L = max(map(len, enc))
    ids = np.full((len(enc), L), PAD)
    for b, e in enumerate(enc):
        ids[b, : len(e)] = e
    r = tb.lmd(ids, ids != PAD)
    assert int((r.mask.sum((1, 2)) > 0).sum()) == LMD_COVERAGE[name]
    rows = spec.reference["attribute_rows"]
    bang = single = full = 0
    for e in enc:  # one line per batch, as the doc's measurement
        x = np.array([e])
        o = tb.attributes(x, np.ones_like(x, bool))
        for n in range(int(o.mask[0].sum())):
            nz = sum(v != 0 for v in rows[o.rows[0, n]])
            first = x[0, o.spans[0, n, 0]]
            bang += first == 0 and nz == 1
            single += first != 0 and nz == 1
            full += first != 0 and nz > 1 and o.weights[0, n].sum() > 0
    assert (bang, single, full) == ADD_TABLE[name]
