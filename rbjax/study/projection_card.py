"""The model card of an exported SentenceDebias or INLP run (``rbjax export`` of a ``rbjax debias --method
sentence-debias|inlp`` folder; docs/debiasing.md §10): what was projected, from which pairs, how it is applied (the LM
head ``W·P``), and the LMB before and after when measured. :func:`rbjax.study.export.model_card` hands such runs here
(their numbers carry ``projection``, :func:`projection_numbers`)."""
from __future__ import annotations

import json
from pathlib import Path

from rbjax import __version__

__all__ = ["projection_numbers", "projection_card"]

METHOD_TEXT = {
    "sentence-debias": "SentenceDebias (Liang et al., ACL 2020), as bias-bench (Meade et al., ACL 2022) applies it to "
                       "GPT-2: the top principal direction(s) of the pair-centred, L2-normalised mean final hidden "
                       "states of counterfactual sentence pairs are projected out of the final hidden state",
    "inlp": "INLP, iterative nullspace projection (Ravfogel et al., ACL 2020), as bias-bench (Meade et al., ACL 2022) "
            "applies it to GPT-2, with logistic-regression classifiers: the final hidden state is projected onto the "
            "intersection of the nullspaces of linear classifiers of the group",
}


def projection_numbers(results: dict) -> dict:
    """What the card says of a training-free run, from its ``results.json``."""
    fit = results.get("fit") or {}
    hist = fit.get("history") or []
    return {"method": results.get("method"), "groups": results.get("groups"), "sets": results.get("sets"),
            "source": results.get("source"), "settings": results.get("settings"),
            "dim": (results.get("projection") or {}).get("dim"),
            "removed": (results.get("projection") or {}).get("removed"),
            "pairs_sha256": (results.get("key") or {}).get("pairs"),
            "classifiers": fit.get("classifiers"), "stopped": fit.get("stopped"),
            "last_dev_accuracy": hist[-1].get("dev_accuracy") if hist else None,
            "chance": hist[-1].get("chance") if hist else None}


def _yaml(s: str) -> str:
    return json.dumps(str(s))  # a JSON string is a YAML double-quoted scalar


def _lmb(r: dict | None) -> str:
    if r is None:
        return "not measured"
    if r.get("t_value") is None:
        return f"no test ({r.get('status')})"
    word = r.get("direction") if r.get("significant") else "not significant"
    return f"t = {r['t_value']:.2f}, p = {r['p_value']:.2g} ({word})"


def projection_card(n: dict, license: str) -> str:
    """The card (``README.md``) of an export whose numbers ``n`` (:func:`rbjax.study.export.export_model`'s) carry
    ``n["projection"]`` (:func:`projection_numbers`)."""
    pj, bt = n["projection"], n["bias_type"]
    method = pj["method"]
    base = n.get("base_model") or "unknown"
    hub = isinstance(base, str) and base.count("/") == 1 and not Path(base).exists()
    front = ["---"] + ([f"base_model: {_yaml(base)}"] if hub else []) + [
        f"license: {_yaml(license)}", "language:", "- en", "library_name: transformers", "pipeline_tag: text-generation",
        "tags:"] + [f"- {_yaml(t)}" for t in ("rbjax", "redditbias", "bias-mitigation", "debiasing",
                                               n.get("model_type") or "gpt2", f"debiasing-{method}",
                                               f"bias-{bt}")] + ["---", ""]
    title = base.split("/")[-1] if hub else Path(str(base)).name
    s = pj.get("settings") or {}
    if method == "sentence-debias":
        what = (f"{pj['removed']} direction(s) (k = {s.get('k')}) of the {pj['dim']}-dimensional final hidden state, "
                "the top principal component(s) of the pair-centred representations")
    else:
        what = (f"{pj['removed']} of the {pj['dim']} dimensions of the final hidden state: the row spaces of "
                f"{pj['classifiers']} linear classifier(s) of the group (at most {s.get('iterations')}; stopped: "
                f"{pj['stopped']}; the last classifier's held-out accuracy {pj['last_dev_accuracy']:.3f} against "
                f"chance {pj['chance']:.3f}, ε = {s.get('epsilon')}; held-out share {s.get('dev_fraction')}, seed "
                f"{s.get('seed')})")
    src = pj.get("source") or {}
    L = [f"# {title} debiased for {bt} with {method} (rbjax, no training)", "",
         f"- **Base model**: {base if hub else f'a local model folder ({base})'}",
         f"- **Method**: {METHOD_TEXT.get(method, method)}.",
         f"- **Projected out**: {what}.",
         "- **Where**: the final hidden state h (after the final norm, before the LM head) is replaced by P h at every "
         "position. P is symmetric, so this is folded into the LM head: W ← W·P, a head of its own (untied from the "
         "input embedding, which is the base model's); this folder is therefore a plain Hugging Face model whose "
         "logits are the debiased model's" + (" (Gemma 2's final-logit soft-cap applies after the projected head)"
                                              if n.get("model_type") == "gemma2" else "") + ".",
         f"- **Counterfactual pairs**: {pj['sets']} sets of ({', '.join(pj.get('groups') or [])}) from "
         f"{src.get('pairs') or src.get('corpus')} (sha256 of pairs.csv `{pj.get('pairs_sha256')}`); the projection "
         "itself is `projection.npy` of the run folder.",
         f"- **Bias type**: {bt} (RedditBias, Barikeri et al., ACL 2021)", ""]
    before, after = n["lmb_before"]["records"], n["lmb_after"]["records"]
    L += ["## Language model bias (LMB) before and after", ""]
    if after is None and before is None:
        L.append("Not measured: export with --after (an `rbjax measure` folder of this model) and --baseline.")
    else:
        L += ["| bias type | before | after |", "|---|---|---|"]
        by = {r["bias_type"]: r for r in (before or [])}
        for r in (after or before):
            t = r["bias_type"]
            L.append(f"| {t} | {_lmb(by.get(t))} | {_lmb(r) if after else 'not measured'} |")
        if n.get("comparison") is not None:
            L += ["", "The paired comparison with the base model on the same pairs is in `evidence/`."]
    L += ["", "## Limitations", "",
          "- A linear projection of one state removes what is linearly decodable there, not the bias of the model; "
          "LMB measures bias on RedditBias phrase pairs only.", "",
          "## Files", ""] + [f"- `{f}`: sha256 `{h}`" for f, h in (n.get("files_sha256") or {}).items()]
    L += ["", "## Versions", "", f"Exported by rbjax {__version__} from `{n['source_run']}`.", ""]
    return "\n".join(front + L)
