"""Candidate retrieval from Reddit comment dumps (paper §2.2).

The paper's procedure, over dumps instead of the (defunct) Pushshift API:

1. **Query** = a T1 target query (``spec.queries``: the T1 terms with the correct form of
   "to be" where the specification says so, e.g. ``"jews are"``, ``"torah is"``) × an A1
   attribute (``spec.attributes_a1``): a comment is retrieved when it contains both, as
   whole words, anywhere. ``*`` in an attribute is a wildcard (``greed*`` matches
   ``greedy``, ``greediness``); multi-word attributes (quoted in the paper's lists, e.g.
   ``"beady eyes"``) must occur as that word sequence.
2. **Cleaning**: remove URLs (including the link part of ``[text](url)``), user names
   (``u/name``, ``/u/name``, ``@name``) and extra spaces, lower-case; HTML entities of the
   dumps (``&amp;``) are decoded. Only comments shorter than ``max_chars`` (150)
   characters *after* cleaning are kept.
3. **Window**: split the cleaned comment on single spaces; for every occurrence of a T1
   target term (``spec.phrase_words`` when the spec has them, else ``spec.targets_t1``),
   the phrase is tokens ``[i-7, i+8)`` around the term's first token ``i``. Flags record
   whether an A1 attribute and a query lie inside the window. Identical phrases are kept
   once (per bias type), as upstream did.

Speed: every query needs one literal word; a raw-bytes prefilter checks the
lower-cased line for these words before any JSON parsing, so the vast majority of lines
cost a ``bytes.lower`` and one regex scan. The prefilter is exact for ASCII query words
(a line it rejects cannot contain a query after cleaning); it is switched off when a query
has non-ASCII letters. Corner cases it would miss: a query word written with HTML numeric
entities (``&#106;ews``) or JSON ``\\u00XX`` escapes of ASCII letters (no dump writer does this),
or with non-ASCII letters whose lower case is ASCII (the Kelvin sign).

Output (CSV, written to a temporary file and moved into place at the end) has the columns
of :data:`CANDIDATE_COLUMNS`.

Many files (:func:`retrieve`): each dump file is one task (:func:`scan_dump`), run in this
process, in spawned worker processes or on a Ray cluster (:mod:`rbjax.core.parallel`). A task
returns every window of its file *before* de-duplication; the calling process writes it as a
part (``<parts>/<file name>-<hash of its path>/windows_<k>.csv`` + ``part.json``, the record
of what produced it, written last) as soon as it comes back. The merge then replays the
de-duplication over the parts in file order, exactly as one pass over the files would, so
the candidates CSV is byte-identical whatever the number of jobs, the executor or the order
in which files finish.

Modules (each imports only those listed before it, so there is no cycle; the import-linter
contract "retrieval modules point down" in pyproject.toml checks it):

* :mod:`~rbjax.data.retrieval.query` — cleaning (:func:`clean_comment`), the T1-query × A1-attribute
  matcher and its windows (:class:`QueryMatcher`), the raw-bytes prefilter (:func:`make_prefilter`),
  the candidate columns (:data:`CANDIDATE_COLUMNS`).
* :mod:`~rbjax.data.retrieval.layout` — where a run writes, from ``--out`` (:func:`output_layout`).
* :mod:`~rbjax.data.retrieval.scan` — one dump file, the work unit of a run (:func:`scan_dump` →
  :class:`FilePart`), its settings, and :func:`code_digest`: the hash of the source of ``query``,
  ``scan``, ``parts`` and :mod:`rbjax.data.dumps` (the code that decides what a part holds) that
  keys every part.
* :mod:`~rbjax.data.retrieval.parts` — the resumable part folders: write, load, what changed.
* :mod:`~rbjax.data.retrieval.merge` — replaying the de-duplication over the parts, in file order,
  into the candidates CSVs.
* :mod:`~rbjax.data.retrieval.config` — the settings of a retrieval (:class:`RetrieveConfig`: the
  date range, subreddits, window, cleaning, de-duplication; ``rbjax retrieve``'s options are its fields).
* :mod:`~rbjax.data.retrieval.run` — the run: :func:`retrieve` and its :class:`RetrievalResult`.

This package re-exports the public names of its modules.
"""
from __future__ import annotations

from rbjax.data.retrieval.config import CLEAN_MODES, RetrieveConfig
from rbjax.data.retrieval.layout import OutputLayout, output_layout, output_paths
from rbjax.data.retrieval.merge import merge_parts
from rbjax.data.retrieval.parts import PART_RECORD, part_folder
from rbjax.data.retrieval.query import (
    CANDIDATE_COLUMNS,
    MAX_CHARS,
    WINDOW,
    Candidate,
    QueryMatcher,
    clean_comment,
    make_prefilter,
    raw_body,
)
from rbjax.data.retrieval.run import RetrievalResult, retrieve
from rbjax.data.retrieval.scan import (
    PART_COLUMNS,
    RETRIEVAL_VERSION,
    FilePart,
    FileTask,
    ScanSettings,
    code_digest,
    peak_rss_mib,
    scan_dump,
)

__all__ = [
    "CANDIDATE_COLUMNS",
    "CLEAN_MODES",
    "MAX_CHARS",
    "PART_COLUMNS",
    "PART_RECORD",
    "RETRIEVAL_VERSION",
    "WINDOW",
    "Candidate",
    "FilePart",
    "FileTask",
    "OutputLayout",
    "QueryMatcher",
    "RetrievalResult",
    "RetrieveConfig",
    "ScanSettings",
    "clean_comment",
    "code_digest",
    "make_prefilter",
    "merge_parts",
    "output_layout",
    "output_paths",
    "part_folder",
    "peak_rss_mib",
    "raw_body",
    "retrieve",
    "scan_dump",
]
