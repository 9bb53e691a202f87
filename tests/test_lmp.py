"""Reddit-6K perplexity (LMP, paper §3.2): estimators, truncation, and parity with PyTorch transformers."""
import math

import numpy as np
import pytest

from rbjax.dialog.reddit_perplexity import lmp_from_counts, model_perplexity, read_reference_lines, reddit_perplexity
from rbjax.model import hf
from rbjax.model.tokenizer import load_tokenizer

LINES = [
    "So let em",
    "Subbed . Amazing .",
    "The grapple and manuverabilty mechanics in that game are so fluid . I think that takes the Cake for me .",
    "ok",
    "I would have just stared at him until he got uncomfortable and left , but that 's just me",
]


def test_estimators_on_hand_made_counts():
    nll = np.array([6.0, 2.0, 0.0, 9.0])
    pred = np.array([3, 1, 0, 3])  # line 3 has one token: unscorable
    ntok = np.array([4, 2, 1, 4])
    out = lmp_from_counts(nll, pred, ntok)
    assert out["n_scored_lines"] == 3 and out["n_unscorable"] == 1 and out["n_predicted_tokens"] == 7
    assert out["perplexity"] == pytest.approx(math.exp(17 / 7))
    # reference grid: per-line mean CE weighted by the line's token count (not its predictions)
    assert out["reference_grid"] == pytest.approx(math.exp((4 * 2 + 2 * 2 + 4 * 3) / 10))
    # CDA: 2-line batches (of the scorable lines), token mean per batch, mean over batches
    assert out["reference_cda"] == pytest.approx(math.exp(((6 + 2) / 4 + 9 / 3) / 2))
    assert lmp_from_counts(np.zeros(1), np.zeros(1, int), np.ones(1, int))["perplexity"] is None


def test_read_reference_lines_skips_empty_lines(tmp_path):
    f = tmp_path / "ref.txt"
    f.write_text("a b\n\n   \nc d\ne\n")
    assert read_reference_lines(f) == ["a b", "c d", "e"]
    assert read_reference_lines(f, max_lines=2) == ["a b", "c d"]
    with pytest.raises(FileNotFoundError):
        read_reference_lines(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no non-empty line"):
        read_reference_lines(tmp_path / "empty.txt")


def test_the_two_copies_of_the_6k_set_agree(shared_dir):
    a = read_reference_lines(shared_dir / "dialogpt-6k" / "human.ref.6k.txt")
    b = read_reference_lines(shared_dir / "redditbias" / "text_files" / "humanref6k.txt")
    assert a == b and len(a) == 6000


def test_lmp_matches_pytorch(torch_tiny_model_dir, tokenizer_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg, params = hf.load_pretrained(torch_tiny_model_dir)
    tok = load_tokenizer(tokenizer_dir)
    block = 12  # short, so that lines 3 and 5 are truncated
    out = reddit_perplexity(params, cfg, tok, LINES, block_size=block, batch_size=2)
    assert out["n_lines"] == 5 and out["n_truncated"] == 2 and out["n_unscorable"] == 1  # "ok" is one token

    pt = transformers.GPT2LMHeadModel.from_pretrained(torch_tiny_model_dir).eval()
    ids = [tok.encode(s)[:block] for s in LINES]
    nll, npred, ntok, means = [], [], [], []
    with torch.no_grad():
        for t in ids:
            if len(t) < 2:
                continue
            x = torch.tensor([t])
            loss = float(pt(x, labels=x).loss)  # mean CE over the n-1 predictions, as the reference
            nll.append(loss * (len(t) - 1))
            npred.append(len(t) - 1)
            ntok.append(len(t))
            means.append(loss)
        # CDA estimator: eval batches of 2 (right-padded, labels -100 on padding), mean of the batch losses
        scorable = [t for t in ids if len(t) >= 2]
        batch_losses = []
        for i in range(0, len(scorable), 2):
            rows = scorable[i:i + 2]
            L = max(len(r) for r in rows)
            x = torch.full((len(rows), L), 50256)
            lab = torch.full((len(rows), L), -100)
            att = torch.zeros((len(rows), L), dtype=torch.long)
            for r, t in enumerate(rows):
                x[r, :len(t)] = torch.tensor(t)
                lab[r, :len(t)] = torch.tensor(t)
                att[r, :len(t)] = 1
            batch_losses.append(float(pt(x, attention_mask=att, labels=lab).loss))
    assert out["perplexity"] == pytest.approx(math.exp(sum(nll) / sum(npred)), rel=1e-4)
    assert out["reference_grid"] == pytest.approx(
        math.exp(sum(n * m for n, m in zip(ntok, means)) / sum(ntok)), rel=1e-4)
    assert out["reference_cda"] == pytest.approx(math.exp(np.mean(batch_losses)), rel=1e-4)


def test_model_perplexity_records_the_file(tiny_model_dir, tmp_path):
    f = tmp_path / "ref.txt"
    f.write_text("\n".join(LINES) + "\n")
    out = model_perplexity(tiny_model_dir, f, max_lines=3, batch_size=4)
    assert out["n_lines"] == 3 and out["file"] == str(f) and len(out["sha256"]) == 64
    assert out["perplexity"] > 1
    with pytest.raises(ValueError, match="block_size"):
        cfg, params = hf.load_pretrained(tiny_model_dir)
        reddit_perplexity(params, cfg, load_tokenizer(tiny_model_dir), LINES, block_size=10_000)
