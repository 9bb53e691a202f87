"""The resumable per-file parts on disk (``<parts>/<file name>-<hash of its path>/windows_<k>.csv`` + ``part.json``):
the driver writes one as each file's result comes back; a rerun reuses a part whose record matches its inputs
and says what changed otherwise. ``part.json`` is a keyed result (:class:`rbjax.core.reuse.KeyedResult`, keyed on
the file's inputs, :meth:`rbjax.data.retrieval.scan.FileTask.inputs`), reused by the one reuse rule
(:func:`rbjax.core.reuse.why_not_reusable`) with the windows files' digests as its extra check."""
from __future__ import annotations

import csv
import hashlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rbjax.core.io import atomic_csv_writer, read_json, sha256_file
from rbjax.core.keys import canonical
from rbjax.core.reuse import KeyedResult, why_not_reusable
from rbjax.data.retrieval.scan import PART_COLUMNS, RETRIEVAL_VERSION, FilePart

#: The record of a part (its key: what produced it), written last.
PART_RECORD = "part.json"


def part_folder(parts_dir: Path, path: str) -> Path:
    """Sub-folder of ``parts_dir`` for the dump file ``path`` (its name plus a hash of its full path)."""
    return parts_dir / f"{Path(path).name}-{hashlib.sha1(path.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def write_part(folder: Path, part: FilePart, inputs: dict, names: Sequence[str]) -> dict:
    """Write a file's windows and record (keyed on ``inputs``); the record goes last, so it exists only for a
    complete part. Returns the record."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PART_RECORD).unlink(missing_ok=True)
    windows = {}
    for j, name in enumerate(names):
        fname = f"windows_{j}.csv"
        with atomic_csv_writer(folder / fname, PART_COLUMNS, errors="backslashreplace") as w:
            w.writerows(part.windows[name])
        windows[name] = {"file": fname, "rows": len(part.windows[name]), "sha256": sha256_file(folder / fname)}
    record = {"format": RETRIEVAL_VERSION, "windows": windows, "stats": part.stats.to_dict(),
              "too_long": part.too_long, "empty": part.empty, "seconds": part.seconds,
              "cpu_seconds": part.cpu_seconds, "worker": part.worker,
              "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return KeyedResult(folder / PART_RECORD, inputs, "part").save(record)


def _changed(old: dict, new: dict) -> list[str]:
    what = []
    of, nf = old.get("file") if isinstance(old.get("file"), dict) else {}, new["file"]
    what += [k for k in ("path", "size", "mtime_ns") if of.get(k) != nf[k]]
    what += [k for k in new if k != "file" and old.get(k) != new[k]]
    return what


def load_part(folder: Path, inputs: dict, names: Sequence[str]) -> tuple[dict | None, str]:
    """``(record, "reused")`` when ``folder`` holds a complete part made from ``inputs`` whose windows files are
    intact, else ``(None, why it must be read)``: ``"new"``, ``"part record unreadable"`` (or unfinished),
    ``"changed: <inputs>"``, ``"part files damaged"``."""
    f = folder / PART_RECORD
    if not f.is_file():
        return None, "new"

    def intact(rec: dict) -> str | None:
        for name in names:
            w = (rec.get("windows") or {}).get(name)
            if not isinstance(w, dict) or not (folder / str(w.get("file"))).is_file() \
                    or sha256_file(folder / w["file"]) != w.get("sha256"):
                return "part files damaged"
        return None

    rec = read_json(f)
    why, other = why_not_reusable(rec, canonical(inputs), check=intact)
    if why is None:
        return rec, "reused"
    if not other:
        return None, f"part record {why}"
    changed = _changed(rec["key"], inputs) if isinstance(rec.get("key"), dict) else []
    return None, ("changed: " + ", ".join(changed)) if changed else why


def file_entry(path: str, rec: dict, status: str, reason: str) -> dict:
    """A file's entry of the run (see :attr:`rbjax.data.retrieval.run.RetrievalResult.files`) from its part record."""
    st = rec["stats"]
    return {"path": path, "size": rec["key"]["file"]["size"], "mtime_ns": rec["key"]["file"]["mtime_ns"],
            "status": status, "reason": reason, "lines": st["lines"], "prefiltered": st["prefiltered"],
            "parsed": st["parsed"], "corrupt": st["corrupt"], "no_body": st["no_body"], "deleted": st["deleted"],
            "out_of_range": st["out_of_range"], "other_subreddit": st["other_subreddit"], "kept": st["yielded"],
            "too_long": rec["too_long"], "empty": rec["empty"],
            "windows": {n: w["rows"] for n, w in rec["windows"].items()},
            "errors": st["errors"], "unreadable": st["unreadable"], "seconds": rec["seconds"],
            "cpu_seconds": rec["cpu_seconds"], "worker": rec["worker"], "part": None}


def read_part_rows(path: Path) -> Iterator[list[str]]:
    """The rows of one part's windows file (:data:`PART_COLUMNS`), after checking its header."""
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.reader(f)
        header = next(r, None)
        if tuple(header or ()) != PART_COLUMNS:
            raise ValueError(f"{path}: not a retrieval part (header {header})")
        yield from r
