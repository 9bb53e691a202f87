"""``rbjax report DIR [DIR ...]``: rebuild the study report from finished study folders.

The report has no settings of its own (it reports the stages' own): its options are the folders, ``--out`` and
``--overwrite``, the arguments of :func:`rbjax.study.report.write_report`."""
from __future__ import annotations

from pathlib import Path

from rbjax.study.report import write_report


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="rebuild report.md / report.html from finished study folders",
        description="Read the stage results of one or more `rbjax run` folders (several: their seeds are pooled; a "
                    "stage found in two folders with the same key — a copied run — is counted once, with a message; "
                    "folders with different baselines are refused) and write report.md, report.html (self-contained, "
                    "figures embedded), figure1.png and comparisons.json (the paired tests behind every 'changed / "
                    "did not change' statement). A study with unfinished stages says so at the top.")
    p.add_argument("folders", nargs="+", metavar="DIR", help="finished study folders")
    p.add_argument("--out", metavar="DIR", help="where to write the report (when not given: the first folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace report files in --out that are not rbjax's unchanged report of the same folders "
                        "(e.g. edited by hand, or the report of other folders)")
    p.set_defaults(func=run)


def run(args) -> int:
    rep = write_report([Path(f) for f in args.folders], args.out or None, overwrite=args.overwrite)
    if rep["incomplete"]:
        print("rbjax report: the study is incomplete (stages missing; listed at the top of the report)")
    print(f"wrote {rep['md']}, {rep['html']}, {rep['figure']}, {rep['comparisons']}")
    return 0
