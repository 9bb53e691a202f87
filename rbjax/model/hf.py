"""Hugging Face checkpoints ⇄ rbjax parameter pytrees, for every registered model family.

Reads a local folder or a hub id (e.g. ``microsoft/DialoGPT-small``) holding ``config.json`` and one of

* ``model.safetensors`` (or sharded ``model.safetensors.index.json``) — preferred; float32, bfloat16 or float16
  tensors (bf16 is read without PyTorch, through ``ml_dtypes``), loaded as float32 parameters;
* ``flax_model.msgpack`` (HF Flax layout; GPT-2 only);
* ``pytorch_model.bin`` — only when PyTorch is installed.

The family is picked from ``config.json``'s ``model_type`` (:func:`rbjax.model.registry.family_of`); its config
reader refuses by name every field it does not implement, and its key map names missing, unexpected or mis-shaped
weights. :func:`save_pretrained` writes ``config.json`` + ``model.safetensors`` that
``transformers.AutoModelForCausalLM.from_pretrained`` loads. GPT-2's key map lives in :mod:`rbjax.model.gpt2_keys`
(re-exported here as :func:`state_dict_to_params` / :func:`params_to_state_dict`).

With a mesh that splits parameters, :func:`load_pretrained` reads safetensors weights slice by slice straight into
the devices (:class:`LazyTensor`): no full copy of the model on the host or on one device.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

from rbjax.core.digests import files_key
from rbjax.core.io import atomic_folder, to_json
from rbjax.core.mesh import is_model_parallel, tree_shardings
from rbjax.model import registry
from rbjax.model.chat_template import ADDITIONAL_TEMPLATES_DIR, CHAT_TEMPLATE_FILES
from rbjax.model.gpt2_keys import flax_msgpack_to_state, params_to_state_dict, state_dict_to_params
from rbjax.model.lora import has_adapters
from rbjax.model.partition import logical_axes_for

__all__ = ["WEIGHT_FILES", "TOKENIZER_FILES", "GENERATION_CONFIG", "LazyTensor", "read_generation_config",
           "load_pretrained", "save_pretrained", "resolve_model_dir", "model_files_key", "weight_files", "read_safetensors",
           "read_config_json", "state_dict_to_params", "params_to_state_dict"]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "flax_model.msgpack", "pytorch_model.bin")
#: files that make a tokenizer (a model folder's content key covers those that exist)
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", *CHAT_TEMPLATE_FILES)
#: how the model generates (``eos_token_id`` lists: Llama-3-Instruct ends a turn with ``<|eot_id|>``, listed only
#: here); read by ``transformers``' ``generate`` and by rbjax's end tokens (:meth:`ModelHandle.end_token_ids`)
GENERATION_CONFIG = "generation_config.json"

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": "bfloat16", "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _read_safetensors_raw(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file read directly (8-byte header length, JSON header, raw little-endian tensors): the
    dtypes numpy lacks (bfloat16) come from ``ml_dtypes`` (a JAX dependency), so bf16 checkpoints need no PyTorch."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError("file shorter than its header")
    n = int.from_bytes(data[:8], "little")
    if 8 + n > len(data):
        raise ValueError("header length beyond the end of the file")
    header = json.loads(data[8:8 + n])
    return {k: np.frombuffer(data, dtype=dt, count=int(np.prod(shape, dtype=np.int64)), offset=off).reshape(shape)
            for k, dt, shape, off in _tensor_table(header, 8 + n, len(data))}


def _tensor_table(header: dict, base: int, size: int):
    """``(name, numpy dtype, shape, byte offset)`` of each tensor a safetensors header lists (``base``: where the data
    starts), checked against the file's ``size``. bfloat16 comes from ``ml_dtypes`` (a JAX dependency).

    Raises:
        ValueError: an unsupported dtype, or a tensor beyond the end of the file or of the wrong size.
    """
    for k, info in header.items():
        if k == "__metadata__":
            continue
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"tensor {k} has unsupported dtype {info['dtype']}")
        dt = np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(dt).newbyteorder("<")
        a, b = info["data_offsets"]
        if base + b > size or b - a != dt.itemsize * int(np.prod(info["shape"], dtype=np.int64)):
            raise ValueError(f"tensor {k} lies beyond the end of the file or has the wrong size")
        yield k, dt, tuple(info["shape"]), base + a


class LazyTensor:
    """One tensor of a safetensors file, read only where it is needed: :meth:`read` maps the file and copies just the
    slice asked for, converted to float32 (``bf16``/``f16`` included). ``.T`` is a transposed view (PyTorch's
    ``(out, in)`` Linear weights become rbjax's ``(in, out)`` kernels) that reads the transposed slice. ``np.asarray``
    reads it whole. Used by :func:`load_pretrained` with a mesh: each device's slice is read straight from the file
    into that device (:func:`jax.make_array_from_callback`), so no full copy of the model is built on the host.
    """

    def __init__(self, path: Path, name: str, file_dtype: np.dtype, file_shape: tuple, offset: int,
                 transposed: bool = False):
        self.path, self.name, self.file_dtype, self.file_shape = path, name, file_dtype, tuple(file_shape)
        self.offset, self.transposed = offset, transposed

    @property
    def shape(self) -> tuple:
        return self.file_shape[::-1] if self.transposed else self.file_shape

    @property
    def ndim(self) -> int:
        return len(self.file_shape)

    @property
    def dtype(self) -> np.dtype:
        """float32 for every floating file dtype (what :meth:`read` returns), else the file's."""
        floating = self.file_dtype.kind == "V" or np.issubdtype(self.file_dtype, np.floating)
        return np.dtype(np.float32) if floating else self.file_dtype

    @property
    def T(self) -> "LazyTensor":
        if self.ndim != 2:
            raise ValueError(f"{self.path}: {self.name}: only a 2-D tensor is transposed, shape {self.file_shape}")
        return LazyTensor(self.path, self.name, self.file_dtype, self.file_shape, self.offset, not self.transposed)

    def read(self, index: tuple = ()) -> np.ndarray:
        """The float32 values at ``index`` (a tuple of slices over :attr:`shape`, as
        :func:`jax.make_array_from_callback` passes it; ``()``: all)."""
        index = tuple(index) + (slice(None),) * (self.ndim - len(tuple(index)))
        if not self.file_shape or 0 in self.file_shape:
            return np.zeros(self.shape, np.float32)[index]
        mm = np.memmap(self.path, dtype=self.file_dtype, mode="r", offset=self.offset, shape=self.file_shape)
        a = np.array(mm[index[::-1] if self.transposed else index], copy=True)
        del mm
        a = a.T if self.transposed else a
        return a.astype(self.dtype, copy=False)

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"LazyTensor({self.name!r}, {self.shape}{', transposed' if self.transposed else ''}, {self.path.name})"


def _lazy_safetensors(path: Path) -> dict[str, LazyTensor]:
    """The tensors of a safetensors file from its header alone (names, dtypes, shapes, offsets: nothing is read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("file shorter than its header")
            n = int.from_bytes(head, "little")
            header = json.loads(f.read(n))
        out = {k: LazyTensor(path, k, dt, shape, off)
               for k, dt, shape, off in _tensor_table(header, 8 + n, path.stat().st_size)}
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read safetensors file ({e}); truncated or corrupted download?") from None
    return out


def _lazy_state(folder: Path) -> tuple[dict, str] | None:
    """``(flat state of LazyTensors, source)`` of a folder's safetensors weights (one file or an index of shards);
    ``None`` where the weights are in another format."""
    if (folder / "model.safetensors").exists():
        p = folder / "model.safetensors"
        return _lazy_safetensors(p), str(p)
    if (folder / "model.safetensors.index.json").exists():
        p = folder / "model.safetensors.index.json"
        return _read_sharded(p, _lazy_safetensors), str(p)
    return None


def _place(params: dict, config, mesh) -> dict:
    """Parameters (numpy arrays or :class:`LazyTensor` leaves) on ``mesh``, laid out by the family's logical axes
    (:func:`rbjax.core.mesh.tree_shardings`): each device's slice of a lazy tensor is read from the file straight
    into that device."""

    def one(x, sharding):
        if isinstance(x, LazyTensor):
            return jax.make_array_from_callback(x.shape, sharding, x.read)
        return jax.device_put(np.asarray(x, np.float32), sharding)

    return jax.tree_util.tree_map(one, params, tree_shardings(params, mesh, logical_axes_for(config)))


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as numpy; floating tensors other than float32 (bf16, f16) are converted to
    float32. Raises ValueError "cannot read safetensors file" naming the file."""
    from safetensors.numpy import load_file

    try:
        state = load_file(str(path))
    except Exception:  # bf16 tensors cannot be read by the numpy backend; a broken file by neither
        try:
            state = _read_safetensors_raw(path)
        except Exception as e:
            raise ValueError(f"{path}: cannot read safetensors file ({e}); truncated or corrupted download?") from None
    return {k: (v.astype(np.float32) if v.dtype.kind == "V" or (np.issubdtype(v.dtype, np.floating)
                                                                 and v.dtype != np.float32)
                else v) for k, v in state.items()}


#: the one safetensors reader (float32 out; bf16/f16 files converted), for other weight files (PEFT adapters)
read_safetensors = _read_safetensors


def _read_sharded(index: Path, read=None) -> dict:
    """The flat state of the shards an index names, each read by ``read`` (default: :func:`_read_safetensors`)."""
    try:
        idx = json.loads(index.read_text())
        shards = sorted(set(idx["weight_map"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a safetensors index (expected a JSON object with weight_map; {e})") from None
    state = {}
    for shard in shards:
        f = index.parent / shard
        if not f.exists():
            raise FileNotFoundError(f"{index}: shard {shard} is missing from {index.parent}")
        state.update((read or _read_safetensors)(f))
    missing = sorted(k for k in idx["weight_map"] if k not in state)
    if missing:
        raise ValueError(f"{index}: tensors {missing[:8]} are listed in weight_map but not in their shard")
    return state


def _read_state(folder: Path, family: "registry.Family", cfg) -> tuple[dict, str]:
    """(flat HF state dict of numpy arrays, source file name) from the folder's weight files."""
    if (folder / "model.safetensors").exists():
        p = folder / "model.safetensors"
        return _read_safetensors(p), str(p)
    if (folder / "model.safetensors.index.json").exists():
        p = folder / "model.safetensors.index.json"
        return _read_sharded(p), str(p)
    if (folder / "flax_model.msgpack").exists():
        p = folder / "flax_model.msgpack"
        if family.name != "gpt2":
            raise ValueError(f"{p}: Flax msgpack weights are read for GPT-2 only; this is a {family.name} model "
                             "(use its model.safetensors)")
        return flax_msgpack_to_state(p), str(p)
    if (folder / "pytorch_model.bin").exists():
        p = folder / "pytorch_model.bin"
        try:
            import torch
        except ImportError:
            raise RuntimeError(
                f"{p}: this checkpoint has only PyTorch weights and PyTorch is not installed. "
                "Install torch (pip install torch) or convert it to model.safetensors."
            ) from None
        sd = torch.load(str(p), map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in sd.items()}, str(p)
    raise FileNotFoundError(
        f"{folder}: no model weights found (looked for {', '.join(WEIGHT_FILES)})"
    )


def _looks_like_hub_id(s: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", s)) and not s.startswith((".", "/"))


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """``None`` when the Hugging Face endpoint answers a TCP connection, else the reason (offline mode included)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if getattr(constants, "HF_HUB_OFFLINE", False):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"
    return None


def resolve_model_dir(name_or_path: str | os.PathLike) -> Path:
    """Return a local folder for a model: the folder itself, or a hub download (cached).

    Raises:
        FileNotFoundError: a local path that does not exist (and is not a hub id).
        RuntimeError: a hub id that cannot be downloaded (no network, unknown repo).
    """
    p = Path(name_or_path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: expected a model folder (config.json + weights), got a file")
        return p
    s = str(name_or_path)
    if not _looks_like_hub_id(s):
        raise FileNotFoundError(f"model folder not found: {s}")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    # Offline, huggingface_hub retries with back-off for ~25 s per file before it gives up; see at once whether the
    # hub can be reached, and if not, use the local cache only (a model downloaded before still works).
    offline = _hub_unreachable()

    def fetch(filename: str) -> Path | None:
        try:
            return Path(hf_hub_download(s, filename, local_files_only=offline is not None))
        except Exception as e:
            if isinstance(e, EntryNotFoundError) and not isinstance(e, LocalEntryNotFoundError):
                return None  # the repository has no such file (LocalEntryNotFound = hub unreachable)
            # offline, unknown repo, gated repo, ... : say what and how to fix it
            if offline is not None:
                raise RuntimeError(
                    f"cannot download {filename!r} of hub model {s!r}: the hub is not reachable ({offline}) and the "
                    "file is not in the local Hugging Face cache. Pass a local folder with config.json and model "
                    "weights, or run once with network access."
                ) from None
            raise RuntimeError(
                f"cannot download {filename!r} of hub model {s!r} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                "Check the name and your network, or pass a local folder with config.json and model weights."
            ) from None

    cfg = fetch("config.json")
    if cfg is None:
        raise RuntimeError(f"hub model {s!r} has no config.json")
    for w in ("model.safetensors", "model.safetensors.index.json", "flax_model.msgpack", "pytorch_model.bin"):
        got = fetch(w)
        if got is not None:
            if w == "model.safetensors.index.json":  # sharded: every shard the index names
                for shard in sorted(set(json.loads(got.read_text()).get("weight_map", {}).values())):
                    fetch(shard)
            break
    else:
        raise RuntimeError(f"hub model {s!r} has none of {', '.join(WEIGHT_FILES)}")
    for t in (*TOKENIZER_FILES, GENERATION_CONFIG):
        try:
            fetch(t)
        except RuntimeError:
            pass
    return cfg.parent


def model_config(name_or_path: str | os.PathLike):
    """The family config of a model from its ``config.json`` alone: a model folder (a finished ``rbjax debias`` run
    folder: its ``model/``), a ``config.json`` path, or a hub id (only its ``config.json`` is fetched, from the local cache when the hub cannot be reached): for plans and
    cost estimates before any weight is downloaded.

    Raises:
        FileNotFoundError: no such folder or file (and not a hub id), or no ``config.json``.
        ValueError: a malformed config or one rbjax does not implement (named).
        RuntimeError: a hub id whose ``config.json`` cannot be fetched.
    """
    p = Path(name_or_path).expanduser()
    if p.is_file() and p.name == "config.json":
        folder = p.parent
    elif p.exists():
        folder = p
    elif _looks_like_hub_id(str(name_or_path)):
        from huggingface_hub import hf_hub_download

        offline = _hub_unreachable()
        try:
            folder = Path(hf_hub_download(str(name_or_path), "config.json",
                                          local_files_only=offline is not None)).parent
        except Exception as e:
            why = f"the hub is not reachable ({offline}) and it is not in the local cache" if offline else (
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            raise RuntimeError(f"cannot fetch config.json of hub model {name_or_path!r} ({why})") from None
    else:
        raise FileNotFoundError(f"model folder not found: {name_or_path}")
    if (folder / "results.json").is_file() and (folder / "model" / "config.json").is_file():
        folder = folder / "model"  # a finished rbjax debias run folder: its exported model (as ModelHandle.open)
    elif (folder / "results.json").is_file() and not (folder / "config.json").is_file():
        try:  # a Self-Debias run folder: no weights of its own, its base model's config (as ModelHandle.open)
            res = json.loads((folder / "results.json").read_text(encoding="utf-8"))
            base = res["base_model"] if res.get("method") == "self-debias" else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            base = None
        if base is not None:
            b = Path(base.get("folder") or "")
            return model_config(b if b.is_dir() else base["source"])
    return _folder_config(folder)[1]


def _folder_config(folder: Path) -> tuple:
    """``(family, config)`` of a model folder's ``config.json`` (the family its ``model_type`` names)."""
    d = read_config_json(folder)
    source = str(folder / "config.json")
    family = registry.family_of(d, source)
    return family, family.config_from_hf(d, source)


def read_config_json(folder: Path) -> dict:
    """``folder/config.json`` as a dict. Raises FileNotFoundError (no file) or ValueError (invalid JSON, not an
    object), naming the file."""
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{folder}: no config.json (is this a Hugging Face model folder?)")
    try:
        d = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path}: invalid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    return d


def read_generation_config(folder: str | os.PathLike) -> dict | None:
    """``folder/generation_config.json`` as a dict, or ``None`` when there is none.

    Raises:
        ValueError: a file that is not a JSON object (named).
    """
    p = Path(folder) / GENERATION_CONFIG
    if not p.is_file():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: cannot read ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return d


def load_pretrained(name_or_path: str | os.PathLike, *, mesh=None) -> tuple:
    """Load a checkpoint of any registered family (local folder or hub id) as ``(config, params)``.

    Args:
        name_or_path: folder with ``config.json`` + weights, or a hub id such as ``microsoft/DialoGPT-small``.
        mesh: a named mesh with ``fsdp`` or ``tensor`` axes (:func:`rbjax.core.mesh.make_mesh`): safetensors weights
            (one file or sharded) are read slice by slice straight into the devices, laid out by the family's
            logical axes — no full copy of the model on the host or on one device (other formats are read whole,
            then placed). ``None``, or a mesh that splits no parameter: numpy arrays on the host, as before.
    Returns:
        ``(config, params)``: the family's frozen config (``GPT2Config``, ``LlamaConfig``, …; its family is
        :func:`rbjax.model.registry.family_of_config`) and a nested dict of float32 numpy arrays (layouts in the
        family modules), or of float32 ``jax.Array``s on ``mesh``.
    Raises:
        FileNotFoundError: no such folder, no ``config.json``, or no weights in it.
        ValueError: malformed config, a config field the family does not implement (named with its value), a
            special token id outside the vocabulary, an unknown ``model_type``, or weights that do not match.
        RuntimeError: hub download failed, or a PyTorch-only checkpoint without PyTorch.
    """
    folder = resolve_model_dir(name_or_path)
    family, cfg = _folder_config(folder)
    if mesh is not None and is_model_parallel(mesh):
        lazy = _lazy_state(folder)
        state, wsource = lazy if lazy is not None else _read_state(folder, family, cfg)
        return cfg, _place(family.params_from_hf(state, cfg, wsource), cfg, mesh)
    state, wsource = _read_state(folder, family, cfg)
    params = family.params_from_hf(state, cfg, wsource)
    params = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float32), params)
    return cfg, params


#: default largest safetensors file of an export (transformers' ``save_pretrained`` default, 5 GB)
MAX_SHARD_SIZE = "5GB"


def parse_size(size: int | str) -> int:
    """Bytes of ``5GB`` / ``500MB`` / ``20KB`` / an int (decimal units, as transformers).

    Raises:
        ValueError: a size that is not a positive number of bytes, naming it.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        n = size
    else:
        t = str(size).strip().upper()
        mult = 1
        for unit, m in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
            if t.endswith(unit):
                t, mult = t[:-len(unit)].strip(), m
                break
        try:
            n = int(float(t) * mult)
        except ValueError:
            n = 0
    if n < 1:
        raise ValueError(f"max_shard_size {size!r}: not a size in bytes (e.g. 5GB, 500MB, 1000000)")
    return n


def _write_shards(state: dict, folder: Path, max_bytes: int) -> None:
    """``model.safetensors`` when it fits ``max_bytes``, else ``model-0000i-of-0000n.safetensors`` files of at
    most ``max_bytes`` each (a tensor larger than that gets a file of its own) and ``model.safetensors.index.json``
    (``{"metadata": {"total_size"}, "weight_map": {tensor: file}}``, the layout transformers writes and reads)."""
    from safetensors.numpy import save_file

    total = sum(v.nbytes for v in state.values())
    if total <= max_bytes:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    groups: list[list[str]] = [[]]
    size = 0
    for k, v in state.items():
        if groups[-1] and size + v.nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += v.nbytes
    n = len(groups)
    weight_map = {}
    for i, keys in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: state[k] for k in keys}, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in keys})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, indent=2) + "\n")


def save_pretrained(params: dict, cfg, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None,
                    max_shard_size: int | str = MAX_SHARD_SIZE, *, source_dir: str | os.PathLike | None = None) -> Path:
    """Write params as an HF model folder (``config.json`` + float32 ``model.safetensors``), atomically.

    A model larger than ``max_shard_size`` (default 5 GB, as transformers) is written as several safetensors files
    with a ``model.safetensors.index.json`` (:func:`_write_shards`); parameters split over devices are fetched one
    tensor at a time.

    Any registered family (picked from the type of ``cfg``). The folder loads with
    ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` (GPT-2: ``GPT2LMHeadModel``, LM head tied to
    ``wte``) and with :func:`load_pretrained`. Tokenizer files from ``tokenizer_dir`` are copied along when given,
    byte for byte, so the folder is self-contained and the chat model stays usable: ``tokenizer.json`` (or GPT-2's
    ``vocab.json`` + ``merges.txt``), ``tokenizer_config.json`` with its chat template, ``special_tokens_map.json``,
    ``chat_template.jinja`` / ``chat_template.json`` and ``additional_chat_templates/``; and ``generation_config.json``
    (its eos list, pad and bos: what ``transformers``' ``generate`` stops at) from ``source_dir``, the folder the
    parameters came from (default: ``tokenizer_dir``, which is the model folder unless a separate tokenizer was
    given).

    Returns:
        the output folder.
    """
    if has_adapters(params):
        raise ValueError("save_pretrained: the parameters hold low-rank adapters; merge them first "
                         "(rbjax.model.lora.merge_adapters) or write them as a PEFT folder (rbjax.model.peft_adapter)")
    with atomic_folder(out_dir) as tmp:
        family = registry.family_of_config(cfg)
        _write_shards(family.params_to_hf(params, cfg), tmp, parse_size(max_shard_size))
        (tmp / "config.json").write_text(to_json(family.config_to_hf(cfg), indent=2) + "\n")
        if tokenizer_dir is not None:
            for f in TOKENIZER_FILES:
                src = Path(tokenizer_dir) / f
                if src.exists():
                    shutil.copy2(src, tmp / f)
            extra = Path(tokenizer_dir) / ADDITIONAL_TEMPLATES_DIR
            if extra.is_dir():
                shutil.copytree(extra, tmp / ADDITIONAL_TEMPLATES_DIR)
        gen_src = source_dir if source_dir is not None else tokenizer_dir
        if gen_src is not None and (Path(gen_src) / GENERATION_CONFIG).is_file():
            shutil.copy2(Path(gen_src) / GENERATION_CONFIG, tmp / GENERATION_CONFIG)
    return Path(out_dir)


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """Every weight file of an HF folder: the single files, the shard index and each shard it names (plus any
    ``model-*.safetensors`` beside it).

    Raises:
        ValueError: an unreadable shard index. FileNotFoundError: the index names a shard that is not there.
    """
    folder = Path(folder)
    names = list(WEIGHT_FILES)
    idx = folder / "model.safetensors.index.json"
    if idx.is_file():
        try:
            wm = json.loads(idx.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{idx}: cannot read the shard index ({e})") from None
        for shard in sorted(set(wm.values())):
            if not (folder / shard).is_file():
                raise FileNotFoundError(f"{idx}: names the shard {shard}, which is not in {folder}")
            names.append(shard)
    names += sorted(p.name for p in folder.glob("model-*.safetensors"))
    return [folder / n for n in dict.fromkeys(names)]


def model_files_key(folder: str | os.PathLike) -> dict[str, str]:
    """Content key of an HF model folder: ``{file name: sha256}`` (:func:`rbjax.core.keys.files_key`) of
    ``config.json``, every weight file — every shard the index of a sharded checkpoint names — and the tokenizer
    files.

    Raises:
        ValueError / FileNotFoundError: a shard index that cannot be read or names a missing shard.
    """
    folder = Path(folder)
    return files_key([folder / "config.json", *weight_files(folder), *(folder / n for n in TOKENIZER_FILES)])
