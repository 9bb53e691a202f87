"""Low-rank adapters in the PEFT format: ``adapter_config.json`` + ``adapter_model.safetensors``, the folder
``peft.PeftModel.from_pretrained(base, folder)`` loads (and that PEFT writes with ``save_pretrained``).

Key names are PEFT's for a causal LM: ``base_model.model.<HF module name>.lora_A.weight`` ``(r, in)`` and
``….lora_B.weight`` ``(out, r)`` — PyTorch ``nn.Linear`` weights, i.e. rbjax's ``A (in, r)`` and ``B (r, out)``
transposed; the HF module names are the family's (:func:`rbjax.model.lora.hf_module_name`:
``transformer.h.0.attn.c_attn`` for GPT-2, whose ``Conv1D`` layers PEFT adapts with ``fan_in_fan_out``;
``model.layers.0.self_attn.q_proj`` for Llama, Mistral, Qwen2 and Gemma 2; ``gpt_neox.layers.0.attention
.query_key_value`` for GPT-NeoX). The scale is PEFT's: ``lora_alpha / r`` (``/ √r`` with ``use_rslora``).

:func:`save_adapter` writes rbjax's adapters; :func:`load_adapter` reads an adapter folder — rbjax's or one trained
elsewhere with PEFT — onto a base model's parameters (unmerged, :func:`rbjax.model.layers.lora_update`). What the
adapted model computes that rbjax does not implement is refused with the field named (DoRA, adapter biases, modules
saved whole, rank or alpha patterns, adapters on layers that are not a target, e.g. the embeddings).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from rbjax.core.io import atomic_folder, to_json
from rbjax.core.digests import files_key
from rbjax.model.hf import read_safetensors
from rbjax.model.lora import (LORA, LoraSpec, adapter_modules, hf_module_name, module_path_of_hf, target_names)
from rbjax.model.registry import family_of_config

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "save_adapter", "load_adapter", "read_adapter_config",
           "adapter_files_key", "PEFT_PREFIX"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's prefix of a causal LM's adapter keys
PEFT_PREFIX = "base_model.model."


def save_adapter(params: dict, config, folder: str | os.PathLike, spec: LoraSpec, *,
                 base_model: str | None = None) -> Path:
    """Write the adapters of an adapted parameter tree as a PEFT folder (atomically: a temporary folder renamed).

    Args:
        params: the adapted model's parameters (:func:`rbjax.model.lora.add_adapters`; the base is not written).
        config: the model's config (its family names the modules). spec: the adapter's settings (rank, alpha,
            dropout, rsLoRA and targets for ``adapter_config.json``).
        base_model: ``base_model_name_or_path`` of the config (the base model's hub id or folder).

    Returns:
        the folder.

    Raises:
        ValueError: a tree without adapters, or an adapter whose rank or scale is not ``spec``'s.
    """
    mods = adapter_modules(params)
    if not mods:
        raise ValueError("the parameters hold no adapters")
    state = {}
    for path, a in sorted(mods.items()):
        A, B = np.asarray(a["A"], np.float32), np.asarray(a["B"], np.float32)
        if A.shape[1] != spec.rank or not math.isclose(float(np.asarray(a["scale"])), spec.scale, rel_tol=1e-6):
            raise ValueError(f"{'/'.join(path)}: adapter of rank {A.shape[1]} and scale {float(a['scale'])}, not "
                             f"the setting's rank {spec.rank} and scale {spec.scale}")
        name = PEFT_PREFIX + hf_module_name(config, path)
        state[f"{name}.lora_A.weight"] = np.ascontiguousarray(A.T)
        state[f"{name}.lora_B.weight"] = np.ascontiguousarray(B.T)
    fam = family_of_config(config).name
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
           "r": spec.rank, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout, "use_rslora": spec.rslora,
           "target_modules": target_names(config, spec.targets), "bias": "none",
           "fan_in_fan_out": fam == "gpt2", "inference_mode": True, "init_lora_weights": True,
           "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
           "use_dora": False}
    with atomic_folder(folder) as tmp:
        save_file(state, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(to_json(cfg, indent=2) + "\n")
    return Path(folder)


def read_adapter_config(folder: str | os.PathLike) -> dict:
    """``adapter_config.json`` of a PEFT folder, checked for what rbjax implements.

    Raises:
        FileNotFoundError: no such folder or file. ValueError: not a LoRA adapter of a causal LM, or a field whose
            value rbjax does not implement (named, with its value).
    """
    f = Path(folder) / ADAPTER_CONFIG
    if not f.is_file():
        raise FileNotFoundError(f"--adapter {folder}: no {ADAPTER_CONFIG} (not a PEFT adapter folder)")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{f}: invalid JSON ({e})") from None

    def refuse(field: str, why: str):
        return ValueError(f"{f}: {field} = {cfg.get(field)!r}: {why}")

    if cfg.get("peft_type") != "LORA":
        raise refuse("peft_type", "only LoRA adapters are implemented")
    if cfg.get("task_type") not in (None, "CAUSAL_LM"):
        raise refuse("task_type", "rbjax scores causal language models (CAUSAL_LM)")
    if cfg.get("use_dora"):
        raise refuse("use_dora", "DoRA is not implemented")
    if cfg.get("bias", "none") != "none":
        raise refuse("bias", "adapter biases are not implemented (bias must be 'none')")
    if cfg.get("modules_to_save"):
        raise refuse("modules_to_save", "modules saved whole are not implemented")
    for k in ("rank_pattern", "alpha_pattern"):
        if cfg.get(k):
            raise refuse(k, "per-module ranks or alphas are not implemented")
    for k in ("r", "lora_alpha"):
        if not isinstance(cfg.get(k), (int, float)) or isinstance(cfg.get(k), bool) or cfg[k] <= 0:
            raise refuse(k, "must be a positive number")
    for k, ok in (("use_qalora", False), ("lora_bias", False)):
        if cfg.get(k, ok) != ok:
            raise refuse(k, "not implemented")
    return cfg


def load_adapter(folder: str | os.PathLike, params: dict, config) -> tuple[dict, dict]:
    """A PEFT adapter folder on a base model's parameters: ``(adapted params, adapter_config)``. The base's leaves
    are shared, not copied; the adapters are float32 whatever their file dtype.

    Raises:
        FileNotFoundError, ValueError: a missing file; a field rbjax does not implement (:func:`read_adapter_config`);
            a key that is no LoRA matrix of a target module of this family (named); a module with ``lora_A`` but no
            ``lora_B``; a shape that does not fit the base model.
    """
    cfg = read_adapter_config(folder)
    wfile = Path(folder) / ADAPTER_WEIGHTS
    if not wfile.is_file():
        raise FileNotFoundError(f"--adapter {folder}: no {ADAPTER_WEIGHTS}")
    state = read_safetensors(wfile)
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    dropout = float(cfg.get("lora_dropout") or 0.0)
    found: dict[tuple, dict] = {}
    for k, v in state.items():
        name = k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if name.endswith(suffix):
                name = name[:-len(suffix)]
                break
        else:
            raise ValueError(f"{wfile}: {k} is not a LoRA matrix (lora_A.weight / lora_B.weight); rbjax implements "
                             "LoRA on the family's linear layers only")
        try:
            path = module_path_of_hf(config, name)
        except KeyError as e:
            raise ValueError(f"{wfile}: {k}: {e.args[0]}") from None
        found.setdefault(path, {})[part] = np.asarray(v, np.float32)
    out = _copy_dicts(params)
    for path, ab in sorted(found.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"{wfile}: {hf_module_name(config, path)} has {', '.join(ab)} but not both lora_A "
                             "and lora_B")
        node = out
        for p in path:
            node = node[p]
        din, dout = node["kernel"].shape
        A, B = ab["lora_A"].T, ab["lora_B"].T
        if A.shape != (din, r) or B.shape != (r, dout):
            raise ValueError(f"{wfile}: {hf_module_name(config, path)}: lora_A {ab['lora_A'].shape}, lora_B "
                             f"{ab['lora_B'].shape}; the base model and r = {r} need ({r}, {din}) and ({dout}, {r})")
        entry = {"A": np.ascontiguousarray(A), "B": np.ascontiguousarray(B), "scale": np.asarray(scale, np.float32)}
        if dropout > 0:
            entry["dropout"] = np.asarray(dropout, np.float32)
        node[LORA] = entry
    if not found:
        raise ValueError(f"{wfile}: holds no LoRA matrices")
    return out, cfg


def _copy_dicts(tree):
    return {k: _copy_dicts(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def adapter_files_key(folder: str | os.PathLike) -> dict[str, str]:
    """Content key of a PEFT adapter folder: ``{file: sha256}`` of its config and weights."""
    folder = Path(folder)
    return files_key([folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS])
