"""Atomic result files and run metadata (versions, settings) stored with every result."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import platform
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Sequence

#: the environment variable that moves rbjax's cache folder (downloads, file digests, compiled programs)
ENV_CACHE_DIR = "RBJAX_CACHE_DIR"


def cache_dir() -> Path:
    """rbjax's cache folder: ``$RBJAX_CACHE_DIR``, else ``~/.cache/rbjax`` (verified downloads, the digests of large
    files, the persistent compilation cache; docs/scale.md "Caches" says what each holds and how to clear it)."""
    return Path(os.environ.get(ENV_CACHE_DIR, Path.home() / ".cache" / "rbjax")).expanduser()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs):
    """A file object on a temporary file next to ``path``, moved into place when the block succeeds.

    On an exception in the block (a failed check included) the temporary file is removed and
    ``path`` is left untouched, so nobody ever sees a half-written result. The file gets the
    permissions ``open()`` would give (``mkstemp`` makes 0600). Creates ``path``'s folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike):
    """A temporary folder next to ``path`` to write a whole folder into (a model, an adapter, an export), put in
    ``path``'s place when the block succeeds; on an exception the temporary folder is removed and ``path`` is left
    untouched. An existing folder at ``path`` is replaced as a whole — none of its files survive beside the new
    ones: it is first renamed aside, the new folder renamed into place, then the old one deleted (so ``path`` is
    never a half-deleted folder). The folder and its files get the permissions ``mkdir``/``open()`` would give
    (``mkdtemp`` makes 0700). Creates ``path``'s parent."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = tmp.with_name(tmp.name + ".replaced")
    try:
        yield tmp
        os.chmod(tmp, dir_mode())
        for f in tmp.rglob("*"):
            os.chmod(f, dir_mode() if f.is_dir() else file_mode())
        if out.exists() or out.is_symlink():
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            if old.exists() or old.is_symlink():
                os.replace(old, out)  # the earlier folder back in place
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old.is_symlink():
            old.unlink()
        elif old.exists():
            shutil.rmtree(old, ignore_errors=True)


#: the prefix of the hidden folder inside a run folder that :func:`replacing` sets the earlier run's files aside in
REPLACED_PREFIX = ".replaced-"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


@contextlib.contextmanager
def replacing(folder: str | os.PathLike, names):
    """Replace the entries ``names`` of ``folder`` (a run's own files and folders) by what the block writes, or keep
    them as they were: the ``--overwrite`` of a command that writes its run in place.

    Before the block, those of ``names`` that exist are moved (renamed, not copied) into a hidden folder inside
    ``folder`` (``.replaced-<random>``: the same file system, no write access to the parent needed), so the block
    starts from a folder holding none of the earlier run's
    files and nothing of it can survive beside the new one. When the block succeeds they are deleted; when it
    raises (an error, Ctrl-C, an :class:`rbjax.core.interrupt.Interrupted`) whatever the block wrote under those
    names is deleted and the earlier entries are moved back: ``folder`` is as before. Entries not in ``names`` are
    never touched. A process killed outright (SIGKILL, power loss) leaves the earlier files in the hidden folder
    (:func:`replaced_leftovers` names it).

    Yields:
        the names that were set aside (empty when ``folder`` held none of them: nothing to restore).
    """
    folder = Path(folder)
    present = [n for n in names if (folder / n).exists() or (folder / n).is_symlink()]
    if not present:
        yield []
        return
    aside = Path(tempfile.mkdtemp(prefix=REPLACED_PREFIX, dir=folder))
    moved = []

    def put_back():
        for n in moved:
            os.replace(aside / n, folder / n)
        shutil.rmtree(aside, ignore_errors=True)

    try:
        for n in present:
            os.replace(folder / n, aside / n)
            moved.append(n)
    except BaseException:
        put_back()
        raise
    try:
        yield list(present)
    except BaseException:
        for n in names:  # what the block wrote
            _remove(folder / n)
        put_back()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def replaced_leftovers(folder: str | os.PathLike) -> list[Path]:
    """The hidden folders in ``folder`` where :func:`replacing` set an earlier run aside and that a killed process
    left behind (sorted)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"{REPLACED_PREFIX}*"))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace`` (never a half-written file)."""
    with atomic_file(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return Path(path)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def file_mode() -> int:
    """Permissions for a result file: what ``open()`` would give (``mkstemp`` makes 0600)."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """Permissions for a result folder: what ``mkdir()`` would give (``mkdtemp`` makes 0700)."""
    return 0o777 & ~_umask()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item") and getattr(o, "shape", None) == ():  # a 0-d JAX array
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite(o):
    """Replace non-finite floats by None so the file is strict JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def to_json(obj, *, indent: int | None = None, **kw) -> str:
    """``obj`` as strict JSON text (RFC 8259), the one serialiser of every JSON and JSONL file rbjax writes.

    Non-finite floats (``NaN``, ``±inf``: a skipped update's loss, an undefined statistic) are written as ``null``,
    never as the bare ``NaN``/``Infinity`` Python's ``json`` emits by default, which strict readers reject. numpy
    scalars and arrays, 0-d JAX arrays and paths are converted. ``kw`` goes to :func:`json.dumps`
    (``ensure_ascii``, ``separators``, ``sort_keys``).
    """
    obj = json.loads(json.dumps(obj, default=_json_default))  # (the default parser reads NaN back as float)
    return json.dumps(_finite(obj), indent=indent, allow_nan=False, **kw)


def atomic_write_json(path, obj) -> Path:
    """Write ``obj`` as strict JSON (:func:`to_json`, indent 2), atomically."""
    return atomic_write_text(path, to_json(obj, indent=2) + "\n")


def atomic_write_csv(path, header: list[str], rows) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def read_json(path: str | os.PathLike, default=None):
    """The parsed content of a JSON file rbjax wrote earlier, or ``default`` when it is missing, unreadable or
    damaged: such a file is something to recompute (the callers say so), never an error."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def read_toml(path: str | os.PathLike, what: str) -> dict:
    """The content of a TOML file (``what`` names it in errors, e.g. "study file").

    Raises:
        FileNotFoundError: no such file. ValueError: not valid TOML (file and parser message named).
    """
    import tomllib

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: {what} not found")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{p}: not valid TOML ({e})") from None


def versions(extra: tuple[str, ...] = ()) -> dict:
    """Package versions and platform, recorded in every result file (``extra``: more packages to name)."""
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("rbjax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy", "tokenizers",
                *extra):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    try:
        import jax

        out["jax_backend"] = jax.default_backend()
        out["devices"] = [str(d) for d in jax.devices()]
    except Exception:  # pragma: no cover
        pass
    return out


# ------------------------------------------------------------------------------------------ where results go
def _first_existing(path: Path) -> Path | None:
    """``path`` or its nearest parent that exists (None when none does, e.g. a relative path's root)."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return p
    return None


def _check_creatable(folder: Path, what: str, target: Path, verb: str) -> None:
    """``folder`` is, or can be created as, a folder rbjax can write in (nothing is created)."""
    p = _first_existing(folder)
    if p is None:
        return
    if not p.is_dir():
        if p == target:
            raise ValueError(f"{what} {target} exists and is not a folder")
        raise ValueError(f"cannot {verb} {what} {target}: {p} exists and is not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        if p == target:
            raise ValueError(f"{what} {target}: the folder is not writable (permission denied or a read-only "
                             "file system); choose another location")
        raise ValueError(f"cannot {verb} {what} {target}: {p} is not writable (permission denied or a read-only "
                         "file system); choose another location")


def check_output_dir(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """Check, before any work, that ``folder`` is (or can be created as) a folder this process can write in.

    Nothing is created. Used by every command for its output location, so that a bad ``--out`` fails at once with
    its name instead of after the computation on a temporary file.

    Raises:
        ValueError: ``folder`` or one of its parents exists and is not a folder, or the folder (or, when it does
            not exist yet, its nearest existing parent) is not writable — ``what`` and the path are named.
    """
    folder = Path(folder)
    _check_creatable(folder, what, folder, "create")
    return folder


def check_output_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """Check, before any work, that ``path`` can be written as a file: it is not a folder, and its folder exists
    and is writable or can be created (nothing is created).

    Raises:
        ValueError: ``path`` is a folder, a parent of it exists and is not a folder, or the folder it goes to is not
            writable (``what`` and the path named).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file name")
    _check_creatable(path.parent, what, path, "write")
    return path


def _make_parent(path: Path) -> None:
    check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the folder {path.parent} for {path}: {e.strerror or e}") from None



@contextlib.contextmanager
def atomic_csv_writer(path: str | Path, header: Sequence[str], errors: str | None = None):
    """A ``csv.writer`` on a temporary file next to ``path``, moved into place on success.

    On an exception the temporary file is removed and ``path`` is left untouched.
    ``errors``: the UTF-8 encoder's error handler (``None`` = strict; retrieval writes lone
    surrogates from ``\\ud800`` escapes in the dumps as ``backslashreplace`` text).

    Raises:
        ValueError: ``path`` is a folder, a parent of it is a file, or its folder cannot be
            created (the message names the path).
    """
    path = Path(path)
    _make_parent(path)
    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(atomic_file(path, "w", encoding="utf-8", newline="", errors=errors))
        except OSError as e:
            raise ValueError(f"cannot write {path}: {e.strerror or e}") from None
        w = csv.writer(fh)
        w.writerow(header)
        yield w
