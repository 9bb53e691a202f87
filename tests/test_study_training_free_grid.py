"""The small grids of the methods without training in a study (docs/debiasing.md §10, "A grid in the study"):
``[sweep] methods`` naming SentenceDebias / Self-Debias with ``k`` / ``decay_constant``: one run per value, each
measured on the valid split (dev LMB, LMP), selected by the sweeps' rule, the selected value's run measured by the
test stages; no grid by default; a grid without values (or values without their method) is named."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from rbjax.study.config import load_study
from rbjax.study.run import estimate_cost, plan_study

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


def _study(tmp_path, shared_dir, sweep: str) -> str:
    p = tmp_path / "s.toml"
    p.write_text(f"""
[study]
random_model = {{ n_embd = 32, n_layer = 2, n_head = 2, n_positions = 64, vocab_size = 50257, seed = 0 }}
tokenizer = "{shared_dir / 'tokenizers' / 'gpt2'}"
data_dir = "{shared_dir / 'redditbias'}"
bias_types = ["religion1"]
methods = ["sentence-debias", "self-debias"]
seeds = [42]

[training]
lmp_max_lines = 8

[sweep]
{sweep}

[measure]
n_bootstrap = 0

[dialog]
tasks = []
""")
    return str(p)


@pytest.mark.parametrize("sweep, message", [
    ('methods = ["sentence-debias"]', "sweep.methods has sentence-debias, whose grid is over sweep.k: give its values"),
    ("k = [1, 2]", "sweep.k is the grid of sentence-debias, which sweep.methods does not name"),
    ('methods = ["inlp"]\ninlp_iterations = [0, 2]', "sweep.inlp_iterations must be a non-empty list of distinct "
                                                      "integers >= 1"),
    ('methods = ["self-debias"]\ndecay_constant = [10, 10]', "sweep.decay_constant must be a non-empty list of "
                                                             "distinct finite numbers > 0"),
])
def test_a_grid_without_values_or_values_without_a_grid_are_named(sweep, message, shared_dir, tmp_path):
    with pytest.raises(ValueError, match=message):
        load_study(_study(tmp_path, shared_dir, sweep))


def test_no_grid_by_default_and_the_cost_of_one(shared_dir, tmp_path):
    plain = load_study(_study(tmp_path, shared_dir, ""))
    names = [s.name for s in plan_study(plain, tmp_path / "o")]
    assert "seed42/religion1/sentence-debias/run" in names and not any(n.endswith("/sweep") for n in names)
    grid = load_study(_study(tmp_path, shared_dir, 'methods = ["sentence-debias"]\nk = [1, 2, 3]'))
    # three fits and the selected one's again instead of one (each sentence and its twin: 2 × 720 religion1 lines),
    # and the three models and the start on the valid pairs (2 × 480 phrases each)
    extra = estimate_cost(grid)["phrases_scored"] - estimate_cost(plain)["phrases_scored"]
    assert extra == 3 * 2 * 720 + 4 * 2 * 480


def test_the_grid_stage_is_keyed_on_the_format_its_points_are_measured_in(shared_dir, tmp_path):
    """A Self-Debias grid's points are scored on the valid pairs in the study's format: a study switched to the chat
    format measures them again (its key changes), never reuses the raw-format selection."""
    sweep = 'methods = ["self-debias"]\ndecay_constant = [5.0, 100.0]'
    raw = load_study(_study(tmp_path, shared_dir, sweep))
    chat = load_study(_study(tmp_path, shared_dir, sweep), ['study.format="chat"'])
    assert chat.is_chat and not raw.is_chat
    plans = {c.is_chat: {s.name: s for s in plan_study(c, tmp_path / "o", progress=False)} for c in (raw, chat)}
    plans[False]["model"].run()  # the random model both plans start from (the key holds its digest)
    key = {fmt: plan["seed42/religion1/self-debias/sweep"].key() for fmt, plan in plans.items()}
    assert key[True] != key[False] and key[True]["grid"]["chat"]["format"] == "chat"


def test_a_grid_of_sentence_debias_and_self_debias_is_selected_on_the_valid_split(shared_dir, tmp_path):
    cfg = load_study(_study(tmp_path, shared_dir, 'methods = ["sentence-debias", "self-debias"]\nk = [1, 2]\n'
                                                   'decay_constant = [5.0, 100.0]\ndev_max_pairs = 24\n'
                                                   'n_bootstrap = 0'))
    out = tmp_path / "out"
    stages = {s.name: s for s in plan_study(cfg, out, progress=False)}
    assert "seed42/religion1/sentence-debias/run" not in stages
    stages["model"].run()  # the random model, then only the grids (the test stages measure like any method's)
    for m in ("sentence-debias", "self-debias"):
        assert stages[f"seed42/religion1/{m}/sweep"].run()["n_runs"] == 2

    sd = out / "seed42/religion1/sentence-debias/sweep"
    sel = json.loads((sd / "selection.json").read_text())
    recs = {r["id"]: r for r in sel["records"]}
    assert set(recs) == {"k=1", "k=2"} and sel["training_free"] and sel["baseline"]["lmp"]["perplexity"] > 0
    # the default rule by hand: the smallest |dev t| among the points whose LMP is within 10 % of the start's
    budget = 1.1 * sel["baseline"]["lmp"]["perplexity"]
    within = [r for r in recs.values() if r["lmp"]["perplexity"] <= budget]
    want = min(within, key=lambda r: abs(r["dev"]["t_value"]))["id"] if within else \
        min(recs.values(), key=lambda r: r["lmp"]["perplexity"])["id"]
    assert sel["default"]["id"] == want and sel["default"]["constraint_met"] == bool(within)
    assert sel["reference"]["id"] == max(recs.values(), key=lambda r: r["dev"]["reference"]["p_value"])["id"]
    assert recs["k=1"]["dev"]["t_value"] != recs["k=2"]["dev"]["t_value"]  # each point's own model was scored
    assert all(r["dev"]["n_pairs"] == 24 for r in recs.values())
    with open(sd / "sweep.csv", newline="") as f:
        assert [r["id"] for r in csv.DictReader(f)] == ["k=1", "k=2"]
    # the selected value run again into selected_default: the same subspace as its point's; the test stages read it
    chosen = sel["default"]["point"]["k"]
    np.testing.assert_array_equal(np.load(sd / "selected_default/subspace.npy"),
                                  np.load(sd / f"points/k={chosen}/subspace.npy"))
    assert stages["seed42/religion1/sentence-debias/lmb_test"].key()["model"]  # its model: the selected run's

    # Self-Debias: scored with its rescaling (λ changes dev t and the LMP), selected by the same default rule
    sdb = json.loads((out / "seed42/religion1/self-debias/sweep/selection.json").read_text())
    r = {x["id"]: x for x in sdb["records"]}
    assert set(r) == {"decay_constant=5", "decay_constant=100"}
    assert r["decay_constant=5"]["dev"]["t_value"] != r["decay_constant=100"]["dev"]["t_value"]
    assert r["decay_constant=5"]["lmp"]["perplexity"] != r["decay_constant=100"]["lmp"]["perplexity"]
    sd_budget = 1.1 * sdb["baseline"]["lmp"]["perplexity"]
    sd_within = [x for x in r.values() if x["lmp"]["perplexity"] <= sd_budget]
    sd_want = min(sd_within, key=lambda x: abs(x["dev"]["t_value"]))["id"] if sd_within else \
        min(r.values(), key=lambda x: x["lmp"]["perplexity"])["id"]
    assert sdb["default"]["id"] == sd_want and sdb["default"]["constraint_met"] == bool(sd_within)
    res = json.loads((out / "seed42/religion1/self-debias/sweep/selected_default/results.json").read_text())
    assert res["self_debias"]["decay_constant"] == sdb["default"]["point"]["decay_constant"]
    # the report's selection table names the value each grid selected (the trained grids' columns stay empty)
    from rbjax.study.report import _selections
    data = {"studies": [{"folder": str(out), "config": {"sweep": {"selection": "default"}}}],
            "baseline": {"lmb": [{"bias_type": "religion1"}]},
            "runs": {("sentence-debias", "religion1"): {f"{out.name}:42": {"selection": sel}},
                     ("self-debias", "religion1"): {f"{out.name}:42": {"selection": sdb}}}}
    _, rows, _ = _selections(data)
    assert rows[0][0] == f"SentenceDebias (k = {chosen})" and rows[0][3:7] == ["", "", "", ""]
    assert rows[1][0].startswith("Self-Debias (decay_constant = ")
