"""CDA's default data path (no --train-file): the RedditBias training phrases and their swapped copies (paper §4.4)."""
import pytest

from rbjax.data.swap import reference_direction, swap_targets
from rbjax.debias import cda
from rbjax.debias.config import DebiasRun
from rbjax.debias.data import load_training_texts
from rbjax.specs import BIAS_TYPES, UPSTREAM_NAME, load_spec


def _lines(path):
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and not ln.isspace()]


@pytest.mark.parametrize("name", BIAS_TYPES)
def test_default_training_set_is_the_train_file_and_its_swaps(redditbias_dir, name):
    up = UPSTREAM_NAME[name]
    fname = f"{up}_bias_manual_lowercase_train.txt" if name == "religion2" else f"{up}_bias_manual_train.txt"
    raw = _lines(redditbias_dir / "text_files" / up / fname)
    # the queerness file prefixes every line with a literal "<bos> ": removed, as in the released swapped file
    orig = [ln[len("<bos> "):] if ln.startswith("<bos> ") else ln for ln in raw]
    assert (name == "queerness") == all(ln.startswith("<bos> ") for ln in raw)
    spec = load_spec(name)
    got = cda.augmented_training_set(name, redditbias_dir)
    assert got[:len(orig)] == orig and len(got) == 2 * len(orig)
    direction = reference_direction(spec)
    assert direction == ("both" if name in ("religion1", "religion2", "race") else "t1_to_t2")
    assert got[len(orig):] == [swap_targets(s, spec, "paper", direction) for s in orig]
    changed = sum(a != b for a, b in zip(orig, got[len(orig):]))
    assert changed > 0.9 * len(orig)  # nearly every training phrase names a target term


@pytest.mark.parametrize("semantics", ["paper", "reference"])
def test_trainer_loads_the_cda_set_without_a_train_file(redditbias_dir, tmp_path, semantics):
    cfg = DebiasRun.from_flat(method="cda", bias_type="religion1", data_dir=str(redditbias_dir), out_dir=str(tmp_path),
                      semantics=semantics, train_file=None)
    texts, info = load_training_texts(cfg)
    assert texts == cda.augmented_training_set("religion1", redditbias_dir, mode=semantics)
    assert info["files"] == [str(redditbias_dir / "text_files/religion1/religion1_bias_manual_train.txt")]
    assert info["n_original"] * 2 == len(texts) == info["n_lines"]
    released = _lines(redditbias_dir / "text_files/religion1/religion1_bias_manual_swapped_targets_train.txt")
    if semantics == "reference":  # the official substring rules rebuild the released CDA file line for line
        assert texts == released and info["released_cross_check"]["agreement"] == 1.0
    else:
        cc = info["released_cross_check"]
        assert cc["n_released"] == len(released) and 0.9 < cc["agreement"] < 1.0
        assert cc["n_identical"] == sum(a == b for a, b in zip(texts, released))
