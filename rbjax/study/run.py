"""``rbjax run STUDY.toml``: the paper's §5 study from the baseline to the report, as keyed, resumable stages.

Stages (in order; folders under ``OUT``)::

    model                         the starting model (only for a [study.random_model]: written to OUT/model)
    baseline/lmb_test             LMB of the starting model on every bias type (test split)         rbjax measure
    baseline/dialog               LMP, DST, CRG of the starting model                                 rbjax evaluate
    seed<S>/sweeps                the grid of every (debias type, method with a grid), selection on
                                  valid, the selected point retrained and exported                   rbjax sweep
    seed<S>/<type>/<method>/run   methods without a grid (CDA): one run with the method's defaults   rbjax debias
                                  (kind "train"); the methods without training (SentenceDebias, INLP,
                                  Self-Debias, docs/debiasing.md §10–11): one run with their defaults, no
                                  grid (kind "debias"; SentenceDebias and Self-Debias, which no seed
                                  changes, under the first seed only)                   rbjax debias --method
    seed<S>/<type>/<method>/sweep      a method without training with a grid of its own ([sweep] methods and k,
                                  inlp_iterations or decay_constant): a run per value, each measured on the
                                  valid split (dev LMB, LMP), selected by the sweeps' rule, the selected
                                  value run again into sweep/selected_<rule> (kind "debias")
    seed<S>/<type>/<method>/lmb_test   the debiased model measured on ALL bias types (test split)
    seed<S>/<type>/<method>/dialog     LMP, DST, CRG of the debiased model (Self-Debias: LMP and CRG with the
                                       rescaled distribution, no DST — its classifier never reads the next-token
                                       distribution, rbjax evaluate refuses it; the report says so)
    baseline/<benchmark>, seed<S>/<type>/<method>/<benchmark>
                                  [benchmarks]: CrowS-Pairs (crows-pairs), each pair file (pairs-<stem>) and
                                  BBQ (bbq) on the starting model and on every debiased
                                  model                                                  rbjax measure --benchmark
    report                        OUT/report.md, OUT/report.html (rbjax.study.report)

Every stage has a key: the content of what it reads (model files, the upstream stage's outputs) and its settings.
``OUT/stages.json`` records each finished stage's key; a rerun skips a stage whose key is unchanged, and reruns a
stage (and, through the keys, only the stages after it that read its outputs) when anything it depends on changed.
Inside a stage the work is keyed too (per bias type, per grid point, per finished run), so a study killed during a
sweep resumes at the next unfinished point.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from rbjax.core.interrupt import Interrupted
from rbjax.core.io import atomic_write_json, check_output_dir, sha256_file, versions
from rbjax.core.keys import canonical, digest
from rbjax.core.log import get_logger
from rbjax.core.mesh import mesh_product
from rbjax.core.reuse import KeyedEntries
from rbjax.debias.config import DebiasRun
from rbjax.debias.run import debias
from rbjax.debias.self_debias import METHOD as SELF_DEBIAS
from rbjax.debias.self_debias import SelfDebiasRun, run_self_debias
from rbjax.debias.sweep import grid_memory_plan, grid_points, run_sweeps
from rbjax.debias.training_free import TRAINING_FREE_METHODS as TRAINING_FREE
from rbjax.debias.training_free import ProjectionRun, run_training_free
from rbjax.dialog.evaluate import evaluate
from rbjax.data.bbq import bbq_files, git_blob_sha1
from rbjax.data.pairs import crows_pairs_manifest, read_pair_file
from rbjax.lmb.bbq import measure_bbq
from rbjax.lmb.config import MeasureConfig
from rbjax.lmb.measure import measure_bias
from rbjax.lmb.pair_benchmark import measure_pair_benchmark
from rbjax.model.gpt2 import GPT2Config
from rbjax.model.handle import ModelHandle, has_tokenizer_files, tokenizer_files_key
from rbjax.model.hf import resolve_model_dir, save_pretrained
from rbjax.model.memory import flops_per_token
from rbjax.model.self_debias import CATEGORY_PREFIXES, default_prefixes
from rbjax.model.registry import family_of_config
from rbjax.model.chat import ChatSettings
from rbjax.study.tuning import PointEvaluation, select_no_training, write_selection
from rbjax.study.config import NO_TRAINING_METHODS, SEED_FREE_METHODS, StudyConfig
from rbjax.study.report import write_report

__all__ = ["Stage", "plan_study", "run_study", "estimate_cost", "chat_context_tokens", "study_format", "format_plan", "StageResult"]

log = get_logger("run")


@dataclasses.dataclass
class Stage:
    """One step of a study: ``run()`` does the work (keyed inside), ``key()`` says what it depends on (called once
    the stages it reads from are done)."""

    name: str
    kind: str
    folder: Path
    run: Callable[[], dict]
    key: Callable[[], dict]
    training_runs: int = 0
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StageResult:
    name: str
    status: str  # "ran" | "skipped"
    seconds: float
    summary: dict




def _model_digest(folder: str | Path) -> str:
    return ModelHandle.open(folder).digest


class _Study:
    """Builds the stage list of a study (closures over the config and the output folder)."""

    def __init__(self, cfg: StudyConfig, out: Path, progress: bool):
        self.cfg, self.out, self.progress = cfg, out, progress

    # -- model --------------------------------------------------------------------------------------------------
    @property
    def model(self) -> str:
        return str(self.out / "model") if self.cfg.random_model else self.cfg.model

    def _tok_for(self, model_dir: str | Path) -> str | None:
        p = Path(model_dir)
        return None if p.is_dir() and has_tokenizer_files(p) else self.cfg.tokenizer

    def _make_random_model(self) -> dict:
        """A seeded random model of any family: the table is a ``config.json`` (``model_type`` picks the family;
        GPT-2 without one) plus ``seed``."""
        seed = int(self.cfg.random_model.get("seed", 0))
        config = self.cfg.random_model_config()
        fam = family_of_config(config)
        if not self.cfg.tokenizer:
            raise ValueError(f"{self.cfg.path}: a random_model needs [study] tokenizer (e.g. the GPT-2 BPE files)")
        tok = resolve_model_dir(self.cfg.tokenizer)
        save_pretrained(fam.init_params(config, seed), config, self.out / "model", tokenizer_dir=tok)
        return {"folder": str(self.out / "model"), "config": fam.config_to_hf(config), "seed": seed}

    def _random_model_key(self) -> dict:
        tok = resolve_model_dir(self.cfg.tokenizer) if self.cfg.tokenizer else None
        return {"random_model": self.cfg.random_model, "tokenizer": tokenizer_files_key(tok) if tok else None}

    # -- common settings ----------------------------------------------------------------------------------------
    def _train_base(self, method: str, bias_type: str, seed: int, out_dir: Path):

        kw = {"model": self.model, "tokenizer": self.cfg.tokenizer, "data_dir": self.cfg.data_dir,
              "semantics": self.cfg.semantics, "precision": self.cfg.precision, "progress": self.progress,
              "mesh": self.cfg.mesh, **self.cfg.chat, **self.cfg.training}
        kw.update(method=method, bias_type=bias_type, seed=seed, out_dir=str(out_dir),
                  eval_bias=",".join(self.cfg.bias_types))
        return DebiasRun.from_flat(kw)

    def _grid_methods(self) -> list[str]:
        """The trained methods with a grid (``rbjax sweep``)."""
        return [m for m in self.cfg.methods if m in self.cfg.sweep["methods"] and m not in NO_TRAINING_METHODS]

    def _no_training_grid(self, method: str) -> bool:
        """A method without training that has a grid of its own (:meth:`StudyConfig.no_training_grid`)."""
        return self.cfg.no_training_grid(method) is not None

    def _single_methods(self) -> list[str]:
        return [m for m in self.cfg.methods if m not in self.cfg.sweep["methods"] and m not in NO_TRAINING_METHODS]

    def _no_training_methods(self, seed: int) -> list[str]:
        """The methods without training run under ``seed`` (those no seed changes: under the first seed only)."""
        return [m for m in self.cfg.methods if m in NO_TRAINING_METHODS
                and (m not in SEED_FREE_METHODS or seed == self.cfg.seeds[0])]

    def _methods_of(self, seed: int) -> list[str]:
        """The methods with a model under ``seed`` (measured, benchmarked, evaluated)."""
        return [m for m in self.cfg.methods if m not in NO_TRAINING_METHODS or m in self._no_training_methods(seed)]

    def run_folder(self, seed: int, bias_type: str, method: str) -> Path:
        return self.out / f"seed{seed}" / Path(bias_type).stem / method

    def selected_model(self, seed: int, bias_type: str, method: str) -> Path:
        f = self.run_folder(seed, bias_type, method)
        if method in self._grid_methods():
            return f / "sweep" / f"selected_{self.cfg.sweep['selection']}" / "model"
        if self._no_training_grid(method):  # the selected value's run (Self-Debias: the folder itself)
            sel = f / "sweep" / f"selected_{self.cfg.sweep['selection']}"
            return sel if method == SELF_DEBIAS else sel / "model"
        if method == SELF_DEBIAS:  # no weights: the run folder is the base model with the rescaled distribution
            return f / "run"
        return f / "run" / "model"

    # -- stage bodies -------------------------------------------------------------------------------------------
    def _measure(self, model: str | Path, out_dir: Path) -> dict:

        recs = measure_bias(model=str(model), bias_types=self.cfg.bias_types, config=self.cfg.measure_config(),
                            data_dir=self.cfg.data_dir, tokenizer=self._tok_for(model), out_dir=out_dir,
                            progress=self.progress, resume=True, overwrite=True,
                            log_reuse=False)  # the study owns the folder
        return {"types": [r["bias_type"] for r in recs], "t": {r["bias_type"]: r["t_value"] for r in recs},
                "reused_perplexities": [r["bias_type"] for r in recs if r.get("reused_perplexities")]}

    def _bbq_config(self) -> MeasureConfig:
        """[measure] for BBQ: RedditBias's own settings (split, outlier handling, the phrase's role, user message
        and end-of-turn scoring) at their defaults; the format, system prompt and chat template as the study's."""
        d = MeasureConfig()
        return self.cfg.measure_config().replace(
            **{k: getattr(d, k) for k in ("split", "outlier_removal", "skip_unscorable", "n_std", "ddof", "role",
                                          "prompt", "score_end_of_turn")})

    def _bbq(self, model: str | Path, out_dir: Path, bench: dict) -> dict:
        """BBQ on ``model`` (:func:`rbjax.lmb.bbq.measure_bbq`, both conventions)."""
        s = measure_bbq(str(model), self._bbq_config(), categories=bench["categories"], data_dir=bench["data_dir"],
                        tokenizer=self._tok_for(model), out_dir=out_dir, progress=self.progress, resume=True,
                        overwrite=True)  # the study owns the folder
        o = s["lm_eval"]["overall"]
        return {"categories": s["categories"], "n_rows": s["n_rows"],
                **{k: o[k] for k in ("acc", "amb_bias_score", "disamb_bias_score")}}

    def _benchmark(self, model: str | Path, out_dir: Path, bench: dict) -> dict:
        """A benchmark of [benchmarks] on ``model`` (``split`` is RedditBias's: not a setting of it)."""
        if bench["benchmark"] == "bbq":
            return self._bbq(model, out_dir, bench)
        res = measure_pair_benchmark(
            str(model), bench["benchmark"], self.cfg.measure_config().replace(split=MeasureConfig.split),
            pairs_file=bench["pairs_file"], categories=bench["categories"], data_dir=bench["data_dir"],
            tokenizer=self._tok_for(model), out_dir=out_dir, progress=self.progress, resume=True, overwrite=True,
            log_reuse=False)  # the study owns the folder
        s = res["summary"]
        return {"categories": s["categories"], "pct_stereotype": s["lm_eval"]["overall"]["pct_stereotype"],
                "t": {r["bias_type"]: r["t_value"] for r in res["records"]}}

    def _benchmark_key(self, model: str | Path, bench: dict) -> dict:
        if bench["benchmark"] == "bbq":  # the category files' git blob SHA-1 (FileNotFoundError before a download)
            data = {c: git_blob_sha1(p) for c, p, _ in bbq_files(bench["data_dir"], bench["categories"],
                                                                 download=False)}
            return {"model": _model_digest(model), "measure": self.cfg.measure, "benchmark": "bbq", "data": data,
                    "categories": bench["categories"], "precision": self.cfg.precision,
                    "tokenizer": self.cfg.tokenizer, **self.cfg.chat_key()}
        data = (crows_pairs_manifest()["sha256"] if bench["benchmark"] == "crows-pairs"
                else sha256_file(bench["pairs_file"]))
        return {"model": _model_digest(model), "measure": self.cfg.measure, "benchmark": bench["benchmark"],
                "data": data, "categories": bench["categories"], "precision": self.cfg.precision,
                "tokenizer": self.cfg.tokenizer}

    def _benchmark_stages(self, prefix: str, model_of: Callable[[], str | Path], folder: Path) -> list[Stage]:
        return [Stage(f"{prefix}/{b['name']}", "benchmark", folder / b["name"],
                      (lambda b=b: self._benchmark(model_of(), folder / b["name"], b)),
                      (lambda b=b: self._benchmark_key(model_of(), b)))
                for b in self.cfg.benchmarks()]

    def _dialog_tasks(self, method: str | None = None) -> list[str]:
        """The [dialog] tasks a model of ``method`` is evaluated on (``None``: the baseline): all of them, but DST for
        Self-Debias (rbjax.dialog.evaluate.SELF_DEBIAS_DST)."""
        return [t for t in self.cfg.dialog["tasks"] if not (method == SELF_DEBIAS and t == "dst")]

    def _dialog(self, model: str | Path, out_dir: Path, tasks: list[str] | None = None) -> dict:

        d = self.cfg.dialog
        out = {}
        for task in (d["tasks"] if tasks is None else tasks):
            settings = dict(d.get(task, {}))
            if task == "lmp":
                settings.setdefault("data_dir", self.cfg.data_dir)
            if task == "crg":
                settings.setdefault("data_dir", self.cfg.data_dir)
            settings["mesh"] = self.cfg.mesh  # [study] mesh, as for every stage
            settings.update(self.cfg.dialog_chat(task))  # [study] format, as for every stage
            res = evaluate(task, str(model), out_dir, tokenizer=self._tok_for(model), progress=self.progress,
                           overwrite=True, **settings)  # the study owns its folders (stages keyed on inputs)
            out[task] = {k: res.get(k) for k in ("metrics",) if k in res}
        return out

    def _sweeps(self, seed: int) -> dict:

        s = self.cfg.sweep
        bases = []
        for b in self.cfg.debias_types:
            for m in self._grid_methods():
                folder = self.run_folder(seed, b, m) / "sweep"
                bases.append((self._train_base(m, b, seed, folder), folder))
        sels = run_sweeps(bases, self.cfg.sweep_config(), grid=self.cfg.grid(), progress=self.progress,
                          final_evaluate=False,  # the selected models are measured by the test/dialog stages
                          replace_other_inputs=True)  # the study owns its folders: a changed setting reruns
        return {str(f): {"selected": sel[s["selection"]]["id"], "n_runs": sel["n_runs"]}
                for (_, f), sel in zip(bases, sels)}

    def _train(self, seed: int, bias_type: str, method: str) -> dict:

        cfg = self._train_base(method, bias_type, seed, self.run_folder(seed, bias_type, method) / "run")
        res = debias(cfg.replace(evaluate=False, lmp=False),  # measured by the test/dialog stages
                    replace_other_inputs=True)  # the study owns its folders: a changed setting trains again
        return {"updates": res["training"]["updates"], "model_dir": res.get("model_dir")}

    def _no_training_run(self, seed: int, bias_type: str, method: str, out: Path | None = None, **setting):
        """The run of a method without training with its defaults, or ``setting`` (a grid point's), into ``out``
        (default: the method's ``run`` folder); INLP's split seeded by ``seed``; SentenceDebias and INLP read their
        sentences in the study's format (:meth:`StudyConfig.projection_chat`) and fit on [study] mesh."""
        out = str(out if out is not None else self.run_folder(seed, bias_type, method) / "run")
        if method == SELF_DEBIAS:
            return SelfDebiasRun(bias_type=bias_type, model=self.model, out_dir=out, tokenizer=self._tok_for(self.model),
                                 **setting)
        return ProjectionRun(method=method, bias_type=bias_type, model=self.model, out_dir=out,
                             tokenizer=self._tok_for(self.model), data_dir=self.cfg.data_dir,
                             chat=self.cfg.projection_chat(), mesh=self.cfg.mesh,
                             **({"seed": seed} if method == "inlp" else {}), **setting)

    @staticmethod
    def _run_without_training(cfg) -> dict:
        run = run_self_debias if isinstance(cfg, SelfDebiasRun) else run_training_free
        try:  # a finished run with the same inputs is reused ...
            return run(cfg)
        except FileExistsError:  # ... one with other inputs replaced: the study owns its folders
            return run(cfg, overwrite=True)

    def _debias_without_training(self, seed: int, bias_type: str, method: str) -> dict:
        res = self._run_without_training(self._no_training_run(seed, bias_type, method))
        fit = {k: v for k, v in (res.get("fit") or {}).items() if k != "history"}
        return {"method": method, "training_free": True, "reused": bool(res.get("reused")),
                "model_dir": res.get("model_dir"), **({"fit": fit} if fit else {})}

    def _no_training_sweep(self, seed: int, bias_type: str, method: str) -> dict:
        """The small grid of a method without training (docs/debiasing.md §10, "A grid in the study"): one run per
        value in ``sweep/points/<setting>=<value>``, each measured on the valid split of ``bias_type`` as the
        trained methods' grid points are (:func:`rbjax.study.tuning.evaluate_point`: dev LMB, LMP), selected by
        the same rules (:func:`rbjax.debias.sweep.select`), the study's rule's value run again into
        ``sweep/selected_<rule>``. ``sweep/selection.json`` and ``sweep/sweep.csv`` as a sweep writes them."""
        setting, values = self.cfg.no_training_grid(method)
        folder = self.run_folder(seed, bias_type, method) / "sweep"
        ev = PointEvaluation.of(self._train_base("lmd", bias_type, seed, folder), self.cfg.sweep_config(),
                                chat=ChatSettings(**self.cfg.chat) if self.cfg.is_chat else None)  # as measured
        records = []
        for v in values:
            pid = f"{setting}={v:g}" if isinstance(v, float) else f"{setting}={v}"
            res = self._run_without_training(self._no_training_run(seed, bias_type, method, folder / "points" / pid,
                                                                   **{setting: v}))
            dev, lmp = ev.evaluate(folder / "points" / pid)
            records.append({"id": pid, "point": {setting: v}, "dev": dev, "lmp": lmp,
                            "fit": {k: x for k, x in (res.get("fit") or {}).items() if k != "history"}})
        sel = select_no_training(records, ev, method, self.cfg.sweep)
        rule = self.cfg.sweep["selection"]
        final = self._no_training_run(seed, bias_type, method, folder / f"selected_{rule}", **sel[rule]["point"])
        self._run_without_training(final)
        sel[rule]["final"] = {"out_dir": final.out_dir}
        write_selection(folder, sel, records)
        return {"selected": sel[rule]["id"], "n_runs": len(records)}

    # -- keys ---------------------------------------------------------------------------------------------------
    def _training_key(self, seed: int) -> dict:
        return {"model": _model_digest(self.model), "tokenizer": self.cfg.tokenizer, "data_dir": self.cfg.data_dir,
                "semantics": self.cfg.semantics, "precision": self.cfg.precision, "training": self.cfg.training,
                "seed": seed, "bias_types": self.cfg.bias_types, **self.cfg.chat_key()}

    def _no_training_key(self, seed: int, bias_type: str, method: str) -> dict:
        cfg = self._no_training_run(seed, bias_type, method)
        settings = dataclasses.asdict(cfg)
        settings.pop("out_dir")
        settings.update(model=_model_digest(self.model))
        for k, default in (("chat", dataclasses.asdict(ChatSettings())), ("mesh", None)):
            if settings.get(k, default) == default:  # a raw-format, one-device study's key is what it was
                settings.pop(k, None)
        key = {"method": method, "type": bias_type, "settings": settings, "seed": seed}
        if self._no_training_grid(method):  # the grid, how its points are measured and selected
            sw = self.cfg.sweep
            key["grid"] = {"values": self.cfg.no_training_grid(method),
                           "sweep": {k: sw.get(k) for k in ("selection", "lmp_tolerance", "n_bootstrap",
                                                            "dev_max_pairs")},
                           "lmp": {k: self.cfg.training.get(k) for k in ("lmp_file", "lmp_max_lines", "block_size",
                                                                          "eval_batch_size")},
                           "data_dir": self.cfg.data_dir, "precision": self.cfg.precision,
                           **self.cfg.chat_key()}  # the points' dev LMB is scored in the study's format
        return key

    # -- the plan -----------------------------------------------------------------------------------------------
    def stages(self) -> list[Stage]:
        cfg, out = self.cfg, self.out
        st: list[Stage] = []
        if cfg.random_model:
            st.append(Stage("model", "model", out / "model", self._make_random_model, self._random_model_key))
        st.append(Stage("baseline/lmb_test", "measure", out / "baseline" / "lmb_test",
                        lambda: self._measure(self.model, out / "baseline" / "lmb_test"),
                        lambda: {"model": _model_digest(self.model), "measure": cfg.measure,
                                 "types": cfg.bias_types, "data_dir": cfg.data_dir, "precision": cfg.precision,
                                 **cfg.chat_key()}))
        st += self._benchmark_stages("baseline", lambda: self.model, out / "baseline")
        if cfg.dialog["tasks"]:
            st.append(Stage("baseline/dialog", "dialog", out / "baseline" / "dialog",
                            lambda: self._dialog(self.model, out / "baseline" / "dialog"),
                            lambda: {"model": _model_digest(self.model), "dialog": cfg.dialog,
                                     "data_dir": cfg.data_dir, "tokenizer": cfg.tokenizer, **cfg.chat_key()}))
        for seed in cfg.seeds:
            grid_methods = self._grid_methods()
            if grid_methods:

                n_runs = sum(len(grid_points(m, cfg.grid())[:cfg.sweep.get("max_points")]) + 1
                             for m in grid_methods) * len(cfg.debias_types)
                st.append(Stage(f"seed{seed}/sweeps", "sweep", out / f"seed{seed}",
                                (lambda s=seed: self._sweeps(s)),
                                (lambda s=seed: {**self._training_key(s), "sweep": cfg.sweep, "grid": cfg.grid(),
                                                 "types": cfg.debias_types, "methods": grid_methods}),
                                training_runs=n_runs,
                                info={"methods": grid_methods, "types": cfg.debias_types}))
            for b in cfg.debias_types:
                for m in self._single_methods():
                    name = f"seed{seed}/{Path(b).stem}/{m}/run"
                    st.append(Stage(name, "train", self.run_folder(seed, b, m) / "run",
                                    (lambda s=seed, b=b, m=m: self._train(s, b, m)),
                                    (lambda s=seed, b=b, m=m: {**self._training_key(s), "type": b, "method": m}),
                                    training_runs=1))
            for b in cfg.debias_types:
                for m in self._no_training_methods(seed):
                    if self._no_training_grid(m):  # a small grid of its own, selected on the valid split
                        st.append(Stage(f"seed{seed}/{Path(b).stem}/{m}/sweep", "debias",
                                        self.run_folder(seed, b, m) / "sweep",
                                        (lambda s=seed, b=b, m=m: self._no_training_sweep(s, b, m)),
                                        (lambda s=seed, b=b, m=m: self._no_training_key(s, b, m))))
                        continue
                    st.append(Stage(f"seed{seed}/{Path(b).stem}/{m}/run", "debias", self.run_folder(seed, b, m) / "run",
                                    (lambda s=seed, b=b, m=m: self._debias_without_training(s, b, m)),
                                    (lambda s=seed, b=b, m=m: self._no_training_key(s, b, m))))
            for b in cfg.debias_types:
                for m in self._methods_of(seed):
                    base = f"seed{seed}/{Path(b).stem}/{m}"
                    folder = self.run_folder(seed, b, m)
                    sel = self.selected_model(seed, b, m)
                    st.append(Stage(f"{base}/lmb_test", "measure", folder / "lmb_test",
                                    (lambda sel=sel, f=folder: self._measure(sel, f / "lmb_test")),
                                    (lambda sel=sel: {"model": _model_digest(sel), "measure": cfg.measure,
                                                      "types": cfg.bias_types, "data_dir": cfg.data_dir,
                                                      "precision": cfg.precision, **cfg.chat_key()})))
                    st += self._benchmark_stages(base, lambda sel=sel: sel, folder)
                    tasks = self._dialog_tasks(m)  # Self-Debias: no DST (the report says)
                    if tasks:
                        st.append(Stage(f"{base}/dialog", "dialog", folder / "dialog",
                                        (lambda sel=sel, f=folder, ts=tasks: self._dialog(sel, f / "dialog", ts)),
                                        (lambda sel=sel: {"model": _model_digest(sel), "dialog": cfg.dialog,
                                                          "data_dir": cfg.data_dir, **cfg.chat_key()})))
        return st


def plan_study(cfg: StudyConfig, out_dir: str | Path, progress: bool = True) -> list[Stage]:
    """The stages of a study, in execution order (nothing is run)."""
    return _Study(cfg, Path(out_dir), progress).stages()


# ------------------------------------------------------------------------------------------------ cost estimate
#: figures from benchmarks/RESULTS.md at the DialoGPT-small shape (2-core shared CPU VM); see there
COSTS = {
    # bench_debias_run.py (3 December 2026, this 2-core CPU, quiet): `rbjax debias --method lm|hd --bias religion1
    # --batch-size 8`, DialoGPT-small shape, packed layout (the default): 6,942 real (non-pad) tokens in 65.3 s (LM)
    # and 69.5 s (HD) of updates, ≈ 100 real tokens/s ...
    "train_tokens_per_s": 100.0,
    # ... and the padded 8 × 36 layout, bench_packed_train.py (1 December 2026, before the fused optimizer, so
    # conservative): 32.8 real tokens/s at 41.1 % real slots = 80 slots/s (every slot computed, real or not)
    "train_padded_slots_per_s": 80.0,
    "score_phrases_per_s": 50.0,     # bench_scoring.py: LMB phrases/s (packed scorer is faster; conservative)
    "machine": "2-core CPU (benchmarks/RESULTS.md); divide by your accelerator's speed-up",
}
TRAIN_LINES = {"religion1": 720, "religion2": 720, "race": 763, "gender": 1521, "queerness": 720}
#: mean real GPT-2 tokens per training phrase (paper semantics, at most the block size of 36)
TOKENS_PER_LINE = {"religion1": 14.65, "religion2": 14.54, "race": 12.27, "gender": 12.2, "queerness": 12.08}
PHRASES = {"test": 2432, "valid": 2426}


def model_size_ratio(cfg: StudyConfig) -> tuple[float, str]:
    """``(ratio, what)``: the study model's forward matmul FLOPs per token over DialoGPT-small's
    (:func:`rbjax.model.memory.flops_per_token`, from its ``config.json`` alone — of a hub id only that file is
    fetched — or its ``random_model`` table), and a phrase saying so; ``(1.0, why)`` when the config cannot be
    read."""
    try:
        config = cfg.random_model_config() if cfg.random_model else ModelHandle.open(cfg.model).model_config()
    except (OSError, ValueError, RuntimeError) as e:
        return 1.0, f"at the DialoGPT-small shape (the model's config.json could not be read: {str(e).splitlines()[0]})"
    r = flops_per_token(config) / flops_per_token(GPT2Config())
    return r, f"at this model's size ({r:.3g}× DialoGPT-small's matmul FLOPs per token)"


def estimate_cost(cfg: StudyConfig, costs: dict | None = None) -> dict:
    """Training runs, token counts and an estimated wall time of the study from the benchmark figures, measured at
    the DialoGPT-small shape and scaled by the model's matmul FLOPs per token (:func:`model_size_ratio`; a user's
    own figures may be passed in ``costs``). The token counts are GPT-2's: another tokenizer cuts the phrases
    somewhat differently.

    Training time: the real tokens of every run at the packed rate (``train_tokens_per_s``), or, with
    ``[training] layout = "padded"``, every slot of the ``batch × block_size`` micro-batches at the padded rate.

    The methods without training (SentenceDebias, INLP, Self-Debias) count no training run and no training token:
    SentenceDebias and INLP one forward pass over each of their counterfactual sentences (the debiased type's
    training phrases and their swapped twins, counted as phrases scored); Self-Debias one more pass per prefix
    over every phrase its model is measured on. SentenceDebias and Self-Debias, which no seed changes, count once.
    """

    c = {**COSTS, **(costs or {})}
    ratio, size_note = model_size_ratio(cfg)
    tr = cfg.training
    epochs, block = int(tr.get("epochs", 2)), int(tr.get("block_size", 36))
    padded = tr.get("layout", "packed") == "padded"
    max_steps = tr.get("max_steps")
    n_seeds, n_types = len(cfg.seeds), len(cfg.debias_types)
    runs, tokens, seconds = 0, 0.0, 0.0
    context = chat_context_tokens(cfg)

    def run_cost(n_lines: int, per_line: float, batch: int, accum: int) -> tuple[float, float]:
        """(real tokens, seconds) of one run."""
        n_batches = -(-n_lines // batch)
        updates = (n_batches // accum) * epochs if max_steps is None else int(max_steps)
        examples = updates * accum * batch
        real = examples * (min(per_line, block) + context)  # the chat template's context is computed too
        return real, ((examples * (block + context) / c["train_padded_slots_per_s"]) if padded
                      else real / c["train_tokens_per_s"])

    for b in cfg.debias_types:
        lines = TRAIN_LINES.get(b, 720)
        per_line = TOKENS_PER_LINE.get(b, float(block) / 2)
        for m in cfg.methods:
            n = lines * (2 if m == "cda" else 1)
            if m in NO_TRAINING_METHODS:
                continue
            if m in cfg.sweep["methods"]:
                pts = grid_points(m, cfg.grid())[:cfg.sweep.get("max_points")]
                runs += len(pts) + 1
                costs_ = [run_cost(n, per_line, p.batch_size, p.grad_accum) for p in pts]
                costs_.append(run_cost(n, per_line, pts[0].batch_size, pts[0].grad_accum))  # the retrained selection
            else:
                runs += 1
                costs_ = [run_cost(n, per_line, int(tr.get("batch_size") or (2 if m == "cda" else 8)),
                                   int(tr.get("grad_accum", 1)))]
            tokens += sum(t for t, _ in costs_)
            seconds += sum(s_ for _, s_ in costs_)
    runs *= n_seeds
    tokens *= n_seeds
    seconds *= n_seeds
    def seeds_of(m: str) -> int:
        return 1 if m in SEED_FREE_METHODS else n_seeds

    n_models = 1 + n_types * sum(seeds_of(m) for m in cfg.methods)
    # the counterfactual sets' sentences of SentenceDebias and INLP, one forward pass each (at most every line of the
    # debiased type and its swapped twin)
    def fits_of(m: str) -> int:  # a grid of its own: a fit per value and the selected value's again
        g = cfg.no_training_grid(m)
        return 1 if g is None else len(g[1]) + 1

    fit_scored = sum(seeds_of(m) * fits_of(m) * 2 * TRAIN_LINES.get(b, 720) for m in cfg.methods
                     if m in TRAINING_FREE for b in cfg.debias_types)
    # Self-Debias: every phrase its model is measured on once more per prefix (the scorer's extra passes)
    extra_passes = sum(len(default_prefixes(b)) if b in CATEGORY_PREFIXES else 1 for b in cfg.debias_types) \
        if SELF_DEBIAS in cfg.methods else 0
    dev_scored = n_seeds * sum(len(grid_points(m, cfg.grid())[:cfg.sweep.get("max_points")])
                               for m in cfg.methods if m in cfg.sweep["methods"] and m not in NO_TRAINING_METHODS
                               ) * n_types * 2 * 480
    # the grids of the methods without training: each value's model and the starting model on the valid pairs
    dev_scored += sum(seeds_of(m) * (len(cfg.no_training_grid(m)[1]) + 1) for m in cfg.methods
                      if m in NO_TRAINING_METHODS and cfg.no_training_grid(m)) * n_types * 2 * 480
    per_model = PHRASES.get(cfg.measure["split"], 2432) * len(cfg.bias_types) / 5
    test_scored = (n_models + extra_passes) * per_model + fit_scored
    # [benchmarks]: each pair's two sentences, twice where the two conventions need two passes (GPT-2); CrowS-Pairs
    # counted whole even when only some of its categories are measured
    test_scored += (n_models + extra_passes) * 4 * sum(crows_pairs_manifest()["n_pairs"] if b["benchmark"] == "crows-pairs"
                                      else len(read_pair_file(b["pairs_file"])) for b in cfg.benchmarks()
                                      if b["benchmark"] != "bbq")
    # BBQ: each row's 13 answers (its three and ten "unknown" phrasings) counted as phrases
    test_scored += (n_models + extra_passes) * 13 * sum(_bbq_rows(b) for b in cfg.benchmarks() if b["benchmark"] == "bbq")
    train_h = seconds * ratio / 3600
    score_h = (dev_scored + test_scored) * ratio / c["score_phrases_per_s"] / 3600
    return {"training_runs": runs, "training_tokens": int(tokens), "models_evaluated": n_models,
            "phrases_scored": int(dev_scored + test_scored), "train_hours": train_h, "score_hours": score_h,
            "dialog_note": "dialog checks (LMP, DST, CRG) per model come on top: see docs/dialog.md for their cost",
            "layout": "padded" if padded else "packed", "rates": c, "size_ratio": ratio, "size_note": size_note,
            "chat_context_tokens": context,
            **({"self_debias_note": "Self-Debias's scoring is counted at (1 + prefixes)× the plain scorer's; today's "
                                    "scorer is slower (docs/debiasing.md §11)"} if extra_passes else {})}


#: the rows of the eleven upstream BBQ files (lm-evaluation-harness's bbq task: 58,492)
BBQ_ROWS = 58492


def _bbq_rows(bench: dict) -> int:
    """The rows BBQ measures (for the estimate): the lines of its files where they are here, else the upstream
    count (all of it, even when only some categories are measured)."""
    try:
        files = bbq_files(bench["data_dir"], bench["categories"], download=False)
    except (OSError, ValueError):
        return BBQ_ROWS
    return sum(sum(1 for line in open(p, encoding="utf-8", errors="replace") if line.strip()) for _, p, _ in files)


def study_format(cfg: StudyConfig) -> str:
    """The study's format in words (the plan and the report say it)."""
    if not cfg.is_chat:
        if cfg.measure.get("format") == "chat":
            return ("raw text (the paper's) for training and dialog; the LMB measured in chat format ([measure] "
                    "format)")
        return "raw text (the paper's): every phrase and dialog as bare text"
    c = cfg.chat
    parts = [f"the {c['role'] or 'assistant'}'s turn"]
    if c["system"] is not None:
        parts.append(f"system prompt {c['system']!r}")
    if c["prompt"] is not None:
        parts.append(f"after the user message {c['prompt']!r}")
    parts.append("end-of-turn token scored and trained" if c["score_end_of_turn"] else "end-of-turn token not scored")
    tpl = c["chat_template"] or "the model's own template"
    return (f"chat ({tpl}): every phrase as " + ", ".join(parts) + "; the template's tokens are context only; "
            "dialog: CRG contexts as user/assistant turns")


def chat_context_tokens(cfg: StudyConfig) -> float:
    """The template tokens a chat-format study adds before every training phrase, estimated (the template is not
    read: a BOS, the role headers and end-of-turn tokens, about 8 tokens in Llama 3's and Qwen's templates, and
    about 1.3 tokens a word of the system prompt and the user message, each with its own header); 0 in the raw
    format. Scoring shares the template's prefix across phrases (docs/chat.md) and is not charged more."""
    if not cfg.is_chat:
        return 0.0
    c = cfg.chat
    extra = sum(6 + 1.3 * len(str(c[k]).split()) for k in ("system", "prompt") if c[k] is not None)
    return 8.0 + extra


def format_plan(stages: list[Stage], cost: dict, cfg: StudyConfig, out: Path) -> str:
    lines = [f"study {cfg.name!r} ({cfg.path}) → {out}",
             f"  model: {cfg.model or 'random ' + json.dumps(cfg.random_model)}; measured on: "
             f"{', '.join(cfg.bias_types)}; debiased: {', '.join(cfg.debias_types)}; methods: "
             f"{', '.join(cfg.methods)} (grid: {', '.join(m for m in cfg.methods if m in cfg.sweep['methods'])}"
             + "".join(f"; without training: {', '.join(nt)}" for nt in [[m for m in cfg.methods
                                                                          if m in NO_TRAINING_METHODS]] if nt)
             + f"); "
             f"seeds: {cfg.seeds}; dialog: {', '.join(cfg.dialog['tasks']) or 'none'}",
             f"  format: {study_format(cfg)}",
             f"  {len(stages)} stages:"]
    for s in stages:
        extra = (f"  ({s.training_runs} training run{'' if s.training_runs == 1 else 's'})" if s.training_runs else "")
        if s.kind == "sweep" and s.training_runs:
            g = len(s.info["methods"]) * len(s.info["types"])
            extra = (f"  ({s.training_runs} training runs: {g} sweeps (method × bias type), each its grid points "
                     "+ 1 retraining of the selected point with export)")
        if s.kind == "debias":
            extra = "  (no training: the method's defaults, no grid)"
        lines.append(f"    {s.name:<48} {s.kind}{extra}")
    at = "" if cost["size_ratio"] == 1.0 else " at DialoGPT-small's size"
    rate = (f"{cost['rates']['train_padded_slots_per_s']:g} padded slots/s{at}" if cost["layout"] == "padded"
            else f"{cost['rates']['train_tokens_per_s']:g} real tokens/s{at}, packed")
    lines.append(f"  training runs: {cost['training_runs']}, real training tokens: {cost['training_tokens']:,}; models "
                 f"evaluated: {cost['models_evaluated']}; phrases scored: {cost['phrases_scored']:,}")
    lines.append(f"  estimated cost {cost['size_note']} on {cost['rates']['machine']}: training "
                 f"{cost['train_hours']:.1f} h ({rate}), LMB scoring "
                 f"{cost['score_hours']:.1f} h ({cost['rates']['score_phrases_per_s']:g} phrases/s{at}); "
                 f"{cost['dialog_note']}")
    if cost.get("self_debias_note"):
        lines.append(f"  {cost['self_debias_note']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- running
def memory_plans(cfg: StudyConfig, out: Path, device_memory_gb: float | None = None) -> list[str]:
    """The memory plan of each gridded method's largest sweep chunk (:func:`rbjax.debias.sweep.grid_memory_plan`:
    [training] settings, adapters included, on [study] mesh), as text for the dry run; a line saying why when the
    model's ``config.json`` cannot be read (a random model has none yet: it is planned from its table)."""
    study = _Study(cfg, out, False)
    lines: list[str] = []
    done: dict[str, int] = {}  # plan text -> its line (the methods of one grid share one plan)
    for m in study._grid_methods():
        base = study._train_base(m, cfg.debias_types[0], cfg.seeds[0], out / "plan")
        pts = grid_points(m, cfg.grid())[:cfg.sweep.get("max_points")]
        try:
            if cfg.random_model:
                raise ValueError("a random model is planned when it is built")
            plan = grid_memory_plan(base, pts, grid_chunk=cfg.sweep.get("grid_chunk"),
                                    device_memory_gb=device_memory_gb,
                                    n_devices=mesh_product(base.mesh) if base.mesh else None)
            text = plan.format().replace("\n", "\n    ")
            if text in done:
                i = done[text]
                lines[i] = lines[i].replace(":", f", {m}:", 1)
                continue
            done[text] = len(lines)
            n_all = len(pts) * (plan.totals["gradients"] + plan.totals["optimizer"]) // max(plan.settings["n_points"], 1)
            lines.append(f"  {m}: memory of the largest sweep chunk ({len(pts)} grid points in chunks of one batch plan, "
                         f"one chunk after another on the same loaded model; the gradients and Adam state of all "
                         f"{len(pts)} points together: {n_all / 1e9:.3g} GB)\n    " + text)
        except (OSError, ValueError, RuntimeError) as e:
            lines.append(f"  {m}: memory plan not made ({str(e).splitlines()[0]})")
    return lines


def run_study(cfg: StudyConfig, out_dir: str | Path, *, dry_run: bool = False, progress: bool = True,
              report: bool = True, device_memory_gb: float | None = None) -> dict:
    """Run (or, with ``dry_run``, print the plan of) a study; finished stages with unchanged keys are skipped.

    ``device_memory_gb``: the memory of one device for the dry run's memory plans (default: what the device
    reports).

    Returns:
        ``{"stages": [StageResult...], "report": {...}}`` (``{"plan": text, "cost": ...}`` for a dry run).

    Raises:
        ValueError, FileNotFoundError, RuntimeError: bad settings or data (the stage is named);
        rbjax.core.interrupt.Interrupted: Ctrl-C (finished stages and the work inside the current one are kept).
    """

    out = Path(out_dir)
    stages = plan_study(cfg, out, progress)
    cost = estimate_cost(cfg)
    if dry_run:
        text = "\n".join([format_plan(stages, cost, cfg, out)] + memory_plans(cfg, out, device_memory_gb))
        return {"plan": text, "cost": cost, "stages": [s.name for s in stages]}
    check_output_dir(out, "--out")  # before any work
    if out.is_dir() and not ((out / "study.json").exists() or (out / "stages.json").exists()) \
            and any(out.iterdir()):
        # the study owns its folder and replaces what its stages wrote; never files of something else
        raise ValueError(f"--out {out} holds files but is not a study folder (no study.json); give a new or empty "
                         "folder, or the folder of an earlier rbjax run")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "study.json", {"file": str(cfg.path), "config": cfg.raw, "versions": versions(),
                                           "stages": [s.name for s in stages]})  # the report checks completeness
    state = KeyedEntries(out / "stages.json", "stages")  # each finished stage's key (the one reuse rule)
    results: list[StageResult] = []
    for i, s in enumerate(stages):
        try:
            key = digest(s.key())
        except FileNotFoundError:
            key = None  # an upstream output is missing: run
        prev = None if key is None else state.stored(s.name, key)
        if prev is not None:
            results.append(StageResult(s.name, "skipped", 0.0, prev.get("summary") or {}))
            log.info(f"[{i + 1}/{len(stages)}] {s.name}: unchanged, skipped")
            continue
        log.info(f"[{i + 1}/{len(stages)}] {s.name} ...")
        t0 = time.perf_counter()
        state.drop(s.name)  # its outputs are about to change
        try:
            summary = s.run()
        except KeyboardInterrupt:

            raise Interrupted(f"rbjax run: interrupted in stage {s.name}; the finished stages and the finished work "
                              "inside this one are kept: run the same command again to resume.") from None
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            raise type(e)(f"stage {s.name}: {e}") from e
        dt = time.perf_counter() - t0
        key = digest(s.key())  # after the run, the outputs it read exist
        state.save(s.name, key, {"seconds": dt, "summary": canonical(summary)})
        results.append(StageResult(s.name, "ran", dt, summary))
    rep = None
    if report:

        rep = write_report([out], out, overwrite=True)  # the study owns its folder
        log.info(f"wrote {rep['md']} and {rep['html']}")
    return {"stages": results, "report": rep}
