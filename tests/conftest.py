"""Shared fixtures: the ../shared data, and small seeded random GPT-2 folders in the real HF format.

* ``tiny_model_dir`` / ``tiny_model_dir_no_tokenizer``: built by rbjax itself (:func:`rbjax.model.gpt2.init_params`
  + :func:`rbjax.model.hf.save_pretrained`, GPT-2's N(0, 0.02) init), no PyTorch needed: for every test that is not
  about parity with PyTorch.
* ``torch_tiny_model_dir``: built and saved by PyTorch ``transformers`` with ``initializer_range`` 0.2, for the
  parity tests. At GPT-2's 0.02 the activations of a tiny model are so small that the network is nearly linear
  (``gelu_new`` and exact gelu agree to ~1e-7); at 0.2 the MLP pre-activations have std ≈ 1, so a wrong activation,
  layer-norm epsilon or attention scale moves the logits far beyond the parity tolerance.

Data: ``../shared`` beside the checkout (``RBJAX_SHARED`` overrides). Without it the data tests skip — unless
``RBJAX_REQUIRE_SHARED=1`` (set by ``.ci/run``): then a missing folder fails them, so CI cannot pass without the
data it is meant to test on.
"""
import atexit
import gc
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# One persistent XLA compilation cache for the whole run, in a fresh temporary folder, before anything imports jax:
# the same tiny programs are compiled again by many tests, by every CLI subprocess and after the per-module cache
# clearing below; each is compiled once per run and read back afterwards. Nothing outlives the run.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = tempfile.mkdtemp(prefix="rbjax-tests-xla-")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # the many small programs too
# Compile for compile time: the suite's programs are tiny and mostly compiled once, so XLA's CPU compiler spends far
# longer optimising them than they run. LLVM without optimisation and XLA's elemental (not the MLIR fusion) emitters
# cut the backend compile time of a training-step test about 3x and the suite's time by about a third (docs/testing.md).
# They change float32 rounding, not results: what most tests check (values within their tolerances, programs
# counted, files written) does not depend on code generation. A test or module whose tolerances sit at the rounding
# of the code users run, or whose programs run longer than they compile (generation, scoring), is marked
# ``xla_default_codegen``: its programs are compiled with XLA's defaults (the override below, per compile; the
# programs' cache keys differ). Subprocesses (the CLI, the 8-device checks: :func:`simulated_devices_env`) inherit
# XLA_FLAGS. Users' runs and benchmarks/ keep XLA's defaults; RBJAX_TEST_XLA_DEFAULTS=1 runs the whole suite with
# them. A jaxlib that no longer knows a flag would abort at start-up, and a jax without the per-compile override
# could not honour the marker, so either leaves XLA's defaults on.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
#: XLA's own defaults for the same options, set per compile in modules marked ``xla_default_codegen``
XLA_DEFAULT_CODEGEN = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
_CODEGEN = {"default": False}


def _install_codegen_override() -> bool:
    """Wrap jax's compile options so that modules marked ``xla_default_codegen`` compile with XLA's defaults."""
    import inspect

    try:
        from jax._src import compiler
    except ImportError:
        return False
    orig = getattr(compiler, "get_compile_options", None)
    if orig is None or "env_options_overrides" not in inspect.signature(orig).parameters:
        return False

    def get_compile_options(*args, env_options_overrides=None, **kwargs):
        if _CODEGEN["default"]:
            env_options_overrides = {**XLA_DEFAULT_CODEGEN, **(env_options_overrides or {})}
        return orig(*args, env_options_overrides=env_options_overrides, **kwargs)

    compiler.get_compile_options = get_compile_options
    return True


def _with_test_xla_flags() -> str:
    import subprocess
    import sys

    base = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("RBJAX_TEST_XLA_DEFAULTS", "") not in ("", "0"):
        return base
    flags = f"{base} {TEST_XLA_FLAGS}".strip()
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True,
                           env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu"), timeout=300)
    return flags if probe.returncode == 0 else base


_OVERRIDE = _install_codegen_override()  # in every process that runs tests (the controller and each xdist worker)
if "RBJAX_TEST_XLA_FLAGS_SET" not in os.environ:  # once per run: xdist workers and subprocesses inherit XLA_FLAGS
    if _OVERRIDE:
        os.environ["XLA_FLAGS"] = _with_test_xla_flags()
    os.environ["RBJAX_TEST_XLA_FLAGS_SET"] = "1"


def simulated_devices_env(n: int, **env: str) -> dict:
    """The environment of a subprocess with ``n`` simulated CPU devices: this run's environment and XLA_FLAGS (the
    suite's code generation) with ``--xla_force_host_platform_device_count=n``, JAX on the CPU, and ``env``."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
    return dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **env)
# rbjax's own cache folder (file digests, parsed MultiWOZ splits) in a temporary folder too: nothing written to the
# user's ~/.cache by the suite
if "RBJAX_CACHE_DIR" not in os.environ:
    _RBJAX_CACHE = tempfile.mkdtemp(prefix="rbjax-tests-cache-")
    atexit.register(shutil.rmtree, _RBJAX_CACHE, ignore_errors=True)
    os.environ["RBJAX_CACHE_DIR"] = _RBJAX_CACHE

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
REDDITBIAS = SHARED / "redditbias"
TOKENIZER_DIR = SHARED / "tokenizers" / "gpt2"
REQUIRE_SHARED = os.environ.get("RBJAX_REQUIRE_SHARED", "") not in ("", "0")

#: initializer_range of the PyTorch-built parity fixtures (see the module docstring)
PARITY_INIT = 0.2


def _need(path: Path, what: str) -> Path:
    if path.exists():
        return path
    msg = f"{what} not found at {path} (set RBJAX_SHARED to the shared data folder)"
    if REQUIRE_SHARED:
        pytest.fail(f"RBJAX_REQUIRE_SHARED is set: {msg}", pytrace=False)
    pytest.skip(msg)


def pytest_report_header(config):
    return f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')!r} (xla_default_codegen modules: XLA's defaults)"


def _drop_programs() -> None:
    import jax

    from rbjax.train.step import clear_programs

    jax.clear_caches()
    clear_programs()
    gc.collect()


def _default_codegen(node) -> bool:
    return node.get_closest_marker("xla_default_codegen") is not None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs(request):
    """Drop jax's in-memory compiled programs after each test module: ~700 tests keep thousands of executables
    otherwise (the process grew past 10 GB); a program needed again is read back from the persistent cache. A module
    marked ``xla_default_codegen`` compiles with XLA's defaults (above), its module fixtures included."""
    _CODEGEN["default"] = _default_codegen(request.node)
    yield
    _drop_programs()
    _CODEGEN["default"] = False


@pytest.fixture(autouse=True)
def _code_generation(request):
    """A test marked ``xla_default_codegen`` in an unmarked module (or the reverse): jax's in-memory programs are
    dropped where the code generation changes, so that no program compiled one way runs where the other is asked."""
    want = _default_codegen(request.node)
    if want != _CODEGEN["default"]:
        _drop_programs()
        _CODEGEN["default"] = want
    yield


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return _need(SHARED, "../shared")


@pytest.fixture(scope="session")
def redditbias_dir(shared_dir) -> Path:
    return _need(shared_dir / "redditbias", "the RedditBias data")


@pytest.fixture(scope="session")
def crows_dir(shared_dir) -> Path:
    return _need(shared_dir / "crows-pairs", "the CrowS-Pairs data")


@pytest.fixture(scope="session")
def bbq_dir(shared_dir) -> Path:
    return _need(shared_dir / "bbq", "the BBQ data")


@pytest.fixture(scope="session")
def tokenizer_dir(shared_dir) -> Path:
    return _need(shared_dir / "tokenizers" / "gpt2", "the GPT-2 tokenizer files")


def make_rbjax_gpt2_folder(folder: Path, *, n_embd=32, n_layer=2, n_head=2, n_positions=128, vocab_size=50257,
                           seed=0, initializer_range=0.02, tokenizer_dir: Path | None = None) -> Path:
    """A seeded random GPT-2 built by rbjax (``init_params``) and saved in the HF format (``save_pretrained``)."""
    from rbjax.model.gpt2 import GPT2Config, init_params
    from rbjax.model.hf import save_pretrained

    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                     initializer_range=initializer_range)
    return save_pretrained(init_params(cfg, seed), cfg, folder, tokenizer_dir=tokenizer_dir)


def make_torch_gpt2_folder(folder: Path, *, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                           vocab_size=50257, seed=0, initializer_range=0.02,
                           tokenizer_dir: Path | None = None) -> Path:
    """A seeded random GPT-2 built and saved by PyTorch transformers (the real HF format)."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                                  n_layer=n_layer, n_head=n_head, initializer_range=initializer_range)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(folder)
    if tokenizer_dir is not None:
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(tokenizer_dir / f, folder / f)
    return folder


def make_torch_model(cls_name: str, kw: dict, folder: Path, seed: int = 0):
    """A seeded random ``transformers`` model of any family (``cls_name``: its config class, e.g. ``"LlamaConfig"``,
    built from ``kw``; weights perturbed by 0.1 × N(0, 1) so that every part matters), saved in the real HF format
    to ``folder`` and loaded back in eval mode (eager attention)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls_name)(**kw),
                                                      attn_implementation="eager")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m.save_pretrained(folder, safe_serialization=True)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """Small random GPT-2 (2 layers, width 32, GPT-2 vocabulary) as an HF folder with tokenizer files; built by
    rbjax, no PyTorch."""
    return make_rbjax_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2") / "model", tokenizer_dir=tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir_no_tokenizer(tmp_path_factory) -> Path:
    """As ``tiny_model_dir``, without tokenizer files."""
    return make_rbjax_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2_bare") / "model")


@pytest.fixture(scope="session")
def torch_tiny_model_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """Small random GPT-2 built and saved by PyTorch ``transformers`` (init std 0.2), with tokenizer files: for
    parity tests."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return make_torch_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2_torch"), initializer_range=PARITY_INIT,
                                  tokenizer_dir=tokenizer_dir)


def religion1_train_file(redditbias_dir, folder, n: int) -> str:
    """The first ``n`` non-empty religion1 training phrases, written to ``folder/train{n}.txt``; returns its path."""
    lines = (Path(redditbias_dir) / "text_files/religion1/religion1_bias_manual_train.txt").read_text().splitlines()
    f = Path(folder) / f"train{n}.txt"
    f.write_text("\n".join([ln for ln in lines if ln.strip()][:n]) + "\n")
    return str(f)


def small_train_config(model_dir, tokenizer_dir, redditbias_dir, out, **kw):
    """A short HD training run on religion1 (batch 4, 4 updates, no export/evaluation); ``kw`` overrides fields.

    The token layout is ``padded`` unless ``layout`` is given: one compiled training program per run instead of up
    to four packed shapes (compiling is most of a tiny run's time). The packed layout (the users' default) is
    tests/test_packed.py's subject (packed = padded for every loss, the grid step and the dialog tasks) and the
    layout of the kill-and-resume tests of tests/test_train.py, of the 8-device data-parallel run
    (tests/mesh_checks.py) and of most CLI runs."""
    from rbjax.debias.config import DebiasRun

    base = dict(method="hd", bias_type="religion1", model=str(model_dir), tokenizer=str(tokenizer_dir),
                data_dir=str(redditbias_dir), out_dir=str(out), batch_size=4, grad_accum=1, max_steps=4,
                export=False, evaluate=False, lmp=False, progress=False, layout="padded")
    base.update(kw)
    return DebiasRun.from_flat(base)


def make_tokenizer_json(folder: Path, *, kind: str = "bytelevel", add_bos: bool = True, vocab_size: int = 400,
                        redditbias_dir: Path = REDDITBIAS) -> Path:
    """A tiny ``tokenizer.json`` folder trained offline with ``tokenizers`` on RedditBias phrases (religion1 train):
    ``kind`` ``"bytelevel"`` (byte-level BPE, ``Ġ`` pieces, as Llama 3 / Qwen2) or ``"metaspace"`` (Unigram with
    ``▁`` pieces, as SentencePiece: Llama 2, Mistral, Gemma); ``add_bos``: a template post-processor that puts
    ``<s>`` before every text (as Llama/Gemma tokenizers do). Special tokens ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2,
    ``<pad>`` 3, named in ``tokenizer_config.json``."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    src = _need(Path(redditbias_dir) / "text_files/religion1/religion1_bias_manual_train.txt", "the RedditBias data")
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()][:600]
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "metaspace":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tr = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    else:
        raise ValueError(kind)
    tok.train_from_iterator(lines, tr)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
         "unk_token": "<unk>"}))
    return folder


# ----------------------------------------------------------------------------------------- chat-format fixtures
CHAT_TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"
#: the pre-tokenizer patterns of Llama 3 and Qwen2 (digits in threes / one by one)
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
#: per chat style: special tokens (ids 0..), the tokenizer_config.json entries, and which template file
CHAT_STYLES = {
    "llama3": dict(specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"],
                   config={"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                           "eos_token": "<|end_of_text|>"},
                   template="llama3-instruct.json", template_in="tokenizer_config.json"),
    "qwen2": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                  config={"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
                          "pad_token": "<|endoftext|>", "unk_token": None},
                  template="qwen2.5-instruct.json", template_in="tokenizer_config.json"),
    "gemma2": dict(specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
                   config={"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
                           "pad_token": "<pad>", "unk_token": "<unk>"},
                   template="gemma2-it.json", template_in="chat_template.jinja"),
}


def chat_template_text(style: str) -> str:
    """The real chat template of a style (tests/fixtures/chat_templates: Llama-3-Instruct, Qwen2.5-Instruct,
    Gemma-2-it, as their tokenizer_config.json carries it)."""
    import json

    return json.loads((CHAT_TEMPLATES / CHAT_STYLES[style]["template"]).read_text(encoding="utf-8"))["chat_template"]


def make_chat_tokenizer(folder: Path, style: str, *, vocab_size: int = 384,
                        redditbias_dir: Path = REDDITBIAS) -> Path:
    """A tiny tokenizer folder of a chat family, trained offline with ``tokenizers`` on RedditBias phrases, with the
    family's special tokens and its real chat template:

    * ``llama3``: byte-level BPE with Llama 3's split pattern, ``<|begin_of_text|>`` added before a text by the
      post-processor, ``<|start_header_id|>``, ``<|end_header_id|>``, ``<|eot_id|>``; the template in
      ``tokenizer_config.json``, the special tokens also in ``special_tokens_map.json`` (as Meta ships them);
    * ``qwen2``: byte-level BPE with Qwen2's pattern, ChatML ``<|im_start|>`` / ``<|im_end|>``, no BOS; the template
      (which adds a default system prompt) in ``tokenizer_config.json``;
    * ``gemma2``: SentencePiece-style BPE (spaces as ``▁``, no pre-tokenizer), ``<bos>`` added,
      ``<start_of_turn>`` / ``<end_of_turn>``; the template (which refuses a system turn) in
      ``chat_template.jinja``."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    st = CHAT_STYLES[style]
    src = _need(Path(redditbias_dir) / "text_files/religion1/religion1_bias_manual_train.txt", "the RedditBias data")
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()][:800]
    lines += ["You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "user", "assistant", "model",
              "system"]
    specials = st["specials"]
    if style in ("llama3", "qwen2"):
        tok = Tokenizer(models.BPE())
        pattern = _LLAMA3_SPLIT if style == "llama3" else _QWEN2_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse()])
        # every character of the religion1 phrases is in the alphabet (no <unk> in the tests' phrases)
        chars = {c for f in src.parent.glob("*.txt") for c in f.read_text(encoding="utf-8") if not c.isspace()}
        tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                 initial_alphabet=sorted(chars | {"\n", "▁"}))
    tok.train_from_iterator(lines, tr)
    if style == "llama3":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A "
                                          "<|begin_of_text|> $B", special_tokens=[("<|begin_of_text|>", 0)])])
    elif style == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", 2)])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = dict(st["config"])
    template = chat_template_text(style)
    if st["template_in"] == "tokenizer_config.json":
        cfg["chat_template"] = template
    else:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    if style == "llama3":
        (folder / "special_tokens_map.json").write_text(json.dumps(
            {"bos_token": {"content": "<|begin_of_text|>", "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False}, "eos_token": "<|end_of_text|>"}), encoding="utf-8")
    return folder


def make_chat_model(folder: Path, style: str, tokenizer_dir: Path, *, seed: int = 0) -> Path:
    """A tiny seeded random model of the style's family (Llama, Qwen2, Gemma 2), built and saved by PyTorch
    ``transformers`` (init std 0.3, every parameter perturbed as in tests/test_families_torch.py), with the tokenizer
    files and a ``generation_config.json`` whose ``eos_token_id`` lists the end-of-text and end-of-turn tokens (as
    the instruct models ship it; ``config.json`` names one eos)."""
    import json
    import shutil

    import torch
    import transformers

    tok = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    V = len(tok["model"]["vocab"])
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3)
    if style == "llama3":
        cfg = transformers.LlamaConfig(**common, bos_token_id=ids["<|begin_of_text|>"],
                                       eos_token_id=ids["<|end_of_text|>"], tie_word_embeddings=False)
        gen_eos = [ids["<|end_of_text|>"], ids["<|eot_id|>"]]
        bos, pad = ids["<|begin_of_text|>"], None
    elif style == "qwen2":
        cfg = transformers.Qwen2Config(**common, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                                       tie_word_embeddings=True)
        gen_eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        bos, pad = ids["<|endoftext|>"], ids["<|endoftext|>"]
    else:
        cfg = transformers.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                        bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"])
        gen_eos = [ids["<eos>"], ids["<end_of_turn>"]]
        bos, pad = ids["<bos>"], ids["<pad>"]
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    folder = Path(folder)
    m.save_pretrained(folder, safe_serialization=True)
    gen = {"bos_token_id": bos, "eos_token_id": gen_eos, **({} if pad is None else {"pad_token_id": pad})}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
    for f in Path(tokenizer_dir).iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    return folder


@pytest.fixture(scope="session")
def chat_tokenizer_dirs(tmp_path_factory, redditbias_dir) -> dict:
    """``{style: tokenizer folder}`` for the three chat styles (:func:`make_chat_tokenizer`)."""
    root = tmp_path_factory.mktemp("chat_tokenizers")
    return {s: make_chat_tokenizer(root / s, s, redditbias_dir=redditbias_dir) for s in CHAT_STYLES}


@pytest.fixture(scope="session")
def chat_model_dirs(tmp_path_factory, chat_tokenizer_dirs) -> dict:
    """``{style: model folder}``: a tiny PyTorch-built model of each chat style's family with its tokenizer and
    generation config (:func:`make_chat_model`)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("chat_models")
    return {s: make_chat_model(root / s, s, chat_tokenizer_dirs[s]) for s in CHAT_STYLES}
def make_tiny_llama_folder(root: Path, *, redditbias_dir: Path = REDDITBIAS, seed: int = 0,
                           max_positions: int = 256) -> Path:
    """A tiny Llama (grouped-query attention, untied head, init 0.2) saved by rbjax with a byte-level
    ``tokenizer.json`` whose post-processor adds the BOS ``<s>`` (:func:`make_tokenizer_json`), as in
    tests/test_families_e2e.py; ``transformers`` loads it. Returns the model folder."""
    from rbjax.model.hf import save_pretrained
    from rbjax.model.registry import FAMILIES

    tok = make_tokenizer_json(Path(root) / "tok", kind="bytelevel", add_bos=True, redditbias_dir=redditbias_dir)
    fam = FAMILIES["llama"]
    cfg = fam.config_from_hf({"model_type": "llama", "vocab_size": 400, "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                              "initializer_range": PARITY_INIT, "bos_token_id": 1, "eos_token_id": 2,
                              "pad_token_id": 3}, "tiny llama")
    return save_pretrained(fam.init_params(cfg, seed), cfg, Path(root) / "model", tokenizer_dir=tok)
