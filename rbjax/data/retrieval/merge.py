"""The merge: the parts of a run, in file order, replayed through the de-duplication into one candidates CSV per
bias type, exactly as one pass over the files would (so the result does not depend on the jobs, the executor or
the order in which files finished)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from rbjax.core.io import atomic_csv_writer
from rbjax.data.retrieval.parts import read_part_rows
from rbjax.data.retrieval.query import CANDIDATE_COLUMNS


def _replay(rows: Iterable[list[str]], writer, state: dict, dedupe: bool, require_attribute_in_window: bool) -> None:
    """Apply de-duplication to one part's windows, exactly as one pass over the files in order
    would: a comment id seen before drops all the comment's windows (and does not mark its
    phrases); a window without an attribute is dropped before its phrase is marked."""
    seen_ids, seen_phrases = state["ids"], state["phrases"]
    group: list[list[str]] = []
    current = None

    def flush():
        if not group:
            return
        cid = group[0][1]
        if dedupe and cid:
            if cid in seen_ids:
                state["duplicates"] += len(group)
                return
            seen_ids.add(cid)
        wrote = False
        for row in group:
            if require_attribute_in_window and row[11] != "True":
                continue
            if dedupe:
                phrase = row[6]
                if phrase in seen_phrases:
                    state["duplicates"] += 1
                    continue
                seen_phrases.add(phrase)
            writer.writerow(row[1:])
            state["candidates"] += 1
            wrote = True
        if wrote:
            state["matched"] += 1

    for row in rows:
        if row[0] != current:
            flush()
            group = []
            current = row[0]
        group.append(row)
    flush()


def merge_parts(csvs: dict[str, Path], parts: Sequence[tuple[Path, dict]], *, dedupe: bool,
                require_attribute_in_window: bool) -> dict[str, dict[str, int]]:
    """Write the candidates CSV of each bias type from the parts of a run (atomically, all at the end).

    Args:
        csvs: the output CSV of each bias type (the part records' ``windows`` are keyed by these names).
        parts: ``(folder, record)`` of each dump file's part, in file order.
        dedupe, require_attribute_in_window: see :func:`rbjax.data.retrieval.run.retrieve`.

    Returns:
        Per bias type: ``candidates`` (rows written), ``matched`` (comments with a row written) and
        ``duplicates`` (windows dropped as repeated phrases or comment ids).
    """
    names = list(csvs)
    states = {n: {"ids": set(), "phrases": set(), "candidates": 0, "matched": 0, "duplicates": 0} for n in names}
    with contextlib.ExitStack() as stack:
        writers = {n: stack.enter_context(atomic_csv_writer(csvs[n], CANDIDATE_COLUMNS,
                                                            errors="backslashreplace")) for n in names}
        for n in names:
            for folder, rec in parts:
                _replay(read_part_rows(folder / rec["windows"][n]["file"]), writers[n], states[n], dedupe,
                        require_attribute_in_window)
    return {n: {k: states[n][k] for k in ("candidates", "matched", "duplicates")} for n in names}
