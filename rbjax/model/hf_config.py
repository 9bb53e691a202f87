"""Reading a Hugging Face ``config.json`` into a family's config: typed fields, refusals by name, RoPE parameters,
special token ids, and the fields that never change a causal LM's computation.

Rule ("no config field is silently ignored"): every field of a family's ``transformers`` config class is
in the family's ``HANDLED`` set (read and implemented), in :data:`NO_COMPUTE` (does not change the forward pass or
the loss: metadata, output switches, heads of other tasks, initialisation), or in the family's ``REFUSED`` map
(field → the condition under which a checkpoint is refused). ``tests/test_families.py`` enumerates the classes.
Keys that are in no set (another ``transformers`` version, custom code) raise a :class:`UserWarning` naming them.
"""
from __future__ import annotations

import dataclasses
import warnings

#: config fields that do not change a causal LM's logits (metadata, output switches, other tasks' heads, init)
NO_COMPUTE = frozenset({
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "id2label", "label2id",
    "problem_type", "output_attentions", "output_hidden_states", "return_dict", "use_cache", "model_type",
    "chunk_size_feed_forward",  # HF feed-forward chunking: the same result in pieces
    "initializer_range",  # initialisation only (rbjax init_params uses it)
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "num_labels",
    "cache_implementation",  # HF's cache class choice (rbjax has its own cache)
    "is_decoder",  # GPT-NeoX: rbjax runs it as a decoder, as GPTNeoXForCausalLM does
    "classifier_dropout",  # sequence-classification head
    "pretraining_tp",  # Llama: tensor-parallel slicing of the same matmuls (v5 ignores it too)
    "attn_implementation", "_attn_implementation_autoset",
    # generation defaults of old configs: rbjax's generation takes its own settings
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k", "top_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "typical_p", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id", "sep_token_id",
    "eos_token_ids", "diversity_penalty", "num_beam_groups", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "output_scores",
    "return_dict_in_generate", "tie_encoder_decoder", "torchscript", "pruned_heads", "cross_attention_hidden_size",
    "encoder_no_repeat_ngram_size", "tf_legacy_loss", "use_bfloat16",
})

#: refused whatever the family: they change the computation in ways no rbjax family implements
REFUSED_COMMON = {
    "quantization_config": "quantised weights are not supported (load the unquantised checkpoint)",
    "auto_map": "custom modelling code (trust_remote_code) is not supported",
    "is_encoder_decoder": "must be false: rbjax runs decoder-only causal LMs",
    "add_cross_attention": "must be false: cross-attention layers are not implemented",
}


def refuse(source: str, field: str, value, why: str) -> ValueError:
    return ValueError(f"{source}: config field {field}={value!r} is not supported by rbjax: {why}")


def check_common(d: dict, source: str) -> None:
    """Refuse the family-independent fields of :data:`REFUSED_COMMON` when set."""
    for k in ("quantization_config", "auto_map"):
        if d.get(k):
            raise refuse(source, k, d[k] if not isinstance(d[k], dict) else "{…}", REFUSED_COMMON[k])
    for k in ("is_encoder_decoder", "add_cross_attention"):
        if d.get(k):
            raise refuse(source, k, d[k], REFUSED_COMMON[k])


def warn_unknown(d: dict, known: set, source: str, family: str) -> None:
    """A :class:`UserWarning` for keys of ``config.json`` that rbjax does not know (none is silently dropped)."""
    unknown = sorted(k for k in d if k not in known and k not in NO_COMPUTE and k not in REFUSED_COMMON)
    if unknown:
        warnings.warn(f"{source}: config fields {unknown} are not read by rbjax's {family} family (not fields of "
                      "the transformers config class it implements); check that they do not change the model",
                      UserWarning, stacklevel=3)


def get_int(d: dict, key: str, default, source: str, *, minimum: int = 1, allow_none: bool = False):
    v = d.get(key, default)
    if v is None and (allow_none or default is None):
        return None
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= minimum):
        raise ValueError(f"{source}: config field {key} must be an integer >= {minimum}, got {v!r}")
    return v


def get_float(d: dict, key: str, default, source: str, *, allow_none: bool = False, positive: bool = False):
    v = d.get(key, default)
    if v is None and allow_none:
        return None
    if not (isinstance(v, (int, float)) and not isinstance(v, bool)) or (positive and not v > 0):
        raise ValueError(f"{source}: config field {key} must be a {'positive ' if positive else ''}number, got {v!r}")
    return float(v)


def get_bool(d: dict, key: str, default: bool, source: str) -> bool:
    v = d.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ValueError(f"{source}: config field {key} must be true or false, got {v!r}")
    return v


def get_activation(d: dict, key: str, default: str, source: str, supported) -> str:
    v = d.get(key, default)
    if v not in supported:
        raise refuse(source, key, v, f"supported activations: {sorted(supported)}")
    return v


@dataclasses.dataclass(frozen=True)
class Rope:
    """RoPE parameters (HF ``rope_parameters``, or the legacy ``rope_theta`` + ``rope_scaling`` fields)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0

    def to_hf(self) -> dict:
        """The legacy fields (``rope_theta``, ``rope_scaling``) that transformers 4.x and 5.x both read."""
        out: dict = {"rope_theta": self.theta}
        if self.type == "default":
            out["rope_scaling"] = None
        elif self.type == "linear":
            out["rope_scaling"] = {"rope_type": "linear", "factor": self.factor}
        else:
            out["rope_scaling"] = {"rope_type": "llama3", "factor": self.factor,
                                   "low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                                   "original_max_position_embeddings": self.original_max_position_embeddings}
        return out


ROPE_TYPES = ("default", "linear", "llama3")


def read_rope(d: dict, source: str, *, max_position_embeddings: int, theta_keys=("rope_theta",),
              partial_keys=(), default_theta: float = 10000.0, default_partial: float = 1.0) -> Rope:
    """RoPE from ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (4.x).

    Raises:
        ValueError: a ``rope_type`` other than default/linear/llama3 (dynamic, yarn, longrope, … change the
            frequencies with the input length or add attention factors rbjax does not implement), or a malformed
            parameter; the message names the field and the value.
    """
    field = "rope_parameters" if d.get("rope_parameters") else "rope_scaling"
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise ValueError(f"{source}: config field {field} must be an object, got {rp!r}")
    if any(isinstance(v, dict) for v in rp.values()):
        raise refuse(source, field, "{per-layer-type dict}", "per-layer RoPE parameters are not implemented")
    theta = None
    for k in theta_keys:
        if d.get(k) is not None:
            theta = d[k]
    theta = rp.get("rope_theta", theta if theta is not None else default_theta)
    partial = default_partial
    for k in partial_keys:
        if d.get(k) is not None:
            partial = d[k]
    partial = rp.get("partial_rotary_factor", partial)
    rtype = rp.get("rope_type", rp.get("type", "default"))
    if rtype not in ROPE_TYPES:
        raise refuse(source, f"{field}.rope_type", rtype,
                     f"supported RoPE types: {', '.join(ROPE_TYPES)} (scaling that depends on the input length or "
                     "rescales attention is not implemented)")
    sub = {"rope_theta": theta, "partial_rotary_factor": partial}
    theta = get_float(sub, "rope_theta", None, source, positive=True)
    partial = get_float(sub, "partial_rotary_factor", None, source, positive=True)
    if partial > 1:
        raise ValueError(f"{source}: config field partial_rotary_factor must be in (0, 1], got {partial}")
    if rtype == "default":
        return Rope(theta=theta, partial_rotary_factor=partial)
    pre = f"{field}."
    factor = get_float({pre + "factor": rp.get("factor")}, pre + "factor", None, source, positive=True)
    if rtype == "linear":
        return Rope(theta=theta, type="linear", factor=factor, partial_rotary_factor=partial)
    vals = {pre + k: rp.get(k) for k in ("low_freq_factor", "high_freq_factor")}
    low = get_float(vals, pre + "low_freq_factor", None, source, positive=True)
    high = get_float(vals, pre + "high_freq_factor", None, source, positive=True)
    if not high > low:
        raise ValueError(f"{source}: config field {field} needs high_freq_factor > low_freq_factor, got {high}, {low}")
    orig = rp.get("original_max_position_embeddings", max_position_embeddings)
    orig = get_int({pre + "original_max_position_embeddings": orig}, pre + "original_max_position_embeddings",
                   None, source)
    return Rope(theta=theta, type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                original_max_position_embeddings=orig, partial_rotary_factor=partial)


def read_special_tokens(d: dict, vocab_size: int, source: str, defaults: dict) -> dict:
    """``{"bos": id|None, "eos": id|tuple|None, "pad": id|None}`` from ``bos_token_id``/``eos_token_id``/
    ``pad_token_id``, each checked against the vocabulary (an eos id outside it makes generation read a row of the
    logits that does not exist: NaN).

    Raises:
        ValueError: naming the field, the id and the vocabulary size.
    """
    out = {}
    for name in ("bos", "eos", "pad"):
        key = f"{name}_token_id"
        v = d.get(key, defaults.get(name))
        ids = v if isinstance(v, list) else [v]
        for i in ids:
            if i is None:
                continue
            if not (isinstance(i, int) and not isinstance(i, bool)):
                raise ValueError(f"{source}: config field {key} must be an integer token id or null, got {v!r}")
            if not 0 <= i < vocab_size:
                raise ValueError(f"{source}: config field {key}={v!r} is outside the vocabulary "
                                 f"(vocab_size={vocab_size}); fix {key} in config.json")
        out[name] = tuple(v) if isinstance(v, list) else v
    return out


def hf_id(v):
    """A special-token field as config.json stores it (tuples back to lists)."""
    return list(v) if isinstance(v, tuple) else v
