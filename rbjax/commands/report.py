"""``rbjax report DIR [DIR ...]``: rebuild the study report from finished study folders."""
from __future__ import annotations

from rbjax.study.report import write_report


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="rebuild report.md / report.html from finished study folders",
        description="Read the stage results of one or more `rbjax run` folders (several: their seeds are pooled) and "
                    "write report.md, report.html (self-contained, figures embedded) and figure1.png.")
    p.add_argument("folders", nargs="+", metavar="DIR", help="finished study folders")
    p.add_argument("--out", metavar="DIR", help="where to write the report (when not given: the first folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace report files in --out that are not rbjax's unchanged report of the same folders "
                        "(e.g. edited by hand, or the report of other folders)")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path


    out = Path(args.out or args.folders[0])
    rep = write_report([Path(f) for f in args.folders], out, overwrite=args.overwrite)
    print(f"wrote {rep['md']}, {rep['html']}, {rep['figure']}")
    return 0
