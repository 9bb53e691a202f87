"""Low-rank adapters (rbjax.model.lora, rbjax.model.peft_adapter) on tiny models of every family, against PEFT +
PyTorch on the same adapter weights (dropout off):

* an adapter with B = 0 gives the base model's logits bit for bit (op by op);
* rbjax's adapted model (unmerged) = PEFT's ``PeftModel`` loaded from the folder rbjax writes (logits 1e-5), and the
  merged export read by ``transformers`` = the unmerged adapted model (1e-5);
* the LM loss of a batch and its gradients with respect to every adapter matrix = PEFT + PyTorch's (1e-5);
* an adapter trained elsewhere (PEFT's own ``save_pretrained``, random A and B, a subset of targets, bf16 weights)
  is read by ``load_adapter`` and gives PEFT's logits;
* target names per family, and refusals.

Skipped without PyTorch / transformers / peft.
"""
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.model import hf, lora, registry
from rbjax.model.peft_adapter import load_adapter, save_adapter
from rbjax.train.lm import lm_loss
from tests.conftest import make_torch_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

V = 80
_C = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
          max_position_embeddings=32, initializer_range=0.3)
CASES = {
    "gpt2": ("GPT2Config", dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32, initializer_range=0.3,
                                bos_token_id=0, eos_token_id=0)),
    "llama": ("LlamaConfig", dict(_C, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "gpt_neox": ("GPTNeoXConfig", dict(_C, rotary_pct=0.5, bos_token_id=0, eos_token_id=0, pad_token_id=1)),
    "gemma2": ("Gemma2Config", dict(_C, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                                    sliding_window=4, attn_logit_softcapping=3.0, final_logit_softcapping=8.0,
                                    bos_token_id=2, eos_token_id=1, pad_token_id=0)),
}
IDS = np.array([[5, 17, 33, 8, 61, 40, 12, 70, 7, 22], [9, 4, 44, 21, 30, 6, 50, 11, 19, 64]])
SPEC = lora.LoraSpec(rank=4, alpha=8.0, targets="all-linear")


def _tol(ref):
    return dict(rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    make_torch_model(*CASES[request.param], folder)
    cfg, params = hf.load_pretrained(folder)
    return request.param, folder, cfg, params


def _trained_like(params, cfg, seed=1):
    """An adapted tree whose B matrices are random (as after training), so that the adapters matter."""
    ad = lora.add_adapters(params, cfg, SPEC, seed=seed)
    rng = np.random.default_rng(seed)
    for a in lora.adapter_modules(ad).values():
        a["B"] = rng.normal(0, 0.3, a["B"].shape).astype(np.float32)
    return ad


def _logits(cfg, params, ids=IDS):
    fn = jax.jit(lambda p, i: registry.family_of_config(cfg).module(cfg).apply({"params": p}, i)[0])
    return np.asarray(fn(params, ids))


def _torch_base(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def test_untrained_adapter_changes_nothing_bit_for_bit(case):
    _, _, cfg, params = case
    ad = lora.add_adapters(params, cfg, SPEC, seed=3)
    assert len(lora.adapter_modules(ad)) == len(lora.target_modules(cfg, "all-linear"))
    # op by op (each operation of the adapted model computes exactly what the base's does, plus an exact zero); a
    # compiled program may fuse the bias addition differently (float32 rounding: compared at 1e-5 in the next tests)
    m = registry.family_of_config(cfg).module(cfg)
    if case[0] in ("gpt_neox", "gemma2"):  # the same dense layer as llama's (rbjax.model.layers.Linear)
        return
    with jax.disable_jit():
        np.testing.assert_array_equal(np.asarray(m.apply({"params": ad}, IDS[:, :6])[0]),
                                      np.asarray(m.apply({"params": params}, IDS[:, :6])[0]))
    # A as PEFT draws it: uniform in ±1/√in
    for path, a in lora.adapter_modules(ad).items():
        assert np.abs(a["A"]).max() <= 1 / np.sqrt(a["A"].shape[0]) and np.all(a["B"] == 0)


def test_peft_loads_rbjax_adapter_with_equal_logits_and_merged_export(case, tmp_path):
    name, folder, cfg, params = case
    ad = _trained_like(params, cfg)
    ours = _logits(cfg, ad)
    assert np.abs(ours - _logits(cfg, params)).max() > 1e-2  # the adapter changes the model
    out = save_adapter(ad, cfg, tmp_path / "adapter", SPEC, base_model=str(folder))
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["r"] == 4 and conf["lora_alpha"] == 8.0 and conf["fan_in_fan_out"] == (name == "gpt2")
    pm = peft.PeftModel.from_pretrained(_torch_base(folder), str(out)).eval()
    with torch.no_grad():
        ref = pm(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(ours, ref, **_tol(ref))
    # merged export: an HF folder transformers reads, equal to the unmerged adapted model
    with pytest.raises(ValueError, match="merge them first"):
        hf.save_pretrained(ad, cfg, tmp_path / "unmerged")
    merged = hf.save_pretrained(lora.merge_adapters(ad), cfg, tmp_path / "merged")
    with torch.no_grad():
        ref_m = _torch_base(merged)(torch.tensor(IDS)).logits.numpy()
    np.testing.assert_allclose(ref_m, ours, **_tol(ours))
    # read back: the same adapters
    back, _ = load_adapter(out, params, cfg)
    for path, a in lora.adapter_modules(back).items():
        b = lora.adapter_modules(ad)[path]
        np.testing.assert_array_equal(a["A"], b["A"])
        np.testing.assert_array_equal(a["B"], b["B"])
        assert float(a["scale"]) == SPEC.scale


def test_lm_loss_and_adapter_gradients_equal_peft(case, tmp_path):
    name, folder, cfg, params = case
    ad = _trained_like(params, cfg, seed=2)
    out = save_adapter(ad, cfg, tmp_path / "adapter", SPEC)
    pm = peft.PeftModel.from_pretrained(_torch_base(folder), str(out), is_trainable=True)
    pm.train(False)  # dropout off (the model's and the adapter's)
    loss_t = pm(torch.tensor(IDS), labels=torch.tensor(IDS)).loss
    loss_t.backward()
    grads_t = {n: p.grad.numpy() for n, p in pm.named_parameters() if p.grad is not None}
    base = lora.strip_adapters(ad)
    mods = lora.adapter_modules(ad)
    fam = registry.family_of_config(cfg)

    def loss(ab):
        tree = lora._copy_dicts(base)
        for path, a in mods.items():
            node = tree
            for p in path:
                node = node[p]
            node[lora.LORA] = {**a, "A": ab[path][0], "B": ab[path][1]}
        logits = fam.module(cfg).apply({"params": tree}, IDS)[0]
        return lm_loss(logits, jnp.asarray(IDS), jnp.ones(IDS.shape, jnp.int32))

    ab = {p: (jnp.asarray(a["A"]), jnp.asarray(a["B"])) for p, a in mods.items()}
    val, g = jax.jit(jax.value_and_grad(loss))(ab)
    np.testing.assert_allclose(float(val), loss_t.item(), rtol=1e-5)
    assert len(grads_t) == 2 * len(mods)
    for path, (gA, gB) in g.items():
        key = "base_model.model." + lora.hf_module_name(cfg, path)
        ta, tb = grads_t[f"{key}.lora_A.default.weight"], grads_t[f"{key}.lora_B.default.weight"]
        np.testing.assert_allclose(np.asarray(gA).T, ta, rtol=1e-5, atol=1e-5 * np.abs(ta).max())
        np.testing.assert_allclose(np.asarray(gB).T, tb, rtol=1e-5, atol=1e-5 * np.abs(tb).max())


def test_adapter_trained_elsewhere_loads(case, tmp_path):
    name, folder, cfg, params = case
    targets = {"gpt2": ["c_attn"], "llama": ["q_proj", "v_proj"], "gpt_neox": ["query_key_value"],
               "gemma2": ["q_proj", "down_proj"]}[name]
    torch.manual_seed(5)
    conf = peft.LoraConfig(r=2, lora_alpha=5, target_modules=targets, lora_dropout=0.1, use_rslora=True,
                           init_lora_weights=False, task_type="CAUSAL_LM")
    pm = peft.get_peft_model(_torch_base(folder), conf).to(torch.bfloat16).to(torch.float32)
    pm.save_pretrained(tmp_path / "peft")
    pm = peft.PeftModel.from_pretrained(_torch_base(folder), str(tmp_path / "peft")).eval()
    with torch.no_grad():
        ref = pm(torch.tensor(IDS)).logits.numpy()
    ad, read = load_adapter(tmp_path / "peft", params, cfg)
    assert read["use_rslora"] and len(lora.adapter_modules(ad)) == len(targets) * cfg.num_layers
    a0 = next(iter(lora.adapter_modules(ad).values()))
    assert float(a0["scale"]) == pytest.approx(5 / np.sqrt(2)) and float(a0["dropout"]) == pytest.approx(0.1)
    np.testing.assert_allclose(_logits(cfg, ad), ref, **_tol(ref))


def test_target_names_per_family(case):
    name, _, cfg, _ = case
    all_ = lora.target_names(cfg, "all-linear")
    assert set(lora.target_names(cfg, "attention")) | set(lora.target_names(cfg, "mlp")) == set(all_)
    if name == "gpt2":
        assert lora.target_names(cfg, "c_proj") == ["attn.c_proj", "mlp.c_proj"]  # PEFT's suffix rule
        assert lora.hf_module_name(cfg, ("h_1", "attn", "c_attn")) == "transformer.h.1.attn.c_attn"
    if name in ("llama", "gemma2"):
        assert lora.target_names(cfg, "q_proj,v_proj") == ["self_attn.q_proj", "self_attn.v_proj"]
        assert lora.module_path_of_hf(cfg, "model.layers.1.mlp.up_proj") == ("layers_1", "mlp", "up_proj")
    with pytest.raises(ValueError, match="names no module"):
        lora.target_names(cfg, "wte")
    assert lora.adapter_param_count(cfg, SPEC) == sum(
        a["A"].size + a["B"].size for a in lora.adapter_modules(lora.add_adapters(case[3], cfg, SPEC, 0)).values())


def test_refused_adapter_configs(case, tmp_path):
    _, _, cfg, params = case
    ad = _trained_like(params, cfg)
    out = save_adapter(ad, cfg, tmp_path / "a", SPEC)
    conf = json.loads((out / "adapter_config.json").read_text())
    for field, value in (("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"]),
                         ("rank_pattern", {"q_proj": 2}), ("peft_type", "IA3")):
        (out / "adapter_config.json").write_text(json.dumps({**conf, field: value}))
        with pytest.raises(ValueError, match=field):
            load_adapter(out, params, cfg)


# -- a foreign adapter's module selection, as PEFT selects (issue: foreign adapters applied as PEFT applies them) --

def _crafted_configs(name, cfg):
    """Adapter configs that select modules by every rule PEFT has: exact names, dotted suffixes, a regular
    expression, ``layers_to_transform`` (with and without ``layers_pattern``), ``exclude_modules``, all-linear."""
    inner = list(lora.TARGETS[name])
    layer = lora.LAYER_PREFIX[name][1]  # e.g. transformer.h.{i}
    pattern = layer.split(".")[-2]      # h / layers
    leaf = [n.split(".")[-1] for n in inner]
    return [
        {"target_modules": [inner[0], "mlp.foo_proj"]},                      # one name matches nothing
        {"target_modules": rf".*\.1\.{re.escape(inner[1])}"},                # a regex over the whole name
        {"target_modules": [leaf[0], leaf[-1]], "layers_to_transform": [1]},  # suffixes in layer 1 only
        {"target_modules": [inner[2]], "layers_to_transform": 0, "layers_pattern": pattern},
        {"target_modules": "all-linear", "exclude_modules": [inner[1]]},
        # an exact full name is selected in every layer PEFT finds it, layers_to_transform notwithstanding
        {"target_modules": [f"{layer.format(i=0)}.{inner[0]}", leaf[-1]], "layers_to_transform": [1]},
    ]


def _peft_selection(folder, conf):
    pm = peft.get_peft_model(_torch_base(folder), peft.LoraConfig(r=2, lora_alpha=4, **conf))
    return {n.removeprefix("base_model.model.") for n, m in pm.named_modules() if hasattr(m, "lora_A")}


def _write_adapter(out, state, conf):
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(conf))
    return out


def test_hf_module_names_are_the_transformers_modules(case):
    _, folder, cfg, _ = case
    names = lora.hf_module_names(cfg)
    assert set(names) == {n for n, _ in _torch_base(folder).named_modules() if n}
    assert {n for n, p in names.items() if p is not None} == {
        lora.hf_module_name(cfg, m) for m in lora.target_modules(cfg, "all-linear")}


def test_foreign_adapter_selects_modules_as_peft(case, tmp_path):
    from safetensors.numpy import load_file

    from rbjax.model.peft_adapter import selected_modules

    name, folder, cfg, params = case
    full = save_adapter(_trained_like(params, cfg), cfg, tmp_path / "full", SPEC)
    base_conf = json.loads((full / "adapter_config.json").read_text())
    state = load_file(str(full / "adapter_model.safetensors"))
    for i, crafted in enumerate(_crafted_configs(name, cfg)):
        conf = {**base_conf, **crafted}
        chosen = selected_modules(conf, cfg)
        assert set(chosen) == _peft_selection(folder, crafted) and chosen, crafted
        # the whole file on a config that selects fewer modules: PEFT would leave the rest unused; refused
        with pytest.raises(ValueError, match="does not select"):
            load_adapter(_write_adapter(tmp_path / f"all{i}", state, conf), params, cfg)
        # the selected modules' tensors only: applied exactly as PEFT applies them
        keep = {k: v for k, v in state.items() if k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] in chosen}
        out = _write_adapter(tmp_path / f"sel{i}", keep, conf)
        ad, _ = load_adapter(out, params, cfg)
        assert {lora.hf_module_name(cfg, p) for p in lora.adapter_modules(ad)} == set(chosen)
        if i == 2:  # one PEFT forward per family (each adapted tree compiles a program of its own)
            pm = peft.PeftModel.from_pretrained(_torch_base(folder), str(out)).eval()
            with torch.no_grad():
                ref = pm(torch.tensor(IDS)).logits.numpy()
            np.testing.assert_allclose(_logits(cfg, ad), ref, **_tol(ref))


def test_foreign_adapter_refusals_name_the_modules(case, tmp_path):
    from safetensors.numpy import load_file

    name, folder, cfg, params = case
    full = save_adapter(_trained_like(params, cfg), cfg, tmp_path / "full", SPEC)
    base_conf = json.loads((full / "adapter_config.json").read_text())
    state = load_file(str(full / "adapter_model.safetensors"))
    # a config that selects no module: PEFT raises NoMatchingPeftModuleError, rbjax refuses (was: applied the file)
    with pytest.raises(peft.utils.error.NoMatchingPeftModuleError):
        _peft_selection(folder, {"target_modules": ["foo_proj"]})
    with pytest.raises(ValueError, match="selects no module"):
        load_adapter(_write_adapter(tmp_path / "none", state, {**base_conf, "target_modules": ["foo_proj"]}),
                     params, cfg)
    # a selected module with no tensor (PEFT: a fresh adapter there)
    first = lora.hf_module_name(cfg, lora.target_modules(cfg, "all-linear")[0])
    part = {k: v for k, v in state.items() if first not in k}
    with pytest.raises(ValueError, match=f"selects {re.escape(first)}.*holds no LoRA matrices"):
        load_adapter(_write_adapter(tmp_path / "miss", part, base_conf), params, cfg)
    # a module rbjax does not adapt (the LM head)
    with pytest.raises(ValueError, match="lm_head, which rbjax does not adapt"):
        load_adapter(_write_adapter(tmp_path / "head", state, {**base_conf, "target_modules": ["lm_head"]}),
                     params, cfg)
    with pytest.raises(ValueError, match="target_modules"):
        load_adapter(_write_adapter(tmp_path / "unset", state, {**base_conf, "target_modules": None}), params, cfg)
