"""PyTorch parity of the debiasing losses and the trainer's LM loss (needs the test extra: torch, transformers).

* Reference semantics (triggers + losses from token ids) against the official formulas written as PyTorch loops.
* The trainer's causal LM loss (:func:`rbjax.train.lm.lm_loss`, and a real training micro-batch through
  :func:`rbjax.train.step.batch_losses`) against ``GPT2LMHeadModel(labels=…)`` with −100 on padding, on
  right-padded batches of different lengths.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rbjax.debias import losses as L

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _rng(seed=0):
    return np.random.default_rng(seed)


# ------------------------------------------------------- reference semantics vs an independent PyTorch computation
# The official formulas (docs/debiasing.md §3-§4, "reference"), written here as loops over token ids (cai
# modeling_gpt2.py), on the same random inputs; rbjax goes through triggers.py + losses.py.
PAD = 50257


def _torch_lmd(h, ids, pairs, E):
    labels = ids.clone()
    labels[ids == PAD] = -100
    total = torch.zeros((), dtype=h.dtype)
    for s in range(ids.shape[0]):
        n_s = (ids[s] != PAD).sum()
        for t1, t2 in pairs:
            if (ids[s] == t1).any():  # only the first element of the pair is checked
                keep = (labels[s] > 0).to(h.dtype)  # pads (-100) and "!" (0) masked out
                hs = h[s] * keep[:, None]
                logits = torch.stack([hs @ E[t1], hs @ E[t2]])
                p = torch.softmax(logits, dim=0)
                total = total + torch.abs(torch.log(p[0] / p[1])).sum() / n_s
    return total / len(pairs)


def _torch_occurrences(h, ids, rows):
    """Yield the representation of each attribute occurrence in the code's loop order."""
    d = h.shape[-1]
    for s in range(ids.shape[0]):
        for i in range(ids.shape[1]):
            for row in rows:
                if int(ids[s, i]) in row:
                    n = sum(1 for v in row if v != 0)
                    if n > 1:
                        win = ids[s, i:i + n]
                        if all(int(x) in row for x in win):
                            yield h[s, i:i + n].mean(0)
                        else:
                            yield torch.zeros(d, dtype=h.dtype)
                    else:
                        yield h[s, i]


def _torch_add(h, ids, pairs, rows, E):
    cos = torch.nn.functional.cosine_similarity
    total = torch.zeros((), dtype=h.dtype)
    for v in _torch_occurrences(h, ids, rows):
        for t1, t2 in pairs:
            total = total + torch.abs((1 - cos(E[t1], v, dim=0)) - (1 - cos(E[t2], v, dim=0)))
    return total


def _torch_hd(h, ids, pairs, rows, E):
    C = torch.stack([(E[t2] - E[t1]) / 2 for t1, t2 in pairs])
    _, S, V = torch.svd(C)
    s2 = S ** 2
    cum = torch.cumsum(s2, 0)
    k = next(j + 1 for j in range(len(S)) if cum[j] > 0.5 * s2.sum())  # strict >
    B = V[:, :k]
    r = torch.zeros(h.shape[-1], dtype=h.dtype)  # created once per forward call, never reset
    total = torch.zeros((), dtype=h.dtype)
    for v in _torch_occurrences(h, ids, rows):
        for j in range(k):
            r = r + (v @ B[:, j]) * B[:, j]
        total = total + r.abs().sum()
    return total


def _random_ids(spec, rng, B=4):
    ref = spec.reference
    rows = [[v for v in r if v != 0] for r in ref["attribute_rows"]]
    pair_ids = [i for p in ref["lmd_pairs"] + ref["add_hd_pairs"] for i in p]
    sents = []
    for _ in range(B):
        s = []
        while len(s) < rng.integers(4, 14):
            c = rng.integers(0, 6)
            if c == 0:
                s += rows[rng.integers(len(rows))]  # a full attribute row
            elif c == 1:
                r = rows[rng.integers(len(rows))]
                s += [r[rng.integers(len(r))]]  # one piece
            elif c == 2:
                s += [0]  # "!"
            elif c == 3:
                s += [pair_ids[rng.integers(len(pair_ids))]]
            else:
                s += [int(rng.integers(1, 50000))]
        sents.append([min(x, 50256) if x >= 50257 else x for x in s])
    sents[0].insert(1, ref["lmd_pairs"][0][0])  # make sure some LMD pairs fire
    sents[1].append(ref["lmd_pairs"][-1][0])
    L = max(map(len, sents))
    ids = np.full((B, L), PAD, np.int64)
    for b, s in enumerate(sents):
        ids[b, : len(s)] = s
    return ids


@pytest.mark.parametrize("name", ["religion1", "religion2", "race", "gender", "queerness"])
def test_reference_semantics_match_pytorch(name):
    from rbjax.debias.triggers import TriggerBuilder
    from rbjax.specs import load_spec

    spec = load_spec(name)
    rng = _rng(sum(map(ord, name)))
    d = 6
    ids = _random_ids(spec, rng)
    E = rng.normal(size=(PAD + 1, d)) * 0.5
    h = rng.normal(size=ids.shape + (d,))
    tb = TriggerBuilder(spec, semantics="reference")
    rows = [list(r) for r in spec.reference["attribute_rows"]]
    lmd_pairs = [tuple(p) for p in spec.reference["lmd_pairs"]]
    add_pairs = [tuple(p) for p in spec.reference["add_hd_pairs"]]

    # ours (float32); an extra padding column on our side must not change anything
    ids_x = np.concatenate([ids, np.full((ids.shape[0], 2), PAD)], axis=1)
    h_x = jnp.asarray(np.concatenate([h, rng.normal(size=(ids.shape[0], 2, d))], axis=1), jnp.float32)
    Ej = jnp.asarray(E, jnp.float32)
    lm = tb.lmd(ids_x, ids_x != PAD)
    occ = tb.attributes(ids_x, ids_x != PAD)
    assert occ.mask.sum() > 0 and lm.mask.sum() > 0
    t_lmd = L.gather_targets(Ej, *tb.pair_ids("lmd"))
    t_add = L.gather_targets(Ej, *tb.pair_ids("add_hd"))

    def ours(hh):
        basis, bm = L.bias_subspace(t_add, semantics="reference")
        return (L.equalising_loss(hh, t_lmd, lm.mask, lm.norm, semantics="reference"),
                L.attribute_distance_loss(hh, t_add, occ.weights, occ.mask, semantics="reference"),
                L.neutralisation_loss(hh, occ.weights, occ.mask, basis, bm, semantics="reference"))

    @jax.jit
    def vals_and_grads(hh):
        return ours(hh), [jax.grad(lambda x, k=k: ours(x)[k])(hh) for k in range(3)]

    vals, grads = vals_and_grads(h_x)

    # PyTorch, float64, the code's own padded batch (longest sentence)
    ht = torch.tensor(h, dtype=torch.float64, requires_grad=True)
    it, Et = torch.tensor(ids), torch.tensor(E, dtype=torch.float64)
    theirs = [_torch_lmd(ht, it, lmd_pairs, Et), _torch_add(ht, it, add_pairs, rows, Et),
              _torch_hd(ht, it, add_pairs, rows, Et)]
    for k, (a, b) in enumerate(zip(vals, theirs)):
        np.testing.assert_allclose(float(a), b.item() if False else float(b.detach()), rtol=2e-4, err_msg=f"loss {k}")
        (g,) = torch.autograd.grad(b, ht)
        np.testing.assert_allclose(np.asarray(grads[k])[:, : ids.shape[1]], g.numpy(), rtol=2e-3, atol=2e-4,
                                   err_msg=f"grad {k}")
        assert np.all(np.asarray(grads[k])[:, ids.shape[1]:] == 0)


# ------------------------------------------------------------------------------ the trainer's LM loss vs PyTorch
# Right-padded rows of different lengths: the target after a row's last real token is padding and must not be
# scored (HF: labels -100 there). GPT-2 pads with <|endoftext|> (50256), an ordinary token to the model.
EOS = 50256
ROWS = [[1169, 15849, 373, 1611, 0, 484, 389, 1611, 13], [31373, 995, 13, 198], [42773, 0, 484, 389, 1611, 0],
        [464, 3290]]


def _right_padded(rows, L=None):
    L = L or max(map(len, rows))
    ids = np.full((len(rows), L), EOS, np.int64)
    mask = np.zeros((len(rows), L), np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r)], mask[b, :len(r)] = r, 1
    return ids, mask


def _torch_lm_loss(folder, ids, mask):
    pt = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    labels = torch.tensor(np.where(mask > 0, ids, -100))
    with torch.no_grad():
        return float(pt(torch.tensor(ids), attention_mask=torch.tensor(mask), labels=labels).loss)


def test_lm_loss_matches_pytorch_labels_on_a_right_padded_batch(torch_tiny_model_dir):
    from rbjax.train.lm import lm_loss
    from rbjax.model.gpt2 import GPT2LMHeadModel
    from rbjax.model.hf import load_pretrained

    cfg, params = load_pretrained(torch_tiny_model_dir)
    ids, mask = _right_padded(ROWS, L=11)  # every row padded, by 2 to 9 positions
    logits, _ = GPT2LMHeadModel(cfg).apply({"params": params}, jnp.asarray(ids, jnp.int32),
                                           attention_mask=jnp.asarray(mask, jnp.int32))
    ours = float(lm_loss(logits, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
    ref = _torch_lm_loss(torch_tiny_model_dir, ids, mask)
    assert ours == pytest.approx(ref, rel=2e-5)
    # the test can tell: also scoring each row's first pad target gives another loss
    lg = np.asarray(logits, np.float64)[:, :-1]
    nll = (np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
           - np.take_along_axis(lg, ids[:, 1:, None], -1)[..., 0])
    with_pad = (nll * mask[:, :-1]).sum() / mask[:, :-1].sum()
    assert abs(with_pad - ref) > 1e3 * 2e-5 * abs(ref)


def test_training_micro_batch_lm_loss_matches_pytorch(torch_tiny_model_dir, tokenizer_dir, tmp_path):
    from rbjax.train.step import batch_losses
    from rbjax.debias.config import DebiasRun
    from rbjax.debias.run import debias_trainer

    texts = ["jews are greedy", "christians are generous people who like to give",
             "the jewish community is rich", "ok then"]
    cfg = DebiasRun.from_flat(method="lm", bias_type="religion1", model=str(torch_tiny_model_dir),
                      tokenizer=str(tokenizer_dir), out_dir=str(tmp_path / "run"), batch_size=6, block_size=12,
                      dropout=False, export=False, evaluate=False, lmp=False, progress=False)
    tr = debias_trainer(cfg, texts=texts)
    batch = tr.make_batch(np.arange(len(texts)))  # 4 rows of different lengths + 2 empty filler rows
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths[:4].tolist())) == 4 and lengths[4:].sum() == 0 and lengths.max() <= 12
    total, aux = batch_losses(tr.init_params, {k: jnp.asarray(v) for k, v in batch.items()},
                              jnp.asarray(tr.hparams), None, tr.spec, dropout=False)
    lm = aux["lm_loss"]
    ref = _torch_lm_loss(torch_tiny_model_dir, np.asarray(batch["input_ids"], np.int64),
                         np.asarray(batch["attention_mask"], np.int64))
    assert float(lm) == pytest.approx(ref, rel=2e-5) and float(total) == pytest.approx(ref, rel=2e-5)
