"""``rbjax run STUDY.toml``: the paper's §5 study (baseline → sweeps → every debiased model on every bias type →
dialog checks → report) from one study file."""
from __future__ import annotations

from rbjax.study.config import load_study
from rbjax.study.run import run_study


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a whole study from a study file (baseline, sweeps, measurements, dialog checks, report)",
        description="Run the study a TOML file describes (experiments/paper.toml: the paper's §5; experiments/"
                    "tiny.toml: a small random GPT-2 and a few steps per stage). Stages are keyed on their inputs and "
                    "skipped when unchanged; a killed study resumes where it stopped. Ends with OUT/report.md and "
                    "OUT/report.html.")
    p.add_argument("study", metavar="STUDY.toml", help="the study file")
    p.add_argument("--out", required=True, metavar="DIR", help="study folder (results of every stage, the report)")
    p.add_argument("--seeds", type=int, metavar="N",
                   help="repeat the training stages with N seeds (the study's first seed and the N-1 after it)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a field of the study file, e.g. --set study.data_dir=../shared/redditbias or "
                        "--set training.max_steps=2 (TOML values; repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the stages, the number of training runs, an estimate of their cost and the memory plan "
                        "of each sweep's largest chunk; run nothing")
    p.add_argument("--device-memory-gb", type=float, metavar="GB",
                   help="memory of one device for the dry run's memory plans (default: what the device reports; a "
                        "CPU reports none)")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path


    cfg = load_study(args.study, args.overrides)
    if args.seeds is not None:
        cfg = cfg.with_seeds(args.seeds)
    res = run_study(cfg, Path(args.out), dry_run=args.dry_run, progress=not args.no_progress,
                    report=not args.no_report, device_memory_gb=args.device_memory_gb)
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
