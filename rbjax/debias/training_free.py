"""``rbjax debias --method sentence-debias|inlp``: debiasing without training, as a run folder like any other method's
(docs/debiasing.md, "Debiasing without training").

The run: counterfactual sets of sentences (:func:`counterfactual_sets`: the bias type's RedditBias training phrases
or a corpus of the user's own, each swapped with the spec's target pairs by :func:`rbjax.data.swap.swap_targets`; or
ready-made sets from a CSV), their representations (:mod:`rbjax.debias.representations`), the projection
(:mod:`rbjax.debias.projection`), and the folder::

    OUT/results.json     status "done", the method, its settings, the keys of its inputs, what was removed
    OUT/projection.npy   the (d, d) float64 projection P applied to the final hidden state
    OUT/subspace.npy     SentenceDebias: the (k, d) removed directions; INLP: the kept classifiers' stacked rows
    OUT/pairs.csv        the counterfactual sets used, one column per group
    OUT/model/           the debiased model as a Hugging Face folder: the base with its LM head W replaced by W·P
                         (untied), so ``measure``, ``evaluate``, ``compare`` and ``export`` read the run as they read
                         a trained one
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
from pathlib import Path

import jax
import numpy as np

from rbjax.core.io import atomic_folder, atomic_write_json, atomic_write_text
from rbjax.core.keys import digest
from rbjax.core.reuse import KeyedResult
from rbjax.data.swap import swap_targets
from rbjax.debias import projection as pr
from rbjax.debias.cda import read_train_phrases
from rbjax.debias.config import bias_spec, resolve_bias_type
from rbjax.core.mesh import mesh_of
from rbjax.debias.representations import sentence_representations
from rbjax.model.chat import ChatSettings
from rbjax.model.handle import ModelHandle
from rbjax.model.hf import save_pretrained

__all__ = ["TRAINING_FREE_METHODS", "ProjectionRun", "counterfactual_sets", "read_pairs_csv", "pairs_csv_text",
           "fit_projection", "run_training_free"]

TRAINING_FREE_METHODS = ("sentence-debias", "inlp")


@dataclasses.dataclass(frozen=True)
class ProjectionRun:
    """The settings of a training-free run.

    Attributes:
        method: ``"sentence-debias"`` or ``"inlp"``. bias_type: a packaged bias type or a spec file (its target
            pairs swap the corpus; its training phrases are the default corpus). model, tokenizer, out_dir: as a
            trained run's. data_dir: the RedditBias folder (default: ``$RBJAX_DATA_DIR`` / download cache).
        corpus: a text file of the user's own sentences (one a line) to swap instead of the training phrases.
        pairs: a CSV of ready-made counterfactual sets (a header naming the groups, one column each).
        k: SentenceDebias's number of principal directions (bias-bench: 1).
        iterations: INLP's classifiers at most (bias-bench: 80). epsilon: INLP stops once a classifier's held-out
            accuracy is within this of chance. dev_fraction: INLP's held-out share of the sets. seed: of INLP's split.
        bos: the BOS policy (``None``: as the model's tokenizer encodes a text). batch_size: rows per forward call.
        chat: the format the sentences are read in (:class:`rbjax.model.chat.ChatSettings`; default raw): in the
            chat format each sentence is a turn of the model's chat template, as LMB scoring renders a phrase, and
            its representation is the mean over its own tokens (the template's are context). ``score_end_of_turn``
            is a scoring setting and is refused; so is ``bos`` (the template writes the BOS).
        mesh: the device mesh of the representation pass (``"data=8"``, ``"data=2,fsdp=2,tensor=2"``;
            :func:`rbjax.core.mesh.mesh_of`), or ``None``: one device. It changes where the pass runs, not what
            it computes (not a setting of the projection: it is recorded, not keyed).
    """

    method: str
    bias_type: str
    model: str
    out_dir: str
    tokenizer: str | None = None
    data_dir: str | None = None
    corpus: str | None = None
    pairs: str | None = None
    k: int = 1
    iterations: int = 80
    epsilon: float = 0.01
    dev_fraction: float = 0.3
    seed: int = 0
    bos: bool | None = None
    batch_size: int = 32
    chat: ChatSettings = ChatSettings()
    mesh: str | None = None

    def __post_init__(self):
        if self.method not in TRAINING_FREE_METHODS:
            raise ValueError(f"method must be one of {', '.join(TRAINING_FREE_METHODS)}, got {self.method!r}")
        if self.corpus is not None and self.pairs is not None:
            raise ValueError("--corpus and --pairs are alternatives: the pairs are either built from a corpus or "
                             "given ready-made")
        for name, lo in (("k", 1), ("iterations", 1), ("batch_size", 1)):
            if getattr(self, name) < lo:
                raise ValueError(f"{name} must be >= {lo}, got {getattr(self, name)}")
        if not 0 < self.dev_fraction < 1:
            raise ValueError(f"dev_fraction must lie in (0, 1), got {self.dev_fraction}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0, got {self.epsilon}")
        if not isinstance(self.chat, ChatSettings):
            raise TypeError(f"chat must be a ChatSettings, got {type(self.chat).__name__}")
        self.chat.check_chat_settings()
        if self.chat.score_end_of_turn:
            raise ValueError("score_end_of_turn is a scoring setting: a sentence's representation is the mean over "
                             "its own tokens (leave --score-end-of-turn out)")
        if self.chat.is_chat and self.bos is not None:
            raise ValueError("bos has no effect in the chat format: the chat template writes the BOS")
        object.__setattr__(self, "bias_type", resolve_bias_type(self.bias_type))

    def settings(self) -> dict:
        """What defines the projection (recorded; the output folder, batch size and mesh excluded). In the chat
        format: ``format = "chat"`` and the format's settings (``role``, ``system``, ``prompt``,
        ``chat_template``); a raw-format run records none of them (its key is what it was before the chat format
        existed)."""
        d = dataclasses.asdict(self)
        for k in ("out_dir", "batch_size", "mesh", "chat"):
            d.pop(k)
        if self.chat.is_chat:
            d.update({k: getattr(self.chat, k) for k in ("format", "role", "system", "prompt", "chat_template")})
        if self.method == "sentence-debias":
            for k in ("iterations", "epsilon", "dev_fraction", "seed"):
                d.pop(k)
        else:
            d.pop("k")
        return d


def counterfactual_sets(sentences, spec) -> tuple[list[str], list[list[str]]]:
    """``(group names, sets)``: each sentence that holds a target term of the spec with its swapped twin, ordered
    (group 1's version, group 2's version). A sentence with T1 terms is swapped T1 → T2; one with only T2 terms
    T2 → T1 (when the spec swaps both ways); a sentence the swap leaves unchanged is skipped, as are repeats.

    Raises:
        ValueError: no sentence holds a target term.
    """
    groups = [spec.t1_group, spec.t2_group]
    seen, sets = set(), []
    for s in sentences:
        t = swap_targets(s, spec, "paper", "t1_to_t2")
        row = [s, t]
        if t == s and spec.two_way:
            t = swap_targets(s, spec, "paper", "t2_to_t1")
            row = [t, s]
        if t == s or tuple(row) in seen:
            continue
        seen.add(tuple(row))
        sets.append(row)
    if not sets:
        raise ValueError(f"no sentence holds a target term of {spec.name!r} (nothing to swap)")
    return groups, sets


def read_pairs_csv(path: str | os.PathLike) -> tuple[list[str], list[list[str]]]:
    """``(group names, sets)`` of a CSV of ready-made counterfactual sets: a header row naming ≥ 2 groups, then one
    set a row (every cell a non-empty sentence).

    Raises:
        FileNotFoundError; ValueError naming the file and row: no header, fewer than 2 columns, a short row or an
        empty cell, no set.
    """
    p = Path(path)
    rows = list(csv.reader(io.StringIO(p.read_text(encoding="utf-8"))))
    if not rows:
        raise ValueError(f"{p}: empty (expected a header naming the groups, then one set a row)")
    header = [h.strip() for h in rows[0]]
    if len(header) < 2 or any(not h for h in header):
        raise ValueError(f"{p}: row 1: the header must name at least 2 groups, got {rows[0]!r}")
    sets = []
    for i, r in enumerate(rows[1:], start=2):
        if not r or all(not c.strip() for c in r):
            continue
        if len(r) != len(header) or any(not c.strip() for c in r):
            raise ValueError(f"{p}: row {i}: expected {len(header)} non-empty sentences ({', '.join(header)}), "
                             f"got {r!r}")
        sets.append(list(r))
    if not sets:
        raise ValueError(f"{p}: no counterfactual set after the header")
    return header, sets


def pairs_csv_text(groups: list[str], sets: list[list[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(groups)
    w.writerows(sets)
    return buf.getvalue()


def fit_projection(cfg: ProjectionRun, params, config, token_sets: list[list[list[int]]], *,
                   bos_id: int | None, n_context: list[list[int]] | None = None,
                   mesh=None) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(P, removed rows, record)`` of the method on tokenised sets (``token_sets[i][g]``: set i's sentence of group
    g; in the chat format its rendered chat up to the sentence's end, ``n_context[i][g]`` leading ids of them the
    template's). SentenceDebias: L2-normalised representations,
    :func:`rbjax.debias.projection.sentence_debias_subspace`; INLP: plain mean representations labelled by group,
    sets split by :func:`rbjax.debias.projection.split_groups`, :func:`rbjax.debias.projection.inlp_projection`.
    ``mesh``: the representation pass's (:func:`rbjax.debias.representations.sentence_representations`)."""
    G = len(token_sets[0])
    flat = [s[g] for g in range(G) for s in token_sets]
    ctx = None if n_context is None else [c[g] for g in range(G) for c in n_context]
    reps = sentence_representations(params, config, flat, bos_id=bos_id, batch_size=cfg.batch_size,
                                    normalize=cfg.method == "sentence-debias", n_context=ctx, mesh=mesh)
    reps = reps.reshape(G, len(token_sets), -1)
    if cfg.method == "sentence-debias":
        v = pr.sentence_debias_subspace(reps, k=cfg.k)
        return pr.subspace_projection(v), v, {"directions": int(v.shape[0])}
    train, dev = pr.split_groups(len(token_sets), cfg.dev_fraction, cfg.seed)

    def rows(idx):
        return reps[:, idx].reshape(-1, reps.shape[2]), np.repeat(np.arange(G), len(idx))

    res = pr.inlp_projection(*rows(train), *rows(dev), n_classes=G, iterations=cfg.iterations, epsilon=cfg.epsilon)
    removed = np.concatenate(res.classifiers) if res.classifiers else np.zeros((0, reps.shape[2]))
    return res.projection, removed, {"classifiers": len(res.classifiers), "stopped": res.stopped,
                                     "train_sets": len(train), "dev_sets": len(dev), "history": res.history}


def run_training_free(cfg: ProjectionRun, *, overwrite: bool = False) -> dict:
    """Fit the projection and write the run folder (module docstring); returns the results record.

    A finished run in ``cfg.out_dir`` with the same inputs (the ``key`` of results.json) is reused; with other
    inputs it is refused unless ``overwrite``.

    Raises:
        FileExistsError: ``out_dir`` holds another run (or anything else) and ``overwrite`` is false.
        ValueError: as :func:`read_pairs_csv`, :func:`counterfactual_sets`, :mod:`rbjax.debias.projection`.
    """
    out = Path(cfg.out_dir)
    handle = ModelHandle.open(cfg.model, cfg.tokenizer)
    tok = handle.tokenizer
    spec = bias_spec(cfg.bias_type)
    if cfg.pairs is not None:
        groups, sets = read_pairs_csv(cfg.pairs)
        source = {"pairs": str(cfg.pairs)}
    else:
        sentences = (read_train_phrases(cfg.bias_type, cfg.data_dir) if cfg.corpus is None else
                     [ln for ln in Path(cfg.corpus).read_text(encoding="utf-8").splitlines() if ln.strip()])
        groups, sets = counterfactual_sets(sentences, spec)
        source = {"corpus": str(cfg.corpus) if cfg.corpus else f"{cfg.bias_type} training phrases"}
    pairs_text = pairs_csv_text(groups, sets)
    turns = cfg.chat.chat_turns(tok)  # the chat format: each sentence a turn of the model's template (None: raw)
    key = {"method": cfg.method, "settings": cfg.settings(), "model": handle.digest,
           "tokenizer": handle.tokenizer_digest, "pairs": hashlib.sha256(pairs_text.encode()).hexdigest(),
           "bos": handle.resolve_bos(cfg.bos) if turns is None else None,
           **({"chat": turns.key()} if turns is not None else {})}
    prev = None if overwrite else stored_run(out, key, cfg.method)
    if prev is not None:
        return prev
    mesh = mesh_of(cfg.mesh)
    config, params, _ = handle.load(mesh=mesh)
    if turns is None:
        bos_id, n_context = handle.bos_id(cfg.bos), None
        token_sets = [[tok.encode(s) for s in row] for row in sets]
    else:  # the rendered chat up to each sentence's end; the mean over its own tokens (as LMB scores a phrase)
        bos_id = None
        spans = [turns.encode(row) for row in sets]
        token_sets = [[list(sp.ids) for sp in row] for row in spans]
        n_context = [[sp.n_context for sp in row] for row in spans]
    for i, row in enumerate(token_sets):
        if any(len(t) <= (0 if n_context is None else n_context[i][g]) for g, t in enumerate(row)):
            raise ValueError(f"set {i + 1} ({sets[i]!r}) has a sentence without tokens")
    p, removed, fit = fit_projection(cfg, params, config, token_sets, bos_id=bos_id, n_context=n_context, mesh=mesh)
    params = jax.device_get(params)  # (on a mesh: its slices gathered to fold the head and save)
    dparams, dconfig = pr.projected_model(params, config, p)
    res = {"status": "done", "method": cfg.method, "bias_type": cfg.bias_type, "training_free": True,
           "groups": groups, "sets": len(sets), "source": source, "settings": cfg.settings(), "key": key,
           "key_digest": digest(key), "model": handle.describe(), "model_dir": str(out / "model"),
           "projection": {"dim": int(p.shape[0]), "rank": int(np.linalg.matrix_rank(p, tol=1e-8)),
                          "removed": int(p.shape[0] - np.linalg.matrix_rank(p, tol=1e-8)),
                          "applied_to": "the final hidden state (after the final norm, before the LM head), "
                                        "folded into the LM head as W·P"},
           "fit": fit, "format": cfg.chat.format, "mesh": cfg.mesh}
    if turns is not None:  # as a trained run's results.json records its format
        res["chat"] = turns.record(sets[0][0])
    with atomic_folder(out) as tmp:  # the run written whole, then put in place: an earlier one never survives in part
        np.save(tmp / "projection.npy", p)
        np.save(tmp / "subspace.npy", removed)
        atomic_write_text(tmp / "pairs.csv", pairs_text)
        save_pretrained(dparams, dconfig, tmp / "model", tokenizer_dir=handle.tokenizer_folder(),
                        source_dir=handle.folder)
        atomic_write_json(tmp / "results.json", res)
    return res


def stored_run(out: Path, key: dict, method: str) -> dict | None:
    """The finished run of ``key`` in ``out`` (reused: ``reused`` true), or ``None`` when ``out`` may take a new run
    (:class:`rbjax.core.reuse.KeyedResult`, the one reuse rule). The new run is written beside ``out`` and put in its
    place whole (:func:`rbjax.core.io.atomic_folder`), so nothing of an earlier run is deleted before it has finished.

    Raises:
        FileExistsError: ``out`` holds another run (other inputs or settings), an unfinished one or other files,
            without ``--overwrite`` (the caller passes it on; nothing was computed).
    """
    prev = KeyedResult(out / "results.json", key, f"{method} run").stored()
    if prev is not None:
        return prev
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: holds another run (other inputs or settings) or other files; pass "
                              "--overwrite to replace it, or another --out")
    return None
