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
import re
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from rbjax.core.io import atomic_folder, to_json
from rbjax.core.digests import files_key
from rbjax.core.keys import digest
from rbjax.model.hf import read_safetensors, weight_files
from rbjax.model.lora import LORA, LoraSpec, adapter_modules, hf_module_name, hf_module_names, target_names
from rbjax.model.registry import family_of_config

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "save_adapter", "load_adapter", "read_adapter_config",
           "adapter_files_key", "PEFT_PREFIX", "selected_modules", "base_weights_key", "recorded_base_key",
           "check_adapter_base", "OtherBaseError", "BASE_KEY_METADATA"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's prefix of a causal LM's adapter keys
PEFT_PREFIX = "base_model.model."
#: the safetensors metadata entry in which rbjax records its adapter's base (:func:`base_weights_key`); PEFT ignores it
BASE_KEY_METADATA = "rbjax_base_weights_sha256"


class OtherBaseError(ValueError):
    """An rbjax adapter scored on a base whose weights are not those it was trained on."""


def base_weights_key(folder: str | os.PathLike) -> str:
    """The content key of a base model's weights: sha256 over ``{file: sha256}`` of its weight files (every shard;
    :func:`rbjax.model.hf.weight_files`). ``config.json`` and the tokenizer files are left out, so a base re-saved
    with another ``transformers`` version or tokenizer keeps its key while other weights never share it."""
    return digest(files_key(weight_files(folder)))


def save_adapter(params: dict, config, folder: str | os.PathLike, spec: LoraSpec, *,
                 base_model: str | None = None, base_key: str | None = None) -> Path:
    """Write the adapters of an adapted parameter tree as a PEFT folder (atomically: a temporary folder renamed).

    Args:
        params: the adapted model's parameters (:func:`rbjax.model.lora.add_adapters`; the base is not written).
        config: the model's config (its family names the modules). spec: the adapter's settings (rank, alpha,
            dropout, rsLoRA and targets for ``adapter_config.json``).
        base_model: ``base_model_name_or_path`` of the config (the base model's hub id or folder: give an absolute
            path, so that ``AutoPeftModelForCausalLM`` finds it from any folder).
        base_key: :func:`base_weights_key` of the base, recorded in the weights file's metadata
            (:data:`BASE_KEY_METADATA`) so that :func:`check_adapter_base` can tell another base apart.

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
        meta = {"format": "pt", **({BASE_KEY_METADATA: base_key} if base_key else {})}
        save_file(state, str(tmp / ADAPTER_WEIGHTS), metadata=meta)
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
    if cfg.get("target_parameters"):
        raise refuse("target_parameters", "adapters on parameters (not modules) are not implemented")
    if cfg.get("layer_replication"):
        raise refuse("layer_replication", "not implemented")
    tm = cfg.get("target_modules")
    if not (isinstance(tm, str) or (isinstance(tm, list) and all(isinstance(t, str) for t in tm))) or not tm:
        raise refuse("target_modules", "must name the adapted modules (a list of names or a regular expression); "
                                       "rbjax does not fill in PEFT's per-model-type default")
    ex = cfg.get("exclude_modules")
    if ex is not None and not (isinstance(ex, str) or (isinstance(ex, list) and all(isinstance(t, str) for t in ex))):
        raise refuse("exclude_modules", "must be a list of names or a regular expression")
    lt = cfg.get("layers_to_transform")
    if lt is not None and not (isinstance(lt, int) or (isinstance(lt, list) and all(isinstance(i, int) for i in lt))):
        raise refuse("layers_to_transform", "must be a layer index or a list of them")
    return cfg


def _layer_index(cfg: dict, key: str) -> int | None:
    """PEFT's layer index of a module name for ``layers_to_transform``: the first numbered segment (after one of
    ``layers_pattern``'s names, when given)."""
    pattern = cfg.get("layers_pattern")
    if not pattern:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        m = None
        for pat in ([pattern] if isinstance(pattern, str) else pattern):
            m = re.match(rf"(?:^|.*?\.){pat}\.(?P<idx>\d+)\.", key)
            if m is not None:
                break
    return None if m is None else int(m.group("idx"))


def _peft_selects(cfg: dict, targets, key: str) -> bool:
    """Whether PEFT (``check_target_module_exists``) adapts the module named ``key`` under ``cfg``: ``exclude_modules``
    first (a regular expression matching the whole name, or names matched exactly or as a dotted suffix), then
    ``targets`` — a regular expression matching the whole name; or a list, where an exact name is selected in every
    layer and a dotted suffix only in the layers of ``layers_to_transform`` (``layers_pattern``), when given."""
    ex = cfg.get("exclude_modules")
    if ex:
        if isinstance(ex, str):
            if re.fullmatch(ex, key):
                return False
        elif key in ex or any(key.endswith(f".{e}") for e in ex):
            return False
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None
    if key in targets:
        return True
    if not any(key.endswith(f".{t}") for t in targets):
        return False
    layers = cfg.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    idx = _layer_index(cfg, key)
    return idx is not None and (idx == layers if isinstance(layers, int) else idx in layers)


def selected_modules(cfg: dict, config) -> list[str]:
    """The HF module names of ``config``'s model that an adapter config selects, as PEFT selects them: its
    ``target_modules`` (a list of names matched exactly or as a dotted suffix, or one regular expression matching the
    whole name; ``"all-linear"``: every linear layer but the LM head), ``layers_to_transform`` and
    ``layers_pattern``, ``exclude_modules`` (peft ``tuners_utils.check_target_module_exists``), over every module
    of the ``transformers`` model (:func:`rbjax.model.lora.hf_module_names`), in the model's order."""
    modules = hf_module_names(config)
    targets = cfg["target_modules"]
    if isinstance(targets, str) and targets.lower() == "all-linear":
        # PEFT replaces it by the full names of the linear layers, the output embedding excluded: for every family
        # rbjax implements, exactly its adapter targets
        targets = [n for n, path in modules.items() if path is not None]
    return [n for n in modules if _peft_selects(cfg, targets, n)]


def _describe_selection(cfg: dict) -> str:
    parts = [f"target_modules = {cfg.get('target_modules')!r}"]
    for k in ("layers_to_transform", "layers_pattern", "exclude_modules"):
        if cfg.get(k) not in (None, [], ""):
            parts.append(f"{k} = {cfg[k]!r}")
    return ", ".join(parts)


def _short(names, n: int = 4) -> str:
    names = list(names)
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def load_adapter(folder: str | os.PathLike, params: dict, config) -> tuple[dict, dict]:
    """A PEFT adapter folder on a base model's parameters: ``(adapted params, adapter_config)``, applied exactly as
    ``peft.PeftModel.from_pretrained`` applies it, or refused. The base's leaves are shared, not copied; the adapters
    are float32 whatever their file dtype.

    The modules adapted are those ``adapter_config.json`` selects (:func:`selected_modules`: PEFT's rule for
    ``target_modules``, ``layers_to_transform``/``layers_pattern`` and ``exclude_modules``), and each of them must
    have its ``lora_A`` and ``lora_B`` in the weights file. Where PEFT would compute something else than the file
    says, the folder is refused, the modules named: a config that selects no module of the model (PEFT raises
    ``NoMatchingPeftModuleError``); a selected module rbjax does not adapt (the LM head, an embedding, a norm, a
    container); a tensor of a module the config does not select (PEFT would leave it unused); a selected module
    without tensors (PEFT would give it a freshly initialised adapter).

    Raises:
        FileNotFoundError, ValueError: a missing file; a field rbjax does not implement (:func:`read_adapter_config`);
            a selection or tensor PEFT would apply otherwise (above); a key that is no LoRA matrix; a module with
            ``lora_A`` but no ``lora_B``; a shape that does not fit the base model.
    """
    cfg = read_adapter_config(folder)
    cfile = Path(folder) / ADAPTER_CONFIG
    wfile = Path(folder) / ADAPTER_WEIGHTS
    if not wfile.is_file():
        raise FileNotFoundError(f"--adapter {folder}: no {ADAPTER_WEIGHTS}")
    fam = family_of_config(config).name
    modules = hf_module_names(config)
    chosen = selected_modules(cfg, config)
    if not chosen:
        raise ValueError(f"{cfile}: {_describe_selection(cfg)} selects no module of this {fam} model (PEFT raises "
                         f"NoMatchingPeftModuleError); its adaptable modules are named like "
                         f"{_short(n for n, p in modules.items() if p is not None)}")
    foreign = [n for n in chosen if modules[n] is None]
    if foreign:
        raise ValueError(f"{cfile}: {_describe_selection(cfg)} selects {_short(foreign)}, which rbjax does not "
                         f"adapt (LoRA is implemented on the {fam} family's attention and MLP projections only)")
    state = read_safetensors(wfile)
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    scale = alpha / (math.sqrt(r) if cfg.get("use_rslora") else r)
    dropout = float(cfg.get("lora_dropout") or 0.0)
    found: dict[str, dict] = {}
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
        found.setdefault(name, {})[part] = np.asarray(v, np.float32)
    unselected = [n for n in found if n not in chosen]
    if unselected:
        where = [n for n in unselected if n in modules]
        raise ValueError(f"{wfile}: holds LoRA matrices of {_short(unselected)}, which {cfile.name}'s "
                         f"{_describe_selection(cfg)} does not select"
                         + (" (PEFT would leave them unused)" if len(where) == len(unselected) else
                            f" ({_short(n for n in unselected if n not in modules)} is no module of this {fam} "
                            "model)"))
    missing = [n for n in chosen if n not in found]
    if missing:
        raise ValueError(f"{cfile}: {_describe_selection(cfg)} selects {_short(missing)}, but {wfile.name} holds no "
                         "LoRA matrices for it (PEFT would give it a freshly initialised adapter)")
    out = _copy_dicts(params)
    for name in chosen:
        ab, path = found[name], modules[name]
        if set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"{wfile}: {name} has {', '.join(ab)} but not both lora_A and lora_B")
        node = out
        for p in path:
            node = node[p]
        din, dout = node["kernel"].shape
        A, B = ab["lora_A"].T, ab["lora_B"].T
        if A.shape != (din, r) or B.shape != (r, dout):
            raise ValueError(f"{wfile}: {name}: lora_A {ab['lora_A'].shape}, lora_B {ab['lora_B'].shape}; the base "
                             f"model and r = {r} need ({r}, {din}) and ({dout}, {r})")
        entry = {"A": np.ascontiguousarray(A), "B": np.ascontiguousarray(B), "scale": np.asarray(scale, np.float32)}
        if dropout > 0:
            entry["dropout"] = np.asarray(dropout, np.float32)
        node[LORA] = entry
    return out, cfg


def recorded_base_key(folder: str | os.PathLike) -> str | None:
    """The base key an rbjax adapter recorded (:data:`BASE_KEY_METADATA`); ``None`` for an adapter written
    elsewhere (PEFT records none)."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / ADAPTER_WEIGHTS), "np") as f:
        return (f.metadata() or {}).get(BASE_KEY_METADATA)


def check_adapter_base(folder: str | os.PathLike, base_folder: str | os.PathLike | None, *,
                       allow_other_base: bool = False) -> dict:
    """Whether an adapter is scored on the base it was trained on: ``{"recorded": key | None, "base": key | None,
    "same": True | False | None}`` (``None``: not known — an adapter written elsewhere, or a base in memory).

    Raises:
        OtherBaseError: the adapter recorded another base's weights (:func:`base_weights_key`) and not
            ``allow_other_base`` (``--allow-other-base``).
    """
    recorded = recorded_base_key(folder)
    base = None if base_folder is None else base_weights_key(base_folder)
    same = None if recorded is None or base is None else recorded == base
    if same is False and not allow_other_base:
        try:
            named = json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8")).get(
                "base_model_name_or_path")
        except (OSError, ValueError):
            named = None
        raise OtherBaseError(
            f"--adapter {folder} was trained on other base weights than {base_folder}'s (its base: "
            f"{named or 'not named'}; weights sha256 {recorded[:12]}… recorded, {base[:12]}… here): an adapter on "
            "another base computes another model. Give the base it was trained on, or pass --allow-other-base to "
            "score it on this one anyway (recorded in the results)")
    return {"recorded": recorded, "base": base, "same": same}


def _copy_dicts(tree):
    return {k: _copy_dicts(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def adapter_files_key(folder: str | os.PathLike) -> dict[str, str]:
    """Content key of a PEFT adapter folder: ``{file: sha256}`` of its config and weights."""
    folder = Path(folder)
    return files_key([folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS])
