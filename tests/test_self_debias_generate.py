"""Generation with Self-Debias (rbjax.model.generate, docs/debiasing.md "Self-Debias"): greedy tokens against a
PyTorch loop that applies the formula to ``transformers`` next-token distributions (a GPT-2 without BOS, a Llama whose
prompts start with a BOS — the prefix after it — or not); seeded sampling repeats, does not depend on the batch, and
with λ = 0 draws the plain sampler's tokens; the prefix counts against the model's positions."""
import json

import numpy as np
import pytest

from rbjax.model.generate import SamplingSettings, generate, sampling_settings
from rbjax.model.gpt2 import GPT2Config, init_params
from rbjax.model.self_debias import SelfDebiasSettings

V = 96
EOS = 2
TORCH_CASES = {  # (config class, config, bos id or None, prompts)
    "gpt2": ("GPT2Config", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                initializer_range=0.3, bos_token_id=1, eos_token_id=EOS), None,
             [[5, 9, 17, 3, 8, 11, 12], [11, 40], [40, 41, 42, 43], [7], [20, 21, 22, 23, 24, 25]]),
    "llama": ("LlamaConfig", dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  initializer_range=0.3, bos_token_id=1, eos_token_id=EOS, pad_token_id=0,
                                  tie_word_embeddings=False), 1,
              [[1, 5, 9, 17, 3, 8], [1, 11], [40, 41, 42, 43], [1, 7], [1, 20, 21, 22, 23, 24, 25]]),
}
PREFIXES = ([60, 61, 62, 63, 64], [70, 71, 72])
LAM, EPS = 50.0, 0.01
MAX_NEW = 8


def _torch_greedy(tm, prompt, prefixes, bos, lam, eps):
    """Greedy decoding by the formula, one full forward per variant and step; returns (tokens without the final EOS,
    stopped at EOS, the smallest log-odds between the chosen token and the runner-up)."""
    import torch

    seq, out, margin = list(prompt), [], np.inf
    lead = 1 if bos is not None and prompt[0] == bos else 0
    with torch.no_grad():
        for _ in range(MAX_NEW):
            lp = torch.log_softmax(tm(input_ids=torch.tensor([seq])).logits[0, -1].double(), -1)
            pk = [torch.softmax(tm(input_ids=torch.tensor([seq[:lead] + list(q) + seq[lead:]])).logits[0, -1].double(),
                                -1) for q in prefixes]
            p = lp.exp()
            pb = torch.stack(pk).max(0).values
            q = p * torch.clamp(torch.exp(-lam * torch.clamp(pb - p, min=0)), min=eps)
            top = torch.topk(q, 2).values
            margin = min(margin, float(torch.log(top[0] / top[1])))
            tok = int(torch.argmax(q))
            seq.append(tok)
            if tok == EOS:
                return out, True, margin
            out.append(tok)
    return out, False, margin


@pytest.fixture(scope="module", params=list(TORCH_CASES))
def torch_case(request, tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rbjax.model import hf
    from tests.conftest import make_torch_model

    cls_name, kw, bos, prompts = TORCH_CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    tm = make_torch_model(cls_name, kw, folder)
    cfg, params = hf.load_pretrained(folder)
    return tm, cfg, params, bos, prompts


@pytest.mark.parametrize("n_prefixes", [1, 2])
def test_greedy_self_debias_matches_torch(torch_case, n_prefixes):
    """Left-padded batches (3 rows, prompts of 1–7 tokens), each prefix variant with its own cache and positions:
    rbjax's greedy tokens are those of the PyTorch loop, and differ from plain greedy decoding."""
    tm, cfg, params, bos, prompts = torch_case
    prefixes = PREFIXES[:n_prefixes]
    sd = SelfDebiasSettings(tuple(f"p{i}" for i in range(n_prefixes)), LAM, EPS)
    settings = SamplingSettings(max_new_tokens=MAX_NEW, greedy=True)
    got = generate(params, cfg, prompts, settings=settings, batch_size=3, eos_id=EOS, self_debias=sd,
                   prefix_ids=prefixes, bos_id=bos)
    for i, prompt in enumerate(prompts):
        want, stopped, margin = _torch_greedy(tm, prompt, prefixes, bos, LAM, EPS)
        assert margin > 1e-3, "the reference's choice is a near tie: pick other prompts"
        assert got.tokens[i] == want, i
        assert bool(got.stopped_at_eos[i]) == stopped, i
    plain = generate(params, cfg, prompts, settings=settings, batch_size=3, eos_id=EOS)
    assert plain.tokens != got.tokens  # the rescaling chose other tokens somewhere (else the test shows nothing)
    assert got.settings["self_debias"]["prefix_tokens"] == [len(q) for q in prefixes]


CFG = GPT2Config(vocab_size=64, n_positions=160, n_embd=32, n_layer=2, n_head=2, eos_token_id=63, bos_token_id=63)
PROMPTS = [[5, 9, 17, 3, 8, 1, 2, 3, 4, 5, 6], [11, 2], [40, 41, 42, 43], [7], [20, 21, 22, 23, 24, 25]]


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=7)


def test_seeded_self_debias_sampling_repeats_and_lambda_zero_is_plain_sampling(params):
    s = sampling_settings("rbjax", max_new_tokens=10)
    pre = [[30, 31, 32], [33]]
    plain = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=5)
    off = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=5, self_debias=SelfDebiasSettings(("a", "b"),
                   0.0, 0.01), prefix_ids=pre)
    assert off.tokens == plain.tokens  # λ = 0: q = p, the same draws
    strong = SelfDebiasSettings(("a", "b"), 1e5, 0.0)
    a = generate(params, CFG, PROMPTS, settings=s, seed=3, batch_size=5, self_debias=strong, prefix_ids=pre)
    b = generate(params, CFG, PROMPTS[::-1], settings=s, seed=3, batch_size=5, self_debias=strong, prefix_ids=pre,
                 example_ids=[4, 3, 2, 1, 0])
    assert b.tokens[::-1] == a.tokens  # seeded per-example streams: the same draws in another order
    assert a.tokens != plain.tokens  # the rescaled distribution was sampled from
    # top-k 1 sampling of the rescaled distribution is its greedy decoding
    g = generate(params, CFG, PROMPTS, settings=SamplingSettings(max_new_tokens=10, top_k=1), seed=9, batch_size=5,
                 self_debias=strong, prefix_ids=pre)
    h = generate(params, CFG, PROMPTS, settings=SamplingSettings(max_new_tokens=10, greedy=True), batch_size=5,
                 self_debias=strong, prefix_ids=pre)
    assert g.tokens == h.tokens


def test_the_prefix_counts_against_the_positions_and_bad_prefixes_are_refused(params):
    sd = SelfDebiasSettings(("a",))
    s = SamplingSettings(max_new_tokens=10, greedy=True)
    long = [[3 + i % 60 for i in range(150)]]  # 150 tokens + a 5-token prefix: 5 new tokens fit in 160 positions
    got = generate(params, CFG, long, settings=s, self_debias=sd, prefix_ids=[[3, 4, 5, 6, 7]])
    n_new = len(got.tokens[0]) + int(got.stopped_at_eos[0])
    assert n_new == 5 or (got.stopped_at_eos[0] and n_new < 5)
    with pytest.raises(ValueError, match="longest Self-Debias prefix"):
        generate(params, CFG, [[3 + i % 60 for i in range(156)]], settings=s, self_debias=sd,
                 prefix_ids=[[3, 4, 5, 6]])
    with pytest.raises(ValueError, match="at least one prefix"):
        generate(params, CFG, PROMPTS, settings=s, self_debias=sd, prefix_ids=[[]])
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        generate(params, CFG, PROMPTS, settings=s, self_debias=sd, prefix_ids=[[64]])


# ------------------------------------------------------------------------------------------------ rbjax evaluate
def test_evaluate_scores_and_generates_with_the_rescaling_and_refuses_dst(tiny_model_dir, redditbias_dir, tmp_path,
                                                                          capsys):
    """A Self-Debias run folder (λ 1e6: the tiny model is near uniform, a large λ makes the rescaling visible):
    ``lmp`` equals the Self-Debias scorer's perplexity of the lines (not the base's), ``crg`` the responses
    generated with the rescaling (not the base's); ``dst`` and ``all`` are refused by name before any work."""
    from rbjax.cli import main
    from rbjax.dialog import crg_data
    from rbjax.dialog.crg_generation import generate_responses
    from rbjax.dialog.evaluate import evaluate
    from rbjax.dialog.reddit_perplexity import read_reference_lines
    from rbjax.lmb.self_debias import SelfDebiasScorer
    from rbjax.model.handle import ModelHandle

    run = tmp_path / "sd"
    assert main(["debias", "--method", "self-debias", "--bias", "religion1", "--model", str(tiny_model_dir),
                 "--out", str(run), "--decay-constant", "1e6"]) == 0
    out = tmp_path / "eval"
    for task in ("dst", "all"):
        with pytest.raises(ValueError, match=f"--task {task} includes dst: DST fine-tunes a classifier on the "
                                             "model's hidden states and never reads its next-token distribution"):
            evaluate(task, run, out, data_dir=redditbias_dir, progress=False)
    assert not out.exists()
    capsys.readouterr()
    assert main(["evaluate", "--task", "dst", "--model", str(run), "--out", str(out)]) != 0
    assert "evaluate the base model for DST" in capsys.readouterr().err

    lmp = evaluate("lmp", run, out, data_dir=redditbias_dir, lmp_max_lines=8, progress=False)
    base = ModelHandle.open(tiny_model_dir)
    cfg, params, tok = base.load()
    sd = SelfDebiasSettings.from_dict(lmp["model"]["self_debias"])
    assert sd.decay_constant == 1e6
    prefix_ids = [tok.encode(p) for p in sd.prefixes]
    lines = read_reference_lines(redditbias_dir / "text_files" / "humanref6k.txt", 8)
    ids = [t[:36] for t in tok.encode_batch(lines)]
    sc = SelfDebiasScorer(params, cfg, prefix_ids, sd, batch_size=64).score_ids(ids)
    want = float(sc.nll_sum.sum() / sc.n_scored.sum())
    assert lmp["metrics"]["mean_nll"] == pytest.approx(want, rel=1e-6)
    plain = evaluate("lmp", tiny_model_dir, tmp_path / "plain", data_dir=redditbias_dir, lmp_max_lines=8,
                     progress=False)
    assert abs(plain["metrics"]["mean_nll"] - want) > 1e-4  # the base's perplexity is another number
    assert any("Self-Debias" in n for n in lmp["notes"])

    crg = evaluate("crg", run, out, data_dir=redditbias_dir, max_examples=4, greedy=True, max_new_tokens=6,
                   meteor=False, progress=False)
    assert crg["generation"]["self_debias"]["decay_constant"] == 1e6
    examples = crg_data.read_response_hyp(redditbias_dir / crg_data.RESPONSE_HYP)[:4]
    kw = dict(settings=SamplingSettings(max_new_tokens=6, greedy=True), seed=42, progress=False)
    want = generate_responses(params, cfg, tok, examples, self_debias=sd, prefix_ids=prefix_ids, **kw)
    got = [json.loads(ln) for ln in (out / "crg_responses.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["response"] for r in got] == [r["response"] for r in want]
    plain_resp = generate_responses(params, cfg, tok, examples, **kw)
    assert [r["response"] for r in plain_resp] != [r["response"] for r in want]
