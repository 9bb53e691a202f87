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
