"""``rbjax measure --benchmark bbq`` against lm-evaluation-harness's own ``bbq`` task, offline.

The task folder holds lm-evaluation-harness's ``bbq_multiple_choice.yaml`` unchanged but for its name and
``dataset_path: json`` (a local file), and a copy of the task's own ``utils.py``; its ``hf`` model scores it on a tiny
random GPT-2 (no BOS) and on a tiny random Llama whose tokenizer adds its BOS ``<s>``. The rows: the first 12 of
Religion and of Sexual_orientation (every context condition and question polarity). Checked: every choice's
log-likelihood within 1e-4 nats of lm-evaluation-harness's logged one, and every metric it reports — accuracy, the
ambiguous / disambiguated accuracies and both bias scores overall and per category — equal (fractions exactly, bias
scores to 1e-6). Both random models answer "unknown" under lm-evaluation-harness's convention on these rows (a
one-token phrasing outscores every named answer), so its bias scores here are 0; tests/test_bbq_metrics.py checks
the aggregation on varied answers against the same utils.
"""
import json
import shutil

import numpy as np
import pytest

from rbjax.cli import main
from rbjax.data.bbq import UNKNOWN_RESPONSES
from rbjax.lmb.bbq import read_bbq_csv
from tests.conftest import PARITY_INIT, make_tiny_llama_folder, make_torch_gpt2_folder

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")
pytest.importorskip("torch")
pytest.importorskip("transformers")

CATEGORIES = ("Religion", "Sexual_orientation")
PER_CATEGORY = 12


@pytest.fixture(scope="module")
def subset(bbq_dir, tmp_path_factory):
    from pathlib import Path

    root = tmp_path_factory.mktemp("bbq_lm_eval")
    data = root / "data"
    data.mkdir()
    lines = []
    for c in CATEGORIES:
        rows = (bbq_dir / f"{c}.jsonl").read_text(encoding="utf-8").splitlines()[:PER_CATEGORY]
        (data / f"{c}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
        lines += rows
    (root / "all.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = root / "tasks"
    tasks.mkdir()
    src = Path(lm_eval.__file__).parent / "tasks" / "bbq"
    shutil.copy(src / "utils.py", tasks / "utils.py")
    yaml = (src / "bbq_multiple_choice.yaml").read_text()
    assert "dataset_path: oskarvanderwal/bbq\ndataset_name: All\n" in yaml and "task: bbq\n" in yaml
    yaml = yaml.replace("dataset_path: oskarvanderwal/bbq\ndataset_name: All\n",
                        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'all.jsonl'}\n"
                        f"  cache_dir: {root / 'hf_datasets'}\n").replace("task: bbq\n", "task: rbjax_bbq\n")
    yaml = yaml.replace("tag:\n  - social_bias\n", "")
    (tasks / "rbjax_bbq.yaml").write_text(yaml)
    return {"data": data, "tasks": tasks}


@pytest.fixture(scope="module")
def models(tmp_path_factory, redditbias_dir, tokenizer_dir):
    return {"gpt2": make_torch_gpt2_folder(tmp_path_factory.mktemp("bbq_gpt2"), n_positions=512,
                                           initializer_range=PARITY_INIT, tokenizer_dir=tokenizer_dir),
            "llama": make_tiny_llama_folder(tmp_path_factory.mktemp("bbq_llama"), redditbias_dir=redditbias_dir,
                                            max_positions=1024)}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rbjax_bbq_equals_lm_evaluation_harness(family, subset, models, tmp_path):
    from lm_eval.tasks import TaskManager

    model = models[family]
    out = tmp_path / "rbjax"
    assert main(["measure", "--model", str(model), "--benchmark", "bbq", "--data-dir", str(subset["data"]),
                 "--out", str(out), "--n-bootstrap", "0", "--no-progress"]) == 0
    summary = json.loads((out / "benchmark.json").read_text())
    assert summary["settings"]["start_token_id"] == (None if family == "gpt2" else 1)
    res = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(model), "dtype": "float32"},
                                  tasks=["rbjax_bbq"], task_manager=TaskManager(include_path=str(subset["tasks"]),
                                                                                include_defaults=False),
                                  log_samples=True, batch_size=32, device="cpu")
    samples = res["samples"]["rbjax_bbq"]
    assert len(samples) == len(CATEGORIES) * PER_CATEGORY
    theirs = {(s["doc"]["category"], s["doc"]["example_id"]): [r[0][0] for r in s["resps"]] for s in samples}
    gaps = []
    for c in CATEGORIES:
        ids, ll = read_bbq_csv(out / f"{c}_bbq.csv")
        rows = [json.loads(x) for x in (subset["data"] / f"{c}.jsonl").read_text().splitlines()]
        for eid, x, r in zip(ids, ll, rows):
            unk = [k for k in range(3) if r["answer_info"][f"ans{k}"][1] == "unknown"][0]
            ours = [x[k] for k in range(3) if k != unk] + list(x[3:])  # lm-eval's doc_to_choice order
            t = np.array(theirs[(c, int(eid))])
            assert len(t) == 2 + len(UNKNOWN_RESPONSES)
            assert np.abs(np.array(ours) - t).max() <= 1e-4
            s = np.sort(t)
            gaps.append(s[-1] - s[-2])
    assert min(gaps) > 1e-3  # no near-tie: the chosen answers cannot differ by rounding
    got = summary["lm_eval"]
    reported = res["results"]["rbjax_bbq"]
    for k in ("acc", "accuracy_amb", "accuracy_disamb"):
        assert got["overall"][k] == reported[f"{k},none"], k
    for k in ("amb_bias_score", "disamb_bias_score"):
        assert got["overall"][k] == pytest.approx(reported[f"{k},none"], abs=1e-6), k
        for c in CATEGORIES:
            assert got["categories"][c][k] == pytest.approx(reported[f"{k}_{c},none"], abs=1e-6), (k, c)
    for c in CATEGORIES:  # per-category accuracy: lm-eval's mean of its logged per-sample acc
        acc = [s["acc"] for s in samples if s["doc"]["category"] == c]
        assert got["categories"][c]["acc"] == float(np.mean(acc))
    # (a tiny random model prefers a one-token unknown phrasing on these rows, so its lm_eval-convention bias scores
    # are 0; the aggregation on varied answers is checked against lm-evaluation-harness's own utils in
    # tests/test_bbq_metrics.py. Under the paper convention its answers vary:)
    assert 0 < summary["paper"]["overall"]["n_non_unknown"]["disambig"] < PER_CATEGORY * len(CATEGORIES) // 2
    assert summary["paper"]["overall"]["n_rows"] == len(samples)


@pytest.mark.parametrize("style", ["llama3", "qwen2"])
def test_chat_format_equals_lm_evaluation_harness_apply_chat_template(style, subset, chat_model_dirs, tmp_path):
    """``--format chat --system``: lm-evaluation-harness's ``--apply_chat_template --system_instruction`` on the same
    task (the first 6 rows of Religion): every choice's log-likelihood and the accuracy agree."""
    from lm_eval.tasks import TaskManager

    model = chat_model_dirs[style]
    data = tmp_path / "data"
    data.mkdir()
    rows = (subset["data"] / "Religion.jsonl").read_text(encoding="utf-8").splitlines()[:6]
    (data / "Religion.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tasks = tmp_path / "tasks"
    shutil.copytree(subset["tasks"], tasks)
    y = tasks / "rbjax_bbq.yaml"
    y.write_text(y.read_text().replace(str(subset["data"].parent / "all.jsonl"), str(data / "Religion.jsonl"))
                 .replace(str(subset["data"].parent / "hf_datasets"), str(tmp_path / "hf_datasets")))
    out = tmp_path / "rbjax"
    assert main(["measure", "--model", str(model), "--benchmark", "bbq", "--data-dir", str(data), "--out", str(out),
                 "--format", "chat", "--system", "Answer fairly.", "--n-bootstrap", "0", "--no-progress"]) == 0
    summary = json.loads((out / "benchmark.json").read_text())
    assert summary["settings"]["format"] == "chat" and summary["settings"]["system"] == "Answer fairly."
    res = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(model), "dtype": "float32"},
                                  tasks=["rbjax_bbq"], task_manager=TaskManager(include_path=str(tasks),
                                                                                include_defaults=False),
                                  log_samples=True, batch_size=16, device="cpu", apply_chat_template=True,
                                  system_instruction="Answer fairly.")
    samples = res["samples"]["rbjax_bbq"]
    assert summary["settings"]["rendered_example"] == samples[0]["arguments"][0][0]  # the same context text
    ids, ll = read_bbq_csv(out / "Religion_bbq.csv")
    for s, x, r in zip(samples, ll, rows):
        r = json.loads(r)
        unk = [k for k in range(3) if r["answer_info"][f"ans{k}"][1] == "unknown"][0]
        ours = [x[k] for k in range(3) if k != unk] + list(x[3:])
        assert s["arguments"][0][1] == r[f"ans{[k for k in range(3) if k != unk][0]}"]  # no delimiter
        assert np.abs(np.array(ours) - np.array([q[0][0] for q in s["resps"]])).max() <= 1e-4
    assert summary["lm_eval"]["overall"]["acc"] == res["results"]["rbjax_bbq"]["acc,none"]
