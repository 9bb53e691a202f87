"""The model families rbjax implements, as one record each (the contract of issue 17, /FAMILY_INTERFACE.md).

A :class:`Family` bundles everything a caller needs to run a causal LM without knowing its architecture: the
config reader/writer for HF ``config.json``, the linen module, the HF key map in both directions, the LM head
matrix, the final-logit soft-cap, the KV cache and random initialisation. :func:`family_of` picks the family from
``config.json``'s ``model_type``. Adding a family is one model module, its key map and one entry in
:data:`FAMILIES`.

=========  ======================  =====================================================================
family     HF model_type           module
=========  ======================  =====================================================================
gpt2       gpt2                    :class:`rbjax.model.gpt2.GPT2LMHeadModel`
llama      llama, mistral, qwen2   :class:`rbjax.model.llama.LlamaForCausalLM`
gpt_neox   gpt_neox                :class:`rbjax.model.gpt_neox.GPTNeoXForCausalLM`
gemma2     gemma2                  :class:`rbjax.model.gemma2.Gemma2ForCausalLM`
=========  ======================  =====================================================================

docs/models.md lists what each family implements and refuses.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

from rbjax.model import gemma2, gpt2, gpt2_keys, gpt_neox, llama
from rbjax.model import hf_config as hc
from rbjax.model.layers import config_special_tokens


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family (see /FAMILY_INTERFACE.md for each member's contract)."""

    name: str
    model_types: tuple[str, ...]
    config_from_hf: Callable[[dict, str], Any]
    config_to_hf: Callable[[Any], dict]
    module: Callable[..., Any]
    params_from_hf: Callable[[dict, Any, str], dict]
    params_to_hf: Callable[[dict, Any], dict]
    lm_head: Callable[[dict], Any]
    logit_softcap: Callable[[Any], float | None]
    init_cache: Callable[..., Any]
    init_params: Callable[[Any, int], dict]
    special_tokens: Callable[[Any], dict]


# ------------------------------------------------------------------------------------------------------ GPT-2

#: GPT2Config fields rbjax reads and implements
GPT2_HANDLED = {"vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
                "layer_norm_epsilon", "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                "bos_token_id", "eos_token_id", "pad_token_id", "scale_attn_weights",
                "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "tie_word_embeddings",
                "add_cross_attention",
                # the sequence-summary head of GPT2DoubleHeadsModel: not part of the causal LM
                "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                "summary_first_dropout"}
#: GPT-2 fields refused for the values given
GPT2_REFUSED = {"tie_word_embeddings": "false (an untied LM head)", "add_cross_attention": "true",
                "activation_function": "activations other than gelu_new, gelu_pytorch_tanh, gelu, relu"}


def _gpt2_config_from_hf(d: dict, source: str) -> gpt2.GPT2Config:
    hc.check_common(d, source)
    hc.warn_unknown(d, GPT2_HANDLED | set(GPT2_REFUSED), source, "gpt2")
    try:
        cfg = gpt2.GPT2Config.from_dict(d)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    hc.read_special_tokens({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                            "pad_token_id": cfg.pad_token_id}, cfg.vocab_size, source, {})
    return cfg


def _gpt2_special(cfg: gpt2.GPT2Config) -> dict:
    return {"bos": cfg.bos_token_id, "eos": cfg.eos_token_id, "pad": cfg.pad_token_id}


GPT2 = Family(
    name="gpt2", model_types=("gpt2",), config_from_hf=_gpt2_config_from_hf,
    config_to_hf=lambda c: c.to_hf_dict(), module=gpt2.GPT2LMHeadModel,
    params_from_hf=lambda state, cfg, source: gpt2_keys.state_dict_to_params(state, cfg, source=source),
    params_to_hf=gpt2_keys.params_to_state_dict, lm_head=lambda p: p["wte"]["embedding"],
    logit_softcap=lambda c: None, init_cache=gpt2.init_cache, init_params=gpt2.init_params,
    special_tokens=_gpt2_special)

LLAMA = Family(
    name="llama", model_types=llama.MODEL_TYPES, config_from_hf=llama.LlamaConfig.from_hf,
    config_to_hf=lambda c: c.to_hf(), module=llama.LlamaForCausalLM, params_from_hf=llama.params_from_hf,
    params_to_hf=llama.params_to_hf, lm_head=llama.lm_head, logit_softcap=lambda c: None,
    init_cache=llama.init_cache, init_params=llama.init_params, special_tokens=config_special_tokens)

GPT_NEOX = Family(
    name="gpt_neox", model_types=("gpt_neox",), config_from_hf=gpt_neox.GPTNeoXConfig.from_hf,
    config_to_hf=lambda c: c.to_hf(), module=gpt_neox.GPTNeoXForCausalLM, params_from_hf=gpt_neox.params_from_hf,
    params_to_hf=gpt_neox.params_to_hf, lm_head=gpt_neox.lm_head, logit_softcap=lambda c: None,
    init_cache=gpt_neox.init_cache, init_params=gpt_neox.init_params, special_tokens=config_special_tokens)

GEMMA2 = Family(
    name="gemma2", model_types=("gemma2",), config_from_hf=gemma2.Gemma2Config.from_hf,
    config_to_hf=lambda c: c.to_hf(), module=gemma2.Gemma2ForCausalLM, params_from_hf=gemma2.params_from_hf,
    params_to_hf=gemma2.params_to_hf, lm_head=gemma2.lm_head,
    logit_softcap=lambda c: c.final_logit_softcapping, init_cache=gemma2.init_cache,
    init_params=gemma2.init_params, special_tokens=config_special_tokens)

#: the registry: family name -> Family
FAMILIES: dict[str, Family] = {f.name: f for f in (GPT2, LLAMA, GPT_NEOX, GEMMA2)}

_BY_MODEL_TYPE = {mt: f for f in FAMILIES.values() for mt in f.model_types}
_BY_CONFIG_CLASS = {gpt2.GPT2Config: GPT2, llama.LlamaConfig: LLAMA, gpt_neox.GPTNeoXConfig: GPT_NEOX,
                    gemma2.Gemma2Config: GEMMA2}


def supported_model_types() -> tuple[str, ...]:
    return tuple(_BY_MODEL_TYPE)


def family_of(config_json: dict, source: str) -> Family:
    """The family of a ``config.json`` dict, by its ``model_type`` (a config without one is GPT-2, as old GPT-2
    checkpoints are).

    Raises:
        ValueError: an unknown ``model_type``, naming ``source`` and listing the supported ones.
    """
    mt = config_json.get("model_type", "gpt2")
    if mt not in _BY_MODEL_TYPE:
        raise ValueError(f"{source}: model_type is {mt!r}; rbjax supports the model types "
                         f"{', '.join(repr(m) for m in _BY_MODEL_TYPE)} (families: {', '.join(FAMILIES)})")
    return _BY_MODEL_TYPE[mt]


def config_fields(model_type: str) -> tuple[set, dict]:
    """``(handled, refused)`` config fields of a ``model_type``: the fields rbjax reads and implements (or that do
    not change the computation, :data:`rbjax.model.hf_config.NO_COMPUTE`), and field → the values refused by name
    (tests/test_families.py checks them against the ``transformers`` config classes)."""
    if model_type == "gpt2":
        handled, refused = GPT2_HANDLED, GPT2_REFUSED
    elif model_type in llama.MODEL_TYPES:
        handled, refused = llama.HANDLED[model_type], llama.REFUSED
    elif model_type == "gpt_neox":
        handled, refused = gpt_neox.HANDLED, gpt_neox.REFUSED
    elif model_type == "gemma2":
        handled, refused = gemma2.HANDLED, gemma2.REFUSED
    else:
        raise ValueError(f"unknown model_type {model_type!r}")
    return set(handled) | set(hc.NO_COMPUTE), dict(refused, **hc.REFUSED_COMMON)


def family_of_config(config: Any) -> Family:
    """The family of a config object (as returned by ``Family.config_from_hf``)."""
    try:
        return _BY_CONFIG_CLASS[type(config)]
    except KeyError:
        raise TypeError(f"not a model config of a registered family: {type(config).__name__}") from None


def make_model(config: Any, dtype=jnp.float32):
    """The linen module of ``config``'s family."""
    return family_of_config(config).module(config, dtype=dtype)
