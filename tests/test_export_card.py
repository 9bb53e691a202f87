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


# ------------------------------------------------------------------------------------------ --overwrite
@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory, tiny_model_dir):
    """A hand-made finished run of ``--adapter lora``: ``model/`` the merged model, ``adapter/`` the PEFT folder on
    ``tiny_model_dir`` (random B: the adapters matter); no training."""
    import numpy as np

    from rbjax.model import hf, lora
    from rbjax.model.peft_adapter import save_adapter

    run = _run(tmp_path_factory.mktemp("adapter_run"), "hd", "gpt2")
    cfg, params = hf.load_pretrained(tiny_model_dir)
    spec = lora.LoraSpec(rank=2, alpha=4.0, targets="all-linear")
    ad = lora.add_adapters(params, cfg, spec, seed=1)
    rng = np.random.default_rng(1)
    for a in lora.adapter_modules(ad).values():
        a["B"] = rng.normal(0, 0.3, a["B"].shape).astype(np.float32)
    hf.save_pretrained(lora.merge_adapters(ad), cfg, run / "model", tokenizer_dir=tiny_model_dir)
    save_adapter(ad, cfg, run / "adapter", spec, base_model=str(tiny_model_dir))
    res = json.loads((run / "results.json").read_text())
    res["adapter"] = {"rank": 2, "alpha": 4.0, "scale": 2.0, "dropout": 0.0, "targets": ["attn.c_attn"],
                      "trained_parameters": 1, "param_dtype": "float32", "base_model_key": "k"}
    (run / "results.json").write_text(json.dumps(res))
    return run


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_replaces_an_export_as_a_whole(adapter_run, tmp_path, capsys):
    """An adapter-only export over a merged one, and the reverse, leave exactly the new export's files: no merged
    weights beside the adapter, no adapter_config.json beside merged weights (transformers would apply the
    adapter to them), and the folder loads as the run's model."""
    out, ref = tmp_path / "out", tmp_path / "ref"
    run = str(adapter_run)
    assert main(["export", run, "--out", str(out)]) == 0
    assert main(["export", run, "--adapter-only", "--out", str(ref)]) == 0
    assert main(["export", run, "--adapter-only", "--out", str(out), "--overwrite"]) == 0
    assert sorted(_files(out)) == sorted(_files(ref)) == ["README.md", "adapter_config.json",
                                                          "adapter_model.safetensors", "export.json"]
    assert _files(out)["adapter_model.safetensors"] == _files(adapter_run / "adapter")["adapter_model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left beside
    # and back: the merged model over the adapter-only export
    assert main(["export", run, "--out", str(out), "--overwrite"]) == 0
    got = _files(out)
    assert set(got) == set(_files(adapter_run / "model")) | {"README.md", "export.json"}
    assert all(got[f] == b for f, b in _files(adapter_run / "model").items())
    assert sorted(json.loads(got["export.json"])["files_sha256"]) == sorted(_files(adapter_run / "model"))
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = torch.tensor([[464, 6772, 389, 257, 1310, 286]])
    with torch.no_grad():
        a = transformers.AutoModelForCausalLM.from_pretrained(out)(ids).logits.numpy()
        b = transformers.AutoModelForCausalLM.from_pretrained(adapter_run / "model")(ids).logits.numpy()
    assert (a == b).all()
    capsys.readouterr()


def test_a_failed_overwrite_leaves_the_earlier_export_untouched(adapter_run, tmp_path, capsys, monkeypatch):
    from rbjax.study import export

    out = tmp_path / "out"
    assert main(["export", str(adapter_run), "--out", str(out)]) == 0
    before = _files(out)

    def broken(*a, **k):  # a failure after the model files are copied (a full disk, an interrupt)
        raise OSError("no space left on device")

    monkeypatch.setattr(export, "model_card", broken)
    assert main(["export", str(adapter_run), "--adapter-only", "--out", str(out), "--overwrite"]) == 1
    assert "no space left on device" in capsys.readouterr().err
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left beside


def test_overwrite_refuses_a_folder_with_files_no_export_wrote(adapter_run, tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".git").mkdir(parents=True)  # e.g. a clone of a hub repository
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(adapter_run), "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert f"--out {out} holds files that no rbjax export wrote (.git, notes.txt)" in err
    assert sorted(p.name for p in out.iterdir()) == [".git", "notes.txt"]
    # an earlier export with a file added by hand: refused too
    (out / "notes.txt").unlink()
    (out / ".git").rmdir()
    assert main(["export", str(adapter_run), "--out", str(out), "--overwrite"]) == 0
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(adapter_run), "--adapter-only", "--out", str(out), "--overwrite"]) == 1
    assert "(notes.txt)" in capsys.readouterr().err and (out / "model.safetensors").is_file()


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


def test_card_shows_bbq_before_and_after(tmp_path, capsys, tiny_model_dir, bbq_dir):
    """--bbq-baseline / --bbq-after: the card's BBQ section carries both models' numbers and the comparison of
    rbjax compare (kept in evidence/); a folder that is not a BBQ run is refused by its flag."""
    from rbjax.lmb.bbq_compare import compare_bbq, movement_words
    from tests.conftest import make_rbjax_gpt2_folder

    data = tmp_path / "bbq"
    data.mkdir()
    rows = (bbq_dir / "Religion.jsonl").read_text(encoding="utf-8").splitlines()[:8]
    (data / "Religion.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    other = make_rbjax_gpt2_folder(tmp_path / "other", seed=5, tokenizer_dir=tiny_model_dir)
    before, after = tmp_path / "before", tmp_path / "after"
    for model, out in ((tiny_model_dir, before), (other, after)):
        assert main(["measure", "--model", str(model), "--benchmark", "bbq", "--data-dir", str(data), "--out",
                     str(out), "--n-bootstrap", "50", "--no-progress"]) == 0
    run = _run(tmp_path, "hd", "gpt2")
    assert main(["export", str(run), "--out", str(tmp_path / "x"), "--bbq-after", str(run)]) != 0
    assert f"--bbq-after {run}: not an 'rbjax measure --benchmark bbq' folder" in capsys.readouterr().err
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--bbq-baseline", str(before), "--bbq-after",
                 str(after)]) == 0
    assert "BBQ: compared with the base model on Religion" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "## BBQ before and after" in card and f"Before: `{before}`; after: `{after}`." in card
    assert "Bonferroni-corrected across the 1 category (significant: below 0.05)" in card
    ref = compare_bbq(after, before, labels=("debiased", "base model"))
    assert json.loads((out / "evidence" / "compare_bbq.json").read_text())["categories"] == ref["categories"]
    sb, sa = (json.loads((f / "benchmark.json").read_text()) for f in (before, after))
    for cv in ("lm_eval", "paper"):
        for name, s in (("base model", sb), ("this model", sa)):
            o = s[cv]["overall"]
            assert f"| {cv} | {name} | 8 | {o['accuracy_amb']:.3f} | {o['accuracy_disamb']:.3f} |" in card
        d = ref["categories"]["Religion"][cv]["amb_bias_score"]
        row = next(x for x in card.splitlines() if x.startswith(f"| {cv} | Religion | "))
        assert f"{d['b']:+.3f} → {d['a']:+.3f} ({d['change']:+.3f}" in row and movement_words(d["movement"]) in row
