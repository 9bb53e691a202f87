"""Where a retrieval run writes: the candidates CSV of each bias type, the parts folder and ``summary.json``,
from ``--out``."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path


def output_paths(out: str | Path, names: Sequence[str]) -> dict[str, Path]:
    """Output CSV per bias type (see :func:`output_layout`)."""
    return output_layout(out, names).csvs


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    """Where a retrieval run writes.

    Attributes:
        csvs: the merged candidates CSV of each bias type.
        parts_dir: the per-file parts (one sub-folder per dump file).
        summary: the JSON summary of the run.
        folder: whether ``--out`` named a folder.
    """

    csvs: dict[str, Path]
    parts_dir: Path
    summary: Path
    folder: bool


def output_layout(out: str | Path, names: Sequence[str]) -> OutputLayout:
    """Output files of a run for ``names`` (bias types) from ``--out``.

    * A folder (an existing one, or a path without a file suffix and without ``{bias}``):
      ``OUT/candidates_<name>.csv`` per type, ``OUT/summary.json`` and ``OUT/parts/``.
    * A file: one bias type: ``out`` itself; several: ``out`` formatted with ``{bias}``,
      else ``<stem>_<name><suffix>``. The parts and ``summary.json`` go to ``<out>.parts/``
      beside it (``{bias}`` there replaced by the names joined with ``+``).
    """
    out_s = str(out)
    names = list(names)
    p = Path(out_s)
    if "{bias}" not in out_s and (p.is_dir() or (not p.exists() and not p.suffix)):
        return OutputLayout({n: p / f"candidates_{n}.csv" for n in names}, p / "parts", p / "summary.json", True)
    if "{bias}" in out_s:
        csvs = {n: Path(out_s.format(bias=n)) for n in names}
        parts = Path(out_s.replace("{bias}", "+".join(names)) + ".parts")
    else:
        if len(names) == 1:
            csvs = {names[0]: p}
        else:
            suffix = p.suffix or ".csv"
            csvs = {n: p.with_name(f"{p.stem}_{n}{suffix}") for n in names}
        parts = Path(out_s + ".parts")
    return OutputLayout(csvs, parts, parts / "summary.json", False)
