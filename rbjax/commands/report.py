"""``rbjax report DIR [DIR ...]``: rebuild the study report from finished study folders.

The report has no settings of its own (it reports the stages' own): its options are the folders
(:class:`ReportCommand`), ``--out`` and ``--overwrite`` (:class:`rbjax.commands.settings.Output`), the arguments of
:func:`rbjax.study.report.write_report`."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.commands.options import add_config_arguments
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.study.report import write_report


@dataclasses.dataclass(frozen=True)
class ReportCommand:
    """The study folders ``rbjax report`` reads."""

    folders: tuple[str, ...] | None = field(None, "finished study folders", positional=True, metavar="DIR")


#: --out of report: the first folder when not given
REPORT_OUT_HELP = "where to write the report (when not given: the first folder)"


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="rebuild report.md / report.html from finished study folders",
        description="Read the stage results of one or more `rbjax run` folders (several: their seeds are pooled; a "
                    "stage found in two folders with the same key — a copied run — is counted once, with a message; "
                    "folders with different baselines are refused) and write report.md, report.html (self-contained, "
                    "figures embedded), figure1.png and comparisons.json (the paired tests behind every 'changed / "
                    "did not change' statement). A study with unfinished stages says so at the top.")
    add_config_arguments(p, ReportCommand)
    add_config_arguments(p, Output, ("out",), overrides={"out": {"help": REPORT_OUT_HELP}})
    add_config_arguments(p, Output, ("overwrite",))
    p.set_defaults(func=run)


def run(args) -> int:
    rep = write_report([Path(f) for f in args.folders], args.out or None, overwrite=args.overwrite)
    if rep["incomplete"]:
        print("rbjax report: the study is incomplete (stages missing; listed at the top of the report)")
    print(f"wrote {rep['md']}, {rep['html']}, {rep['figure']}, {rep['comparisons']}")
    return 0
