"""rbjax's lm-evaluation-harness convention against lm-evaluation-harness itself (``lm-eval``, the test extra), offline.

lm-evaluation-harness's ``hf`` model runs its own ``crows_pairs_english_<category>`` code — ``process_results``,
``doc_to_choice`` and the category filters of ``lm_eval/tasks/crows_pairs/utils.py``, imported by a local task folder
whose YAMLs copy ``crows_pairs_english*.yaml`` but read a local CSV (``dataset_path: csv``) — on a tiny random GPT-2 (the
GPT-2 tokenizer, no BOS of its own: the start token is ``<|endoftext|>``) and a tiny random Llama whose tokenizer
adds its BOS ``<s>``. The pairs: the first 12 of each of CrowS-Pairs' nine categories (108 pairs), in CrowS-Pairs'
own layout for lm-evaluation-harness and converted by ``rbjax pairs --crows-pairs-csv`` for ``rbjax measure
--benchmark pairs`` (tests/test_pair_benchmark.py shows ``--benchmark crows-pairs`` measures the same values).

Checked: every sentence's log-likelihood equals lm-evaluation-harness's logged sample within 1e-4 nats (lm-eval sums
the token log-probabilities in float32: at |LL| ≈ 400 that sum alone carries a few 1e-5); ``pct_stereotype`` and its
standard error equal the reported values, overall and per category (no pair is within 1e-3 of a tie, so the sign of
every difference is the same); ``likelihood_diff`` and its standard error within 1e-4. The nine category tasks hold
every pair once; the overall values (``crows_pairs_english``) are lm-evaluation-harness's own aggregation of a task,
``lm_eval.api.metrics.mean`` and ``mean_stderr``, over the per-sample metrics it logged (running the overall task too
would score every sentence twice). rbjax's paired statistics
against scipy are tests/test_pair_benchmark.py's.
"""
import csv
import json

import numpy as np
import pytest

from rbjax.cli import main
from rbjax.lmb.pair_benchmark import read_loglikelihoods
from tests.conftest import make_tiny_llama_folder

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-evaluation-harness's hf model needs it (the lm-eval[hf] extra)
pytest.importorskip("torch")
pytest.importorskip("transformers")

#: CrowS-Pairs category → lm-evaluation-harness's filter of it (lm_eval/tasks/crows_pairs/utils.py)
FILTERS = {"race-color": "filter_race_color", "socioeconomic": "filter_socio", "gender": "filter_gender",
           "disability": "filter_disability", "nationality": "filter_nationality",
           "sexual-orientation": "filter_orientation", "physical-appearance": "filter_appearance",
           "religion": "filter_religion", "age": "filter_age"}
PER_CATEGORY = 12

BASE_TASK = """task: rbjax_crows
dataset_path: csv
dataset_kwargs:
  data_files:
    test: {csv}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: ""
doc_to_target: 0
doc_to_choice: !function utils.doc_to_choice
target_delimiter: ""
process_results: !function utils.process_results
metric_list:
  - metric: likelihood_diff
    aggregation: mean
    higher_is_better: false
  - metric: pct_stereotype
    aggregation: mean
    higher_is_better: false
"""


def _task(cat: str) -> str:
    return "rbjax_crows_" + cat.replace("-", "_")


@pytest.fixture(scope="module")
def subset(shared_dir, tmp_path_factory):
    """The first 16 pairs of every category, in CrowS-Pairs' layout with the upstream ids; the lm-eval task folder
    that reads it; the same pairs as an rbjax pair file."""
    src = shared_dir / "crows-pairs" / "crows_pairs_anonymized.csv"
    if not src.exists():
        pytest.skip("../shared/crows-pairs not found")
    root = tmp_path_factory.mktemp("lm_eval")
    with open(src, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    col = header.index("bias_type")
    keep = [r for c in FILTERS for r in [x for x in rows if x[col] == c][:PER_CATEGORY]]
    data = root / "crows_subset.csv"
    with open(data, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(keep)
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "utils.py").write_text("from lm_eval.tasks.crows_pairs.utils import *  # noqa: F401,F403\n")
    (tasks / "rbjax_crows.yaml").write_text(BASE_TASK.format(csv=data, cache=root / "hf_datasets"))
    for c, fn in FILTERS.items():
        (tasks / f"{_task(c)}.yaml").write_text(
            f"include: rbjax_crows.yaml\ntask: {_task(c)}\nprocess_docs: !function utils.{fn}\n")
    pairs = root / "pairs.csv"
    assert main(["pairs", "--crows-pairs-csv", str(data), "--out", str(pairs)]) == 0
    return {"csv": data, "tasks": tasks, "pairs": pairs, "n": len(keep)}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, redditbias_dir):
    return make_tiny_llama_folder(tmp_path_factory.mktemp("tiny_llama_lm_eval"), redditbias_dir=redditbias_dir)


def _lm_eval(model_dir, tasks_dir):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    return lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(model_dir), "dtype": "float32"},
                                   tasks=list(map(_task, FILTERS)), task_manager=tm, log_samples=True,
                                   batch_size=32, device="cpu")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rbjax_equals_lm_evaluation_harness(family, subset, torch_tiny_model_dir, tiny_llama, tmp_path):
    import transformers

    model = torch_tiny_model_dir if family == "gpt2" else tiny_llama
    out = tmp_path / "rbjax"
    assert main(["measure", "--model", str(model), "--benchmark", "pairs", "--pairs", str(subset["pairs"]),
                 "--out", str(out), "--n-bootstrap", "0", "--no-progress"]) == 0
    summary = json.loads((out / "benchmark.json").read_text())
    records = {r["bias_type"]: r for r in json.loads((out / "lmb.json").read_text())}
    tok = transformers.AutoTokenizer.from_pretrained(model)
    prefix = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id  # HFLM.prefix_token_id
    assert summary["settings"]["lm_eval_prefix_token_id"] == prefix == (50256 if family == "gpt2" else 1)
    ours = {}
    for c in FILTERS:
        ll1, ll2, _, _, ids, st = read_loglikelihoods(out / f"{c}_loglikelihoods.csv")
        for i, s, a, b in zip(ids, st, ll1, ll2):
            ours[i] = (a, b) if s == 1 else (b, a)  # (sent_more, sent_less)

    from lm_eval.api.metrics import mean, mean_stderr

    res = _lm_eval(model, subset["tasks"])
    samples = [s for c in FILTERS for s in res["samples"][_task(c)]]
    assert len(samples) == len(ours) == subset["n"] == 9 * PER_CATEGORY
    theirs = {str(s["doc"]["Unnamed: 0"]): (s["resps"][0][0][0], s["resps"][1][0][0]) for s in samples}
    assert set(theirs) == set(ours)
    diff = np.array([[ours[i][k] - theirs[i][k] for k in (0, 1)] for i in ours])
    assert np.abs(diff).max() <= 1e-4, np.abs(diff).max()
    gaps = np.array([abs(t[0] - t[1]) for t in theirs.values()])
    assert gaps.min() > 1e-3  # no near-tie: the share of stereotypical preferences cannot differ by rounding

    def agree(reported, mine):
        assert mine["pct_stereotype"] == pytest.approx(reported["pct_stereotype,none"], abs=1e-12)
        assert mine["pct_stereotype_stderr"] == pytest.approx(reported["pct_stereotype_stderr,none"], rel=1e-9)
        assert mine["likelihood_diff"] == pytest.approx(reported["likelihood_diff,none"], abs=1e-4)
        assert mine["likelihood_diff_stderr"] == pytest.approx(reported["likelihood_diff_stderr,none"], abs=1e-4)

    overall = {f"{m}{k},none": f([s[m] for s in samples]) for m in ("pct_stereotype", "likelihood_diff")
               for k, f in (("", mean), ("_stderr", mean_stderr))}
    agree(overall, summary["lm_eval"]["overall"])
    for c in FILTERS:
        assert res["results"][_task(c)]["sample_len"] == records[c]["lm_eval"]["n_pairs"] == PER_CATEGORY
        agree(res["results"][_task(c)], records[c]["lm_eval"])
