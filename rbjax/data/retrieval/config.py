"""The settings of a retrieval (:func:`rbjax.data.retrieval.run.retrieve`, ``rbjax retrieve``): which comments are
kept and how their windows are cut (paper §2.2).

:class:`RetrieveConfig` holds each default, help text and check once; ``rbjax retrieve``'s options are generated from
its fields (:func:`rbjax.commands.options.add_config_arguments`). Every field shapes the result: the scan's settings
(:class:`rbjax.data.retrieval.scan.ScanSettings`) and the merge's (de-duplication, the attribute rule) are made from
it, and it is part of the key of the files a retrieval writes. How the files are read (``jobs``, ``executor``,
``ray_address``), resuming and the progress bar are arguments of :func:`~rbjax.data.retrieval.run.retrieve` of
their own: the result is the same whatever they are.
"""
from __future__ import annotations

import dataclasses

from rbjax.core.config import check_types, field, replace_settings
from rbjax.core.errors import SettingError
from rbjax.data.retrieval.query import MAX_CHARS, WINDOW

__all__ = ["RetrieveConfig", "CLEAN_MODES"]

#: comment cleaning (:func:`rbjax.data.retrieval.query.clean_comment`): the paper's, or the released files' as well
CLEAN_MODES = ("paper", "reference")


@dataclasses.dataclass(frozen=True)
class RetrieveConfig:
    """Which comments a retrieval keeps and how their windows are cut (frozen). Each field's ``metadata["help"]`` is
    its documentation.

    ``start`` / ``end`` are parsed when the retrieval starts (:class:`rbjax.data.dumps.RecordFilter`: an ISO date or
    epoch seconds, UTC); ``subreddits`` may be given as any iterable of names (not one string).

    Raises:
        rbjax.core.errors.SettingError: a value of the wrong type or out of range (names the field; the CLI shows
            its flag).
    """

    start: str | int | float | None = field(None, "keep comments created at or after this (YYYY-MM-DD or epoch s, "
                                                  "UTC)", metavar="DATE")
    end: str | int | float | None = field(None, "keep comments created before this (exclusive)", metavar="DATE")
    subreddits: tuple[str, ...] | None = field(None, "keep only this subreddit (repeatable)", flag="--subreddit",
                                               alias=False, metavar="NAME", repeat=True)
    window: int = field(WINDOW, "tokens each side of the target term (default 7)")
    max_chars: int = field(MAX_CHARS, "keep cleaned comments shorter than this (default 150)")
    clean_mode: str = field("paper", "cleaning: 'paper' (default) or 'reference' (also keep only a-z0-9 .!?- like "
                                     "the released files)", flag="--clean", alias=False, choices=CLEAN_MODES)
    require_attribute_in_window: bool = field(False, "drop windows without an A1 attribute (upstream did this for "
                                                     "all types but religion1)", flag="--attribute-in-window-only",
                                              alias=False)
    dedupe: bool = field(True, "drop repeated phrases / comment ids", negate="--keep-duplicates")
    prefilter: bool = field(True, "the raw-bytes prefilter: lines without a query term are not parsed (faster; the corrupt lines it skips are not counted)", negate="--no-prefilter")

    def __post_init__(self):
        if self.subreddits is not None and not isinstance(self.subreddits, (str, list, tuple)):
            object.__setattr__(self, "subreddits", tuple(self.subreddits))  # a set or another iterable of names
        check_types(self)
        for name in ("window", "max_chars"):
            if getattr(self, name) < 1:
                raise SettingError(name, f"must be at least 1, got {getattr(self, name)}")
        if self.clean_mode not in CLEAN_MODES:
            raise SettingError("clean_mode", f"must be 'paper' or 'reference', got {self.clean_mode!r}")

    def replace(self, **changes) -> RetrieveConfig:
        """A copy with ``changes`` (checked again).

        Raises:
            TypeError: a name that is not a setting of the retrieval.
        """
        return replace_settings(self, "retrieval", **changes)
