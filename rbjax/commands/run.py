"""``rbjax run STUDY.toml``: the paper's §5 study (baseline → sweeps → every debiased model on every bias type →
dialog checks → report) from one study file."""
from __future__ import annotations

import dataclasses

from rbjax.commands.options import add_config_arguments
from rbjax.commands.settings import Output, PlanSettings
from rbjax.core.config import field
from rbjax.study.config import load_study
from rbjax.study.run import run_study


@dataclasses.dataclass(frozen=True)
class RunCommand:
    """The options of ``rbjax run`` besides the shared blocks (``--out``, ``--no-progress``:
    :class:`rbjax.commands.settings.Output`; ``--dry-run``, ``--device-memory-gb``:
    :class:`~rbjax.commands.settings.PlanSettings`): the study file and what the command line changes of it."""

    study: str | None = field(None, "the study file", positional=True, metavar="STUDY.toml")
    seeds: int | None = field(None, "repeat the training stages with N seeds (the study's first seed and the N-1 after "
                                    "it)", metavar="N")
    overrides: tuple[str, ...] | None = field(None, "override a field of the study file, e.g. --set "
                                                    "study.data_dir=../shared/redditbias or --set "
                                                    "training.max_steps=2 (TOML values; repeatable)",
                                              flag="--set", alias=False, repeat=True, metavar="KEY=VALUE")
    report: bool = field(True, "the report at the end (OUT/report.md, OUT/report.html)", negate="--no-report")


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a whole study from a study file (baseline, sweeps, measurements, dialog checks, report)",
        description="Run the study a TOML file describes (experiments/paper.toml: the paper's §5; experiments/"
                    "tiny.toml: a small random GPT-2 and a few steps per stage). Stages are keyed on their inputs and "
                    "skipped when unchanged; a killed study resumes where it stopped. Ends with OUT/report.md and "
                    "OUT/report.html.")
    add_config_arguments(p, RunCommand, ("study",))
    add_config_arguments(p, Output, ("out",), required=("out",))
    add_config_arguments(p, RunCommand, ("seeds", "overrides"))
    add_config_arguments(p, PlanSettings)
    add_config_arguments(p, RunCommand, ("report",))
    add_config_arguments(p, Output, ("progress",))
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path


    cfg = load_study(args.study, args.overrides or [])
    if args.seeds is not None:
        cfg = cfg.with_seeds(args.seeds)
    res = run_study(cfg, Path(args.out), dry_run=args.dry_run, progress=args.progress,
                    report=args.report, device_memory_gb=args.device_memory_gb)
    if args.dry_run:
        print(res["plan"])
        return 0
    ran = sum(1 for s in res["stages"] if s.status == "ran")
    reused = sum(1 for s in res["stages"] if s.status == "ran" and (s.summary or {}).get("reused_perplexities"))
    note = (f" ({reused} of them reused their stored perplexities: only the statistics were recomputed)"
            if reused else "")
    print(f"{ran} stage(s) ran{note}, {len(res['stages']) - ran} unchanged and skipped")
    if res["report"]:
        print(f"report: {res['report']['md']}, {res['report']['html']}")
    return 0
