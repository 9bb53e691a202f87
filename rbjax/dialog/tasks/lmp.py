"""``lmp``: Reddit-6K perplexity of the model (paper §3.2; :mod:`rbjax.dialog.reddit_perplexity`) → ``OUT/lmp.json``."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from rbjax.core.config import field
from rbjax.core.progress import progress_bar
from rbjax.data.redditbias import RedditBiasData, manifest
from rbjax.dialog.reddit_perplexity import read_reference_lines, reddit_perplexity
from rbjax.lmb.measure import LoadedModel
from rbjax.dialog.tasks.common import (
    EvalModel,
    Task,
    TaskSettings,
    check_memory,
    evaluation_phase,
    data_dir_field,
    eval_batch_size_field,
    existing_result,
    file_record,
    finish,
    result_key,
    result_path,
    task_mesh,
)

__all__ = ["TASK", "LMPSettings", "memory_plans", "run_lmp"]


@dataclasses.dataclass(frozen=True)
class LMPSettings(TaskSettings):
    """The settings of ``lmp`` (see :class:`rbjax.dialog.tasks.common.TaskSettings`)."""

    data_dir: str | None = data_dir_field()
    lmp_file: str | None = field(None, "LMP reference file, one utterance a line (default: RedditBias "
                                       "text_files/humanref6k.txt)", metavar="FILE")
    lmp_max_lines: int | None = field(None, "score only the first N LMP lines (quick runs)", metavar="N")
    lmp_block_size: int = field(36, "tokens kept per LMP line")
    eval_batch_size: int = eval_batch_size_field()

    path_fields = ("data_dir", "lmp_file")
    chat_refusal = ("LMP is the perplexity of Reddit comments as bare text (paper §3.2), which a chat template has no "
                    "turn for")


def memory_plans(s: LMPSettings) -> list[dict]:
    """The memory plan's computations: scoring batches of ``eval_batch_size`` lines (a BOS may come before each)."""
    return [{"training": False, "batch_size": s.eval_batch_size, "seq_len": s.lmp_block_size + 1,
             "flags": {"batch_size": "--eval-batch-size", "param_dtype": None}}]


def run_lmp(model: EvalModel, out_dir: str | os.PathLike, s: LMPSettings, *, overwrite: bool = False) -> dict:
    """Reddit-6K perplexity (paper §3.2; :mod:`rbjax.dialog.reddit_perplexity`) → ``OUT/lmp.json``.

    ``s``: ``lmp_file``/``data_dir``, ``lmp_max_lines``, ``lmp_block_size``, ``eval_batch_size``, ``progress``.
    Metrics: ``perplexity`` (corpus level), ``reference_grid``, ``reference_cda``, ``mean_nll`` and counts. A
    Self-Debias model (:attr:`rbjax.model.handle.ModelHandle.self_debias`) is scored by its Self-Debias scorer (the
    self-debiased log-likelihoods, one device: no ``mesh``), built as ``rbjax measure`` builds it.
    ``overwrite``: replace a result of other inputs (else refused: :class:`rbjax.core.reuse.OutputExists`).
    """

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    path = Path(s.lmp_file) if s.lmp_file else RedditBiasData(s.data_dir).reddit_reference_file()
    if not path.is_file():
        raise FileNotFoundError(f"LMP reference file {path}: no such file")
    rec = file_record(path)
    official = rec["sha256"] == manifest()["files"]["text_files/humanref6k.txt"]["sha256"]
    key = result_key("lmp", model, {"lmp_file": rec["sha256"]}, s)
    prev = existing_result(result_path(out_dir, "lmp"), key, "lmp", overwrite)
    if prev is not None:
        return prev
    mesh = task_mesh(s)
    check_memory(model, s, memory_plans(s))
    t1 = time.perf_counter()
    scorer = None
    if model.self_debias is not None:  # a Self-Debias run folder: the lines scored with the rescaled distribution
        scorer = LoadedModel(model, batch_size=s.eval_batch_size, mesh=mesh).scorer  # (it accepts the rescaling)
    config, params, tok = model.load(mesh=mesh)
    t_model = time.perf_counter() - t1
    lines = read_reference_lines(path, s.lmp_max_lines)
    t1 = time.perf_counter()
    with evaluation_phase("lmp", "the scoring of the Reddit lines", out_dir), \
            progress_bar(len(lines), "LMP (Reddit 6K)", "line", enabled=s.progress) as bar:  # stops between batches
        m = reddit_perplexity(params, config, tok, lines, block_size=s.lmp_block_size,
                              batch_size=s.eval_batch_size, progress=bar.update, bos_id=model.bos_id(),
                              mesh=None if scorer is not None else mesh, scorer=scorer)
    t_eval = time.perf_counter() - t1
    data = {"lmp_file": {**rec, "n_lines_scored": len(lines), "official": official,
                         "what": "RedditBias text_files/humanref6k.txt (DialoGPT's human.ref.6k.txt)" if official
                         else "a reference file given by the user"}}
    notes = []
    if s.lmp_max_lines:
        notes.append(f"only the first {s.lmp_max_lines} lines were scored: not the paper's LMP")
    if scorer is not None:
        notes.append("Self-Debias: every token's log-likelihood is taken from the self-debiased distribution "
                     f"({len(model.self_debias.prefixes)} prefix(es), λ {model.self_debias.decay_constant:g}, "
                     f"ε {model.self_debias.epsilon:g}), as rbjax measure scores it")
    return finish("lmp", out_dir, key, model, s, overwrite, {"metrics": m, "data": data, "notes": notes,
                                                                "timings": {"load_model_s": t_model,
                                                                            "eval_s": t_eval}}, t0)


TASK = Task("lmp", LMPSettings, run_lmp, "Reddit-6K perplexity of the model", ("lmp.json",), memory_plans)
