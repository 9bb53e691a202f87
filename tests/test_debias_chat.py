"""Debiasing in chat format: each training phrase is a turn of the model's chat template; the LM loss, the LMD
triggers and the ADD/HD attribute occurrences are on the phrase's tokens only (never on the template's); a packed
update equals the padded one; the LM loss equals PyTorch's phrase-span NLL; low-rank adapters train in chat format."""
import jax
import numpy as np
import pytest

from rbjax.core.errors import SettingError
from rbjax.debias.config import DebiasRun
from rbjax.debias.data import TrainingData
from rbjax.debias.objective import DebiasObjective
from rbjax.debias.run import debias_trainer
from rbjax.debias.triggers import TriggerBuilder
from rbjax.model import lora
from rbjax.model.handle import ModelHandle
from rbjax.specs import load_spec
from rbjax.train.batching import BatchPlan
from rbjax.train.step import StepSpec
from tests.conftest import religion1_train_file
from tests.test_packed import _compare, _run

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")


@pytest.fixture(scope="module")
def llama3(chat_model_dirs):
    folder = chat_model_dirs["llama3"]
    config, params, tok = ModelHandle.open(folder).load()
    return folder, (config, params, tok)


def _cfg(tmp_path, redditbias_dir, n=16, **kw):
    base = dict(method="hd", bias_type="religion1", model="unused", out_dir=str(tmp_path / "run"),
                train_file=religion1_train_file(redditbias_dir, tmp_path, n), batch_size=4, grad_accum=1,
                max_steps=3, dropout=False, learning_rate=1e-3, export=False, evaluate=False, lmp=False,
                progress=False, format="chat", block_size=128)
    base.update(kw)
    return DebiasRun.from_flat(base)


def _lines(cfg):
    return [ln for ln in open(cfg.debias.train_file, encoding="utf-8").read().splitlines() if ln.strip()]


def test_chat_settings_are_checked():
    with pytest.raises(SettingError, match="role"):
        DebiasRun.from_flat(role="user")  # a chat setting with the raw format would be ignored
    with pytest.raises(SettingError, match="semantics"):
        DebiasRun.from_flat(format="chat", semantics="reference")
    cfg = DebiasRun.from_flat(format="chat", role="user", system="Be brief.")
    assert cfg.to_dict()["format"] == "chat" and cfg.to_dict()["role"] == "user"


@pytest.mark.parametrize("method", ["lmd", "hd"])
def test_chat_examples_mask_every_template_token(llama3, tmp_path, redditbias_dir, method):
    """Context = the rendered template up to the phrase (no loss, no trigger, no attribute occurrence there); the
    phrase's triggers are those of the phrase's own tokens, shifted past the context, even when the system prompt
    itself names target terms and attributes."""
    _, (config, _, tok) = llama3
    system = "Speak about jews, christians, muslims: greedy, violent, terrorists."  # terms the template must hide
    cfg = _cfg(tmp_path, redditbias_dir, method=method, system=system, prompt="What do you think?")
    data = TrainingData(cfg, tok, config.vocab_size)
    texts = _lines(cfg)
    spans = cfg.debias.chat_turns(tok).encode(texts)
    assert len(spans) == data.n_examples
    for r, sp in enumerate(spans):
        n = len(sp.ids)
        assert data.ids[r, :n].tolist() == list(sp.ids) and data.mask[r].sum() == n
        assert data.n_context[r] == sp.n_context > 10  # BOS, headers, the system prompt, the user message
        assert data.loss_mask[r].tolist() == [0] * sp.n_context + [1] * len(sp.span) + [0] * (data.ids.shape[1] - n)
        assert tok.decode(list(sp.span)).strip() == texts[r].strip()
    # the triggers: those of the phrase's tokens alone, shifted past the context
    tb = TriggerBuilder(load_spec("religion1"), tok)
    rows = np.arange(data.n_examples)
    got = data.triggers(data.ids, data.mask, rows)
    assert got["loss_mask"].tolist() == data.loss_mask.tolist()
    for r, sp in enumerate(spans):
        c, ph = sp.n_context, np.asarray(sp.span)[None]
        one = np.ones_like(ph)
        if method == "lmd":
            alone = tb.lmd(ph, one).mask[0]
            want = np.zeros_like(got["lmd_mask"][r])
            want[c:c + ph.shape[1]] = alone
            # a term on the phrase's first token is predicted by the template's last token (unpredicted alone)
            if tb.lmd(ph, one).unpredicted[0]:
                assert got["lmd_mask"][r, c - 1].sum() > 0
                want[c - 1] = got["lmd_mask"][r, c - 1]
            np.testing.assert_array_equal(got["lmd_mask"][r], want)
            assert got["lmd_mask"][r, :c - 1].sum() == 0
        else:
            alone = tb.attributes(ph, one, max_occurrences=data.n_occ)
            np.testing.assert_array_equal(got["occ_mask"][r], alone.mask[0])
            np.testing.assert_array_equal(got["occ_weights"][r][:, c:c + ph.shape[1]], alone.weights[0])
            assert got["occ_weights"][r][:, :c].sum() == 0
    assert data.trigger_stats["sentences_triggered"] > 0
    # the system prompt's terms fire nothing: the same triggers as without it
    other = TrainingData(_cfg(tmp_path, redditbias_dir, method=method, prompt="What do you think?"), tok,
                         config.vocab_size)
    assert other.trigger_stats == data.trigger_stats


@pytest.mark.parametrize("score_end_of_turn", [False, True])
def test_chat_lm_loss_equals_pytorch_phrase_nll(llama3, tmp_path, redditbias_dir, score_end_of_turn):
    """The LM loss of a chat micro-batch = PyTorch's mean NLL with labels -100 on every template token (and on the
    end-of-turn token unless it is scored)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder, (config, params, tok) = llama3
    cfg = _cfg(tmp_path, redditbias_dir, n=6, method="lm", prompt="What do you think?",
               score_end_of_turn=score_end_of_turn)
    data = TrainingData(cfg, tok, config.vocab_size)
    plan = BatchPlan(data, 6, 1, 1, 0, layout="padded")
    batch = plan.make_batch(np.arange(data.n_examples))
    spec = StepSpec(config, None)
    _, metrics = DebiasObjective("lm")(params, {k: jax.numpy.asarray(v) for k, v in batch.items()}, (), None, spec)
    eot = tok.encode("<|eot_id|>")[-1]
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    labels = ids.clone()
    for r in range(data.n_examples):
        labels[r, :int(data.n_context[r])] = -100  # the template's tokens: never targets
        labels[r, int(batch["attention_mask"][r].sum()):] = -100
        assert (ids[r, int(batch["attention_mask"][r].sum()) - 1] == eot) == score_end_of_turn
    with torch.no_grad():
        ref = tm(input_ids=ids, attention_mask=torch.tensor(batch["attention_mask"]), labels=labels).loss.item()
    assert abs(float(metrics["lm_loss"]) - ref) <= 1e-5 * abs(ref), (float(metrics["lm_loss"]), ref)


# one parameter of HD's run lands 2.4e-5 apart under the suite's faster-to-compile code generation (4.3e-6 under
# XLA's): an element whose gradient is near Adam's epsilon, where rounding becomes a fraction of a step
@pytest.mark.xla_default_codegen
@pytest.mark.parametrize("method", ["lmd", "hd", "cda"])
def test_chat_packed_update_equals_padded(llama3, tmp_path, redditbias_dir, method):
    """Packing keeps the template's prefix in each phrase's segment: losses within 1e-6, parameters after three
    updates within 1e-5 of the padded layout."""
    _, start = llama3
    cfg = _cfg(tmp_path, redditbias_dir, n=12 if method == "cda" else 24, method=method, batch_size=4,
               grad_accum=2, learning_rate=5e-5)
    data = TrainingData(cfg, start[2], start[0].vocab_size)
    padded, packed = _run(cfg, start, data, "padded"), _run(cfg, start, data, "packed")
    assert packed[0].plan.layout == "packed"
    if method != "cda":
        assert any(abs(u["debias_loss"]) > 0 for u in padded[2])
    # LMD in the chat format lands 1.37e-6 relative apart under jax/jaxlib 0.10.2 (XLA's default code generation;
    # within 1e-6 under the versions before): its later updates start from parameters that already differ by float32
    # rounding, and its term is a difference of two nearly equal projections
    _compare(padded, packed, loss_rtol=2e-6 if method == "lmd" else 1e-6)


def test_chat_lora_run_trains_adapters(llama3, tmp_path, redditbias_dir):
    _, (config, params, tok) = llama3
    cfg = _cfg(tmp_path, redditbias_dir, method="hd", adapter="lora", lora_rank=2, max_steps=2)
    model = ModelHandle.from_params(params, config, tok, name="tiny", digest="tiny")
    tr = debias_trainer(cfg, model=model)
    assert tr.key()["trajectory"]["chat"]["format"] == "chat"
    metrics = []
    res = tr.run(checkpoints=False, callback=lambda ev: ev["kind"] == "update" and metrics.append(ev["metrics"]))
    assert len(metrics) == 2 and all(np.isfinite(m["lm_loss"]) and m["lm_loss"] > 0 and m["debias_loss"] != 0
                                     for m in metrics)
    trained = {tuple(str(getattr(k, "key", k)) for k in p): np.asarray(x)
               for p, x in jax.tree_util.tree_leaves_with_path(jax.device_get(res.state.params))}
    assert trained and all(lora.is_adapter_param(p) for p in trained)  # adapters only, on the frozen base
    assert max(np.abs(v).max() for p, v in trained.items() if p[-1] == "B") > 0  # B moved from zero


def test_sweep_dev_lmb_scores_chat_turns_as_pytorch_does(llama3, redditbias_dir):
    """The sweep's dev LMB in chat format: each phrase's perplexity over its own tokens in the rendered chat;
    the reference t-test (unfiltered ttest_rel) equals scipy's on PyTorch's phrase-span perplexities."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from scipy.stats import ttest_rel

    from rbjax.data.redditbias import load_pairs
    from rbjax.debias.sweep import SweepContext, dev_lmb

    folder, (config, params, tok) = llama3
    chat = DebiasRun.from_flat(format="chat", prompt="What do you think?").debias.chat_turns(tok)
    got = dev_lmb(params, config, tok, "religion1", str(redditbias_dir), n_bootstrap=0, max_pairs=8, batch_size=8,
                  chat=chat)
    raw = dev_lmb(params, config, tok, "religion1", str(redditbias_dir), n_bootstrap=0, max_pairs=8, batch_size=8)
    pairs = load_pairs("religion1", "valid", str(redditbias_dir))
    tm = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()

    def ppl(phrases):
        out = []
        for sp in chat.encode(phrases[:8]):
            ids = torch.tensor([list(sp.ids)])
            labels = ids.clone()
            labels[0, :sp.n_context] = -100
            with torch.no_grad():
                out.append(float(torch.exp(tm(input_ids=ids, labels=labels).loss)))
        return out

    ref = ttest_rel(ppl(pairs.biased), ppl(pairs.counterfactual))
    assert got["n_pairs"] == 8
    np.testing.assert_allclose(got["reference"]["t_value"], ref.statistic, rtol=1e-4)
    assert got["t_value"] != raw["t_value"]
    base = DebiasRun.from_flat(model=str(folder), format="chat")
    assert SweepContext.key_of(base) != SweepContext.key_of(base.replace(format="raw"))


def test_sweep_cli_in_chat_format(llama3, redditbias_dir, tmp_path):
    """`rbjax sweep --format chat`: the grid points train on chat turns and the dev LMB scores chat turns (equal to
    dev_lmb's chat scoring of the start model for the baseline); the format is in the sweep's settings and key."""
    from rbjax.cli import main
    from rbjax.debias.sweep import dev_lmb

    folder, (config, params, tok) = llama3
    out = tmp_path / "sweep"
    assert main(["sweep", "--method", "hd", "--bias", "religion1", "--model", str(folder), "--format", "chat",
                 "--prompt", "What do you think?", "--data-dir", str(redditbias_dir), "--out", str(out),
                 "--train-file", religion1_train_file(redditbias_dir, tmp_path, 16), "--block-size", "64",
                 "--batch-sizes", "4", "--grad-accums", "1", "--lambda-lms", "0.01", "--lambda-ds", "10",
                 "--max-points", "1", "--max-steps", "1", "--no-lmp", "--dev-max-pairs", "8", "--n-bootstrap", "0",
                 "--layout", "padded", "--no-progress"]) == 0
    import json

    settings = json.loads((out / "sweep_settings.json").read_text())
    assert settings["settings"]["format"] == "chat" and settings["key"]["trajectory"]["chat"]["prompt"] == \
        "What do you think?"
    baseline = json.loads((out / "baseline.json").read_text())
    chat = DebiasRun.from_flat(format="chat", prompt="What do you think?").debias.chat_turns(tok)
    want = dev_lmb(params, config, tok, "religion1", str(redditbias_dir), n_bootstrap=0, max_pairs=8, chat=chat)
    assert baseline["dev"]["t_value"] == pytest.approx(want["t_value"], rel=1e-5)


def test_debias_with_a_chat_template_file_exports_it(llama3, redditbias_dir, tmp_path):
    """A run trained with --chat-template exports that template (chat_template.jinja, read before the tokenizer
    config's by transformers and rbjax), so the export is used as it was trained."""
    transformers = pytest.importorskip("transformers")
    from tests.conftest import chat_template_text

    folder, _ = llama3
    tpl = tmp_path / "mine.jinja"
    tpl.write_text(chat_template_text("llama3").replace("<|start_header_id|>", "<|start_header_id|> "))
    cfg = _cfg(tmp_path, redditbias_dir, model=str(folder), method="lm", chat_template=str(tpl), max_steps=1,
               export=True)
    from rbjax.debias.run import debias

    res = debias(cfg)
    assert res["chat"]["template_source"] == str(tpl)
    from rbjax.commands.debias import format_results

    # the summary says the run trained on chat turns, through which template
    assert (f"\n  trained on chat format ({tpl}): each phrase as the assistant's turn, end-of-turn token not scored; "
            "every weight trained\n") in format_results(res)
    exported = transformers.AutoTokenizer.from_pretrained(res["model_dir"])
    assert exported.chat_template == tpl.read_text()


def test_dry_run_plans_the_template_tokens(llama3, tmp_path, redditbias_dir, capsys):
    from rbjax.cli import main

    folder, (config, _, tok) = llama3
    raw = DebiasRun.from_flat(model=str(folder))
    chat = DebiasRun.from_flat(model=str(folder), format="chat", prompt="What do you think?")
    data = TrainingData(_cfg(tmp_path, redditbias_dir, block_size=36, prompt="What do you think?"), tok,
                        config.vocab_size)
    assert raw.plan_seq_len == 36 and chat.plan_seq_len >= data.ids.shape[1]  # an allowance, not below the real rows
    printed = []
    for fmt in (["--format", "chat"], []):
        assert main(["debias", "--model", str(folder), "--method", "hd", "--bias", "religion1", *fmt, "--out",
                     str(tmp_path / "o"), "--dry-run"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] != printed[1]  # the chat run's activations are planned for its wider rows
