"""Model families (issue 17) — STAND-IN with GPT-2 only, carried by branch i17h until branch i17m's registry lands
(the contract is /work/FAMILY_INTERFACE.md; on merge, i17m's file replaces this one)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from rbjax.model import gpt2


@dataclasses.dataclass(frozen=True)
class Family:
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
    config_class: type = object


def _gpt2_config_from_hf(d: dict, source: str):
    try:
        return gpt2.GPT2Config.from_dict(d)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _hf_params(*a):
    from rbjax.model import hf

    return hf.state_dict_to_params(*a)


def _hf_state(*a):
    from rbjax.model import hf

    return hf.params_to_state_dict(*a)


GPT2 = Family(
    name="gpt2", model_types=("gpt2",), config_from_hf=_gpt2_config_from_hf,
    config_to_hf=lambda c: c.to_hf_dict(), module=gpt2.GPT2LMHeadModel, params_from_hf=_hf_params,
    params_to_hf=_hf_state, lm_head=lambda p: p["wte"]["embedding"], logit_softcap=lambda c: None,
    init_cache=gpt2.init_cache, init_params=gpt2.init_params,
    special_tokens=lambda c: {"bos": c.bos_token_id, "eos": c.eos_token_id, "pad": None},
    config_class=gpt2.GPT2Config)

FAMILIES: dict[str, Family] = {"gpt2": GPT2}


def family_of(config_json: dict, source: str) -> Family:
    mt = config_json.get("model_type", "gpt2")
    for f in FAMILIES.values():
        if mt in f.model_types:
            return f
    supported = sorted(t for f in FAMILIES.values() for t in f.model_types)
    raise ValueError(f"{source}: model_type {mt!r} is not supported; supported: {supported}")


def family_for_config(config) -> Family:
    for f in FAMILIES.values():
        if isinstance(config, f.config_class):
            return f
    raise TypeError(f"no model family for a config of type {type(config).__name__}")
