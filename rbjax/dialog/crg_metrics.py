"""DSTC-7 response-generation metrics, as the official scorer computes them (paper §3.2, Table 5).

The paper scores generated responses with the DSTC-7 Task 2 scorer (``mgalley/DSTC7-End-to-End-Conversation-Modeling``,
``evaluation/src/dstc.py`` → ``metrics.py:nlp_metrics``). That scorer shells out to
two external tools (``mteval-v14c.pl``, Perl, and ``meteor-1.5.jar``, Java) and computes the rest in Python.
:func:`crg_metrics` gives the same numbers from Python; docs/dialog.md lists every definition.

Where each number comes from
----------------------------
* **BLEU-1..4 and NIST-1..4** (cumulative) — reimplemented here from ``mteval-v14c.pl`` (same algorithm as
  ``mteval-v14.pl`` in moses-smt/mosesdecoder ``scripts/generic/``), fed the way ``metrics.py`` feeds it:

  - each line has ``&`` and ``<`` replaced by spaces and an empty line becomes ``__empty__`` (``metrics.py``
    ``_write_xml``; it then tokenises to ``_ _ empty _ _``);
  - mteval's default ("western") normalisation: ASCII-only lower-casing (``tr/A-Z/a-z/``) and the punctuation
    rules. The rules are taken from sacrebleu's ``13a`` tokenizer, a maintained port of exactly that function;
  - n-gram matches clipped by the maximum count in any one reference of the segment, summed over the corpus;
  - **BLEU**: brevity penalty with, per segment, the reference length *closest* to the hypothesis length (ties:
    the shorter; mteval's default ``--brevity-penalty closest``), and mteval's default smoothing: an order with no
    match gets precision ``1/(2^k · #hyp n-grams)``, ``k`` counting such orders; an order with no hypothesis n-gram
    counts as precision 1. BLEU-n = BP · exp(mean of log p_1..p_n);
  - **NIST**: information weights from the references (all reference sets, all segments):
    ``info(w1..wn) = log2(count(w1..wn-1) / count(w1..wn))`` (``count()`` of the empty prefix = number of reference
    words); NIST-n = Σ_{k≤n} Σ info(matched k-grams) / #hyp k-grams, times the length penalty
    ``exp(-β·ln²(min(1, L_hyp / L̄_ref)))`` with ``L̄_ref`` = reference words / number of reference sets and β
    chosen so that a ratio of 2/3 gives 0.5.

  Why not a library: sacrebleu's ``corpus_bleu`` (tokenize ``13a``, smoothing ``exp``, closest reference length)
  agrees with mteval's BLEU on ordinary data (a test checks this), but returns 0 where mteval does not: when no
  hypothesis unigram matches at all, and when some order has no hypothesis n-gram (mteval counts that precision as
  1). sacrebleu lower-cases with Unicode rules where mteval lower-cases ASCII only. nltk's ``corpus_nist`` scores
  each segment against its single best reference and uses that reference's length in the penalty, which is not
  mteval's NIST. The reimplementation is ≈ 60 lines and reproduces the official demo values (below).
* **METEOR** — the real ``meteor-1.5.jar`` run as ``metrics.py`` runs it: ``java -jar meteor-1.5.jar HYP REFS -r K
  -l en -norm`` with the K references of each line merged one after the other, score read from ``Final score:``.
  The jar and its English paraphrase table come from the PyPI package ``pycocoevalcap`` (which bundles
  ``meteor-1.5.jar`` and ``data/paraphrase-en.gz``; extra ``rbjax[meteor]``) or from ``$RBJAX_METEOR_JAR`` /
  ``meteor_jar=``; Java comes from ``PATH`` (or ``java=``). Without them, or when Java fails, METEOR is ``None``
  and ``meteor_note`` says why — never 0. Note: the official README's demo value 0.2832 is what the jar gives
  *without* ``-norm``; the command in ``metrics.py`` (with ``-norm``) gives 0.2714 on the demo. rbjax runs the
  command (``meteor_norm=True``); ``meteor_norm=False`` reproduces the README figure. nltk's ``meteor_score`` is
  a different metric (WordNet synonyms only, no paraphrases, its own parameters) and is not used.
* **entropy-1..4** — Shannon entropy in nats of the n-gram counts pooled over all hypotheses (``calc_entropy``).
* **dist-1/2** — distinct n-grams / all n-grams, pooled over all hypotheses (``calc_diversity``); *not* the mean
  of per-sentence ratios.
* **avg_len** — mean number of whitespace tokens per hypothesis (``calc_len``).

Entropy, dist and length split lines on whitespace only (no mteval normalisation), as the official code does.
With ``clean=True``, hypotheses and references are first cleaned by :func:`rbjax.dialog.text.clean_dstc7`
(``dstc.py -c``). Differences from the official scripts, all on degenerate input: where an official script would
crash (no n-gram of some order for dist, no reference words for NIST) or return 0 for an undefined value (entropy
of an order with no n-gram), the value here is ``None`` with the reason in ``null_reasons``; lines with characters
that XML forbids (control characters) make ``mteval-v14c.pl``'s XML parser fail, and are scored here as text; a
UTF-8 byte-order mark at the start of a file is dropped.

Official demo (``evaluation/src/demo``, no cleaning), reproduced to the 4 printed decimals by the tests:
nist = [1.8338, 2.0838, 2.1949, 2.1949], bleu = [0.4667, 0.441, 0.4017, 0.3224], entropy = [2.5232, 2.4849,
2.1972, 1.7918], dist = [0.8667, 1.0], avg_len = 5.0; METEOR 0.2832 (README, no ``-norm``) / 0.2714 (``-norm``).
"""
from __future__ import annotations

import importlib.util
import io
import math
import os
import re
import shutil
import string
import subprocess
import tempfile
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from rbjax.core.io import atomic_write_json, check_output_dir, sha256_file, versions
from rbjax.core.reuse import claim_outputs, record_outputs
from rbjax.dialog.text import clean_dstc7

__all__ = [
    "crg_metrics", "read_lines", "read_hyp_refs", "evaluate_crg_metrics", "mteval_words", "bleu_nist",
    "entropy", "distinct", "meteor", "find_meteor_jar", "format_crg_table",
]

#: the packages the metrics come from, recorded with every result
METRIC_PACKAGES = ("nltk", "sacrebleu", "pycocoevalcap")

MAX_ORDER = 4
#: mteval's NIST length penalty: a hypothesis/reference length ratio of 1.5⁻¹ scores 0.5
_NIST_BETA = -math.log(0.5) / math.log(1.5) ** 2
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_METEOR_ENV = "RBJAX_METEOR_JAR"


# --------------------------------------------------------------------------------------------- input

def read_lines(path: str | os.PathLike, what: str = "file") -> list[str]:
    """Lines of a UTF-8 text file, one example per line, as the official scorer reads them.

    Python's universal newlines (``\\n``, ``\\r\\n`` and ``\\r`` all end a line); the final line break is optional;
    a UTF-8 byte-order mark is dropped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty (no line), or is not UTF-8 (the message names the line and byte offset).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{what} {path}: not UTF-8 text (line {line}, byte offset {e.start}: {e.reason})") from None
    # universal newlines, as open() reads text (str.splitlines would also break at \x0b, \x0c, \x1c, \u2028, ...)
    out = [line[:-1] if line.endswith("\n") else line for line in io.StringIO(text, newline=None)]
    if not out:
        raise ValueError(f"{what} {path}: empty file (expected one example per line)")
    return out


def read_hyp_refs(hyp: str | os.PathLike, refs: Sequence[str | os.PathLike] | None) -> tuple[list[str], list[list[str]] | None]:
    """Read a hypothesis file and line-aligned reference files (one file per reference set).

    Returns:
        ``(hypotheses, references)`` with ``references[k][i]`` the line ``i`` of reference file ``k`` (``None`` when
        ``refs`` is empty or ``None``).
    Raises:
        FileNotFoundError, ValueError: a missing, empty or non-UTF-8 file, or a reference file whose line count
        differs from the hypothesis file's (the message names both files and counts).
    """
    hyps = read_lines(hyp, "hypothesis file")
    if not refs:
        return hyps, None
    ref_sets = []
    for path in refs:
        lines = read_lines(path, "reference file")
        if len(lines) != len(hyps):
            raise ValueError(f"reference file {path} has {len(lines)} lines but hypothesis file {hyp} has "
                             f"{len(hyps)}: references must be line-aligned with the hypotheses (one file per "
                             f"reference set, one line per example)")
        ref_sets.append(lines)
    return hyps, ref_sets


def _check_lines(lines: Sequence[str], what: str) -> None:
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise ValueError(f"{what} {i + 1}: expected a string, got {type(line).__name__}")
        if "\n" in line or "\r" in line:
            raise ValueError(f"{what} {i + 1}: contains a line break; each example must be one line "
                             f"(the official scorer is line-based)")


# ----------------------------------------------------------------------------------- mteval BLEU/NIST

@lru_cache(maxsize=1)
def _tokenizer_13a():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def mteval_words(line: str) -> list[str]:
    """Tokens of one line as ``metrics.py`` + ``mteval-v14c.pl`` see them (see the module docstring).

    ``&`` and ``<`` become spaces and an empty line becomes ``__empty__`` (``metrics.py:_write_xml``), then mteval's
    default normalisation: ASCII lower-casing and the punctuation rules (sacrebleu's ``13a`` tokenizer).
    """
    line = line.replace("&", " ").replace("<", " ")
    if not line:
        line = "__empty__"
    return _tokenizer_13a()(line.translate(_ASCII_LOWER)).split()


def _ngrams(words: Sequence[str], max_order: int = MAX_ORDER) -> Counter:
    c: Counter = Counter()
    for n in range(1, max_order + 1):
        for i in range(len(words) - n + 1):
            c[tuple(words[i:i + n])] += 1
    return c


def _closest_ref_len(hyp_len: int, ref_lens: Sequence[int]) -> int:
    """mteval's ``brevity_penalty_closest``: the reference length closest to ``hyp_len``, the shorter on a tie."""
    return min(ref_lens, key=lambda r: (abs(hyp_len - r), r))


def _nist_length_penalty(ratio: float) -> float:
    if ratio >= 1:
        return 1.0
    if ratio <= 0:
        return 0.0
    return math.exp(-_NIST_BETA * math.log(ratio) ** 2)


def bleu_nist(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
              max_order: int = MAX_ORDER) -> tuple[list[float] | None, list[float] | None, dict]:
    """Cumulative BLEU-1..n and NIST-1..n of a corpus, as ``mteval-v14c.pl`` computes them (system level).

    Args:
        hypotheses: N lines.
        references: K reference sets, each N lines line-aligned with ``hypotheses`` (``references[k][i]``).
        max_order: highest n-gram order reported (DSTC-7: 4).
    Returns:
        ``(bleu, nist, stats)``: two lists of ``max_order`` floats (BLEU in [0, 1], NIST in information bits),
        and the sufficient statistics (per-order matches, hypothesis n-grams, matched information, lengths).
        NIST is ``None`` when the references have no word at all (mteval divides by zero there).
    """
    k = len(references)
    tok_hyps = [mteval_words(h) for h in hypotheses]
    tok_refs = [[mteval_words(r) for r in ref_set] for ref_set in references]

    # information weights from all reference segments of all sets
    ref_counts: Counter = Counter()
    ref_words = 0
    for ref_set in tok_refs:
        for words in ref_set:
            ref_counts.update(_ngrams(words, max_order))
            ref_words += len(words)

    def info(g: tuple) -> float:
        denom = ref_counts[g[:-1]] if len(g) > 1 else ref_words
        return math.log2(denom / ref_counts[g])

    match = [0] * (max_order + 1)
    hyp_ngrams = [0] * (max_order + 1)
    match_info = [0.0] * (max_order + 1)
    hyp_len = ref_len = 0
    for i, h in enumerate(tok_hyps):
        refs_i = [ref_set[i] for ref_set in tok_refs]
        for n in range(1, max_order + 1):
            hyp_ngrams[n] += max(len(h) - n + 1, 0)
        hyp_len += len(h)
        ref_len += _closest_ref_len(len(h), [len(r) for r in refs_i])
        ref_max: Counter = Counter()
        for r in refs_i:
            ref_max |= _ngrams(r, max_order)  # element-wise max
        for g, c in _ngrams(h, max_order).items():
            if g in ref_max:
                m = min(c, ref_max[g])
                match[len(g)] += m
                match_info[len(g)] += info(g) * m

    # BLEU with mteval's default smoothing (bleu_score)
    bp = math.exp(min(0.0, 1.0 - ref_len / hyp_len)) if hyp_len > 0 else 0.0
    bleu, log_sum, smooth = [], 0.0, 1
    for n in range(1, max_order + 1):
        if hyp_ngrams[n] == 0:
            log_p = 0.0
        elif match[n] == 0:
            smooth *= 2
            log_p = math.log(1.0 / (smooth * hyp_ngrams[n]))
        else:
            log_p = math.log(match[n] / hyp_ngrams[n])
        log_sum += log_p
        bleu.append(math.exp(log_sum / n) * bp)

    # NIST (nist_score): ref_cnt[1]/nsys is the average reference length
    nist = None
    if ref_words > 0:
        lp = _nist_length_penalty(hyp_ngrams[1] / (ref_words / k))
        nist, acc = [], 0.0
        for n in range(1, max_order + 1):
            acc += match_info[n] / max(hyp_ngrams[n], 1)
            nist.append(acc * lp)
    stats = {"matches": match[1:], "hyp_ngrams": hyp_ngrams[1:], "matched_info_bits": match_info[1:],
             "hyp_len": hyp_len, "ref_len_closest": ref_len, "ref_words": ref_words, "n_reference_sets": k}
    return bleu, nist, stats


# ---------------------------------------------------------------------------------- reference-free

def _pooled_ngram_counts(hypotheses: Sequence[str], n: int) -> Counter:
    c: Counter = Counter()
    for h in hypotheses:
        w = h.split()
        c.update(" ".join(w[i:i + n]) for i in range(len(w) - n + 1))
    return c


def entropy(hypotheses: Sequence[str], max_order: int = MAX_ORDER) -> list[float | None]:
    """Entropy-1..n in nats of the n-gram counts pooled over all hypotheses (``metrics.py:calc_entropy``).

    ``H_n = -Σ_g (c_g/T) ln(c_g/T)`` over the distinct whitespace-token n-grams ``g`` of all hypotheses, ``T`` their
    total count. ``None`` for an order with no n-gram (the official code returns 0 there).
    """
    out = []
    for n in range(1, max_order + 1):
        counts = np.fromiter(_pooled_ngram_counts(hypotheses, n).values(), dtype=np.float64)
        if counts.size == 0:
            out.append(None)
            continue
        p = counts / counts.sum()
        out.append(float(-(p * np.log(p)).sum()))
    return out


def distinct(hypotheses: Sequence[str], max_order: int = 2) -> list[float | None]:
    """dist-1..n: distinct n-grams / all n-grams, both pooled over all hypotheses (``metrics.py:calc_diversity``).

    Not the mean of per-sentence ratios: ``["the cat sat", "the cat sat", "a dog ran far"]`` has dist-2 = 5/7.
    ``None`` for an order with no n-gram (the official code divides by zero).
    """
    out = []
    for n in range(1, max_order + 1):
        c = _pooled_ngram_counts(hypotheses, n)
        total = sum(c.values())
        out.append(len(c) / total if total else None)
    return out


# -------------------------------------------------------------------------------------------- METEOR

def find_meteor_jar(meteor_jar: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """Locate ``meteor-1.5.jar``: ``meteor_jar``, else ``$RBJAX_METEOR_JAR``, else the copy bundled in ``pycocoevalcap``.

    Returns:
        ``(path, "")`` when found with its English paraphrase table (``data/paraphrase-en.gz`` beside the jar),
        else ``(None, reason)``.
    """
    hint = ("install the PyPI package pycocoevalcap (pip install 'rbjax[meteor]'), which bundles meteor-1.5.jar "
            f"with its paraphrase data, or point ${_METEOR_ENV} / --meteor-jar at a meteor-1.5.jar")
    if meteor_jar is None:
        meteor_jar = os.environ.get(_METEOR_ENV) or None
    if meteor_jar is None:
        spec = importlib.util.find_spec("pycocoevalcap")
        if spec is None:
            return None, f"meteor-1.5.jar not found: {hint}"
        for root in (spec.submodule_search_locations or []):
            cand = Path(root) / "meteor" / "meteor-1.5.jar"
            if cand.is_file():
                meteor_jar = cand
                break
        else:
            return None, f"pycocoevalcap is installed but has no meteor/meteor-1.5.jar: {hint}"
    jar = Path(meteor_jar)
    if not jar.is_file():
        return None, f"meteor-1.5.jar not found at {jar}: {hint}"
    para = jar.parent / "data" / "paraphrase-en.gz"
    if not para.is_file():
        return None, f"METEOR's English paraphrase table {para} is missing (it must lie in data/ beside {jar.name})"
    return jar, ""


def _java_version(java: str) -> str | None:
    try:
        r = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (r.stderr or r.stdout).strip().splitlines()
    return first[0] if first else None


def meteor(hypotheses: Sequence[str], references: Sequence[Sequence[str]], *, norm: bool = True,
           meteor_jar: str | os.PathLike | None = None, java: str | None = None, heap: str = "2g",
           timeout: float | None = 3600) -> tuple[float | None, str, dict]:
    """Corpus METEOR 1.5 as ``metrics.py:calc_meteor`` computes it (``-l en [-norm] -r K``, merged references).

    Args:
        hypotheses: N lines; references: K sets of N lines (``references[k][i]``).
        norm: pass ``-norm`` (the official command does; the official README's demo value is without it).
        meteor_jar: path of ``meteor-1.5.jar`` (default: see :func:`find_meteor_jar`); java: Java executable
            (default: ``java`` on ``PATH``); heap: JVM ``-Xmx``; timeout: seconds for the Java run.
    Returns:
        ``(score, note, info)``: the system-level ``Final score`` in [0, 1] and a note on how it was obtained, or
        ``(None, reason, info)`` when Java or the jar is missing or the run fails. Never raises for those.
    """
    info: dict = {"norm": norm}
    jar, why = find_meteor_jar(meteor_jar)
    if jar is None:
        return None, why, info
    java_exe = java or shutil.which("java")
    if java_exe is None:
        return None, ("no Java runtime found (METEOR runs meteor-1.5.jar, which needs Java ≥ 8): install one, "
                      "e.g. apt-get install default-jre-headless"), info
    version = _java_version(java_exe)
    if version is None:
        return None, f"Java at {java_exe} does not run (`{java_exe} -version` failed)", info
    info.update({"jar": str(jar), "java": java_exe, "java_version": version})
    k = len(references)
    with tempfile.TemporaryDirectory(prefix="rbjax-meteor-") as tmp:
        hyp_path, refs_path = Path(tmp) / "hyp.txt", Path(tmp) / "refs_merged.txt"
        hyp_path.write_text("\n".join(hypotheses), encoding="utf-8")
        with open(refs_path, "w", encoding="utf-8") as f:
            for i in range(len(hypotheses)):
                for ref_set in references:
                    f.write(ref_set[i] + "\n")
        cmd = [java_exe, f"-Xmx{heap}", "-Dfile.encoding=UTF-8", "-jar", str(jar), str(hyp_path), str(refs_path),
               "-r", str(k), "-l", "en"] + (["-norm"] if norm else [])
        info["command"] = " ".join(cmd[:1] + cmd[1:5] + ["HYP", "REFS_MERGED"] + cmd[7:])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"meteor-1.5.jar did not finish within {timeout} s", info
        except OSError as e:
            return None, f"could not run Java ({java_exe}): {e}", info
    m = re.search(r"^Final score:\s*(\S+)\s*$", r.stdout, re.M)
    if r.returncode != 0 or m is None:
        tail = (r.stderr or r.stdout).strip()[-600:]
        return None, f"meteor-1.5.jar failed (exit {r.returncode}): {tail}", info
    note = (f"meteor-1.5.jar ({jar}) with -l en{' -norm' if norm else ''} over {k} reference set(s), "
            f"{version}")
    return float(m.group(1)), note, info


# ------------------------------------------------------------------------------------------ together

def crg_metrics(hypotheses: list[str], references: list[list[str]] | None = None, clean: bool = False, *,
                compute_meteor: bool = True, meteor_norm: bool = True, meteor_jar: str | os.PathLike | None = None,
                java: str | None = None) -> dict:
    """All DSTC-7 response-generation metrics of a corpus (``dstc.py`` / ``metrics.py:nlp_metrics``).

    Args:
        hypotheses: N generated responses, one string each (no line breaks).
        references: K reference sets, each a list of N strings line-aligned with ``hypotheses``
            (``references[k][i]`` is the k-th reference of example i; DSTC-7 uses K = 6 less the human one), or
            ``None`` for the reference-free metrics only.
        clean: apply DSTC-7's ``-c`` cleaning (:func:`rbjax.dialog.text.clean_dstc7`) to hypotheses and references.
        compute_meteor: run METEOR (needs Java and meteor-1.5.jar; see :func:`meteor`).
        meteor_norm, meteor_jar, java: passed to :func:`meteor`.
    Returns:
        a dict with ``bleu`` (BLEU-1..4, cumulative, in [0, 1]), ``nist`` (NIST-1..4, cumulative, bits),
        ``meteor`` (float in [0, 1] or ``None``), ``meteor_note`` (how METEOR was obtained, or why it is ``None``),
        ``entropy`` (entropy-1..4, nats), ``dist`` (dist-1, dist-2), ``avg_len`` (tokens per hypothesis),
        ``n_hypotheses``, ``n_references`` (reference sets), ``null_reasons`` ({metric: why it is None}) and
        ``bleu_nist_stats`` (mteval's sufficient statistics). DSTC-7's headline numbers are ``bleu[3]``,
        ``nist[1]``, ``meteor``, ``entropy[3]``, ``dist[1]`` and ``avg_len``.
    Raises:
        ValueError: no hypotheses, a reference set whose length differs from the hypotheses', a line break inside
        an example.
    """
    hypotheses = list(hypotheses)
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    _check_lines(hypotheses, "hypothesis")
    if references is not None:
        references = [list(r) for r in references]
        if isinstance(references[0] if references else None, str):
            raise ValueError("references must be a list of reference sets (lists of strings), one set per "
                             "reference file, each line-aligned with the hypotheses")
        for k, ref_set in enumerate(references):
            if len(ref_set) != len(hypotheses):
                raise ValueError(f"reference set {k} has {len(ref_set)} lines but there are {len(hypotheses)} "
                                 f"hypotheses: references must be line-aligned with the hypotheses")
            _check_lines(ref_set, f"reference set {k}, line")
        if not references:
            references = None
    if clean:

        hypotheses = [clean_dstc7(h) for h in hypotheses]
        if references is not None:
            references = [[clean_dstc7(r) for r in ref_set] for ref_set in references]

    null_reasons: dict[str, str] = {}
    ent = entropy(hypotheses)
    for n, v in enumerate(ent, 1):
        if v is None:
            null_reasons[f"entropy-{n}"] = f"no hypothesis has {n} tokens or more"
    dist = distinct(hypotheses)
    for n, v in enumerate(dist, 1):
        if v is None:
            null_reasons[f"dist-{n}"] = f"no hypothesis has {n} tokens or more"
    out: dict = {"bleu": None, "nist": None, "meteor": None, "meteor_note": "", "entropy": ent, "dist": dist,
                 "avg_len": float(np.mean([len(h.split()) for h in hypotheses])),
                 "n_hypotheses": len(hypotheses), "n_references": 0 if references is None else len(references)}
    if references is None:
        why = "no references given (BLEU, NIST and METEOR compare with references)"
        null_reasons.update({"bleu": why, "nist": why, "meteor": why})
        out["meteor_note"] = why
    else:
        bleu, nist, stats = bleu_nist(hypotheses, references)
        out["bleu"], out["nist"], out["bleu_nist_stats"] = bleu, nist, stats
        if nist is None:
            null_reasons["nist"] = "the references have no word (mteval's length penalty divides by zero)"
        if compute_meteor:
            score, note, info = meteor(hypotheses, references, norm=meteor_norm, meteor_jar=meteor_jar, java=java)
            out["meteor"], out["meteor_note"], out["meteor_info"] = score, note, info
            if score is None:
                null_reasons["meteor"] = note
        else:
            out["meteor_note"] = null_reasons["meteor"] = "METEOR not requested (compute_meteor=False / --no-meteor)"
    out["null_reasons"] = null_reasons
    return out


def format_crg_table(m: dict) -> str:
    """A short text table of :func:`crg_metrics` output (4 decimals; ``—`` for a missing value)."""
    def f(v, fmt="{:.4f}"):
        return "—" if v is None else fmt.format(v)

    def row(name, vals):
        vals = vals if vals is not None else [None] * 4
        return f"{name:<9}" + "".join(f"{f(v):>9}" for v in vals)

    lines = [f"{'':<9}" + "".join(f"{'n=' + str(n):>9}" for n in range(1, 5)),
             row("BLEU", m.get("bleu")), row("NIST", m.get("nist")), row("entropy", m.get("entropy")),
             row("dist", list(m.get("dist") or [None, None])),
             f"{'METEOR':<9}{f(m.get('meteor')):>9}" + ("" if m.get("meteor") is not None
                                                        else f"   ({m.get('meteor_note')})"),
             f"{'avg_len':<9}{f(m.get('avg_len'), '{:.2f}'):>9}",
             f"{m.get('n_hypotheses')} hypotheses, {m.get('n_references')} reference set(s)"]
    return "\n".join(lines)


def evaluate_crg_metrics(hyp: str | os.PathLike, refs: Sequence[str | os.PathLike] | None, out_dir: str | os.PathLike,
                         clean: bool = False, *, compute_meteor: bool = True, meteor_norm: bool = True,
                         meteor_jar: str | os.PathLike | None = None, java: str | None = None,
                         overwrite: bool = False) -> dict:
    """Score a hypothesis file against reference files and write ``out_dir/crg_metrics.json`` atomically.

    An existing ``crg_metrics.json`` that is not this scoring's own (other files or settings, edited, not written
    by rbjax) is refused before anything is scored unless ``overwrite`` (:func:`rbjax.core.reuse.claim_outputs`).

    The file holds the :func:`crg_metrics` keys at the top level plus ``settings`` (cleaning, METEOR options),
    ``data`` (each input file's path, sha256 and line count) and ``versions`` (packages, Java).
    This is what ``rbjax evaluate --task crg-metrics`` runs. Raises as :func:`read_hyp_refs` and :func:`crg_metrics`.
    """

    target = check_output_dir(out_dir, "--out") / "crg_metrics.json"
    hyps, ref_sets = read_hyp_refs(hyp, refs)
    key = {"command": "crg-metrics", "hyp": sha256_file(hyp), "refs": [sha256_file(p) for p in (refs or [])],
           "clean": clean, "compute_meteor": compute_meteor, "meteor_norm": meteor_norm}
    claim_outputs([target], key, overwrite=overwrite)
    m = crg_metrics(hyps, ref_sets, clean=clean, compute_meteor=compute_meteor, meteor_norm=meteor_norm,
                    meteor_jar=meteor_jar, java=java)
    v = versions(extra=METRIC_PACKAGES)
    v["java"] = (m.get("meteor_info") or {}).get("java_version")
    result = dict(m)
    result["settings"] = {"task": "crg-metrics", "clean": clean, "compute_meteor": compute_meteor,
                          "meteor_norm": meteor_norm, "mteval": "mteval-v14c.pl reimplemented (closest reference "
                          "length, default smoothing, default western tokenisation)",
                          "scorer": "DSTC-7 Task 2 evaluation/src/dstc.py (metrics.py:nlp_metrics)"}
    result["data"] = {"hyp": {"path": str(Path(hyp).resolve()), "sha256": sha256_file(hyp), "n_lines": len(hyps)},
                      "refs": [{"path": str(Path(p).resolve()), "sha256": sha256_file(p), "n_lines": len(hyps)}
                               for p in (refs or [])]}
    result["versions"] = v
    atomic_write_json(target, result)
    record_outputs([target], key)
    return result
