import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RBJAX_SHARED", ROOT.parent / "shared"))
REDDITBIAS = SHARED / "redditbias"
TOKENIZER_DIR = SHARED / "tokenizers" / "gpt2"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def redditbias_dir(shared_dir) -> Path:
    return shared_dir / "redditbias"


@pytest.fixture(scope="session")
def tokenizer_dir(shared_dir) -> Path:
    return shared_dir / "tokenizers" / "gpt2"


def make_torch_gpt2_folder(folder: Path, *, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                           vocab_size=50257, seed=0, tokenizer_dir: Path | None = None) -> Path:
    """A seeded random GPT-2 built and saved by PyTorch transformers (the real HF format)."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd,
                                  n_layer=n_layer, n_head=n_head)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(folder)
    if tokenizer_dir is not None:
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(tokenizer_dir / f, folder / f)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """Small random GPT-2 (2 layers, width 32, GPT-2 vocabulary) as an HF folder, with tokenizer files."""
    pytest.importorskip("torch")
    return make_torch_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2"), tokenizer_dir=tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir_no_tokenizer(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    return make_torch_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2_bare"))
