"""Release-ready debiased models: the HF folder of a finished debiasing run with a model card that carries its
evidence (``rbjax export RUN --out DIR``).

``RUN`` is one of

* a finished ``rbjax debias`` run folder (``results.json`` with status done, ``model/``);
* a sweep folder (``selection.json``): its selected point ``selected_<rule>`` (``--rule``, default ``default``);
* a study's method folder ``OUT/seed<S>/<type>/<method>`` (``rbjax run``): its selected point or single run, with the
  study's test-split LMB and dialog checks of that model and of the starting model.

``DIR`` gets the model files (config, weights, tokenizer with its chat template, ``generation_config.json``) copied
byte for byte — or, with ``adapter_only`` for a run trained with low-rank adapters, its PEFT adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``) —, ``README.md`` (the model card: the
Hugging Face metadata block — YAML front matter with ``base_model``, ``tags``, ``license``, … — then base model,
method and semantics, grid point and selection rule, training data with sha256, LMB before/after on every bias type
with the paired comparison of :mod:`rbjax.lmb.compare`, BBQ before/after where measured with the comparison of
:mod:`rbjax.lmb.bbq_compare`, LMP, DST/CRG where measured, limitations, versions),
``export.json`` (the same numbers, machine-readable) and ``evidence/`` (``compare.json``/``.csv``/``.png`` and the
per-pair changes; ``compare_bbq.json`` for BBQ) when a before/after comparison was possible. ``DIR`` is written whole:
in a temporary folder beside it, put in its place once complete; with ``overwrite`` it replaces an earlier export
there, none of whose files survive.

Every number on the card is read from the run's files (``results.json``, ``config.json``, ``selection.json``,
``lmb.json``, ``<task>.json``) or computed from its per-pair perplexities by :func:`rbjax.lmb.compare.compare_runs`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from rbjax import __version__
from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.digests import file_digest
from rbjax.core.errors import SettingError
from rbjax.core.io import atomic_folder, atomic_write_json, atomic_write_text, read_json, sha256_file
from rbjax.lmb.compare import (ci_label, compare_runs, describe_format, effects_text, fmt_change, json_ready, plural,
                               record_format, short_verdict, write_comparison)
from rbjax.model.chat_template import ADDITIONAL_TEMPLATES_DIR
from rbjax.model.peft_adapter import ADAPTER_CONFIG
from rbjax.lmb.bbq import CONVENTIONS as BBQ_CONVENTIONS
from rbjax.lmb.bbq import SUMMARY_FILE as BBQ_SUMMARY
from rbjax.lmb.bbq_compare import compare_bbq, is_bbq_run, movement_words
from rbjax.study.projection_card import projection_card, projection_numbers
from rbjax.study.report import DIALOG_COLUMNS, _dig, random_model_name

__all__ = ["ExportConfig", "SELECTION_RULES", "resolve_run", "export_model", "model_card"]

#: a sweep's selection rules (docs/debiasing.md): rbjax's default and the reference's
SELECTION_RULES = ("default", "reference")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """What :func:`export_model` (``rbjax export``) exports and how the card is labelled (frozen). Each field's
    ``metadata["help"]`` is its documentation.

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or not a choice (names the field; the CLI shows
            its flag).
    """

    rule: str | None = field(None, "the sweep's selection rule whose point is exported (default: default)",
                             choices=SELECTION_RULES)
    license: str = field("other", "license id for the card's metadata (default: other — the base model's license "
                                  "applies)")
    adapter_only: bool = field(False, "a run trained with --adapter lora: write its adapters as a PEFT folder "
                                      "(adapter_config.json + adapter_model.safetensors, loaded by "
                                      "peft.PeftModel.from_pretrained on the base model) instead of the merged model")

    def __post_init__(self):
        check_types(self)
        if self.rule is not None and self.rule not in SELECTION_RULES:
            raise SettingError("rule", f"must be default or reference, got {self.rule!r}")

    def replace(self, **changes) -> ExportConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the export.
        """
        return replace_settings(self, "export", **changes)

METHOD_TEXT = {
    "lmd": "LMD — language model debiasing with an equalising loss on the target terms (paper §4.1)",
    "add": "ADD — attribute distance debiasing (paper §4.2)",
    "hd": "HD — hard debiasing: projection away from the bias subspace (paper §4.3)",
    "cda": "CDA — counterfactual data augmentation: fine-tuning on the phrases and their target-swapped "
           "counterfactuals (paper §4.4)",
    "lm": "LM — plain language-model fine-tuning on the bias type's phrases (a control, not a debiasing method)",
}


#: the card's "Grid point and selection" of a single run (no sweep): what the paper did for the method
NO_GRID_TEXT = {
    "cda": "No grid: one run with the settings above, as the paper trains CDA (no grid is searched for CDA: it has "
           "no λ to select).",
    "lm": "No grid: one run with the settings above.",
    **{m: "No grid: one run with the settings above, not a point selected on a grid. The paper selects "
          f"{m.upper()}'s batch size, accumulation, λ_LM and λ_D on the valid split from a grid of 54 runs (§5.1; "
          "`rbjax sweep`, whose selected point `rbjax export` exports with its selection)." for m in ("lmd", "add", "hd")},
}


def _lmp_lines(max_lines) -> str:
    """What an LMP figure is of when only part of the Reddit reference was scored (``max_lines``), else nothing."""
    return "" if not max_lines else f" (on the first {max_lines} lines only)"


def _need_done_run(folder: Path) -> dict:
    res = read_json(folder / "results.json")
    if not isinstance(res, dict) or res.get("status") != "done":
        raise ValueError(f"{folder}: not a finished debiasing run (no results.json with status 'done'); finish it "
                         "with the same 'rbjax debias' (or 'rbjax run') command first")
    if res.get("method") == "self-debias":  # nothing to fold: it rescales at decoding time
        raise ValueError(f"{folder}: Self-Debias cannot be exported: it is inference-time only (it rescales the "
                         "next-token distribution with the prefixes' distributions at every step; no weights hold "
                         f"it). Score with the run folder itself (rbjax measure --model {folder})")
    model = folder / "model"
    if not (model / "config.json").is_file():
        raise ValueError(f"{folder}: the run has no exported model ({model}/config.json missing); it was trained "
                         "with --no-export: rerun the same command without it")
    return res


def resolve_run(path: str | os.PathLike, rule: str | None = None) -> dict:
    """What ``RUN`` names: ``{"run": run folder, "results": results.json, "config": config.json, "sweep": folder |
    None, "selection": the chosen rule's selection entry | None, "rule": name | None, "method_folder": folder | None,
    "study": study folder | None}``.

    Raises:
        FileNotFoundError: no such folder. ValueError: a folder that is none of the accepted kinds, an unfinished
        run, or a rule the sweep did not select with.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such run folder")
    sweep = method_folder = None
    if (p / "results.json").exists():
        run = p
        if p.parent.name == "sweep" or (p.parent / "selection.json").exists():
            sweep = p.parent
    elif (p / "selection.json").exists():
        sweep = p
    elif (p / "sweep" / "selection.json").exists():
        sweep, method_folder = p / "sweep", p
    elif (p / "run" / "results.json").exists():
        run, method_folder = p / "run", p
    else:
        raise ValueError(f"{p}: not a debiasing run (results.json), a sweep (selection.json) or a study's method "
                         "folder (seed<S>/<type>/<method> with sweep/ or run/)")
    selection = None
    if sweep is not None:
        sel = read_json(sweep / "selection.json") or {}
        if p == sweep or method_folder is not None:
            rule = rule or "default"
            run = sweep / f"selected_{rule}"
        else:
            rule = run.name[len("selected_"):] if run.name.startswith("selected_") else None
        if rule is not None:
            if not isinstance(sel.get(rule), dict):
                raise ValueError(f"{sweep / 'selection.json'}: no selection by rule {rule!r} (rules: "
                                 f"{', '.join(k for k, v in sel.items() if isinstance(v, dict) and 'point' in v)})")
            selection = sel[rule]
            if not run.is_dir():
                raise ValueError(f"{run}: the sweep's point selected by rule {rule!r} was not retrained and exported "
                                 f"(rerun the sweep with --final {rule})")
    elif rule is not None:
        raise ValueError(f"--rule {rule}: {p} is a single run, not a sweep")
    if method_folder is None:
        cand = run.parent.parent if sweep is not None else run.parent
        if (cand / "lmb_test").is_dir():
            method_folder = cand
    study = None
    if method_folder is not None and len(method_folder.parents) >= 3:
        root = method_folder.parents[2]
        if (root / "study.json").exists() and method_folder.parents[1].name.startswith("seed"):
            study = root
    results = _need_done_run(run)
    return {"run": run, "results": results, "config": read_json(run / "config.json") or {}, "sweep": sweep,
            "selection": selection, "rule": rule, "method_folder": method_folder, "study": study}


def _lmb_before_after(info: dict, before: str | os.PathLike | None, after: str | os.PathLike | None):
    """(before folder | None, after folder | None): explicit ones, else the study's test-split measurements, else
    the run's own valid-split LMB (after only)."""
    mf, study, run = info["method_folder"], info["study"], info["run"]
    if after is None:
        if mf is not None and (mf / "lmb_test" / "lmb.json").exists():
            after = mf / "lmb_test"
        elif (run / "lmb_valid" / "lmb.json").exists():
            after = run / "lmb_valid"
    if before is None and study is not None and (study / "baseline" / "lmb_test" / "lmb.json").exists():
        before = study / "baseline" / "lmb_test"
    return (None if before is None else Path(before)), (None if after is None else Path(after))


def _bbq_before_after(info: dict, before, after) -> tuple[Path | None, Path | None]:
    """(before, after) BBQ run folders: explicit ones (each must be an ``rbjax measure --benchmark bbq`` folder),
    else the study's ``baseline/bbq`` and the method's ``bbq`` where they were measured.

    Raises:
        ValueError: an explicit folder that is not a BBQ run.
    """
    for flag, f in (("--bbq-baseline", before), ("--bbq-after", after)):
        if f is not None and not is_bbq_run(f):
            raise ValueError(f"{flag} {f}: not an 'rbjax measure --benchmark bbq' folder (no bbq benchmark.json)")
    mf, study = info["method_folder"], info["study"]
    if after is None and mf is not None and is_bbq_run(mf / "bbq"):
        after = mf / "bbq"
    if before is None and study is not None and is_bbq_run(study / "baseline" / "bbq"):
        before = study / "baseline" / "bbq"
    return (None if before is None else Path(before)), (None if after is None else Path(after))


def _bbq_numbers(before: Path | None, after: Path | None, comparison: dict | None) -> dict | None:
    """The card's BBQ numbers: each side's overall metrics per convention and the comparison (or ``None``)."""
    if before is None and after is None:
        return None

    def overall(f):
        s = None if f is None else read_json(f / BBQ_SUMMARY)
        return None if s is None else {cv: s[cv]["overall"] for cv in BBQ_CONVENTIONS}

    return {"before": None if before is None else str(before), "after": None if after is None else str(after),
            "before_overall": overall(before), "after_overall": overall(after), "comparison": comparison}


def _bbq_card(b: dict | None) -> list[str]:
    """The card's "BBQ before and after" section (empty without BBQ)."""
    if b is None:
        return []
    L = ["", "## BBQ before and after", "",
         "BBQ (Parrish et al. 2022; rbjax docs/bbq.md), multiple choice by log-likelihood in lm-evaluation-harness's "
         "convention (lm_eval) and the paper's: accuracy on the ambiguous / disambiguated rows, and the bias scores "
         "s_DIS and s_AMB (> 0: the answers follow the stereotype, < 0: they go against it). "
         + (f"Before: `{b['before']}`" if b["before"] else "Before: not measured (export with --bbq-baseline)")
         + (f"; after: `{b['after']}`." if b["after"] else "; after: not measured (export with --bbq-after)."), "",
         "| convention | model | rows | acc_amb | acc_dis | s_DIS | s_AMB |", "|---|---|---|---|---|---|---|"]
    for cv in BBQ_CONVENTIONS:
        for name, o in (("base model", b["before_overall"]), ("this model", b["after_overall"])):
            if o is not None:
                x = o[cv]
                L.append(f"| {cv} | {name} | {x['n_rows']} | {_f(x['accuracy_amb'], '.3f')} | "
                         f"{_f(x['accuracy_disamb'], '.3f')} | {_f(x['disamb_bias_score'], '+.3f')} | "
                         f"{_f(x['amb_bias_score'], '+.3f')} |")
    comp = b["comparison"]
    if comp is None:
        return L
    alpha = comp["settings"]["alpha"]
    L += ["", "Change per category on the same rows (`rbjax compare`; files in `evidence/`): the exact McNemar test "
          "of the per-row correctness, p Bonferroni-corrected across the "
          f"{len(comp['categories'])} categor{'y' if len(comp['categories']) == 1 else 'ies'} (significant: below {alpha:g}); each bias score base → this model with the change and its "
          f"{100 * (1 - alpha):.4g}% paired bootstrap CI, and whether it moved toward zero, past zero or away.", "",
          "| convention | category | acc: base → this (change) | McNemar p (Bonferroni) | s_DIS: base → this "
          "(change [CI]) | s_DIS moved | s_AMB: base → this (change [CI]) | s_AMB moved |",
          "|---|---|---|---|---|---|---|---|"]

    def cell(x, ci=True):
        c = x.get("change_ci")
        v = "+.3f" if ci else ".3f"  # a bias score signed, an accuracy not
        return (f"{_f(x['b'], v)} → {_f(x['a'], v)} ({_f(x['change'], '+.3f')}"
                + (f" [{c[0]:+.3f}, {c[1]:+.3f}]" if ci and c else "") + ")")

    for cv in BBQ_CONVENTIONS:
        for c, blk in comp["categories"].items():
            x, mc = blk[cv], blk[cv]["mcnemar"]
            p = ("n/a (no row changed)" if mc["p_value"] is None else
                 f"{_f(mc['p_value'], '.2g')} ({_f(mc['p_bonferroni'], '.2g')})"
                 + (", significant" if mc["significant"] else ", not significant"))
            L.append(f"| {cv} | {c} | {cell(x['acc'], False)} | {p} | {cell(x['disamb_bias_score'])} | "
                     f"{movement_words(x['disamb_bias_score']['movement'])} | {cell(x['amb_bias_score'])} | "
                     f"{movement_words(x['amb_bias_score']['movement'])} |")
    return L


def _dialog(folder: Path | None) -> dict:
    if folder is None:
        return {}
    return {t: r for t in ("lmp", "dst", "crg") if isinstance(r := read_json(folder / f"{t}.json"), dict)}


def _is_hub_id(source: str | None) -> bool:
    return bool(source) and not Path(source).exists() and source.count("/") == 1 and not source.startswith(
        (".", "/", "~"))


def _yaml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a valid YAML scalar


def _f(x, f=".2f") -> str:
    return "n/a" if x is None else format(x, f)


def _card_numbers(info: dict, before_dir: Path | None, after_dir: Path | None, comparison: dict | None) -> dict:
    res, cfg = info["results"], info["config"]
    c = res.get("config") or {}
    mf, study = info["method_folder"], info["study"]
    data = cfg.get("data") or {}
    files = {}
    for f in data.get("files") or []:
        try:
            files[str(f)] = file_digest(f)
        except OSError:
            files[str(f)] = None
    before = None if before_dir is None else json.loads((before_dir / "lmb.json").read_text())
    after = None if after_dir is None else json.loads((after_dir / "lmb.json").read_text())
    study_cfg = (read_json(study / "study.json") or {}).get("config") if study else None
    model_config = read_json(info["run"] / "model" / "config.json") or {}
    return {
        "method": res.get("method"), "bias_type": res.get("bias_type"), "semantics": res.get("semantics"),
        # the architecture, as config.json names it (a config without one is GPT-2, as the loader reads it)
        "model_type": model_config.get("model_type", "gpt2"),
        "base_model": (cfg.get("model") or {}).get("source") or c.get("model"),
        "base_model_config": (cfg.get("model") or {}).get("config"),
        "random_base_model": (study_cfg or {}).get("study", {}).get("random_model"),
        "seed": c.get("seed"),
        "training": {k: c.get(k) for k in ("epochs", "max_steps", "batch_size", "grad_accum", "learning_rate",
                                           "lambda_lm", "lambda_d", "block_size", "dropout", "precision")}
                    | {"updates": (res.get("training") or {}).get("updates")},
        "grid_point": None if info["selection"] is None else info["selection"].get("point"),
        "selection": None if info["selection"] is None else {
            "rule_name": info["rule"], "rule": info["selection"].get("rule"), "id": info["selection"].get("id"),
            "dev": info["selection"].get("dev"), "lmp": info["selection"].get("lmp"),
            "constraint_met": info["selection"].get("constraint_met"),
            "n_runs": (read_json(info["sweep"] / "selection.json") or {}).get("n_runs"),
            "lmp_max_lines": ((read_json(info["sweep"] / "sweep_settings.json") or {}).get("settings")
                              or {}).get("lmp_max_lines")},
        "training_data": {"source": data.get("source"), "files_sha256": files, "n_lines": data.get("n_lines"),
                          "n_tokens": data.get("n_tokens"), "sha256_tokens": data.get("sha256_tokens"),
                          "run_key_data_digest": (res.get("key") or {}).get("data")},
        "model_files_digest": res.get("model_files"),
        "format": {"debiased": c.get("format") or "raw", "chat": res.get("chat"),
                   "measured_after": _formats(after), "measured_before": _formats(before)},
        "lmb_before": {"folder": None if before_dir is None else str(before_dir), "records": before},
        "lmb_after": {"folder": None if after_dir is None else str(after_dir), "records": after},
        "comparison": None if comparison is None else json_ready(comparison),
        "dialog_after": _dialog(mf / "dialog" if mf is not None else None),
        "dialog_before": _dialog(study / "baseline" / "dialog" if study is not None else None),
        "lmp_run": res.get("lmp"),
        "adapter": res.get("adapter"),
        "versions_training": res.get("versions"),
        "source_run": str(info["run"]),
    }


def _formats(records) -> list[dict] | None:
    """The distinct formats (:func:`rbjax.lmb.compare.record_format`) of an ``lmb.json``'s records."""
    if records is None:
        return None
    out = []
    for r in records:
        f = record_format(r.get("inputs"))
        if f not in out:
            out.append(f)
    return out


def _rec(records, t):
    return next((r for r in records or [] if r["bias_type"] == t), None)


def _lmb_cell(r: dict | None) -> str:
    if r is None:
        return "not measured"
    if r.get("t_value") is None:
        return f"no test ({r.get('status')})"
    sig = r.get("significant")
    word = (r.get("direction") if sig else "not significant")
    return f"t = {_f(r['t_value'])}, p = {_f(r['p_value'], '.2g')} ({word})"


def model_card(n: dict, license: str) -> str:
    """The model card (``README.md``) of an export: :func:`export_model`'s numbers ``n`` as text, with the Hugging Face
    metadata block as YAML front matter."""
    return "\n".join(_card_front_matter(n, license) + _card_head(n) + _card_selection(n) + _card_training_data(n)
                     + _card_lmb(n) + _card_dialog(n) + _bbq_card(n.get("bbq")) + _card_limitations(n)
                     + _card_files_and_versions(n))


def _card_front_matter(n: dict, license: str) -> list[str]:
    """The Hugging Face metadata block (YAML between ``---`` lines): base model, license, library, tags."""
    method, bt = n["method"], n["bias_type"]
    base = n["base_model"] or "unknown"
    adapter_only = n.get("export") == "adapter"
    tags = ["rbjax", "redditbias", "bias-mitigation", "debiasing", n.get("model_type") or "gpt2", f"debiasing-{method}",
            f"bias-{bt}"]
    if n.get("adapter"):
        tags += ["lora", "peft"]
    front = ["---"]
    if _is_hub_id(base):
        front.append(f"base_model: {_yaml_str(base)}")
    front += [f"license: {_yaml_str(license)}", "language:", "- en",
              f"library_name: {'peft' if adapter_only else 'transformers'}",
              "pipeline_tag: text-generation", "tags:"] + [f"- {_yaml_str(t)}" for t in tags] + ["---", ""]
    return front


def _card_head(n: dict) -> list[str]:
    """The title and the list of what the model is: base model, method, semantics, bias type, seed, training,
    LoRA adapters, format."""
    method, bt = n["method"], n["bias_type"]
    base = n["base_model"] or "unknown"
    ad = n.get("adapter")
    adapter_only = n.get("export") == "adapter"
    base_text = base if _is_hub_id(base) else (
        f"a local model folder ({base})" + (f": a random {random_model_name(n['random_base_model'])} "
                                            f"{json.dumps(n['random_base_model'])}" if n["random_base_model"] else ""))
    title = (base.split("/")[-1] if _is_hub_id(base) else
             random_model_name(n["random_base_model"]) if n["random_base_model"] else Path(base).name)
    L = [f"# {title} debiased for {bt} with "
         f"{method.upper()} (rbjax)", ""]
    L += [f"- **Base model**: {base_text}", f"- **Method**: {METHOD_TEXT.get(method, method)}",
          f"- **Semantics**: `{n['semantics']}` (rbjax's `paper` follows the paper's equations; `reference` "
          "reproduces the official PyTorch code; see rbjax docs/debiasing.md)",
          f"- **Bias type**: {bt} (RedditBias, Barikeri et al., ACL 2021)", f"- **Training seed**: {n['seed']}"]
    tr = n["training"]
    L.append("- **Training**: " + ", ".join(f"{k} = {v}" for k, v in tr.items() if v is not None))
    if ad:
        L.append(f"- **Adapters**: LoRA (low-rank adapters) of rank {ad['rank']}, α = {ad['alpha']:g} (scale "
                 f"{ad['scale']:g}{', rsLoRA' if ad.get('rslora') else ''}), dropout {ad['dropout']:g}, on "
                 f"{', '.join(ad['targets'])} of every layer: {ad['trained_parameters']:,} trained parameters; the "
                 f"base model was frozen (stored in {ad['param_dtype']}), its content key `{ad['base_model_key']}`. "
                 + ("These files are the adapters alone (PEFT format): load them with "
                    "`peft.PeftModel.from_pretrained(base_model, this_folder)` on that base model, or score them "
                    "with `rbjax measure --model BASE --adapter this_folder`."
                    if adapter_only else "These files are the merged model (base + adapters)."))
    fm = n.get("format") or {}
    measured = fm.get("measured_after") or fm.get("measured_before")
    trained_on = "raw text (the paper's format)" if fm.get("debiased", "raw") == "raw" else "chat turns"
    ch = fm.get("chat") or {}
    if ch:  # how the phrases were turns: whose, after what, with which template
        bits = [f"each phrase the {ch.get('role', 'assistant')}'s turn"]
        if ch.get("system") is not None:
            bits.append(f"system prompt {ch['system']!r}")
        if ch.get("prompt") is not None:
            bits.append(f"after the user message {ch['prompt']!r}")
        bits.append("end-of-turn token trained" if ch.get("score_end_of_turn") else "end-of-turn token not trained")
        bits.append(f"template sha256 {str(ch.get('template_sha256'))[:12]}…, the template's tokens masked")
        trained_on += " (" + ", ".join(bits) + ")"
    L.append(f"- **Format**: debiased on {trained_on}" + (
        "" if not measured else "; LMB measured as " + "; ".join(describe_format(f) for f in measured)))
    return L


def _card_selection(n: dict) -> list[str]:
    """The grid point a sweep selected and why, or how the method is run without one."""
    if n["grid_point"] is not None:
        s = n["selection"]
        dev = s.get("dev") or {}
        return ["", "## Grid point and selection", "",
                f"Selected among {s.get('n_runs')} grid point(s) by rule `{s['rule_name']}`: {s.get('rule')}.", "",
                "| " + " | ".join(n["grid_point"]) + " |", "|" + "---|" * len(n["grid_point"]),
                "| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in n["grid_point"].values())
                + " |",
                "", f"Dev (valid split) LMB of the selected point: t = {_f(dev.get('t_value'))}, "
                    f"p = {_f(dev.get('p_value'), '.2g')} on {dev.get('n_pairs')} pairs "
                    f"({dev.get('n_pairs_after_outliers')} after the 3σ rule); LMP of the point: "
                    f"{_f(s.get('lmp'), '.2f')}{_lmp_lines(s.get('lmp_max_lines'))}; within the LMP budget: "
                    f"{s.get('constraint_met')}."]
    return ["", "## Grid point and selection", "", NO_GRID_TEXT.get(n["method"], NO_GRID_TEXT["lm"])]


def _card_training_data(n: dict) -> list[str]:
    """The training data: source, size, the token ids' digest and each file's sha256."""
    td = n["training_data"]
    L = ["", "## Training data", "", f"{td['source']}: {td['n_lines']} lines, {td['n_tokens']} tokens "
         f"(sha256 of the token ids: `{td['sha256_tokens']}`).", ""]
    return L + [f"- `{f}`: sha256 `{h}`" for f, h in td["files_sha256"].items()]


def _card_lmb(n: dict) -> list[str]:
    """LMB before and after: what was measured, the paired comparison with the base model, one row per bias
    type."""
    bt = n["bias_type"]
    before, after = n["lmb_before"]["records"], n["lmb_after"]["records"]
    comp = n["comparison"]
    L = ["", "## Language model bias (LMB) before and after", ""]
    if after is None and before is None:
        L.append("Not measured: the run has no LMB of the exported model (export with --after, an `rbjax measure` "
                 "folder of it).")
        return L
    split = (after or before)[0].get("split")
    L.append(f"Paired two-tailed t-test of the perplexities of biased phrases vs their counterfactuals "
             f"({split} split, 3σ outlier pairs removed; t < 0: stereotypical). After: "
             + (f"`{n['lmb_after']['folder']}`" if after is not None else "not measured (export with --after, an "
                "`rbjax measure` folder of this model on the same split)")
             + (f"; before: `{n['lmb_before']['folder']}`." if before is not None else "."))
    L.append("")
    if comp is not None:
        L.append("Change: the paired comparison of the exported model with the base model on the same pairs "
                 "(`rbjax compare`; per pair d = e(debiased) − e(base), e = log ppl(biased) − log "
                 "ppl(counterfactual); d > 0: toward the anti-stereotypical side; mean e: each model's own "
                 "effect on these pairs, with its one-sample t; the verdict says whether the bias moved toward "
                 "zero, past zero or away from it; p Bonferroni-corrected across the "
                 f"{plural(len(comp['types']), 'type')} compared, and the CI of the change at the same "
                 f"family-wise level: {ci_label(comp['ci_level'], len(comp['types']))}; files in `evidence/`).")
    elif before is None:
        L.append("Before: not measured here (export with --baseline, an `rbjax measure` folder of the base model "
                 "on the same split, to add it and the paired comparison).")
    ci_head = "CI" if comp is None else ci_label(comp["ci_level"], len(comp["types"])).split(",")[0]
    L += ["", f"| bias type | before | after | mean e (t): before → after | change [{ci_head}] | p (Bonferroni) "
              "| verdict |", "|---|---|---|---|---|---|---|"]
    by = {r["bias_type"]: r for r in (comp or {}).get("types", [])}
    for r0 in (after or before):
        t = r0["bias_type"]
        r = _rec(after, t)
        c = by.get(t)
        if c is None:
            eff = ch = pc = verdict = "n/a"
        else:
            ci = c.get("mean_change_ci")
            eff = effects_text(c, ("", ""))
            ch = fmt_change(c["mean_change"]) + ("" if not ci else f" [{fmt_change(ci[0])}, {fmt_change(ci[1])}]")
            pc = _f(c["p_corrected"]["ttest"]["bonferroni"], ".2g")
            verdict = short_verdict(c)  # the study report's wording
        L.append(f"| {t}{' (debiased)' if t == bt else ''} | {_lmb_cell(_rec(before, t)) if before else 'n/a'} | "
                 f"{_lmb_cell(r)} | {eff} | {ch} | {pc} | {verdict} |")
    return L


def _card_dialog(n: dict) -> list[str]:
    """Dialog quality of the base model and of this one (LMP, DST, CRG), or this model's LMP alone."""
    da, db = n["dialog_after"], n["dialog_before"]
    L = ["", "## Dialog quality", ""]
    if da or db:
        L += ["| model | " + " | ".join(h for h, t, _ in DIALOG_COLUMNS if t in da or t in db) + " |",
              "|---|" + "---|" * sum(1 for _, t, _ in DIALOG_COLUMNS if t in da or t in db)]
        for name, d in (("base model", db), ("this model", da)):
            if d:
                L.append(f"| {name} | " + " | ".join(
                    _f(_dig((d.get(t) or {}).get("metrics"), path), ".3f")
                    + ("" if t != "lmp" else _lmp_lines(((d.get(t) or {}).get("settings") or {}).get("lmp_max_lines")))
                    for _, t, path in DIALOG_COLUMNS if t in da or t in db) + " |")
    elif n["lmp_run"]:
        L.append(f"LMP (Reddit perplexity, §3.2) of this model: {_f(n['lmp_run'].get('perplexity'), '.3f')}"
                 f"{_lmp_lines(n['lmp_run'].get('max_lines'))}.")
    else:
        L.append("Not measured (no LMP, DST or CRG results with this run).")
    return L


def _card_limitations(n: dict) -> list[str]:
    """What makes this export less than the paper's (fewer steps, a small dev set, a random base model, the dialog
    results' notes), then what LMB does not guarantee."""
    tr = n["training"]
    lim = []
    if tr.get("max_steps") is not None:
        lim.append(f"training stopped after max_steps = {tr['max_steps']} update(s), not the paper's full epochs")
    if n["selection"] and (n["selection"].get("dev") or {}).get("n_pairs") is not None:
        lim.append(f"the selection's dev t is on {n['selection']['dev']['n_pairs']} valid pairs")
    if n["random_base_model"]:
        lim.append(f"the base model is a random {random_model_name(n['random_base_model'])}: this export is a "
                   "pipeline test, not a usable model")
    for d in (n["dialog_after"], n["dialog_before"]):
        for t, r in d.items():
            for x in r.get("notes") or []:
                lim.append(f"{t.upper()}: {x}")
    lim = list(dict.fromkeys(lim))
    L = ["", "## Limitations", ""] + ([f"- {x}" for x in lim] if lim else
                                      ["- LMB measures bias on RedditBias phrase pairs only; it is not a guarantee "
                                       "of unbiased generation."])
    if lim:
        L.append("- LMB measures bias on RedditBias phrase pairs only; it is not a guarantee of unbiased generation.")
    return L


def _card_files_and_versions(n: dict) -> list[str]:
    """Each exported file's sha256, and what exported and trained the model."""
    L = ["", "## Files", ""] + [f"- `{f}`: sha256 `{h}`" for f, h in (n.get("files_sha256") or {}).items()]
    v = n["versions_training"] or {}
    L += ["", "## Versions", "", f"Exported by rbjax {__version__} from `{n['source_run']}`; model files digest "
          f"`{n['model_files_digest']}`. Trained with: " + ", ".join(f"{k} {v[k]}" for k in
                                                                     ("rbjax", "jax", "flax", "optax", "numpy")
                                                                     if v.get(k)) + ".", ""]
    return L


def export_model(run: str | os.PathLike, out_dir: str | os.PathLike, config: ExportConfig | None = None, *,
                 baseline: str | os.PathLike | None = None, after: str | os.PathLike | None = None,
                 bbq_baseline: str | os.PathLike | None = None, bbq_after: str | os.PathLike | None = None,
                 overwrite: bool = False, **settings) -> dict:
    """Export a finished debiasing run (or a sweep's selected point, or a study's method) as an HF folder with a
    model card; see the module docstring.

    Args:
        run: the run, sweep or study method folder.
        out_dir: the folder to write (must not exist or be empty, unless ``overwrite``).
        overwrite: replace an earlier export in ``out_dir`` as a whole. The new export is written in a temporary
            folder beside ``out_dir`` and put in its place only once complete, so no file of the earlier export
            survives (an adapter-only export over a merged one leaves no merged weights, and the reverse no
            ``adapter_config.json``), and a failed export leaves the earlier one untouched. A folder holding
            anything an export did not write (:func:`_not_exported`) is refused even so: nothing else is deleted.
        config: :class:`ExportConfig` — ``rule``, the sweep's selection rule (``default`` or ``reference``) for a
            sweep or study method folder; ``license``, the card's ``license`` (an HF license id; "other" when
            unknown — the base model's license applies).
        **settings: :class:`ExportConfig` fields that override ``config`` (``rule="reference"``); any other name
            is a ``TypeError``.
        baseline: an ``rbjax measure`` folder of the base model (default: the study's ``baseline/lmb_test``).
        after: an ``rbjax measure`` folder of the exported model (default: the study's ``lmb_test`` of the method,
            else the run's ``lmb_valid``).
        bbq_baseline, bbq_after: ``rbjax measure --benchmark bbq`` folders of the base model and of the exported
            model (default: the study's ``baseline/bbq`` and the method's ``bbq``, where measured); with both, the
            card shows their comparison (:func:`rbjax.lmb.bbq_compare.compare_bbq`).
    Returns:
        ``{"out": folder, "card": README.md, "numbers": export.json content}``.
    Raises:
        FileNotFoundError / ValueError: what :func:`resolve_run` raises; an output folder that is not empty (without
        ``overwrite``) or that holds files no export wrote (with it); a
        setting of the wrong type or not a choice (:class:`rbjax.core.errors.SettingError`);
        :class:`rbjax.lmb.compare.MismatchError` when before and after were not measured on the same pairs; a BBQ
        folder that is not a BBQ run, or BBQ runs of different rows.
    """
    cfg = (config or ExportConfig()).replace(**settings)
    info = resolve_run(run, cfg.rule)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        raise ValueError(f"--out {out} exists and is not an empty folder (pass --overwrite to replace an earlier "
                         "export there)")
    if overwrite and out.is_dir() and (other := _not_exported(out)):
        raise ValueError(f"--out {out} holds files that no rbjax export wrote ({', '.join(other[:5])}"
                         f"{', …' if len(other) > 5 else ''}): --overwrite replaces an earlier export as a whole, so "
                         "it would delete them; choose another --out, or move them away first")
    before_dir, after_dir = _lmb_before_after(info, baseline, after)
    comparison = None
    if before_dir is not None and after_dir is not None:
        comparison = compare_runs(after_dir, before_dir, labels=("debiased", "base model"))
    n = _card_numbers(info, before_dir, after_dir, comparison)
    bbq_before, bbq_after = _bbq_before_after(info, bbq_baseline, bbq_after)
    bbq_comp = None
    if bbq_before is not None and bbq_after is not None:
        bbq_comp = compare_bbq(bbq_after, bbq_before, labels=("debiased", "base model"))
    n["bbq"] = _bbq_numbers(bbq_before, bbq_after, bbq_comp)
    model = info["run"] / "model"
    if cfg.adapter_only:
        ad = info["results"].get("adapter") or {}
        if not ad:
            raise ValueError(f"--adapter-only: {info['run']} was not trained with adapters (--adapter lora); export "
                             "the model itself (without --adapter-only)")
        model = info["run"] / "adapter"
        if not (model / ADAPTER_CONFIG).is_file():
            raise ValueError(f"--adapter-only: {model} holds no PEFT adapter ({ADAPTER_CONFIG}); the run was trained "
                             "with --no-export: rerun the same command without it")
    n["export"] = "adapter" if cfg.adapter_only else "model"
    if info["results"].get("training_free"):  # SentenceDebias / INLP: its own card (rbjax.study.projection_card)
        n["projection"] = projection_numbers(info["results"])
    # written whole beside --out, then put in its place: an earlier export there is replaced, never mixed with
    # this one (adapter files beside merged weights make transformers apply the adapter to them); a failure
    # leaves it untouched
    with atomic_folder(out) as tmp:
        for f in sorted(model.iterdir()):  # byte for byte: weights, tokenizer, chat template, generation config
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
            elif f.is_dir():  # additional_chat_templates/
                shutil.copytree(f, tmp / f.name)
        n["files_sha256"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.is_file()}
        if comparison is not None:
            write_comparison(comparison, tmp / "evidence")
        if bbq_comp is not None:
            atomic_write_json(tmp / "evidence" / "compare_bbq.json", bbq_comp)
        card = projection_card(n, cfg.license) if n.get("projection") else model_card(n, cfg.license)
        atomic_write_text(tmp / "README.md", card)
        atomic_write_json(tmp / "export.json", n)
    return {"out": out, "card": out / "README.md", "numbers": n}


#: what an export writes besides the model's files (which its ``export.json`` lists) and their folders
EXPORT_FILES = ("README.md", "export.json", "evidence", ADDITIONAL_TEMPLATES_DIR)


def _not_exported(folder: Path) -> list[str]:
    """The names in ``folder`` that no export wrote (sorted): everything when it has no readable ``export.json``,
    else what is neither one of :data:`EXPORT_FILES` nor a file its ``export.json`` lists."""
    names = sorted(p.name for p in folder.iterdir())
    n = read_json(folder / "export.json")
    if not isinstance(n, dict) or not isinstance(n.get("files_sha256"), dict):
        return names
    return [x for x in names if x not in EXPORT_FILES and x not in n["files_sha256"]]
