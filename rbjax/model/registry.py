"""The model families rbjax implements, as one record each (docs/models.md).

A :class:`Family` bundles everything a caller needs to run a causal LM without knowing its architecture: the
config reader/writer for HF ``config.json``, the linen module, the HF key map in both directions, the LM head
matrix, the final-logit soft-cap, the KV cache, random initialisation and the special token ids. :func:`family_of`
picks the family from ``config.json``'s ``model_type``. The rotary families share one implementation of each
member (the methods of :class:`Family`, on :mod:`rbjax.model.layers` and :mod:`rbjax.model.keymap`), so adding one
is a model module (config class, linen module, ``hf_keys``, ``HANDLED`` / ``REFUSED``) and one entry in
:data:`FAMILIES` naming only what differs; GPT-2, with its own cache and key map, overrides the methods.

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
import re
from typing import Any, Callable

import jax.numpy as jnp

from rbjax.model import gemma2, gpt2, gpt2_keys, gpt_neox, keymap, llama
from rbjax.model import hf_config as hc
from rbjax.model.layers import config_special_tokens, embedding_head, init_kv_cache, normal_init_params

#: HF buffers that are not parameters, which some older rotary checkpoints saved
ROTARY_BUFFERS = re.compile(r"rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: what it declares (the fields) and what every caller uses (the methods).

    Attributes:
        name: the family's name. model_types: the ``config.json`` ``model_type`` values it reads.
        config_class: the frozen config dataclass, with ``from_hf(d, source)`` and ``to_hf()``.
        module: the linen module class, ``module(config, dtype=...)``.
        hf_keys: ``config → [(HF state-dict key, parameter path, transposed)]``, the key map
            (:mod:`rbjax.model.keymap`).
        embedding, head: parameter names of the input embedding and of the untied output matrix (the LM head is
            the head when the checkpoint has one, else the tied embedding).
        tied_hf_keys: ``(embedding key, head key)`` of a state dict: a tied checkpoint may hold both, equal.
        ignored_hf_keys: state-dict keys that are buffers, not parameters (skipped on load).
        hf_renames: ``(key, the key the map uses)`` pairs applied on load (another ``transformers`` version's name).
        kv_heads_field: the config field with the number of key/value heads (the KV cache's width).
        logit_softcap_field: the config field of the final-logit soft-cap, or ``None`` (no soft-cap).
    """

    name: str
    model_types: tuple[str, ...]
    config_class: type
    module: type
    hf_keys: Callable[[Any], list] | None = None
    embedding: str = "embed_tokens"
    head: str = "lm_head"
    tied_hf_keys: tuple[str, str] = ("model.embed_tokens.weight", "lm_head.weight")
    ignored_hf_keys: re.Pattern | None = ROTARY_BUFFERS
    hf_renames: tuple[tuple[str, str], ...] = ()
    kv_heads_field: str = "num_key_value_heads"
    logit_softcap_field: str | None = None

    def config_from_hf(self, d: dict, source: str) -> Any:
        """The config of a ``config.json`` dict (``source`` names it in errors). Raises ValueError."""
        return self.config_class.from_hf(d, source)

    def config_to_hf(self, config) -> dict:
        """The ``config.json`` content ``transformers`` reads."""
        return config.to_hf()

    def lm_head(self, params: dict) -> Any:
        """(V, d) output matrix: the untied head, or the tied input embedding."""
        return embedding_head(params, self.head, self.embedding)

    def logit_softcap(self, config) -> float | None:
        """The final-logit soft-cap (``None``: none)."""
        return None if self.logit_softcap_field is None else getattr(config, self.logit_softcap_field)

    def init_cache(self, config, batch_size: int, max_length: int, dtype=jnp.float32):
        """An empty KV cache: per layer (B, S, key/value heads, head_dim) — a grouped-query cache is KV/H the size."""
        return init_kv_cache(config.num_hidden_layers, getattr(config, self.kv_heads_field), config.head_dim,
                             batch_size, max_length, dtype)

    def init_params(self, config, seed: int = 0) -> dict:
        """Random parameters, N(0, initializer_range) as ``transformers`` initialises the family (norms at their
        identity)."""
        return normal_init_params(self.module(config), seed)

    def special_tokens(self, config) -> dict:
        """``{"bos", "eos", "pad"}`` token ids of the config (``None`` where unset; eos may be a list)."""
        return config_special_tokens(config)

    def params_from_hf(self, state: dict, config, source: str) -> dict:
        """Params (float32 numpy, or lazy slices) from a flat HF state dict.

        Raises:
            ValueError: naming ``source`` and the missing, unexpected or mis-shaped keys, or a tied head that
                differs from the embedding.
        """
        state = dict(state)
        for old, new in self.hf_renames:
            if old in state and new not in state:
                state[new] = state.pop(old)
        if config.tie_word_embeddings:
            keymap.tied_head(state, *self.tied_hf_keys, source)
        return keymap.from_hf(state, self.hf_keys(config), keymap.expected_shapes(self.module(config)), source,
                              getattr(config, "model_type", self.name), self.ignored_hf_keys)

    def params_to_hf(self, params: dict, config) -> dict:
        """The flat HF state dict (float32 numpy) that ``transformers.AutoModelForCausalLM`` loads."""
        return keymap.to_hf(params, self.hf_keys(config))


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
GPT2_REFUSED = {"add_cross_attention": "true",
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


@dataclasses.dataclass(frozen=True)
class _GPT2Family(Family):
    """GPT-2: its own config reader (:data:`GPT2_HANDLED` / :data:`GPT2_REFUSED`), key map
    (:mod:`rbjax.model.gpt2_keys`, Conv1D kernels), KV cache and initialisation; the head is ``wte`` or, untied,
    ``lm_head``."""

    def config_from_hf(self, d: dict, source: str) -> gpt2.GPT2Config:
        return _gpt2_config_from_hf(d, source)

    def config_to_hf(self, config) -> dict:
        return config.to_hf_dict()

    def lm_head(self, params: dict) -> Any:
        return embedding_head(params, self.head, self.embedding)

    def init_cache(self, config, batch_size: int, max_length: int, dtype=jnp.float32):
        return gpt2.init_cache(config, batch_size, max_length, dtype)

    def init_params(self, config, seed: int = 0) -> dict:
        return gpt2.init_params(config, seed)

    def params_from_hf(self, state: dict, config, source: str) -> dict:
        return gpt2_keys.state_dict_to_params(state, config, source=source)

    def params_to_hf(self, params: dict, config) -> dict:
        return gpt2_keys.params_to_state_dict(params, config)


GPT2 = _GPT2Family(name="gpt2", model_types=("gpt2",), config_class=gpt2.GPT2Config, module=gpt2.GPT2LMHeadModel, embedding="wte")

LLAMA = Family(name="llama", model_types=llama.MODEL_TYPES, config_class=llama.LlamaConfig,
               module=llama.LlamaForCausalLM, hf_keys=llama.hf_keys)

GPT_NEOX = Family(name="gpt_neox", model_types=("gpt_neox",), config_class=gpt_neox.GPTNeoXConfig,
                  module=gpt_neox.GPTNeoXForCausalLM, hf_keys=gpt_neox.hf_keys, embedding="embed_in",
                  head="embed_out", tied_hf_keys=("gpt_neox.embed_in.weight", "embed_out.weight"),
                  ignored_hf_keys=gpt_neox.IGNORED_HF_KEYS,
                  # transformers 5 saves Pythia's embed_out as lm_head
                  hf_renames=(("lm_head.weight", "embed_out.weight"),), kv_heads_field="num_attention_heads")

GEMMA2 = Family(name="gemma2", model_types=("gemma2",), config_class=gemma2.Gemma2Config,
                module=gemma2.Gemma2ForCausalLM, hf_keys=gemma2.hf_keys,
                logit_softcap_field="final_logit_softcapping")

#: the registry: family name -> Family
FAMILIES: dict[str, Family] = {f.name: f for f in (GPT2, LLAMA, GPT_NEOX, GEMMA2)}

_BY_MODEL_TYPE = {mt: f for f in FAMILIES.values() for mt in f.model_types}
_BY_CONFIG_CLASS = {f.config_class: f for f in FAMILIES.values()}


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
