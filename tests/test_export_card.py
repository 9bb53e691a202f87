"""`rbjax export`'s model card on hand-made finished run folders (no training): the metadata tags name the exported
model's architecture, and a single run's card says what the paper did for its method instead of a grid point."""
import json

import pytest
import yaml

from rbjax.cli import main


def _run(root, method, model_type):
    run = root / f"{method}-{model_type or 'untyped'}"
    (run / "model").mkdir(parents=True)
    config = {"vocab_size": 8, **({"model_type": model_type} if model_type else {})}
    (run / "model" / "config.json").write_text(json.dumps(config))
    (run / "results.json").write_text(json.dumps({"status": "done", "method": method, "bias_type": "religion1",
                                                  "semantics": "paper", "config": {"model": "base", "seed": 42}}))
    (run / "config.json").write_text(json.dumps({"data": {"source": "train phrases", "files": [], "n_lines": 3,
                                                          "n_tokens": 30, "sha256_tokens": "00"}}))
    return run


@pytest.mark.parametrize("method,model_type,tag,grid_text", [
    ("hd", "llama", "llama", "not a point selected on a grid. The paper selects HD's batch size"),
    ("lmd", "qwen2", "qwen2", "from a grid of 54 runs"),
    ("cda", "gpt_neox", "gpt_neox", "as the paper trains CDA (no grid is searched for CDA"),
    ("cda", None, "gpt2", "as the paper trains CDA"),  # a config.json without model_type is GPT-2, as the loader reads it
])
def test_card_tags_the_architecture_and_says_what_a_single_run_is(tmp_path, capsys, method, model_type, tag,
                                                                   grid_text):
    out = tmp_path / "export"
    assert main(["export", str(_run(tmp_path, method, model_type)), "--out", str(out)]) == 0
    capsys.readouterr()
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert tag in meta["tags"] and f"debiasing-{method}" in meta["tags"]
    assert not {"gpt2", "llama", "qwen2", "gpt_neox", "gemma2"} - {tag} & set(meta["tags"])  # no other architecture
    assert grid_text in card
    if method != "cda":
        assert "(as the paper's CDA)" not in card and "as the paper trains CDA" not in card
    assert json.loads((out / "export.json").read_text())["model_type"] == tag


@pytest.mark.parametrize("max_lines,said", [(100, "123.457 (on the first 100 lines only)."), (None, "123.457.")])
def test_card_says_an_lmp_of_part_of_the_reference(tmp_path, capsys, max_lines, said):
    """results.json records the LMP's line cap (``lmp.max_lines``); the card says it beside the figure."""
    run = _run(tmp_path, "hd", "gpt2")
    res = json.loads((run / "results.json").read_text())
    res["lmp"] = {"perplexity": 123.4567, "max_lines": max_lines, "file": "humanref6k.txt"}
    (run / "results.json").write_text(json.dumps(res))
    assert main(["export", str(run), "--out", str(tmp_path / "export")]) == 0
    capsys.readouterr()
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"LMP (Reddit perplexity, §3.2) of this model: {said}\n" in card
