"""DST as binary slot-value classification (rbjax.dialog.state_tracking): examples, tokens, the classifier's pooled token (field
case), BCE, the reference's metrics, and joint goal accuracy with dontcare (field case)."""
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rbjax.dialog import state_tracking
from rbjax.dialog import multiwoz as mw
from rbjax.model.gpt2 import GPT2Config, GPT2LMHeadModel, init_params
from rbjax.model.tokenizer import load_tokenizer
from tests.test_multiwoz import dialogue_a, dialogue_b

SMALL_ONTO = {
    "hotel-price range": ["cheap", "do n't care", "expensive"],
    "hotel-type": ["hotel", "guest house"],
    "hotel-parking": ["yes", "no", "do n't care"],
    "hotel-area": ["centre", "north"],
    "hotel-stars": ["3", "4"],
    "hotel-book day": ["tuesday", "friday"],
    "hotel-book people": ["2", "3"],
    "restaurant-price range": ["expensive", "cheap"],
    "restaurant-food": ["chinese", "do n't care"],
    "restaurant-area": ["centre", "west"],
    "taxi-leave at": ["17:15", "09:00"],
    "train-leave at": ["05:00"],  # reached from taxi-leaveat only through the reference's remapping bug
    "train-arrive by": ["06:00"],
}


@pytest.fixture(scope="module")
def mwoz_shared(shared_dir):
    return shared_dir / "dialog-data" / "multiwoz"


@pytest.fixture(scope="module")
def normalizer(mwoz_shared):
    return mw.Normalizer(mw.load_mapping_pairs(mwoz_shared / "budzianowski-multiwoz" / "utils" / "mapping.pair"))


@pytest.fixture(scope="module")
def fixture_dialogues(normalizer):
    dials, dropped = mw.build_trade_dialogues({"SNG0001": dialogue_a(), "MUL0002": dialogue_b()}, normalizer)
    assert not dropped
    return dials


@pytest.fixture(scope="module")
def small_onto(normalizer):
    return mw.SlotOntology(SMALL_ONTO, normalizer)


@pytest.fixture(scope="module")
def full_onto(mwoz_shared, normalizer):
    return mw.SlotOntology(mw.load_ontology(mwoz_shared / "thu-coai-tatk" / "tatk" / "dst" / "sumbt" / "data" /
                                            "ontology.json"), normalizer)


@pytest.fixture(scope="module")
def test_split(mwoz_shared):
    base = mwoz_shared / "ConvLab-ConvLab" / "data" / "multiwoz"
    return mw.load_multiwoz(base / "test.json.zip", "test",
                            mapping=mwoz_shared / "budzianowski-multiwoz" / "utils" / "mapping.pair")


# ------------------------------------------------------------------------------------------------ examples
def test_positive_texts_exact(fixture_dialogues, small_onto):
    ex = state_tracking.build_examples(fixture_dialogues, small_onto, semantics="reference")
    pos = [e for e in ex if e.label == 1]
    assert [e.text for e in pos[:4]] == [
        " [SEP] i am looking for a cheap guesthouse in the centre , parking does not matter . hotel-area-centre",
        " [SEP] i am looking for a cheap guesthouse in the centre , parking does not matter . hotel-parking-dontcare",
        " [SEP] i am looking for a cheap guesthouse in the centre , parking does not matter . hotel-pricerange-cheap",
        " [SEP] i am looking for a cheap guesthouse in the centre , parking does not matter . hotel-type-guesthouse",
    ]
    assert pos[4].text == ("sure , there are 2 options . how many stars ? [SEP] 4 stars please , for 2 people on "
                           "tuesday . hotel-book day-tuesday")
    # one positive per turn_label pair (4 + 3 + 2 + 2 + 1), each followed by its negative when one is kept
    assert len(pos) == 12
    for i, e in enumerate(ex):
        if e.label == 0:
            assert ex[i - 1].label == 1 and ex[i - 1].slot == e.slot and ex[i - 1].turn_idx == e.turn_idx
            prev = ex[i - 1]
            context = prev.text[:len(prev.text) - len(f"{prev.slot}-{prev.value}")]
            assert e.text == context + f"{e.slot}-{e.value}"
    # paper mode writes values in their comparison form (one surface form per value)
    paper = [e for e in state_tracking.build_examples(fixture_dialogues, small_onto) if e.label == 1]
    assert [e.value for e in paper[:4]] == ["centre", "dontcare", "cheap", "guest house"]


def test_seeded_negatives_and_the_reference_remap_bug(fixture_dialogues, small_onto):
    for sem in ("paper", "reference"):
        a = state_tracking.build_examples(fixture_dialogues, small_onto, semantics=sem, seed=7)
        b = state_tracking.build_examples(fixture_dialogues, small_onto, semantics=sem, seed=7)
        assert a == b
        assert any(state_tracking.build_examples(fixture_dialogues, small_onto, semantics=sem, seed=s) != a for s in range(8, 20))
    for seed in range(20):
        ref = state_tracking.build_examples(fixture_dialogues, small_onto, semantics="reference", seed=seed)
        paper = state_tracking.build_examples(fixture_dialogues, small_onto, semantics="paper", seed=seed)
        ref_neg = {e.slot: e.value for e in ref if e.label == 0}
        # the reference draws taxi-leaveat values from 'train-leave at' (a one-value list here)
        assert ref_neg["taxi-leaveat"] == "05:00"
        for e in ref:
            if e.label == 0 and e.slot.endswith("pricerange"):
                assert e.value in SMALL_ONTO["hotel-price range"]  # restaurant too, through the bug
        for e in paper:
            if e.label == 0:
                assert e.value in state_tracking.candidate_values(small_onto, e.slot)
                assert e.value != "05:00"
        # paper: one negative per positive, never the gold value in another spelling
        assert sum(e.label for e in paper) * 2 == len(paper)
        golds = {(e.dialogue_idx, e.turn_idx, e.slot): e.value for e in paper if e.label == 1}
        for e in paper:
            if e.label == 0:
                assert e.value != golds[(e.dialogue_idx, e.turn_idx, e.slot)]


def test_reference_draws_follow_python_random_seeded_like_the_reference(fixture_dialogues, small_onto):
    # the reference calls random.choice once per positive on the (remapped) ontology list, after random.seed(42)
    random.seed(42)
    draws = []
    for d in fixture_dialogues:
        for t in d["dialogue"]:
            for slot, gold in t["turn_label"]:
                key = {"restaurant-pricerange": "hotel-price range", "hotel-pricerange": "hotel-price range",
                       "taxi-leaveat": "train-leave at"}.get(slot, slot)
                v = random.choice(SMALL_ONTO[key])
                if v not in gold:
                    draws.append((slot, v))
    ex = state_tracking.build_examples(fixture_dialogues, small_onto, semantics="reference")  # seed 42 by default
    assert [(e.slot, e.value) for e in ex if e.label == 0] == draws
    # one stream across splits (the reference builds train, then test)
    rng = random.Random(42)
    first = state_tracking.build_examples(fixture_dialogues[:1], small_onto, semantics="reference", rng=rng)
    second = state_tracking.build_examples(fixture_dialogues[1:], small_onto, semantics="reference", rng=rng)
    assert first + second == ex


def test_unknown_slot_and_semantics(fixture_dialogues, normalizer):
    onto = mw.SlotOntology({"hotel-area": ["centre"]}, normalizer)
    with pytest.raises(ValueError, match=r"dialogue SNG0001 turn 0: slot 'hotel-parking'"):
        state_tracking.build_examples(fixture_dialogues, onto)
    with pytest.raises(ValueError, match=r"ontology key 'hotel-parking'"):
        state_tracking.build_examples(fixture_dialogues, onto, semantics="reference")
    with pytest.raises(ValueError, match="semantics must be one of"):
        state_tracking.build_examples(fixture_dialogues, onto, semantics="faithful")


def test_offline_test_split_example_counts(test_split, full_onto):
    paper = state_tracking.build_examples(test_split.dialogues, full_onto, semantics="paper", seed=42)
    ref = state_tracking.build_examples(test_split.dialogues, full_onto, semantics="reference", seed=42)
    assert state_tracking.example_counts(paper) == {"n_examples": 15870, "n_positive": 7935, "n_negative": 7935}
    assert state_tracking.example_counts(ref) == {"n_examples": 15149, "n_positive": 7935, "n_negative": 7214}
    assert ref[0].text == (" [SEP] i would like a taxi from saint john s college to pizza hut fen ditton . "
                           "taxi-destination-pizza hut fen ditton")
    assert ref[1].label == 0 and ref[1].value == "cafe jello gallery"
    # the reference's negatives include the gold value in the ontology's spelling ("do n't care" for "dontcare",
    # not a substring): labelled 0 although right. The paper mode never does that.
    wrong = sum(1 for i, e in enumerate(ref) if e.label == 0 and
                mw.canonical_value(e.slot, e.value) == mw.canonical_value(e.slot, ref[i - 1].value))
    assert wrong == 76
    assert all(mw.canonical_value(e.slot, e.value) != paper[i - 1].value for i, e in enumerate(paper) if e.label == 0)


# ------------------------------------------------------------------------------------------------ tokens
@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def test_encode_examples_and_truncation(fixture_dialogues, small_onto, tok):
    ex = state_tracking.build_examples(fixture_dialogues, small_onto)
    a = state_tracking.encode_examples(ex, tok)
    assert a["input_ids"].shape == (len(ex), 128) and a["input_ids"].dtype == np.int32
    assert a["labels"].dtype == np.float32 and a["labels"].tolist() == [float(e.label) for e in ex]
    for i, e in enumerate(ex):
        ids = tok.encode(e.text)
        n = len(ids)
        assert a["lengths"][i] == n and a["attention_mask"][i].sum() == n
        assert a["input_ids"][i, :n].tolist() == ids and (a["input_ids"][i, n:] == 50256).all()
    # a block shorter than the text: "left" keeps the end (the slot-value pair), "right" (reference) the start
    text = ex[0].text
    ids = tok.encode(text)
    left = state_tracking.encode_examples([text], tok, block_size=8)
    right = state_tracking.encode_examples([text], tok, block_size=8, truncation="reference")
    assert left["input_ids"][0].tolist() == ids[-8:] and tok.decode(ids[-8:]).endswith("hotel-area-centre")
    assert right["input_ids"][0].tolist() == ids[:8] and "hotel" not in tok.decode(ids[:8])
    with pytest.raises(ValueError, match="truncation must be"):
        state_tracking.encode_examples([text], tok, truncation="middle")


def test_offline_test_split_fits_the_block(test_split, full_onto, tok):
    a = state_tracking.encode_examples(state_tracking.build_examples(test_split.dialogues, full_onto), tok)
    assert int(a["lengths"].max()) == 105  # no test example reaches 128 tokens: truncation never fires here


def test_dst_batches_fixed_shape():
    arrays = {"input_ids": np.arange(5 * 4, dtype=np.int32).reshape(5, 4),
              "attention_mask": np.ones((5, 4), np.int32), "labels": np.array([1, 0, 1, 0, 1], np.float32)}
    bs = list(state_tracking.dst_batches(arrays, 2))
    assert len(bs) == 3 and all(b["input_ids"].shape == (2, 4) for b in bs)
    assert bs[-1]["weights"].tolist() == [1.0, 0.0] and bs[-1]["attention_mask"][1].sum() == 0
    assert len(list(state_tracking.dst_batches(arrays, 2, drop_remainder=True))) == 2
    sh = list(state_tracking.dst_batches(arrays, 5, shuffle=True, seed=3))[0]
    assert sorted(sh["input_ids"][:, 0].tolist()) == [0, 4, 8, 12, 16]


# ------------------------------------------------------------------------------------------------ classifier
PAD = 50256
R = [5303, 50256, 31373, 50256, 50256, 50256]
R_MASK = [1, 1, 1, 1, 0, 0]
L = [50256, 50256, 5303, 50256, 31373, 50256]
L_MASK = [0, 0, 1, 1, 1, 1]
SEQ = [5303, 50256, 31373, 50256]  # the real tokens of R and of L (pad == eos: an eos inside the text is real)


@pytest.fixture(scope="module")
def tiny():
    cfg = GPT2Config(vocab_size=50257, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    return cfg, init_params(cfg, seed=1), state_tracking.init_head(cfg, seed=2)


LOGITS = jax.jit(state_tracking.dst_logits, static_argnames=("config", "pooling"))  # eager Flax is slow; one compile per shape


def test_pooling_field_case(tiny):
    cfg, params, head = tiny
    r = np.array(R, np.int32)
    assert state_tracking.pooled_index(np.array([R_MASK, L_MASK])).tolist() == [3, 5]
    # the two wrong rules of the field: "first pad − 1" and the reference's hidden[:, -1]
    assert int(np.argmax(r == PAD)) - 1 == 0  # reads the first token of R
    assert len(R) - 1 == 5 and R_MASK[5] == 0  # a pad of R
    unpadded = float(LOGITS(params, head, np.array([SEQ]), np.ones((1, 4), np.int32), cfg)[0])
    both = LOGITS(params, head, np.array([R, L]), np.array([R_MASK, L_MASK]), cfg)
    assert float(both[0]) == pytest.approx(unpadded, abs=1e-5)
    assert float(both[1]) == pytest.approx(unpadded, abs=1e-5)
    # any amount and side of padding, in one batch of width 8
    rows, masks = [], []
    for pad_left in range(5):
        for pad_right in range(5 - pad_left):
            extra = 8 - 4 - pad_left - pad_right  # the rest of the row: padding too, on the right
            rows.append([PAD] * pad_left + SEQ + [PAD] * (pad_right + extra))
            masks.append([0] * pad_left + [1] * 4 + [0] * (pad_right + extra))
    got = np.asarray(LOGITS(params, head, np.array(rows), np.array(masks), cfg))
    np.testing.assert_allclose(got, unpadded, atol=1e-5)
    # the reference's pooling reads column 5 of the batch [R, L]: a pad for R, so R's logit changes
    ref = LOGITS(params, head, np.array([R, L]), np.array([R_MASK, L_MASK]), cfg, pooling="reference")
    assert abs(float(ref[0]) - unpadded) > 1e-3
    # and the state at R's first token (what "first pad − 1" reads) is another logit again
    first = float(LOGITS(params, head, np.array([SEQ[:1]]), np.ones((1, 1), np.int32), cfg)[0])
    assert abs(first - unpadded) > 1e-3


def test_predict_proba_trims_padding_columns_without_changing_a_logit(tiny, fixture_dialogues, small_onto, tok):
    cfg, params, head = tiny
    arrays = state_tracking.encode_examples(state_tracking.build_examples(fixture_dialogues, small_onto)[:6], tok, block_size=48)
    for pooling in state_tracking.POOLING:
        full = state_tracking.predict_proba(params, head, arrays, cfg, batch_size=4, pooling=pooling, bucket=0)
        cut = state_tracking.predict_proba(params, head, arrays, cfg, batch_size=4, pooling=pooling, bucket=8)
        np.testing.assert_allclose(cut, full, atol=1e-6)
    assert arrays["lengths"].max() < 40  # so the cut really dropped columns


def test_reference_pooling_is_the_last_column_of_the_batch_as_the_reference_pads_it(tiny):
    cfg, params, head = tiny
    rows = [[11, 12, 13], [21, 22, 23, 24, 25]]
    ids = np.full((2, 10), PAD, np.int32)
    mask = np.zeros((2, 10), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    got = LOGITS(params, head, ids, mask, cfg, pooling="reference")
    # the reference: pad to the longest row (5), no attention mask, hidden[:, -1]
    _, hidden = jax.jit(GPT2LMHeadModel(cfg).apply)({"params": params}, jnp.asarray(ids[:, :5]))
    want = hidden[:, -1] @ head["kernel"][:, 0] + head["bias"][0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_logits_match_pytorch(tiny_model_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rbjax.model import hf

    cfg, params = hf.load_pretrained(tiny_model_dir)
    head = state_tracking.init_head(cfg, seed=5)
    ids = np.array([[464, 3797, 3332, 50256, 50256], [50256, 40, 588, 340, 13]], np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int32)
    model = transformers.GPT2Model.from_pretrained(tiny_model_dir).eval()
    w = torch.tensor(np.asarray(head["kernel"])[:, 0])
    with torch.no_grad():
        t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
        pos = (t_mask.cumsum(-1) - 1).clamp(min=0) * t_mask
        h = model(input_ids=t_ids, attention_mask=t_mask, position_ids=pos).last_hidden_state
        last = h[torch.arange(2), torch.tensor([2, 4])] @ w + float(head["bias"][0])
        h_ref = model(input_ids=t_ids).last_hidden_state  # the reference: no mask, hidden[:, -1]
        ref = h_ref[:, -1] @ w + float(head["bias"][0])
    np.testing.assert_allclose(np.asarray(state_tracking.dst_logits(params, head, ids, mask, cfg)), last.numpy(), atol=1e-4)
    np.testing.assert_allclose(np.asarray(state_tracking.dst_logits(params, head, ids, mask, cfg, pooling="reference")),
                               ref.numpy(), atol=1e-4)


def test_bce_equals_optax_and_hand_value():
    logits, labels = jnp.array([2.0, -1.0, 0.5]), jnp.array([1.0, 0.0, 0.0])
    hand = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 3
    assert float(state_tracking.dst_loss(logits, labels)) == pytest.approx(hand, rel=1e-6)
    assert float(state_tracking.dst_loss(logits, labels)) == pytest.approx(
        float(optax.sigmoid_binary_cross_entropy(logits, labels).mean()), rel=1e-7)
    w = jnp.array([1.0, 1.0, 0.0])  # a padding row of weight 0 does not count
    assert float(state_tracking.dst_loss(logits, labels, w)) == pytest.approx(
        (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-1.0))) / 2, rel=1e-6)


def test_loss_fn_for_a_trainer(tiny, fixture_dialogues, small_onto, tok):
    cfg, params, head = tiny
    arrays = state_tracking.encode_examples(state_tracking.build_examples(fixture_dialogues, small_onto), tok, block_size=16)
    batch = next(state_tracking.dst_batches(arrays, 4))
    p = {"gpt2": params, "head": head}
    key = jax.random.key(0, impl="rbg")  # the trainer's dropout keys (raw rbg key data)
    (loss, aux), grads = jax.jit(jax.value_and_grad(state_tracking.make_loss_fn(cfg), has_aux=True))(p, batch, key)
    assert np.isfinite(float(loss)) and aux["logits"].shape == (4,)
    assert set(grads) == {"gpt2", "head"} and float(jnp.abs(grads["head"]["kernel"]).sum()) > 0
    det, det_aux = jax.jit(state_tracking.make_loss_fn(cfg, dropout=False))(p, batch, key)
    want = LOGITS(params, head, batch["input_ids"], batch["attention_mask"], cfg)
    np.testing.assert_allclose(np.asarray(det_aux["logits"]), np.asarray(want), atol=1e-5)
    assert float(det) == pytest.approx(float(state_tracking.dst_loss(want, batch["labels"], batch["weights"])), rel=1e-5)
    assert float(loss) != pytest.approx(float(det), rel=1e-6)  # GPT-2's dropout is on in training


# ------------------------------------------------------------------------------------------------ metrics
def test_binary_metrics_hand_calculation():
    labels = [1, 1, 0, 0, 1, 0]
    probs = [0.9, 0.4, 0.6, 0.1, 0.5, 0.7]  # 0.5 counts as positive (sigmoid >= 0.5)
    m = state_tracking.binary_metrics(probs, labels)
    # predictions 1,0,1,0,1,1: tp = 2, fn = 1, fp = 2, tn = 1
    assert m["confusion_matrix"] == [[1, 2], [1, 2]]
    assert m["accuracy"] == pytest.approx(3 / 6)
    assert m["f1"] == pytest.approx(2 * 2 / (2 * 2 + 2 + 1))  # 4/7
    assert m["f1_macro"] == pytest.approx((4 / 7 + 2 * 1 / (2 * 1 + 1 + 2)) / 2)  # (4/7 + 2/5) / 2
    assert m["precision"] == pytest.approx(2 / 4) and m["recall"] == pytest.approx(2 / 3)
    logits = np.log(np.array(probs) / (1 - np.array(probs)))
    assert state_tracking.binary_metrics(logits, labels, from_logits=True)["confusion_matrix"] == [[1, 2], [1, 2]]
    # no predicted positive: binary F1 is 0 (sklearn's zero_division), macro over the classes present
    z = state_tracking.binary_metrics([0.1, 0.2, 0.3], [1, 0, 0])
    assert z["f1"] == 0.0 and z["f1_macro"] == pytest.approx((0.0 + 2 * 2 / (2 * 2 + 1)) / 2)


# ------------------------------------------------------------------------------------------------ joint goal
def test_jga_dontcare_field_case():
    gold = {"hotel-area": "dontcare", "hotel-stars": "4"}
    assert not state_tracking.beliefs_equal(gold, {"hotel-stars": "4"})  # dontcare is a value to predict, not dropped
    assert state_tracking.beliefs_equal(gold, {"hotel-area": "dontcare", "hotel-stars": "4"})
    res = state_tracking.joint_goal_accuracy([gold, gold], [{"hotel-stars": "4"}, {"hotel-area": "dontcare", "hotel-stars": "4"}])
    assert res["correct"] == [False, True] and res["jga"] == 0.5
    # the same normalisation on both sides
    assert state_tracking.beliefs_equal({"hotel-area": "center"}, {"hotel-area": "centre"})
    assert state_tracking.beliefs_equal({"hotel-area": "do n't care"}, {"hotel-area": "dontcare"})
    assert state_tracking.beliefs_equal({"hotel-type": "guesthouse", "hotel-name": "none"}, {"hotel-type": "guest house"})
    assert not state_tracking.beliefs_equal({"hotel-area": "north"}, {"hotel-area": "centre"})
    assert not state_tracking.beliefs_equal({"hotel-area": "north"}, {"hotel-area": "north", "hotel-stars": "4"})


def test_jga_candidates_and_cost_by_hand(fixture_dialogues, small_onto):
    a, b = fixture_dialogues
    ca = state_tracking.jga_candidates(a, small_onto)
    # hotel: pricerange 3 (dontcare in the ontology), type 2+dontcare, parking 3, area 2+1, stars 2+1,
    # book day 2+1, book people 2+1 = 21
    assert len(ca) == 21 and ("hotel-type", "guest house") in ca and ("hotel-area", "dontcare") in ca
    cb = state_tracking.jga_candidates(b, small_onto)  # restaurant: pricerange 2+1, food 2, area 2+1; taxi-leaveat 2+1
    assert len(cb) == 11 and ("taxi-leaveat", "05:00") not in cb
    cost = state_tracking.jga_cost(fixture_dialogues, small_onto)
    # 2 turns × 21 + 3 turns × 11; B's last turn needs "moderate", which this ontology lacks
    assert cost["n_pairs"] == 75 and cost["n_turns"] == 5 and cost["pairs_per_turn_max"] == 21
    assert cost["oracle_jga"] == pytest.approx(4 / 5)


def test_predict_beliefs_accumulates_turn_decisions(fixture_dialogues, small_onto):
    a = fixture_dialogues[0]
    cands = state_tracking.jga_candidates(a, small_onto)
    probs = np.zeros((2, len(cands)), np.float32)
    idx = {c: i for i, c in enumerate(cands)}
    for sv in [("hotel-area", "centre"), ("hotel-parking", "dontcare"), ("hotel-pricerange", "cheap"),
               ("hotel-type", "guest house")]:
        probs[0, idx[sv]] = 0.9
    probs[0, idx[("hotel-area", "north")]] = 0.6  # lower than centre: centre wins
    probs[1, idx[("hotel-stars", "4")]] = 0.8
    probs[1, idx[("hotel-book day", "tuesday")]] = 0.7
    probs[1, idx[("hotel-book people", "2")]] = 0.51
    pred = state_tracking.predict_beliefs(a, cands, probs)
    gold = [state_tracking.gold_belief(t) for t in a["dialogue"]]
    assert pred[0] == {"hotel-area": "centre", "hotel-parking": "dontcare", "hotel-pricerange": "cheap",
                       "hotel-type": "guest house"}
    assert state_tracking.joint_goal_accuracy(gold, pred)["correct"] == [True, True]
    probs[1, idx[("hotel-book people", "2")]] = 0.49
    assert state_tracking.joint_goal_accuracy(gold, state_tracking.predict_beliefs(a, cands, probs))["correct"] == [True, False]


def test_score_joint_goal_end_to_end(tiny, fixture_dialogues, small_onto, tok):
    cfg, params, head = tiny
    out = state_tracking.score_joint_goal(params, head, cfg, tok, fixture_dialogues, small_onto, batch_size=8, block_size=16,
                               progress=False)
    assert out["n_turns"] == 5 and out["n_pairs"] == 75 and 0.0 <= out["jga"] <= 1.0
    assert [len(d["correct"]) for d in out["per_dialogue"]] == [2, 3]
    # a head whose bias says "no" to everything predicts empty states: every gold state is non-empty → JGA 0
    no = {"kernel": jnp.zeros_like(head["kernel"]), "bias": jnp.array([-10.0])}
    assert state_tracking.score_joint_goal(params, no, cfg, tok, fixture_dialogues, small_onto, block_size=16,
                                progress=False)["jga"] == 0.0


def test_offline_test_split_jga_cost(test_split, full_onto, tok):
    cost = state_tracking.jga_cost(test_split.dialogues, full_onto)
    assert cost["n_turns"] == 7368 and cost["n_pairs"] == 4_713_028
    assert (cost["pairs_per_turn_min"], cost["pairs_per_turn_max"]) == (145, 1292)
    assert cost["oracle_jga"] == pytest.approx(0.98195, abs=1e-5)
    # the fast pair encoding (context once + suffix per pair) equals encoding each whole text
    cache = {}
    for d in test_split.dialogues[:5]:
        cands = state_tracking.jga_candidates(d, full_onto)[::37]
        for t in d["dialogue"][:3]:
            fast = state_tracking._encode_turn_pairs(tok, t, cands, cache)
            assert fast == tok.encode_batch([state_tracking.example_text(t, s, v) for s, v in cands])
