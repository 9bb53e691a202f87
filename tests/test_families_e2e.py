"""End to end on a tiny Llama-architecture checkpoint (grouped-query attention, untied LM head) with a tiny
``tokenizer.json`` whose post-processor adds a BOS (as Llama's does): ``measure`` (perplexities equal PyTorch's
one-at-a-time), ``debias`` with each method, ``measure`` of the exported model, ``evaluate --task lmp``, and the
exported folder loading back in ``transformers``. The model is built and saved by rbjax itself (torch-free); the
PyTorch comparisons skip without torch."""
import csv
import json
import math

import numpy as np
import pytest

from rbjax.cli import main
from tests.conftest import PARITY_INIT, make_tiny_llama_folder, make_tokenizer_json, small_train_config


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, redditbias_dir):
    return make_tiny_llama_folder(tmp_path_factory.mktemp("tiny_llama"), redditbias_dir=redditbias_dir, max_positions=128)


def _csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_measure_llama_bos_policy_and_torch_parity(tiny_llama, redditbias_dir, tmp_path):
    out = tmp_path / "m"
    assert main(["measure", "--model", str(tiny_llama), "--bias", "religion1", "--data-dir", str(redditbias_dir),
                 "--out", str(out), "--n-bootstrap", "0", "--no-progress"]) == 0
    rec = json.loads((out / "lmb.json").read_text())[0]
    assert rec["settings"]["bos"] is True and rec["settings"]["bos_policy"] == "tokenizer"
    rows = _csv(out / "religion1_perplexities.csv")
    assert len(rows) == rec["n_pairs"] == 238
    # --no-bos: another resume key, other numbers (the first token is then context, not predicted); the folder holds
    # the BOS run, which is not replaced without --overwrite
    argv = ["measure", "--model", str(tiny_llama), "--bias", "religion1", "--data-dir", str(redditbias_dir),
            "--out", str(out), "--n-bootstrap", "0", "--no-progress", "--no-bos", "--resume"]
    assert main(argv) == 1
    assert main(argv + ["--overwrite"]) == 0
    rec2 = json.loads((out / "lmb.json").read_text())[0]
    assert rec2["settings"]["bos"] is False and rec2["reused_perplexities"] is False
    assert _csv(out / "religion1_perplexities.csv")[0]["biased_ppl"] != rows[0]["biased_ppl"]

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    assert type(model).__name__ == "LlamaForCausalLM"
    for r in rows[:: len(rows) // 12]:  # a spread of pairs, each phrase alone, BOS as the tokenizer adds it
        for col, phrase in (("biased_ppl", r["biased_phrase"]), ("counterfactual_ppl", r["counterfactual_phrase"])):
            ids = torch.tensor([ref_tok(phrase)["input_ids"]])
            assert ids[0, 0].item() == 1  # the tokenizer's BOS
            with torch.no_grad():
                want = math.exp(model(ids, labels=ids).loss.item())
            assert float(r[col]) == pytest.approx(want, rel=1e-5), phrase


@pytest.mark.slow
def test_debias_each_method_export_measure_evaluate(tiny_llama, redditbias_dir, tmp_path):
    from rbjax.debias.run import debias
    from rbjax.lmb.measure import LoadedModel, measure_bias
    from rbjax.model.hf import load_pretrained

    _, start = load_pretrained(tiny_llama)
    runs = {}
    for method in ("lmd", "add", "hd", "cda"):
        cfg = small_train_config(tiny_llama, tiny_llama, redditbias_dir, tmp_path / method, method=method,
                                 batch_size=2, max_steps=2, export=True)
        res = debias(cfg)
        assert res["training"]["updates"] == 2, method
        runs[method] = tmp_path / method
        _, p = load_pretrained(runs[method] / "model")
        # the untied LM head is trained too (LMD/ADD/HD read their target vectors from it)
        assert not np.array_equal(p["lm_head"]["embedding"], start["lm_head"]["embedding"]), method
    # the exported model measured through the run folder (the handle finds run/model)
    recs = measure_bias(model=str(runs["hd"]), bias_types="religion1", data_dir=redditbias_dir,
                        out_dir=tmp_path / "m_hd", n_bootstrap=0, progress=False, plot=False)
    assert recs[0]["settings"]["bos"] is True and np.isfinite(recs[0]["t_value"])
    assert LoadedModel(str(runs["hd"])).handle.digest != LoadedModel(str(tiny_llama)).handle.digest
    assert main(["evaluate", "--task", "lmp", "--model", str(runs["lmd"]), "--data-dir", str(redditbias_dir),
                 "--lmp-max-lines", "40", "--out", str(tmp_path / "ev"), "--no-progress"]) == 0
    lmp = json.loads((tmp_path / "ev" / "lmp.json").read_text())
    assert lmp["metrics"]["bos"] is True and math.isfinite(lmp["metrics"]["perplexity"])

    transformers = pytest.importorskip("transformers")
    for method, folder in runs.items():
        m = transformers.AutoModelForCausalLM.from_pretrained(folder / "model")
        assert type(m).__name__ == "LlamaForCausalLM" and not m.config.tie_word_embeddings, method


def test_generate_llama_grouped_query_cache_greedy_equals_torch(tiny_llama):
    """Greedy generation through the family module and its grouped-query KV cache, batched with left padding,
    token for token as ``transformers`` generates each prompt alone."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rbjax.model.generate import SamplingSettings, generate
    from rbjax.model.handle import ModelHandle

    config, params, tok = ModelHandle.open(tiny_llama).load()
    prompts = [[tok.bos_id] + tok.encode(s) for s in ("the jews are", "christians are always", "muslims")]
    got = generate(params, config, prompts, settings=SamplingSettings(max_new_tokens=8, greedy=True), eos_id=399)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    for p, g in zip(prompts, got.tokens):
        with torch.no_grad():
            want = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, eos_token_id=399,
                                  pad_token_id=3)[0, len(p):].tolist()
        assert list(g) == want


def test_reference_semantics_refused_for_another_tokenizer(tiny_llama, redditbias_dir, tmp_path):
    from rbjax.debias.run import debias_trainer

    cfg = small_train_config(tiny_llama, tiny_llama, redditbias_dir, tmp_path / "r", semantics="reference")
    with pytest.raises(ValueError, match="reference reproduces the official code's GPT-2 token-id lists.*not "
                                         "GPT-2's BPE"):
        debias_trainer(cfg)


@pytest.mark.parametrize("kind,mark", [("bytelevel", "Ġ"), ("metaspace", "▁")])
def test_triggers_find_terms_whatever_the_word_marker(tmp_path, redditbias_dir, kind, mark):
    """Target terms are found on decoded text and their target vectors average the mid-sentence subwords, for
    byte-level (``Ġ``) and SentencePiece-style (``▁``) pieces alike."""
    from rbjax.debias.triggers import TriggerBuilder
    from rbjax.model.tokenizer import load_tokenizer
    from rbjax.specs import load_spec

    tok = load_tokenizer(make_tokenizer_json(tmp_path / kind, kind=kind, redditbias_dir=redditbias_dir), None)
    tb = TriggerBuilder(load_spec("religion1"), tok)
    ids, mask = tb.pair_ids("lmd")
    for p, pair in enumerate(tb.spec.pairs):
        for k, term in enumerate(pair):
            pieces = [tok.id_to_token(int(i)) for i in ids[p, k][mask[p, k]]]
            assert pieces[0].startswith(mark) and "".join(pieces).replace(mark, " ").strip() == term.lower(), pieces
    s = "i think christians are lazy and jews are greedy"
    x = np.asarray([tok.encode(s)])
    t = tb.lmd(x, np.ones_like(x))
    starts = [i for i in range(1, x.shape[1]) if t.mask[0, i - 1].any()]  # tokens predicted with a pair
    words = {tok.decode(x[0, i:].tolist()).split()[0] for i in starts}
    assert words == {"christians", "jews"}, words


#: GPT-NeoX (Pythia: no BOS added, untied ``embed_out``, partial rotary) and Gemma 2 (BOS added, tied embedding,
#: soft-capping) tiny configs, through every command as the Llama test above
OTHER_FAMILIES = {
    "gpt_neox": (False, {"model_type": "gpt_neox", "vocab_size": 400, "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256,
                         "rotary_pct": 0.25, "tie_word_embeddings": False, "initializer_range": PARITY_INIT,
                         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}),
    "gemma2": (True, {"model_type": "gemma2", "vocab_size": 400, "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                      "max_position_embeddings": 256, "sliding_window": 256, "query_pre_attn_scalar": 12,
                      "attn_logit_softcapping": 3.0, "final_logit_softcapping": 8.0, "tie_word_embeddings": True,
                      "initializer_range": PARITY_INIT, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OTHER_FAMILIES))
def test_other_families_measure_debias_export_evaluate(name, redditbias_dir, tmp_path):
    """A tiny GPT-NeoX / Gemma 2 checkpoint (saved by rbjax, torch-free) through ``measure`` (perplexities equal
    PyTorch's one phrase at a time, BOS as the family's tokenizer adds it), ``debias`` with each method (the output
    embedding trained), ``measure`` of an exported run, ``evaluate --task lmp``, and every export loading back in
    ``transformers`` as the same architecture."""
    from rbjax.debias.run import debias
    from rbjax.lmb.measure import measure_bias
    from rbjax.model.hf import load_pretrained, save_pretrained
    from rbjax.model.registry import FAMILIES

    add_bos, hf = OTHER_FAMILIES[name]
    fam = FAMILIES[name]
    tok = make_tokenizer_json(tmp_path / "tok", kind="bytelevel", add_bos=add_bos, redditbias_dir=redditbias_dir)
    cfg = fam.config_from_hf(hf, f"tiny {name}")
    model = save_pretrained(fam.init_params(cfg, 0), cfg, tmp_path / "model", tokenizer_dir=tok)

    out = tmp_path / "m"
    assert main(["measure", "--model", str(model), "--bias", "religion1", "--data-dir", str(redditbias_dir),
                 "--out", str(out), "--n-bootstrap", "0", "--no-progress"]) == 0
    rec = json.loads((out / "lmb.json").read_text())[0]
    assert rec["settings"]["bos"] is add_bos and np.isfinite(rec["t_value"])
    rows = _csv(out / "religion1_perplexities.csv")
    assert len(rows) == rec["n_pairs"] == 238

    _, start = load_pretrained(model)
    runs = {}
    for method in ("lmd", "add", "hd", "cda"):
        tc = small_train_config(model, model, redditbias_dir, tmp_path / method, method=method, batch_size=2,
                                max_steps=1, export=True, layout="padded")
        assert debias(tc)["training"]["updates"] == 1, method
        runs[method] = tmp_path / method
        _, p = load_pretrained(runs[method] / "model")
        # LMD/ADD/HD read their target vectors from the output embedding, which is trained with the rest
        assert not np.array_equal(np.asarray(fam.lm_head(p)), np.asarray(fam.lm_head(start))), method
    recs = measure_bias(model=str(runs["hd"]), bias_types="religion1", data_dir=redditbias_dir,
                        out_dir=tmp_path / "m_hd", n_bootstrap=0, progress=False, plot=False)
    assert recs[0]["settings"]["bos"] is add_bos and np.isfinite(recs[0]["t_value"])
    assert main(["evaluate", "--task", "lmp", "--model", str(runs["lmd"]), "--data-dir", str(redditbias_dir),
                 "--lmp-max-lines", "40", "--out", str(tmp_path / "ev"), "--no-progress"]) == 0
    lmp = json.loads((tmp_path / "ev" / "lmp.json").read_text())
    assert lmp["metrics"]["bos"] is add_bos and math.isfinite(lmp["metrics"]["perplexity"])

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    arch = {"gpt_neox": "GPTNeoXForCausalLM", "gemma2": "Gemma2ForCausalLM"}[name]
    tm = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(model)
    assert type(tm).__name__ == arch
    for r in rows[:: len(rows) // 8]:  # a spread of pairs, each phrase alone
        for col, phrase in (("biased_ppl", r["biased_phrase"]), ("counterfactual_ppl", r["counterfactual_phrase"])):
            ids = torch.tensor([ref_tok(phrase)["input_ids"]])
            assert (ids[0, 0].item() == 1) is add_bos  # the tokenizer's BOS, where the family's adds one
            with torch.no_grad():
                want = math.exp(tm(ids, labels=ids).loss.item())
            assert float(r[col]) == pytest.approx(want, rel=1e-5), phrase
    for method, folder in runs.items():
        assert type(transformers.AutoModelForCausalLM.from_pretrained(folder / "model")).__name__ == arch, method
