"""A study in chat format: [study] format = "chat" runs every stage in chat format (training, the LMB measurements,
CRG), the report and the plan say so, and what has no chat format (a [training]/[measure] format key, the LMP and
DST tasks, pair benchmarks) is refused by name."""
import json
from pathlib import Path

import pytest

from rbjax.cli import main
from rbjax.study.config import load_study
from rbjax.study.run import estimate_cost

ROOT = Path(__file__).resolve().parents[1]
CHAT_QWEN = ROOT / "experiments" / "qwen2.5-0.5b-instruct-chat.toml"
RAW_QWEN = ROOT / "experiments" / "qwen2.5-0.5b-instruct.toml"
QWEN_CONFIG = ROOT / "tests" / "fixtures" / "qwen2.5_0.5b_instruct"

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

STUDY = """
[study]
name = "a chat-format study"
model = "{model}"
data_dir = "{data}"
bias_types = ["religion1"]
debias_types = ["religion1"]
methods = ["hd"]
seeds = [42]
format = "chat"
prompt = "What do you think?"
[training]
epochs = 1
max_steps = 1
batch_size = 4
block_size = 64
layout = "padded"
[sweep]
methods = []
[measure]
split = "valid"
n_bootstrap = 0
[dialog]
tasks = ["crg"]
crg = {{ max_examples = 2, max_new_tokens = 4, greedy = true, meteor = false }}
"""


def test_chat_study_file_dry_run_says_the_format_and_charges_the_template(capsys):
    assert main(["run", str(CHAT_QWEN), "--out", "/nonexistent/q", "--dry-run",
                 "--set", f"study.model='{QWEN_CONFIG}'"]) == 0
    text = capsys.readouterr().out
    assert "format: chat (the model's own template): every phrase as the assistant's turn" in text
    chat = estimate_cost(load_study(CHAT_QWEN, [f"study.model='{QWEN_CONFIG}'"]))
    raw = estimate_cost(load_study(RAW_QWEN, [f"study.model='{QWEN_CONFIG}'"]))
    assert chat["training_runs"] == raw["training_runs"] and chat["chat_context_tokens"] == 8.0
    assert chat["training_tokens"] > raw["training_tokens"]  # the template's context is computed too


def test_what_has_no_chat_format_is_refused(tmp_path, redditbias_dir, capsys):
    f = tmp_path / "s.toml"
    base = STUDY.format(model="m", data=redditbias_dir)
    cases = [(base.replace("[training]\n", '[training]\nformat = "chat"\n'), "format in [training]"),
             (base.replace("[measure]\n", '[measure]\nrole = "user"\n'), "role in [measure]"),
             (base.replace('tasks = ["crg"]', 'tasks = ["lmp", "crg"]'), "lmp have no chat format"),
             (base.replace('crg = {', 'crg = { system = "x", '), "dialog.crg.system"),
             (base + "[benchmarks]\ncrows_pairs = true\n", "pair benchmark has no chat format"),
             (base.replace('format = "chat"\n', ''), "prompt"),  # a chat setting with the raw format
             (base.replace('seeds = [42]', 'seeds = [42]\nsemantics = "reference"'), "semantics")]
    for text, msg in cases:
        f.write_text(text)
        assert main(["run", str(f), "--out", str(tmp_path / "o"), "--dry-run"]) == 1, msg
        assert msg in capsys.readouterr().err, msg
    # a study trained on raw text may still measure in chat format ([measure] format, as before)
    raw = base.replace('format = "chat"\nprompt = "What do you think?"\n', '').replace(
        'tasks = ["crg"]', 'tasks = []').replace("[measure]\n", '[measure]\nformat = "chat"\n')
    f.write_text(raw)
    assert main(["run", str(f), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    assert load_study(f).measure_config().format == "chat" and "the LMB measured in chat format" in capsys.readouterr().out


def test_chat_study_runs_every_stage_in_chat_format(chat_model_dirs, redditbias_dir, tmp_path):
    study = tmp_path / "chat.toml"
    study.write_text(STUDY.format(model=chat_model_dirs["llama3"], data=redditbias_dir))
    out = tmp_path / "run"
    assert main(["run", str(study), "--out", str(out), "--no-progress"]) == 0
    folder = out / "seed42" / "religion1" / "hd"
    res = json.loads((folder / "run" / "results.json").read_text())
    assert res["format"] == "chat" and res["config"]["prompt"] == "What do you think?"
    assert res["chat"]["example"]["n_context_tokens"] > 5
    for lmb in (out / "baseline" / "lmb_test" / "lmb.json", folder / "lmb_test" / "lmb.json"):
        rec = json.loads(lmb.read_text())[0]
        assert rec["inputs"]["format"] == "chat" and rec["inputs"]["chat"]["prompt"] == "What do you think?"
    crg = json.loads((folder / "dialog" / "crg.json").read_text())
    assert crg["generation"]["format"] == "chat" and crg["generation"]["n_generated"] == 2
    report = (out / "report.md").read_text()
    assert "Format: chat turns (assistant, user message 'What do you think?')" in report
    assert f"Study: a chat-format study. Model: {chat_model_dirs['llama3']}. Folders: " in report
    # the exported model's card says it was trained on chat turns
    assert main(["export", str(folder), "--out", str(tmp_path / "exp")]) == 0
    card = (tmp_path / "exp" / "README.md").read_text()
    assert "debiased on chat turns (each phrase the assistant's turn, after the user message 'What do you think?'" \
        in card
