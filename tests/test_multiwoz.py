"""MultiWOZ 2.0 → TRADE turns (rbjax.dialog.multiwoz): normalisation, belief states, turn labels, filters, layouts,
the default download, and the stable counts of the offline test split."""
import copy
import json
import zipfile

import pytest

from rbjax.dialog import multiwoz as mw

# ------------------------------------------------------------------------------------------------ fixture data
_BLANK = {
    "taxi": {"book": {"booked": []}, "semi": {"leaveAt": "", "destination": "", "departure": "", "arriveBy": ""}},
    "police": {"book": {"booked": []}, "semi": {}},
    "restaurant": {"book": {"booked": [], "time": "", "day": "", "people": ""},
                   "semi": {"food": "", "pricerange": "", "name": "", "area": ""}},
    "hospital": {"book": {"booked": []}, "semi": {"department": ""}},
    "hotel": {"book": {"booked": [], "stay": "", "day": "", "people": ""},
              "semi": {"name": "", "area": "", "parking": "", "pricerange": "", "stars": "", "internet": "",
                       "type": ""}},
    "attraction": {"book": {"booked": []}, "semi": {"type": "", "name": "", "area": ""}},
    "train": {"book": {"booked": [], "people": ""},
              "semi": {"leaveAt": "", "destination": "", "day": "", "arriveBy": "", "departure": ""}},
}


def meta(**parts):
    """A full 2.0 belief state (domain and slot order as in the data); ``hotel_semi={"area": "centre"}`` fills."""
    m = copy.deepcopy(_BLANK)
    for k, v in parts.items():
        dom, part = k.split("_")
        m[dom][part].update(v)
    return m


def _goal(*domains):
    g = {d: {} for d in ("taxi", "police", "hospital", "hotel", "attraction", "train")}
    g.update({"message": ["..."], "restaurant": {}})
    for d in domains:
        g[d] = {"info": {"x": "y"}}
    return g


HOTEL_SEMI_1 = {"name": "not mentioned", "area": "centre", "parking": "dont care", "pricerange": "cheap",
                "stars": "not mentioned", "internet": "not mentioned", "type": "guesthouse"}
ACTS_A = {"1": {"Hotel-Request": [["Stars", "?"]], "Hotel-Inform": [["Choice", "2"]]},
          "2": {"Booking-Book": [["Ref", "ABC 12 34"]]}}
ACTS_B = {"1": {"Restaurant-Request": [["Area", "?"]]}, "2": "No Annotation", "3": {}}


def dialogue_a():
    """Hotel: 'dont care' → dontcare, booking slots (sorted), 'two' → 2, a changed state."""
    return {"goal": _goal("hotel"), "log": [
        {"text": "I'm looking for a cheap guesthouse in the centre; parking doesn't matter.", "metadata": {}},
        {"text": "Sure, there are 2 options. How many stars?", "metadata": meta(hotel_semi=HOTEL_SEMI_1),
         "dialog_act": ACTS_A["1"]},
        {"text": "Four stars please, for two people on Tuesday.", "metadata": {}},
        {"text": "It's booked. Your reference is ABC 12 34.",
         "metadata": meta(hotel_book={"day": "Tuesday", "people": "two"}, hotel_semi={**HOTEL_SEMI_1, "stars": "4"}),
         "dialog_act": ACTS_A["2"]},
    ]}


def dialogue_b():
    """Restaurant then taxi: "don't care" → dontcare, a value that changes (turn_label holds changed values)."""
    r1 = {"food": "don't care", "pricerange": "expensive", "name": "not mentioned", "area": "not mentioned"}
    taxi = {"leaveAt": "17:15", "destination": "not mentioned", "departure": "not mentioned",
            "arriveBy": "not mentioned"}
    return {"goal": _goal("restaurant", "taxi"), "log": [
        {"text": "Find me an expensive restaurant, I don't care about the food.", "metadata": {}},
        {"text": "What area would you like?", "metadata": meta(restaurant_semi=r1), "dialog_act": ACTS_B["1"]},
        {"text": "The centre. I also need a taxi at 17:15 please.", "metadata": {}},
        {"text": "Done. Anything else?", "metadata": meta(restaurant_semi={**r1, "area": "centre"}, taxi_semi=taxi),
         "dialog_act": {}},
        {"text": "Actually make it a moderately priced one.", "metadata": {}},
        {"text": "Okay, moderate it is!",
         "metadata": meta(restaurant_semi={**r1, "area": "centre", "pricerange": "moderate"}, taxi_semi=taxi),
         "dialog_act": {}},
    ]}


def filtered_dialogues():
    """One dialogue per TRADE filter, plus one whose only non-ASCII character the normalisation removes."""
    m = meta(attraction_semi={"area": "west"})
    ok = {"text": "Thanks.", "metadata": {}}
    sys_ = {"text": "You are welcome.", "metadata": m}
    return {
        "SNG0003": {"goal": _goal("attraction"), "log": [ok, sys_, ok]},  # odd number of log entries
        # 50 raw words, but normalisation splits off the final "." → 51 words
        "SNG0004": {"goal": _goal("attraction"), "log": [{"text": "a " * 49 + "b.", "metadata": {}}, sys_]},
        "SNG0005": {"goal": _goal("attraction"), "log": [{"text": "A café please.", "metadata": {}}, sys_]},
        # a curly apostrophe becomes "'" and then disappears: ASCII after normalisation → kept (TRADE checks the
        # normalised text)
        "SNG0006": {"goal": _goal("attraction"), "log": [{"text": "There\u2019s a museum?", "metadata": {}}, sys_]},
    }


EXPECTED_A = [
    {"system_transcript": "", "turn_idx": 0,
     "transcript": "i am looking for a cheap guesthouse in the centre , parking does not matter .",
     "turn_label": [["hotel-area", "centre"], ["hotel-parking", "dontcare"], ["hotel-pricerange", "cheap"],
                    ["hotel-type", "guesthouse"]],
     "belief": [["hotel-area", "centre"], ["hotel-parking", "dontcare"], ["hotel-pricerange", "cheap"],
                ["hotel-type", "guesthouse"]],
     "system_acts": [], "domain": "hotel"},
    {"system_transcript": "sure , there are 2 options . how many stars ?", "turn_idx": 1,
     "transcript": "4 stars please , for 2 people on tuesday .",
     "turn_label": [["hotel-book day", "tuesday"], ["hotel-book people", "2"], ["hotel-stars", "4"]],
     "belief": [["hotel-book day", "tuesday"], ["hotel-book people", "2"], ["hotel-area", "centre"],
                ["hotel-parking", "dontcare"], ["hotel-pricerange", "cheap"], ["hotel-stars", "4"],
                ["hotel-type", "guesthouse"]],
     "system_acts": ["stars", ["choice", "2"]], "domain": "hotel"},
]
EXPECTED_B = [
    {"system_transcript": "", "turn_idx": 0,
     "transcript": "find me an expensive restaurant , i do not care about the food .",
     "turn_label": [["restaurant-food", "dontcare"], ["restaurant-pricerange", "expensive"]],
     "belief": [["restaurant-food", "dontcare"], ["restaurant-pricerange", "expensive"]],
     "system_acts": [], "domain": "restaurant"},
    {"system_transcript": "what area would you like ?", "turn_idx": 1,
     "transcript": "the centre . i also need a taxi at 17:15 please .",
     "turn_label": [["taxi-leaveat", "17:15"], ["restaurant-area", "centre"]],
     "belief": [["taxi-leaveat", "17:15"], ["restaurant-food", "dontcare"], ["restaurant-pricerange", "expensive"],
                ["restaurant-area", "centre"]],
     "system_acts": ["area"], "domain": "taxi"},
    {"system_transcript": "done . anything else ?", "turn_idx": 2,
     "transcript": "actually make it a moderate -ly priced 1 .",
     "turn_label": [["restaurant-pricerange", "moderate"]],
     "belief": [["taxi-leaveat", "17:15"], ["restaurant-food", "dontcare"], ["restaurant-pricerange", "moderate"],
                ["restaurant-area", "centre"]],
     "system_acts": [], "domain": "restaurant"},
]


@pytest.fixture(scope="module")
def mwoz_shared(shared_dir):
    return shared_dir / "dialog-data" / "multiwoz"


@pytest.fixture(scope="module")
def mapping_path(mwoz_shared):
    return mwoz_shared / "budzianowski-multiwoz" / "utils" / "mapping.pair"


@pytest.fixture(scope="module")
def normalizer(mapping_path):
    return mw.Normalizer(mw.load_mapping_pairs(mapping_path))


def _check_turns(dialogue, expected):
    assert len(dialogue["dialogue"]) == len(expected)
    for got, want in zip(dialogue["dialogue"], expected):
        assert got["system_transcript"] == want["system_transcript"]
        assert got["transcript"] == want["transcript"]
        assert got["turn_idx"] == want["turn_idx"]
        assert got["turn_label"] == want["turn_label"]
        assert got["belief_state"] == [{"slots": [sv], "act": "inform"} for sv in want["belief"]]
        assert got["system_acts"] == want["system_acts"]
        assert got["domain"] == want["domain"]


# ------------------------------------------------------------------------------------------------ normalisation
def test_mapping_pair_file(mapping_path, tmp_path):
    pairs = mw.load_mapping_pairs(mapping_path)
    assert len(pairs) == 83 and pairs[0] == ("it's", "it is") and ("pricerange", "price range") in pairs
    bad = tmp_path / "mapping.pair"
    bad.write_text("i'm\ti am\nno tab here\n")
    with pytest.raises(ValueError, match=r"mapping.pair line 2"):
        mw.load_mapping_pairs(bad)


@pytest.mark.parametrize("raw, want", [
    ("I'm looking for a B&B.", "i am looking for a bed and breakfast ."),
    ("It's booked. Your reference is ABC 12 34.", "it s booked . your reference is abc 1234 ."),
    ("Price 3.50, leave at 17:15/18:00 (north-east).", "price 3.50 , leave at 17:15 and 18:00 north east ."),
    ("Two restaurants; cheaper ones?", "2 restaurant -s , cheap -er ones ?"),
    ("restaurant two two", "restaurant 2 two"),  # one pass: " two " pairs share their space
    ("  \u2018Quoted\u2019 word  ", "quoted word"),
])
def test_normalizer_hand_cases(normalizer, raw, want):
    assert normalizer(raw) == want


def test_normalizer_is_not_idempotent_which_is_why_values_get_one_pass(normalizer):
    once = normalizer("restaurant two two")
    assert once == "restaurant 2 two" and normalizer(once) == "restaurant 22"


# ------------------------------------------------------------------------------------------------ construction
def test_fixture_turns_exact(normalizer):
    raw = {"SNG0001": dialogue_a(), "MUL0002": dialogue_b()}
    before = copy.deepcopy(raw)
    dials, dropped = mw.build_trade_dialogues(raw, normalizer)
    assert raw == before  # input untouched
    assert dropped == {}
    assert [d["dialogue_idx"] for d in dials] == ["SNG0001", "MUL0002"]
    assert dials[0]["domains"] == ["hotel"] and dials[1]["domains"] == ["taxi", "restaurant"]  # goal order
    _check_turns(dials[0], EXPECTED_A)
    _check_turns(dials[1], EXPECTED_B)


def test_dialogue_acts_file_gives_the_same_system_acts(normalizer):
    inline = {"SNG0001": dialogue_a(), "MUL0002": dialogue_b()}
    plain = copy.deepcopy(inline)
    for d in plain.values():
        for t in d["log"]:
            t.pop("dialog_act", None)
    acts = {"SNG0001": ACTS_A, "MUL0002": ACTS_B}
    a, _ = mw.build_trade_dialogues(inline, normalizer)
    b, _ = mw.build_trade_dialogues(plain, normalizer, dialogue_acts=acts)
    assert a == b
    c, _ = mw.build_trade_dialogues(plain, normalizer)  # no acts anywhere: empty lists, all else equal
    assert [t["system_acts"] for t in c[0]["dialogue"]] == [[], []]


def test_filters(normalizer):
    raw = {"SNG0001": dialogue_a(), **filtered_dialogues()}
    dials, dropped = mw.build_trade_dialogues(raw, normalizer)
    assert [d["dialogue_idx"] for d in dials] == ["SNG0001", "SNG0006"]
    assert set(dropped) == {"SNG0003", "SNG0004", "SNG0005"}
    assert "odd number" in dropped["SNG0003"]
    assert "51 words" in dropped["SNG0004"]
    assert "non-ASCII" in dropped["SNG0005"]
    assert dials[1]["dialogue"][0]["transcript"] == "there s a museum ?"


def test_malformed_records_are_named(normalizer):
    d = dialogue_a()
    del d["log"][1]["metadata"]["hotel"]
    with pytest.raises(ValueError, match=r"dialogue X, log entry 1: metadata lacks domain 'hotel'"):
        mw.build_trade_dialogues({"X": d}, normalizer)
    d = dialogue_a()
    d["log"][3]["metadata"]["hotel"]["semi"]["area"] = ["centre"]
    with pytest.raises(ValueError, match=r"dialogue Y, log entry 3: hotel slot 'area'"):
        mw.build_trade_dialogues({"Y": d}, normalizer)


# ------------------------------------------------------------------------------------------------ layouts
def _write_layouts(tmp_path, normalizer):
    """The same dialogues as an official folder and zip, a ConvLab split zip and a TRADE file."""
    test_ids, val_ids = ["SNG0001", "MUL0002"], ["SNG0003"]
    recs = {"SNG0001": dialogue_a(), "MUL0002": dialogue_b(), **filtered_dialogues()}
    train_ids = [k for k in recs if k not in test_ids + val_ids]
    official = {}
    for k, d in recs.items():
        d = copy.deepcopy(d)
        for t in d["log"]:
            t.pop("dialog_act", None)
        official[k + ".json"] = d
    acts = {"SNG0001": ACTS_A, "MUL0002": ACTS_B}
    folder = tmp_path / "official"
    folder.mkdir()
    (folder / "data.json").write_text(json.dumps(official))
    (folder / "testListFile.json").write_text("".join(i + ".json\n" for i in test_ids))
    (folder / "valListFile.json").write_text("".join(i + ".json\n" for i in val_ids))
    (folder / "dialogue_acts.json").write_text(json.dumps(acts))
    z = tmp_path / "MultiWOZ_2.0.zip"
    with zipfile.ZipFile(z, "w") as f:
        for name in ("data.json", "testListFile.json", "valListFile.json", "dialogue_acts.json"):
            f.write(folder / name, f"MULTIWOZ2 2/{name}")
            f.writestr(f"__MACOSX/MULTIWOZ2 2/._{name}", b"\x00\x05junk")
    convlab = tmp_path / "convlab"
    convlab.mkdir()
    for split, ids in (("test", test_ids), ("val", val_ids), ("train", train_ids)):
        with zipfile.ZipFile(convlab / f"{split}.json.zip", "w") as f:
            f.writestr(f"{split}.json", json.dumps({i: recs[i] for i in ids}))
    dials, _ = mw.build_trade_dialogues({i: recs[i] for i in test_ids}, normalizer)
    trade = tmp_path / "trade"
    trade.mkdir()
    (trade / "test_dials.json").write_text(json.dumps(dials))
    return folder, z, convlab, trade


def _strip_ids(dials):
    return [{**d, "dialogue_idx": d["dialogue_idx"].removesuffix(".json")} for d in dials]


def test_three_layouts_give_the_same_turns(tmp_path, normalizer, mapping_path):
    folder, z, convlab, trade = _write_layouts(tmp_path, normalizer)
    got = {
        "official folder": mw.load_multiwoz(folder, "test", mapping=mapping_path),
        "official data.json": mw.load_multiwoz(folder / "data.json", "test", mapping=mapping_path),
        "official zip": mw.load_multiwoz(z, "test", mapping=mapping_path),
        "convlab folder": mw.load_multiwoz(convlab, "test", mapping=mapping_path),
        "convlab zip": mw.load_multiwoz(convlab / "test.json.zip", "test", mapping=mapping_path),
        "trade folder": mw.load_multiwoz(trade, "test", mapping=mapping_path),
        "trade file": mw.load_multiwoz(trade / "test_dials.json", "test", mapping=mapping_path),
    }
    ref = _strip_ids(got["convlab zip"].dialogues)
    _check_turns(ref[0], EXPECTED_A)
    _check_turns(ref[1], EXPECTED_B)
    for name, s in got.items():
        assert _strip_ids(s.dialogues) == ref, name
        assert s.layout == name.split()[0]
    assert got["official zip"].dialogues[0]["dialogue_idx"] == "SNG0001.json"  # ids kept as the source has them
    # the official train split = every dialogue in neither list, filtered
    train = mw.load_multiwoz(z, "train", mapping=mapping_path)
    assert [d["dialogue_idx"] for d in train.dialogues] == ["SNG0006.json"]
    assert set(train.dropped) == {"SNG0004.json", "SNG0005.json"} and train.n_source_dialogues == 3
    val = mw.load_multiwoz(convlab, "dev", mapping=mapping_path)
    assert val.split == "val" and val.dialogues == [] and set(val.dropped) == {"SNG0003"}
    d = got["convlab zip"].describe()
    assert d["n_dialogues"] == 2 and d["n_turns"] == 5 and d["stand_in_for"] is None
    assert [f["path"].rsplit("/", 1)[-1] for f in d["files"]] == ["test.json.zip", "mapping.pair"]


def test_a_split_read_again_is_its_files_current_content_and_the_callers_own(tmp_path, normalizer, mapping_path):
    """load_multiwoz keeps the splits it parsed in memory: a second load of unchanged files is equal, a changed file
    (same path) is parsed again, a sidecar list file beside data.json counts, and changing a returned split changes
    no later load."""
    folder, z, convlab, trade = _write_layouts(tmp_path, normalizer)
    f = trade / "test_dials.json"
    first = mw.load_multiwoz(f, "test", mapping=mapping_path)
    first.dialogues[0]["dialogue"].clear()
    first.stand_in_for = "train"
    again = mw.load_multiwoz(f, "test", mapping=mapping_path)
    assert again.stand_in_for is None and len(again.dialogues) == 2 and again.dialogues[0]["dialogue"]
    assert again.files == mw.load_multiwoz(f, "test", mapping=mapping_path).files
    f.write_text(json.dumps(again.dialogues[:1]))  # the same path, other content
    changed = mw.load_multiwoz(f, "test", mapping=mapping_path)
    assert len(changed.dialogues) == 1 and changed.files[0][1] != again.files[0][1]
    assert len(mw.load_multiwoz(folder, "test", mapping=mapping_path).dialogues) == 2
    (folder / "testListFile.json").write_text("SNG0001.json\n")  # the official list beside data.json
    assert [d["dialogue_idx"] for d in mw.load_multiwoz(folder, "test", mapping=mapping_path).dialogues] == [
        "SNG0001.json"]


def test_a_parsed_split_is_a_keyed_result_in_the_cache_folder(tmp_path, normalizer, mapping_path, monkeypatch):
    """A parsed split is kept as a keyed result file in rbjax's cache folder (no state in the process): a second load
    of unchanged files reads it instead of parsing, a changed file is parsed again, and an unreadable or foreign file
    there is ignored and replaced; at most PARSED_MAX files are kept."""
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    folder, z, convlab, trade = _write_layouts(tmp_path, normalizer)
    parses = []
    real_load_file = mw._load_file
    monkeypatch.setattr(mw, "_load_file", lambda p, *a: parses.append(p) or real_load_file(p, *a))
    f = convlab / "test.json.zip"
    first = mw.load_multiwoz(f, "test", mapping=mapping_path)
    (stored,) = (tmp_path / "cache" / mw.PARSED_DIR).glob("*.json")
    rec = json.loads(stored.read_text())
    assert rec["status"] == "done" and rec["key"]["split"] == "test" and rec["key"]["files"] == {str(f): first.files[0][1]}
    again = mw.load_multiwoz(f, "test", mapping=mapping_path)
    assert len(parses) == 1 and again == first  # read from the file, equal to what was parsed

    with zipfile.ZipFile(f, "w") as zf:  # the same path, other content: parsed again, the file rewritten
        zf.writestr("test.json", json.dumps({"SNG0001": dialogue_a()}))
    changed = mw.load_multiwoz(f, "test", mapping=mapping_path)
    assert len(parses) == 2 and len(changed.dialogues) == 1 and changed.files[0][1] != first.files[0][1]
    assert json.loads(stored.read_text())["key"]["files"] == {str(f): changed.files[0][1]}
    assert mw.load_multiwoz(f, "test", mapping=mapping_path) == changed and len(parses) == 2

    stored.write_text("{not json")  # damaged: ignored and rewritten
    assert mw.load_multiwoz(f, "test", mapping=mapping_path) == changed and len(parses) == 3
    foreign = {**json.loads(stored.read_text()), "dialogues": {"SNG0001": "x"}}  # the right key, not a parsed split
    stored.write_text(json.dumps(foreign))
    assert mw.load_multiwoz(f, "test", mapping=mapping_path) == changed and len(parses) == 4
    assert json.loads(stored.read_text())["dialogues"] == changed.dialogues

    monkeypatch.setattr(mw, "PARSED_MAX", 2)
    for src in (trade / "test_dials.json", folder, z):
        mw.load_multiwoz(src, "test", mapping=mapping_path)
    assert len(list((tmp_path / "cache" / mw.PARSED_DIR).glob("*.json"))) == 2 and len(parses) == 7
    mw.load_multiwoz(z, "test", mapping=mapping_path)  # the most recent one is kept
    assert len(parses) == 7


def test_wrong_files_get_clear_errors(tmp_path, normalizer, mapping_path):
    folder, z, convlab, trade = _write_layouts(tmp_path, normalizer)
    with pytest.raises(ValueError, match=r"val\.json\.zip: this file holds the 'val' split, not 'test'"):
        mw.load_multiwoz(convlab / "val.json.zip", "test", mapping=mapping_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no MultiWOZ 2.0 test data found"):
        mw.load_multiwoz(empty, "test", mapping=mapping_path)
    bad = tmp_path / "bad_dials.json"
    bad.write_text(json.dumps([{"dialogue_idx": "a", "dialogue": [{"transcript": "x"}]}]))
    with pytest.raises(ValueError, match=r"bad_dials\.json: dialogue 'a' turn 0 lacks"):
        mw.load_multiwoz(bad, "test", mapping=mapping_path)
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(ValueError, match=r"junk\.json: not valid JSON"):
        mw.load_multiwoz(junk, "test", mapping=mapping_path)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as f:
        f.writestr("readme.txt", "hello")
    with pytest.raises(ValueError, match=r"other\.zip: not a MultiWOZ 2.0 archive"):
        mw.load_multiwoz(other, "test", mapping=mapping_path)
    (folder / "valListFile.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"valListFile\.json: the official split list is missing"):
        mw.load_multiwoz(folder / "data.json", "test", mapping=mapping_path)
    with pytest.raises(ValueError, match="unknown MultiWOZ split"):
        mw.load_multiwoz(convlab, "dev2", mapping=mapping_path)
    with pytest.raises(FileNotFoundError, match="MultiWOZ source not found"):
        mw.load_multiwoz(tmp_path / "nowhere", "test", mapping=mapping_path)


# ------------------------------------------------------------------------------------------------ default download
def test_default_download_verified_and_cached(mwoz_shared, tmp_path, monkeypatch):
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RBJAX_MULTIWOZ_URL", mwoz_shared.as_uri())  # a mirror laid out like shared/: real code path
    monkeypatch.delenv("RBJAX_MULTIWOZ", raising=False)
    for name, (rel, _url, sha, size) in mw.DEFAULT_FILES.items():  # the pinned checksums are the shared files'
        from rbjax.core.io import sha256_file
        assert sha256_file(mwoz_shared / rel) == sha and (mwoz_shared / rel).stat().st_size == size, name
    p = mw.default_file("ontology.json")
    assert p == tmp_path / "cache" / "multiwoz" / "ontology.json" and p.exists()
    onto = mw.load_ontology()
    assert len(onto) == 35 and onto["hotel-price range"] == ["cheap", "do n't care", "moderate", "expensive"]
    with pytest.raises(ValueError, match="train split is not part of the default download"):
        mw.load_multiwoz(None, "train")
    stand_in = mw.load_training_split()
    assert stand_in.split == "val" and stand_in.stand_in_for == "train" and "stands in" in stand_in.describe()["note"]
    assert len(stand_in.dialogues) == 999
    # a corrupt mirror: the checksum fails and nothing reaches the cache
    bad = tmp_path / "mirror" / "budzianowski-multiwoz" / "utils"
    bad.mkdir(parents=True)
    (bad / "mapping.pair").write_text("i'm\ti am\n")
    monkeypatch.setenv("RBJAX_CACHE_DIR", str(tmp_path / "cache2"))
    monkeypatch.setenv("RBJAX_MULTIWOZ_URL", (tmp_path / "mirror").as_uri())
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        mw.default_file("mapping.pair")
    assert not (tmp_path / "cache2" / "multiwoz" / "mapping.pair").exists()
    with pytest.raises(FileNotFoundError, match="downloading is disabled"):
        mw.default_file("test.json.zip", download=False)


# ------------------------------------------------------------------------------------------------ ontology
def test_slot_ontology_names_and_values(mwoz_shared, normalizer):
    onto = mw.SlotOntology(mw.load_ontology(mwoz_shared / "thu-coai-tatk" / "tatk" / "dst" / "sumbt" / "data"),
                           normalizer)
    assert onto.key["hotel-pricerange"] == "hotel-price range" and onto.key["train-leaveat"] == "train-leave at"
    assert onto.key["hotel-book stay"] == "hotel-book stay" and "bus-leaveat" in onto
    assert onto.values["hotel-pricerange"] == ["cheap", "dontcare", "moderate", "expensive"]
    assert onto.values["hotel-type"] == ["hotel", "guest house"]
    assert "christ s college" in onto.values["attraction-name"]  # normalised once, like the gold values
    five = mw.SlotOntology(onto.raw, normalizer, domains=mw.EXPERIMENT_DOMAINS)
    assert len(five.slots) == 30


@pytest.mark.parametrize("slot, a, b", [
    ("hotel-area", "center", "centre"), ("hotel-area", "do n't care", "dontcare"), ("hotel-type", "guesthouse",
                                                                                  "guest house"),
    ("hotel-name", "arbury lodge guesthouse", "arbury lodge guest house"), ("train-leaveat", "1700", "17:00"),
    ("restaurant-book time", "9:15", "09:15"), ("hotel-stars", "4 stars", "4"), ("hotel-internet", "free", "yes"),
    ("hotel-area", "not mentioned", "none"), ("attraction-type", "swimmingpool", "swimming pool"),
])
def test_canonical_value_merges_forms_of_one_value(slot, a, b):
    assert mw.canonical_value(slot, a) == mw.canonical_value(slot, b)


def test_canonical_value_keeps_different_values_apart():
    assert mw.canonical_value("hotel-area", "north") != mw.canonical_value("hotel-area", "centre")
    assert mw.canonical_value("hotel-parking", "free") == "free"  # "free" → "yes" is for internet only
    assert mw.canonical_value("hotel-name", "center") == "center"  # area synonyms only for *-area


# ------------------------------------------------------------------------------------------------ the offline split
@pytest.fixture(scope="module")
def test_split(mwoz_shared, mapping_path):
    return mw.load_multiwoz(mwoz_shared / "ConvLab-ConvLab" / "data" / "multiwoz" / "test.json.zip", "test",
                            mapping=mapping_path)


def test_offline_test_split_counts(test_split):
    # SOURCE.md: the TRADE filters keep 999 of the 1000 test dialogues, 7368 user turns
    assert test_split.layout == "convlab" and test_split.n_source_dialogues == 1000
    assert len(test_split.dialogues) == 999 and test_split.n_turns == 7368
    assert test_split.dropped == {"PMUL1455": "log entry 3 has 57 words (> 50)"}
    turns = [t for d in test_split.dialogues for t in d["dialogue"]]
    assert sum(1 for t in turns if t["turn_label"]) == 4500
    assert sum(len(t["turn_label"]) for t in turns) == 7935  # positive examples
    # every turn_label pair is in the turn's belief state; the first turn's label is its whole state
    for d in test_split.dialogues:
        for i, t in enumerate(d["dialogue"]):
            state = [b["slots"][0] for b in t["belief_state"]]
            assert all(sv in state for sv in t["turn_label"])
            if i == 0:
                assert t["turn_label"] == state and t["system_transcript"] == ""
            else:
                assert t["system_transcript"] != ""
    assert all(t["transcript"].isascii() and len(t["transcript"].split()) <= 50 for t in turns)


def test_offline_val_split_counts(mwoz_shared, mapping_path):
    val = mw.load_multiwoz(mwoz_shared / "ConvLab-ConvLab" / "data" / "multiwoz", "val", mapping=mapping_path)
    # SOURCE.md says 998 of 999; that count checked non-ASCII on the raw text. TRADE checks the normalised text,
    # where PMUL2075's only non-ASCII character (a curly apostrophe in "There ’s") is gone: 999 are kept.
    assert val.n_source_dialogues == 999 and len(val.dialogues) == 999 and val.dropped == {}
    assert val.n_turns == 7365
    assert sum(len(t["turn_label"]) for d in val.dialogues for t in d["dialogue"]) == 8068
