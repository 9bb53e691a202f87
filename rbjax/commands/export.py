"""``rbjax export RUN --out DIR``: a finished debiased model as a release-ready HF folder with its model card (the
options besides the folders and ``--overwrite`` are the fields of :class:`rbjax.study.export.ExportConfig`)."""
from __future__ import annotations

from rbjax.commands import HelpFormatter
from rbjax.commands.options import add_config_arguments, config_values
from rbjax.study.export import ExportConfig, export_model


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
    p.add_argument("run", metavar="RUN", help="finished run, sweep or study method folder")
    p.add_argument("--out", required=True, help="folder to write (new or empty; see --overwrite)")
    p.add_argument("--baseline", metavar="DIR",
                   help="'rbjax measure' folder of the base model, for LMB before and the paired comparison "
                        "(default: the study's baseline/lmb_test when RUN is inside a study)")
    p.add_argument("--after", metavar="DIR",
                   help="'rbjax measure' folder of the exported model (default: the study's lmb_test of the method, "
                        "else the run's lmb_valid)")
    p.add_argument("--bbq-baseline", metavar="DIR",
                   help="'rbjax measure --benchmark bbq' folder of the base model, for BBQ before and the comparison "
                        "(default: the study's baseline/bbq when RUN is inside a study that measured BBQ)")
    p.add_argument("--bbq-after", metavar="DIR",
                   help="'rbjax measure --benchmark bbq' folder of the exported model (default: the study's bbq of "
                        "the method)")
    add_config_arguments(p, ExportConfig)
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out as a whole (written beside it, then swapped in: none of "
                        "its files survive, and a failed export leaves it untouched); a folder holding files no "
                        "export wrote is refused")
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
