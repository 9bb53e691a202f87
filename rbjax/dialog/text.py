"""Text cleaning of the DSTC-7 response-generation scorer (``dstc.py -c``; docs/dialog.md, "Response-generation
metrics").

The official scorer (``mgalley/DSTC7-End-to-End-Conversation-Modeling``, ``evaluation/src/tokenizers.py``,
``clean_str``) cleans every hypothesis and reference when run with ``-c``, which is how the DSTC-7 scores of the
paper's Table 5 and the organisers' score sheets were produced. :func:`clean_dstc7` reimplements it step by step:

1. lower-case (Python ``str.lower``);
2. every whitespace-separated word that contains ``http`` is cut there and the rest replaced by the token
   ``__url__`` (``"this?https://x.org"`` → ``"this? __url__"``);
3. Markdown links ``[text] ( __url__ )`` keep only ``text``;
4. every character outside ``A-Z a-z 0-9 ( ) : , . ! ? " '`` becomes a space (``__url__`` is protected), so
   non-ASCII letters, ``-``, ``/``, ``&``, ``*``, … disappear;
5. nltk's :class:`~nltk.tokenize.TweetTokenizer` (the library the official script uses; emoticons such as ``:)``
   stay one token);
6. contractions are split: ``won't`` → ``will n't``, ``can't`` → ``can n't``, and the suffixes ``'s 'm 're n't
   'll 've 'd 'em`` are detached (``don't`` → ``do n't``), with the same plain string replacements as the
   official script (so their quirks are kept: of two adjacent ``won't`` only the first becomes ``will n't``);
7. runs of whitespace become one space, none at either end.

Known difference: the official scores were produced with the nltk of 2018 (3.3/3.4). TweetTokenizer's regular
expressions changed a little since (phone numbers, some emoticons); text restricted to the characters kept by
step 4 is rarely affected, but this was not checked against the 2018 version. The nltk version is recorded in
every result file.
"""
from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["clean_dstc7"]

#: the contraction suffixes the official scorer detaches (tokenizers.py ``add_space``)
CONTRACTION_SUFFIXES = ("'s", "'m", "'re", "n't", "'ll", "'ve", "'d", "'em")

_MARKDOWN_URL = re.compile(r"\[([^\]]*)\] \( *__url__ *\)")
_ILLEGAL = re.compile(r"[^A-Za-z0-9():,.!?\"\']")
_LEADING = re.compile(r"^\s+")
_TRAILING = re.compile(r"\s+$")
_SPACES = re.compile(r"\s+")


@lru_cache(maxsize=1)
def _tweet_tokenizer():
    try:
        from nltk.tokenize import TweetTokenizer
    except ImportError as e:  # pragma: no cover - nltk is a core dependency
        raise RuntimeError("the DSTC-7 cleaning (--clean) needs nltk: pip install nltk") from e
    return TweetTokenizer(preserve_case=False)


def clean_dstc7(text: str) -> str:
    """Clean one line as DSTC-7's ``dstc.py -c`` does (``tokenizers.py:clean_str``; see the module docstring).

    Args:
        text: one hypothesis or reference (no line breaks needed; any whitespace is a word boundary).
    Returns:
        the cleaned, space-tokenised, lower-case line; ``""`` when nothing is left.
    Examples:
        ``clean_dstc7(" I don't know:). how about this?https://github.com")``
        == ``"i do n't know :) . how about this ? __url__"`` (the official README's example).
    """
    txt = " " + text.lower() + " "
    words = []
    for word in txt.split():
        i = word.find("http")
        if i >= 0:
            word = word[:i] + " " + "__url__"
        words.append(word.strip())
    txt = " ".join(words)
    txt = _MARKDOWN_URL.sub(r"\1", txt)
    # protect the URL token from the character filter (the underscores would go); after lower-casing, the only
    # upper-case "URL" in the text is this placeholder
    txt = txt.replace("__url__", "URL")
    txt = _ILLEGAL.sub(" ", txt)
    txt = txt.replace("URL", "__url__")

    txt = " " + " ".join(_tweet_tokenizer().tokenize(txt)) + " "
    txt = txt.replace(" won't ", " will n't ")
    txt = txt.replace(" can't ", " can n't ")
    for suffix in CONTRACTION_SUFFIXES:
        txt = txt.replace(suffix + " ", " " + suffix + " ")
    txt = _LEADING.sub("", txt)
    txt = _TRAILING.sub("", txt)
    return _SPACES.sub(" ", txt)
