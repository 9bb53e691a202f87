"""``rbjax export RUN --out DIR``: a finished debiased model as a release-ready HF folder with its model card (the
options besides the folders (:class:`ExportCommand`), ``--out`` and ``--overwrite``
(:class:`rbjax.commands.settings.Output`) are the fields of :class:`rbjax.study.export.ExportConfig`)."""
from __future__ import annotations

import dataclasses

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.study.export import ExportConfig, export_model


@dataclasses.dataclass(frozen=True)
class ExportCommand:
    """What ``rbjax export`` reads: the run and the measurements before and after (``--out`` and ``--overwrite``
    are :class:`rbjax.commands.settings.Output`'s, the card's settings :class:`ExportConfig`)."""

    run: str | None = field(None, "finished run, sweep or study method folder", positional=True, metavar="RUN")
    baseline: str | None = field(None, "'rbjax measure' folder of the base model, for LMB before and the paired "
                                       "comparison (default: the study's baseline/lmb_test when RUN is inside a "
                                       "study)", metavar="DIR")
    after: str | None = field(None, "'rbjax measure' folder of the exported model (default: the study's lmb_test of "
                                    "the method, else the run's lmb_valid)", metavar="DIR")
    bbq_baseline: str | None = field(None, "'rbjax measure --benchmark bbq' folder of the base model, for BBQ before "
                                           "and the comparison (default: the study's baseline/bbq when RUN is inside "
                                           "a study that measured BBQ)", metavar="DIR")
    bbq_after: str | None = field(None, "'rbjax measure --benchmark bbq' folder of the exported model (default: the "
                                        "study's bbq of the method)", metavar="DIR")


def register(sub) -> None:
    p = sub.add_parser(
        "export", help="export a finished debiasing run (or a sweep's selected point) as an HF folder with a model card",
        description="Copies the run's HF model folder to OUT and writes OUT/README.md, the model card (Hugging Face "
                    "metadata block, base model, method, semantics, grid point and selection rule, training data "
                    "and its sha256, LMB before/after on every bias type with the paired comparison of "
                    "'rbjax compare', BBQ before/after where measured, LMP, DST/CRG where measured, "
                    "versions), OUT/export.json (the same numbers) and "
                    "OUT/evidence/ (the comparison's files). RUN: an 'rbjax debias' run folder, an 'rbjax sweep' "
                    "folder (its selected point), or a study's seed<S>/<type>/<method> folder.",
        formatter_class=HelpFormatter)
    add_config_arguments(p, ExportCommand, ("run",))
    add_config_arguments(p, Output, ("out",), required=("out",))
    add_config_arguments(p, ExportCommand, ("baseline", "after", "bbq_baseline", "bbq_after"))
    add_config_arguments(p, ExportConfig)
    add_config_arguments(p, Output, ("overwrite",))
    p.set_defaults(func=run)


def run(args) -> int:
    res = export_model(args.run, args.out, ExportConfig(**config_values(args, ExportConfig)), baseline=args.baseline,
                       after=args.after, bbq_baseline=args.bbq_baseline, bbq_after=args.bbq_after,
                       overwrite=args.overwrite)
    n = res["numbers"]
    comp = n["comparison"]
    print(f"exported {n['source_run']} ({n['method']}, {n['bias_type']}) to {res['out']}")
    if comp:
        for r in comp["types"]:
            print(f"  {r['bias_type']}: {r['verdict']}")
    else:
        print("  no before/after comparison (no LMB of the base model on the same pairs: pass --baseline)")
    if (n.get("bbq") or {}).get("comparison"):
        print(f"  BBQ: compared with the base model on {', '.join(n['bbq']['comparison']['categories'])}")
    print(f"wrote {res['card']} and {res['out'] / 'export.json'}")
    return 0
