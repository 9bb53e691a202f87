"""``rbjax annotate``: export candidates for annotators, import their labels (α, majority) — paper §2.3.

The options besides the files (:class:`AnnotateCommand`), the output and ``--overwrite``
(:class:`rbjax.commands.settings.Output`) are the fields of
:class:`rbjax.data.annotation.AnnotationExportConfig` (export) and
:class:`~rbjax.data.annotation.AnnotationImportConfig` (import)."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rbjax.commands.options import add_config_arguments, config_values
from rbjax.commands.settings import Output
from rbjax.core.config import field
from rbjax.core.io import check_output_file, sha256_file
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.data.annotation import (
    AnnotationExportConfig,
    AnnotationImportConfig,
    aggregate,
    export_for_annotation,
    read_annotations,
    write_aggregated,
)


@dataclasses.dataclass(frozen=True)
class AnnotateCommand:
    """The input files of ``rbjax annotate export`` / ``import`` (their output and ``--overwrite`` are
    :class:`rbjax.commands.settings.Output`'s)."""

    candidates: str | None = field(None, "CSV written by 'rbjax retrieve'", metavar="CANDIDATES")
    files: tuple[str, ...] | None = field(None, "one CSV per annotator", positional=True, metavar="files")
    items: str | None = field(None, "items.csv of the export (carries every candidate column; every annotator row "
                                    "must name one of its items)", metavar="ITEMS")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "annotate",
        help="export candidates for annotation; import annotators' files (Krippendorff's alpha, majority labels)",
        description="Annotation round trip (paper §2.3). 'export' writes one CSV per annotator with "
                    "comment_label / phrase_label to fill with biased / unbiased / skip; 'import' reads "
                    "them back, reports Krippendorff's alpha at comment and phrase level, and writes the "
                    "majority labels in the released annotated layout (input of 'rbjax splits').",
    )
    sub = p.add_subparsers(dest="annotate_command", metavar="{export,import}")
    e = sub.add_parser("export", help="write annotation files from a candidates CSV",
                       description="Writes OUT_DIR/items.csv (every candidate column), one OUT_DIR/<annotator>.csv "
                                   "per annotator (comment_label / phrase_label to fill) and OUT_DIR/GUIDELINES.txt.")
    add_config_arguments(e, AnnotateCommand, ("candidates",), required=("candidates",))
    add_config_arguments(e, Output, ("out_dir",), required=("out_dir",))
    add_config_arguments(e, AnnotationExportConfig)
    add_config_arguments(e, Output, ("overwrite",))
    i = sub.add_parser("import", help="read annotators' files: agreement and majority labels")
    add_config_arguments(i, AnnotateCommand, ("files", "items"))
    add_config_arguments(i, Output, ("out",), overrides={"out": {"help": "write the aggregated labels to this file "
                                                                        "(released annotated layout)"}})
    add_config_arguments(i, AnnotationImportConfig)
    add_config_arguments(i, Output, ("overwrite",))
    p.set_defaults(func=run, _annotate_parser=p)


def run_export(args: argparse.Namespace) -> int:

    paths = export_for_annotation(args.candidates, args.out_dir,
                                  config=AnnotationExportConfig(**config_values(args, AnnotationExportConfig)),
                                  overwrite=args.overwrite)
    for k, v in paths.items():
        print(f"{k}: {v}")
    print("fill comment_label and phrase_label with: biased / unbiased / skip")
    return 0


def run_import(args: argparse.Namespace) -> int:
    config = AnnotationImportConfig(**config_values(args, AnnotationImportConfig))
    key = None
    if args.out:
        check_output_file(args.out, "--out")
        inputs = [f for f in [*args.files, args.items] if f is not None and Path(f).is_file()]
        key = {"command": "annotate import", "files": [sha256_file(f) for f in inputs],
               "unknown_labels": config.unknown}
        claim_outputs([args.out], key, overwrite=args.overwrite)
    # every file is checked (columns, labels, items) before anything is computed
    ann = read_annotations(args.files, config, items=args.items)
    for w in ann.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{len(ann.items)} items, {len(ann.annotators)} annotators")
    for name, c in ann.counts.items():
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    for level, res in ann.alpha().items():
        print(f"Krippendorff's alpha ({level} level): {res}")
    agg = aggregate(ann)
    for level, labels, ties in (("comment", agg.comment, agg.comment_ties), ("phrase", agg.phrase, agg.phrase_ties)):
        nb = sum(1 for x in labels if x == 1)
        nu = sum(1 for x in labels if x == 0)
        print(f"majority ({level}): biased {nb}, unbiased {nu}, no label {len(labels) - nb - nu} "
              f"(ties {len(ties)}{': items ' + ', '.join(ties[:20]) + (' ...' if len(ties) > 20 else '') if ties else ''})")
    if args.out:
        out = write_aggregated(ann, agg, args.out, items=args.items)
        record_outputs([out], key)
        print(f"wrote {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to ``export`` / ``import``; without one, print the help (exit 2)."""
    if args.annotate_command == "export":
        return run_export(args)
    if args.annotate_command == "import":
        return run_import(args)
    args._annotate_parser.print_help()
    return 2
