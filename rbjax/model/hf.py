"""Hugging Face GPT-2 checkpoints ⇄ rbjax parameter pytrees.

Reads a local folder or a hub id (e.g. ``microsoft/DialoGPT-small``) holding
``config.json`` and one of

* ``model.safetensors`` (or sharded ``model.safetensors.index.json``) — preferred;
* ``flax_model.msgpack`` (HF Flax layout; its Conv1D kernels are stored (out, in));
* ``pytorch_model.bin`` — only when PyTorch is installed.

HF PyTorch checkpoints store ``c_attn``/``c_proj``/``c_fc`` weights as ``Conv1D``
(in, out), which is rbjax's layout, so they are copied without a transpose. The LM
head is tied to ``wte``; a checkpoint without ``lm_head.weight`` is tied implicitly,
and one whose ``lm_head.weight`` differs from ``wte`` is refused (rbjax's GPT-2 has a
tied head, as GPT-2 and DialoGPT do).

:func:`save_pretrained` writes ``config.json`` + ``model.safetensors`` that
``transformers.GPT2LMHeadModel.from_pretrained`` loads.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from rbjax.model.gpt2 import GPT2Config
from rbjax.model.tokenizer import TOKENIZER_FILES

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "flax_model.msgpack", "pytorch_model.bin")

# (HF key suffix inside a block, rbjax path inside a block, kind)
_BLOCK_MAP = [
    ("ln_1.weight", ("ln_1", "scale")), ("ln_1.bias", ("ln_1", "bias")),
    ("attn.c_attn.weight", ("attn", "c_attn", "kernel")), ("attn.c_attn.bias", ("attn", "c_attn", "bias")),
    ("attn.c_proj.weight", ("attn", "c_proj", "kernel")), ("attn.c_proj.bias", ("attn", "c_proj", "bias")),
    ("ln_2.weight", ("ln_2", "scale")), ("ln_2.bias", ("ln_2", "bias")),
    ("mlp.c_fc.weight", ("mlp", "c_fc", "kernel")), ("mlp.c_fc.bias", ("mlp", "c_fc", "bias")),
    ("mlp.c_proj.weight", ("mlp", "c_proj", "kernel")), ("mlp.c_proj.bias", ("mlp", "c_proj", "bias")),
]
_TOP_MAP = [
    ("wte.weight", ("wte", "embedding")), ("wpe.weight", ("wpe", "embedding")),
    ("ln_f.weight", ("ln_f", "scale")), ("ln_f.bias", ("ln_f", "bias")),
]
# HF buffers that are not parameters
_IGNORED = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


def _expected_shapes(cfg: GPT2Config) -> dict[tuple, tuple]:
    d, inner = cfg.n_embd, cfg.inner_dim
    shapes = {("wte", "embedding"): (cfg.vocab_size, d), ("wpe", "embedding"): (cfg.n_positions, d),
              ("ln_f", "scale"): (d,), ("ln_f", "bias"): (d,)}
    blk = {("ln_1", "scale"): (d,), ("ln_1", "bias"): (d,), ("ln_2", "scale"): (d,), ("ln_2", "bias"): (d,),
           ("attn", "c_attn", "kernel"): (d, 3 * d), ("attn", "c_attn", "bias"): (3 * d,),
           ("attn", "c_proj", "kernel"): (d, d), ("attn", "c_proj", "bias"): (d,),
           ("mlp", "c_fc", "kernel"): (d, inner), ("mlp", "c_fc", "bias"): (inner,),
           ("mlp", "c_proj", "kernel"): (inner, d), ("mlp", "c_proj", "bias"): (d,)}
    for i in range(cfg.n_layer):
        for k, s in blk.items():
            shapes[(f"h_{i}",) + k] = s
    return shapes


def _set(tree: dict, path: tuple, value) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def state_dict_to_params(state: dict[str, np.ndarray], cfg: GPT2Config, source: str = "checkpoint") -> dict:
    """Convert an HF PyTorch-layout state dict (numpy arrays) to an rbjax params pytree.

    Accepts keys with or without the ``transformer.`` prefix.

    Raises:
        ValueError: missing or unexpected keys, shape mismatches, or an untied ``lm_head``.
    """
    flat = {}
    for k, v in state.items():
        key = k[len("transformer."):] if k.startswith("transformer.") else k
        flat[key] = v
    params: dict = {}
    used = set()
    for hf, path in _TOP_MAP:
        if hf in flat:
            _set(params, path, flat[hf]); used.add(hf)
    for i in range(cfg.n_layer):
        for hf, path in _BLOCK_MAP:
            key = f"h.{i}.{hf}"
            if key in flat:
                _set(params, (f"h_{i}",) + path, flat[key]); used.add(key)
    if "lm_head.weight" in flat:
        used.add("lm_head.weight")
        if "wte.weight" in flat and not np.array_equal(np.asarray(flat["lm_head.weight"]), np.asarray(flat["wte.weight"])):
            raise ValueError(f"{source}: lm_head.weight differs from wte.weight; rbjax supports GPT-2 with a tied LM head only")
        if "wte.weight" not in flat:
            _set(params, ("wte", "embedding"), flat["lm_head.weight"])
    unexpected = sorted(k for k in flat if k not in used and not _IGNORED.search(k))
    if unexpected:
        raise ValueError(f"{source}: unexpected GPT-2 weights {unexpected[:8]}{' …' if len(unexpected) > 8 else ''}")
    _check(params, cfg, source)
    return params


def _check(params: dict, cfg: GPT2Config, source: str) -> None:
    from flax.traverse_util import flatten_dict

    got = flatten_dict(params)
    want = _expected_shapes(cfg)
    missing = sorted(".".join(k) for k in want if k not in got)
    if missing:
        raise ValueError(f"{source}: missing weights {missing[:8]}{' …' if len(missing) > 8 else ''}")
    for k, shape in want.items():
        if tuple(got[k].shape) != shape:
            raise ValueError(f"{source}: weight {'.'.join(k)} has shape {tuple(got[k].shape)}, config expects {shape}")
        arr = np.asarray(got[k])
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{source}: weight {'.'.join(k)} has dtype {arr.dtype}, expected floating point")


def _flax_msgpack_to_params(path: Path, cfg: GPT2Config) -> dict:
    from flax.serialization import msgpack_restore

    tree = msgpack_restore(path.read_bytes())
    if "transformer" in tree:
        tree = tree["transformer"]
    state = {}
    for name in ("wte", "wpe"):
        state[f"{name}.weight"] = np.asarray(tree[name]["embedding"])
    state["ln_f.weight"] = np.asarray(tree["ln_f"]["scale"])
    state["ln_f.bias"] = np.asarray(tree["ln_f"]["bias"])
    for i, blk in tree["h"].items():
        for ln in ("ln_1", "ln_2"):
            state[f"h.{i}.{ln}.weight"] = np.asarray(blk[ln]["scale"])
            state[f"h.{i}.{ln}.bias"] = np.asarray(blk[ln]["bias"])
        for mod, sub in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            # HF's FlaxConv1D stores its kernel (out, in) and transposes it at call time.
            state[f"h.{i}.{mod}.{sub}.weight"] = np.asarray(blk[mod][sub]["kernel"]).T
            state[f"h.{i}.{mod}.{sub}.bias"] = np.asarray(blk[mod][sub]["bias"])
    return state_dict_to_params(state, cfg, source=str(path))


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # bf16 tensors cannot be read by the numpy backend; a broken file by neither
        first = e
    try:
        import torch  # noqa: F401
        from safetensors.torch import load_file as load_torch
    except ImportError:
        raise ValueError(f"{path}: cannot read safetensors file ({first})") from None
    try:
        return {k: v.float().numpy() for k, v in load_torch(str(path)).items()}
    except Exception as e:
        raise ValueError(f"{path}: cannot read safetensors file ({e}); truncated or corrupted download?") from None


def _read_weights(folder: Path, cfg: GPT2Config) -> dict:
    if (folder / "model.safetensors").exists():
        p = folder / "model.safetensors"
        return state_dict_to_params(_read_safetensors(p), cfg, source=str(p))
    if (folder / "model.safetensors.index.json").exists():
        idx = json.loads((folder / "model.safetensors.index.json").read_text())
        state = {}
        for shard in sorted(set(idx["weight_map"].values())):
            state.update(_read_safetensors(folder / shard))
        return state_dict_to_params(state, cfg, source=str(folder / "model.safetensors.index.json"))
    if (folder / "flax_model.msgpack").exists():
        return _flax_msgpack_to_params(folder / "flax_model.msgpack", cfg)
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
        return state_dict_to_params({k: v.float().numpy() for k, v in sd.items()}, cfg, source=str(p))
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
    for w in ("model.safetensors", "flax_model.msgpack", "pytorch_model.bin"):
        if fetch(w) is not None:
            break
    else:
        raise RuntimeError(f"hub model {s!r} has none of model.safetensors, flax_model.msgpack, pytorch_model.bin")
    for t in TOKENIZER_FILES:
        try:
            fetch(t)
        except RuntimeError:
            pass
    return cfg.parent


def load_pretrained(name_or_path: str | os.PathLike) -> tuple[GPT2Config, dict]:
    """Load a GPT-2 checkpoint (local folder or hub id) as ``(config, params)``.

    Args:
        name_or_path: folder with ``config.json`` + weights, or a hub id such as
            ``microsoft/DialoGPT-small``.
    Returns:
        ``(GPT2Config, params)``, params a nested dict of float32 numpy arrays (see
        :mod:`rbjax.model.gpt2` for the layout).
    Raises:
        FileNotFoundError: no such folder, no ``config.json``, or no weights in it.
        ValueError: malformed config or weights that do not match it.
        RuntimeError: hub download failed, or a PyTorch-only checkpoint without PyTorch.
    """
    folder = resolve_model_dir(name_or_path)
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{folder}: no config.json (is this a Hugging Face model folder?)")
    cfg = GPT2Config.from_json(cfg_path)
    params = _read_weights(folder, cfg)
    import jax

    params = jax.tree_util.tree_map(lambda a: np.asarray(a, dtype=np.float32), params)
    return cfg, params


def params_to_state_dict(params: dict, cfg: GPT2Config) -> dict[str, np.ndarray]:
    """The inverse of :func:`state_dict_to_params`: HF keys (``transformer.`` prefix), numpy float32."""
    state = {}
    get = lambda path: np.ascontiguousarray(np.asarray(_get(params, path), dtype=np.float32))  # noqa: E731
    for hf, path in _TOP_MAP:
        state[f"transformer.{hf}"] = get(path)
    for i in range(cfg.n_layer):
        for hf, path in _BLOCK_MAP:
            state[f"transformer.h.{i}.{hf}"] = get((f"h_{i}",) + path)
    return state


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def save_pretrained(params: dict, cfg: GPT2Config, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None) -> Path:
    """Write params as an HF GPT-2 folder (``config.json`` + ``model.safetensors``), atomically.

    The folder loads with ``transformers.GPT2LMHeadModel.from_pretrained(out_dir)``
    (LM head tied to ``wte``). Tokenizer files from ``tokenizer_dir`` are copied along
    when given, so the folder is self-contained.

    Returns:
        the output folder.
    """
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        save_file(params_to_state_dict(params, cfg), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
        if tokenizer_dir is not None:
            for f in TOKENIZER_FILES:
                src = Path(tokenizer_dir) / f
                if src.exists():
                    shutil.copy2(src, tmp / f)
        # mkdtemp/mkstemp-style 0700/0600 would hide the model from other users: give what mkdir/open give
        from rbjax.report.io import dir_mode, file_mode

        os.chmod(tmp, dir_mode())
        for f in tmp.iterdir():
            os.chmod(f, file_mode())
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
