"""Dialog state tracking as binary slot-value classification (paper §3.2; docs/dialog.md "DST").

The paper checks that a (debiased) DialoGPT still works as a task-oriented dialog model: every slot-value pair of
a MultiWOZ 2.0 turn becomes a binary decision over the text ::

    "<previous system turn> [SEP] <user turn> <domain-slot>-<value>"        label 1 (the pair was added this turn)

with one sampled negative (same text, another value of the slot, label 0) per positive. A linear layer on the
GPT-2 state of the **last real token** gives one logit, trained with binary cross-entropy. This module holds the
pieces, all pure and host-side where they can be:

* examples: :func:`build_examples` (from TRADE-format dialogues, :mod:`rbjax.dialog.multiwoz`),
  :func:`encode_examples` (GPT-2 BPE, fixed block 128), :func:`dst_batches`;
* model: :func:`init_head`, :func:`pooled_index`, :func:`dst_logits`, :func:`dst_loss`, :func:`make_loss_fn`
  (``loss_fn(params, batch, rng) -> (loss, aux)`` with ``params = {"gpt2": ..., "head": ...}`` for the project's
  trainer);
* metrics: :func:`binary_metrics` (what the reference reports: accuracy, binary F1 of class 1, macro-F1, confusion
  matrix, on the sampled pairs), and joint goal accuracy (:func:`jga_candidates`, :func:`jga_cost`,
  :func:`beliefs_equal`, :func:`joint_goal_accuracy`, :func:`score_joint_goal`).

``semantics="paper"`` (default) versus ``"reference"`` (the official ``lm_dst_binary.py``):

* **negative value** — paper: drawn from the ontology values of the *same* slot (TRADE name → ontology key) in the
  comparison form (:func:`~rbjax.dialog.multiwoz.canonical_value`), ``dontcare`` included, without the gold value
  and values contained in it, so every positive gets one negative. Reference: drawn from the ontology list of the
  slot *after a buggy remap* — every slot with ``pricerange`` reads ``hotel-price range``, ``arriveby`` →
  ``train-arrive by``, ``leaveat`` → ``train-leave at``, also for restaurant and taxi — as written in the ontology
  (``do n't care``), and dropped when it is a substring of the gold value (so the gold value in another spelling
  can become a "negative").
* **values in the text** — paper: the comparison form on both sides (``guest house``, ``dontcare``, ``09:00``);
  reference: the gold value as TRADE wrote it, the raw ontology value for negatives.
* **random numbers** — paper: ``random.Random(seed)``, one ``choice`` per positive over the filtered candidates;
  reference: Python ``random`` seeded 42 (``set_seed``), one ``choice`` per positive over the full list. Pass
  ``rng`` to continue one stream across splits (the reference builds train first, then test, from one stream).
* **truncation to 128 tokens** (:func:`encode_examples`) — default ``"left"`` keeps the *end* (the slot-value
  pair) and cuts the start of the system turn; ``"right"``/``"reference"`` keeps the start, as HF's default does.
* **pooled state** (:func:`dst_logits`) — default: the last real token (rightmost mask = 1); ``pooling="reference"``:
  ``hidden[:, -1]`` of the batch padded to its longest row, with no attention mask (pads attended, positions
  ``0..L-1``).
"""
from __future__ import annotations

import dataclasses
import random
from functools import partial
from typing import Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from rbjax.core.compilation import abstract
from rbjax.core.interrupt import poll
from rbjax.core.mesh import batch_axes, replicate, shard_tree
from rbjax.core.precision import get_policy
from rbjax.core.progress import progress_bar
from rbjax.core.padding import pad_sequences
from rbjax.dialog.multiwoz import EXPERIMENT_DOMAINS, SlotOntology, canonical_value
from rbjax.model.partition import logical_axes_for
from rbjax.model.registry import family_of_config
from rbjax.train.lm import forward_at

__all__ = [
    "SEMANTICS", "POOLING", "TRUNCATION", "BLOCK_SIZE", "REFERENCE_SEED", "SEP", "DSTExample", "turn_context",
    "example_text", "build_examples", "example_counts", "encode_examples", "dst_batches", "init_head",
    "pooled_index", "dst_logits", "dst_head_logits", "dst_loss", "make_loss_fn", "DSTObjective", "predict_proba",
    "prediction_widths", "compile_predictions", "binary_metrics",
    "candidate_values", "jga_slots", "jga_candidates", "jga_cost", "gold_belief", "beliefs_equal",
    "predict_beliefs", "joint_goal_accuracy", "score_joint_goal",
]

SEMANTICS = ("paper", "reference")
POOLING = ("last", "reference")
TRUNCATION = ("left", "right", "reference")
#: the reference's ``--block_size`` for DST
BLOCK_SIZE = 128
#: the reference's ``set_seed(42)``
REFERENCE_SEED = 42
#: literal text between the system and the user turn (tokenised as ordinary BPE pieces, as in the reference)
SEP = "[SEP]"


def _cut_end(truncation: str) -> str:
    """The end :func:`rbjax.core.padding.pad_sequences` cuts of a pair longer than the block for a ``truncation``
    (``"reference"`` keeps the start, as ``"right"``)."""
    return "left" if truncation == "left" else "right"


# ------------------------------------------------------------------------------------------------ examples
@dataclasses.dataclass(frozen=True)
class DSTExample:
    """One binary slot-value example.

    Attributes:
        text: ``"<system> [SEP] <user> <slot>-<value>"``.
        label: 1 = the pair is in the turn's ``turn_label``, 0 = sampled negative.
        slot: TRADE slot name (``hotel-pricerange``). value: the value written in ``text``.
        dialogue_idx, turn_idx: where it comes from.
    """

    text: str
    label: int
    slot: str
    value: str
    dialogue_idx: str
    turn_idx: int


def turn_context(turn: dict) -> str:
    """``"<system_transcript> [SEP] <transcript>"`` (turn 0 starts with a space: its system turn is ``''``)."""
    return f"{turn['system_transcript']} {SEP} {turn['transcript']}"


def example_text(turn: dict, slot: str, value: str) -> str:
    """The classifier input for one slot-value pair of a turn: ``turn_context(turn) + " " + slot + "-" + value``."""
    return f"{turn_context(turn)} {slot}-{value}"


def _reference_ontology_key(slot: str) -> str:
    """The reference's slot remapping (``lm_dst_binary.py:206-211``), bug included."""
    if "pricerange" in slot:
        return "hotel-price range"
    if "arriveby" in slot:
        return "train-arrive by"
    if "leaveat" in slot:
        return "train-leave at"
    return slot


def candidate_values(onto: SlotOntology, slot: str) -> list[str]:
    """The values a slot can take, in comparison form: the ontology's (order kept) plus ``dontcare`` if absent
    (every slot can be "don't care"; the 2.0 ontology lacks it for ``restaurant-area``, which the test data uses).

    Raises:
        ValueError: ``slot`` is not in the ontology.
    """
    if slot not in onto.values:
        raise ValueError(f"slot {slot!r} is not in the ontology (known: {', '.join(onto.slots)})")
    vals = onto.values[slot]
    return vals if "dontcare" in vals else vals + ["dontcare"]


def _check_semantics(semantics: str) -> None:
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, got {semantics!r}")


def build_examples(dialogues: Sequence[dict], onto: SlotOntology, *, semantics: str = "paper",
                   seed: int = REFERENCE_SEED, rng: random.Random | None = None) -> list[DSTExample]:
    """The binary DST examples of TRADE-format dialogues (reference ``DialogTurnDataset``; see the module table).

    Only turns with a non-empty ``turn_label`` give examples: for each ``[slot, value]`` in it, in order, the
    positive and then (when kept) its negative.

    Args:
        dialogues: TRADE-format dialogues (:attr:`rbjax.dialog.multiwoz.MultiWOZSplit.dialogues`).
        onto: :class:`~rbjax.dialog.multiwoz.SlotOntology` built from the 2.0 ``ontology.json`` with all domains
            (the reference mode reads ``onto.raw``).
        semantics: ``"paper"`` or ``"reference"``.
        seed: seeds ``random.Random(seed)`` when ``rng`` is not given.
        rng: a ``random.Random`` to draw from (advanced in place), e.g. to build train then test from one stream
            as the reference does.

    Returns:
        list of :class:`DSTExample`.
    Raises:
        ValueError: unknown semantics; a gold slot missing from the ontology (names dialogue and turn; the
        reference crashes with a KeyError there).
    """
    _check_semantics(semantics)
    rng = rng if rng is not None else random.Random(seed)
    out: list[DSTExample] = []
    for d in dialogues:
        for t in d["dialogue"]:
            if not t["turn_label"]:
                continue
            for slot, gold in t["turn_label"]:
                where = f"dialogue {d['dialogue_idx']} turn {t.get('turn_idx')}"
                if semantics == "reference":
                    key = _reference_ontology_key(slot)
                    if key not in onto.raw:
                        raise ValueError(f"{where}: slot {slot!r} (ontology key {key!r}) is not in the ontology")
                    out.append(DSTExample(example_text(t, slot, gold), 1, slot, gold, d["dialogue_idx"],
                                          t.get("turn_idx", 0)))
                    value = rng.choice(onto.raw[key])
                    if value not in gold:
                        out.append(DSTExample(example_text(t, slot, value), 0, slot, value, d["dialogue_idx"],
                                              t.get("turn_idx", 0)))
                    continue
                if slot not in onto.values:
                    raise ValueError(f"{where}: slot {slot!r} is not in the ontology")
                g = canonical_value(slot, gold)
                if g == "none":
                    continue  # an empty value is no slot-value pair
                out.append(DSTExample(example_text(t, slot, g), 1, slot, g, d["dialogue_idx"], t.get("turn_idx", 0)))
                pool = [v for v in candidate_values(onto, slot) if v != g and v not in g]
                if pool:
                    v = rng.choice(pool)
                    out.append(DSTExample(example_text(t, slot, v), 0, slot, v, d["dialogue_idx"],
                                          t.get("turn_idx", 0)))
    return out


def example_counts(examples: Sequence[DSTExample]) -> dict:
    """``{"n_examples", "n_positive", "n_negative"}``."""
    pos = sum(e.label for e in examples)
    return {"n_examples": len(examples), "n_positive": pos, "n_negative": len(examples) - pos}


# ------------------------------------------------------------------------------------------------ tokens
def encode_examples(examples: Sequence[DSTExample] | Sequence[str], tokenizer, *, block_size: int = BLOCK_SIZE,
                    truncation: str = "left", pad_id: int | None = None,
                    labels: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """GPT-2 BPE ids of the examples as fixed-shape arrays, right-padded.

    Args:
        examples: :class:`DSTExample` s, or plain texts (then ``labels`` or zeros).
        tokenizer: :class:`rbjax.model.tokenizer.Tokenizer` (no special tokens are added, as the reference's
            GPT-2 tokenizer adds none).
        block_size: tokens per row (the reference's 128).
        truncation: ``"left"`` (default) keeps the **last** ``block_size`` tokens: the slot-value pair sits at the
            end of the text and must survive, so the start of the system turn is cut. ``"right"`` (alias
            ``"reference"``) keeps the first ``block_size`` tokens, as the reference's tokenizer call does; on a
            long turn that cuts off the slot-value pair, so positive and negative become the same text.
        pad_id: id written into padding (default: the tokenizer's ``<|endoftext|>``, 50256, as pad == eos in
            DialoGPT); padding is masked, so its value only matters for ``pooling="reference"``.

    Returns:
        ``{"input_ids": int32 (N, block_size), "attention_mask": int32 (N, block_size) (1 = real token),
        "labels": float32 (N,), "lengths": int32 (N,) (token count before truncation)}``.
    Raises:
        ValueError: bad ``truncation``/``block_size``, or an example that encodes to no token.
    """
    if truncation not in TRUNCATION:
        raise ValueError(f"truncation must be one of {TRUNCATION}, got {truncation!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    texts = [e if isinstance(e, str) else e.text for e in examples]
    if labels is None:
        labels = [0.0 if isinstance(e, str) else float(e.label) for e in examples]
    if len(labels) != len(texts):
        raise ValueError(f"{len(labels)} labels for {len(texts)} examples")
    pad = tokenizer.eos_id if pad_id is None else int(pad_id)
    ids = tokenizer.encode_batch(texts) if texts else []
    n = len(texts)
    lengths = np.zeros(n, np.int32)
    for i, seq in enumerate(ids):
        if not seq:
            raise ValueError(f"example {i} ({texts[i][:60]!r}) encodes to no token")
        lengths[i] = len(seq)
    input_ids, mask = pad_sequences(ids, pad, width=block_size, truncate=_cut_end(truncation))
    return {"input_ids": input_ids, "attention_mask": mask, "labels": np.asarray(labels, np.float32),
            "lengths": lengths}


def dst_batches(arrays: dict[str, np.ndarray], batch_size: int, *, shuffle: bool = False, seed: int = 0,
                drop_remainder: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """Fixed-shape batches ``{"input_ids", "attention_mask", "labels", "weights"}`` from :func:`encode_examples`.

    Every batch has ``batch_size`` rows (one compiled program): the last partial batch is filled with
    all-padding rows of weight 0 unless ``drop_remainder``. ``weights`` (float32 ``(B,)``) is 1 for real rows;
    :func:`dst_loss` and :func:`make_loss_fn` average over it.

    Args:
        shuffle: permute the rows with ``np.random.default_rng(seed)`` (a trainer passes a per-epoch seed).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(arrays["labels"])
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    for start in range(0, n, batch_size):
        rows = order[start:start + batch_size]
        if len(rows) < batch_size and drop_remainder:
            return
        b = {k: arrays[k][rows] for k in ("input_ids", "attention_mask", "labels")}
        w = np.ones(len(rows), np.float32)
        if len(rows) < batch_size:
            extra = batch_size - len(rows)
            b["input_ids"] = np.concatenate([b["input_ids"], np.repeat(b["input_ids"][-1:], extra, 0)])
            b["attention_mask"] = np.concatenate([b["attention_mask"], np.zeros((extra, b["attention_mask"].shape[1]),
                                                                                np.int32)])
            b["labels"] = np.concatenate([b["labels"], np.zeros(extra, np.float32)])
            w = np.concatenate([w, np.zeros(extra, np.float32)])
        b["weights"] = w
        yield b


# ------------------------------------------------------------------------------------------------ model
def init_head(config, seed: int = 0) -> dict:
    """The classifier ``Linear(d → 1)``: ``{"kernel": (d, 1) ~ N(0, initializer_range), "bias": (1,) zeros}``
    (HF's ``_init_weights`` for ``nn.Linear``, which the reference's ``GPT2LMandDST`` uses)."""
    k = jax.random.normal(jax.random.PRNGKey(seed), (config.hidden_size, 1), jnp.float32) * config.initializer_range
    return {"kernel": k, "bias": jnp.zeros((1,), jnp.float32)}


FP32 = get_policy("fp32")


def pooled_index(attention_mask) -> jax.Array:
    """Position of the last real token of each row: the rightmost index with mask 1.

    Works for right and left padding alike (``[1,1,1,1,0,0]`` → 3, ``[0,0,1,1,1,1]`` → 5). "First pad − 1" would
    give the wrong token on a left-padded row, or on a right-padded row that contains the pad id as a real token
    (pad == eos in DialoGPT). A row without real tokens gives 0.

    Args:
        attention_mask: ``(B, L)`` 0/1.
    Returns:
        int32 ``(B,)``.
    """
    m = jnp.asarray(attention_mask) > 0
    L = m.shape[-1]
    idx = jnp.max(jnp.where(m, jnp.arange(L, dtype=jnp.int32), -1), axis=-1)
    return jnp.maximum(idx, 0).astype(jnp.int32)


def dst_logits(params, head_params: dict, input_ids, attention_mask, config, *, pooling: str = "last",
               dropout_rng=None) -> jax.Array:
    """One logit per row: ``Linear(d→1)`` on the model's final hidden state (after the final norm, GPT-2's
    ``ln_f``) of the pooled token.

    Args:
        params: the model's params. head_params: :func:`init_head`.
        input_ids, attention_mask: ``(B, L)``.
        config: the model's config (any family of :mod:`rbjax.model.registry`).
        pooling: ``"last"`` (default): the state of the last real token (:func:`pooled_index`), computed with the
            attention mask and position ids from the mask, so a row's logit does not depend on how much padding it
            has or on which side. ``"reference"``: ``lm_dst_binary.py`` — no attention mask (pads are attended,
            positions ``0..L-1``) and the column of the batch's longest row (the last column of the reference's
            dynamically padded batch), which for every shorter right-padded row is a pad.
        dropout_rng: a PRNG key turns GPT-2's dropout on (training); ``None`` = deterministic.

    Returns:
        float32 ``(B,)``.
    """
    if pooling not in POOLING:
        raise ValueError(f"pooling must be one of {POOLING}, got {pooling!r}")
    model = family_of_config(config).module(config)
    kw = dict(deterministic=dropout_rng is None, rngs=None if dropout_rng is None else {"dropout": dropout_rng},
              return_logits=False)
    if pooling == "last":
        idx = pooled_index(attention_mask)
    else:
        idx = jnp.broadcast_to(jnp.max(pooled_index(attention_mask)), (input_ids.shape[0],))
        attention_mask = None
    # the last layer computes the pooled token's state alone (``query_positions``)
    _, hidden = model.apply({"params": params}, input_ids, attention_mask=attention_mask,
                            query_positions=idx[:, None], **kw)
    return dst_head_logits(hidden[:, 0], head_params)


def dst_head_logits(pooled, head_params: dict) -> jax.Array:
    """The classifier ``Linear(d→1)`` on pooled states: float32 ``(B, d)`` → ``(B,)`` logits (also used by the
    trainer's packed layout, which reads each pooled state from its packed slot: :func:`rbjax.train.lm.forward_at`)."""
    return (pooled.astype(jnp.float32) @ head_params["kernel"].astype(jnp.float32))[:, 0] + head_params["bias"][0]


def dst_loss(logits, labels, weights=None) -> jax.Array:
    """Mean binary cross-entropy with logits (``optax.sigmoid_binary_cross_entropy``; the reference's
    ``BCEWithLogitsLoss``), optionally weighted (``weights`` 0 drops padding rows). Scalar, nats."""
    per = optax.sigmoid_binary_cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(labels, jnp.float32))
    if weights is None:
        return jnp.mean(per)
    w = jnp.asarray(weights, jnp.float32)
    return jnp.sum(per * w) / jnp.maximum(jnp.sum(w), 1.0)


def make_loss_fn(config, *, pooling: str = "last", dropout: bool = True):
    """``loss_fn(params, batch, rng) -> (loss, aux)`` for a generic trainer.

    ``params = {"gpt2": GPT-2 params, "head": init_head(...)}``; ``batch`` from :func:`dst_batches`
    (``input_ids``/``attention_mask`` ``(B, L)``, ``labels`` ``(B,)``, optional ``weights``); ``rng`` the dropout
    key (ignored when ``dropout`` is false; the reference trains with GPT-2's dropout on). ``aux`` =
    ``{"logits": (B,), "accuracy": scalar over weighted rows}``. Pure and jit-able.
    """
    def loss_fn(params, batch, rng):
        logits = dst_logits(params["gpt2"], params["head"], batch["input_ids"], batch["attention_mask"], config,
                            pooling=pooling, dropout_rng=rng if dropout else None)
        w = batch.get("weights")
        loss = dst_loss(logits, batch["labels"], w)
        correct = ((logits >= 0) == (batch["labels"] > 0.5)).astype(jnp.float32)
        wf = jnp.ones_like(correct) if w is None else w
        acc = jnp.sum(correct * wf) / jnp.maximum(jnp.sum(wf), 1.0)
        return loss, {"logits": logits, "accuracy": acc}
    return loss_fn


@dataclasses.dataclass(frozen=True)
class DSTObjective:
    """The DST fine-tuning loss for the shared trainer (an :class:`rbjax.train.step.Objective`; paper §3.2): the
    classifier ``Linear(d→1)`` on the state of the pooled token, mean BCE over the rows that hold an example.

    ``params = {"gpt2": the model's params, "head": init_head(...)}``; the micro-batch holds ``input_ids``/
    ``attention_mask`` ``(B, L)``, ``labels`` ``(B,)`` and optionally ``weights`` ``(B,)`` (default: 1 for a row with
    a token, 0 for the filler rows of a short last batch). In the packed layout the model runs on the packed rows
    (:func:`rbjax.train.lm.forward_at`) and the last real token's state is read from its packed slot.

    Attributes:
        pooling: ``last`` or ``reference`` (:func:`dst_logits`; the reference pooling attends padding and is never
            packed).
    """

    pooling: str = "last"
    hparam_names = ()
    metric_names = ("bce_loss",)
    own_params = ("head",)  # trained also when the body is frozen under low-rank adapters

    def describe(self) -> dict:
        """The objective's static settings (for the run's key)."""
        return {"objective": "dst", "pooling": self.pooling}

    def exchangeable(self, data) -> bool:
        """The loss of a micro-batch is the mean BCE of its examples, so an update's examples may be dealt anew into
        its full micro-batches (:class:`rbjax.train.batching.BatchPlan`) — unless ``data`` gives each example a
        weight of its own (``weights``), which makes a micro-batch's mean depend on its members."""
        return "weights" not in getattr(data, "extra", {})

    def __post_init__(self):
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {self.pooling!r}")

    def logical_axes(self, path: tuple, shape: tuple, model_axes) -> tuple | None:
        """The head (``d`` + 1 numbers) is replicated on every device; the body is split by its family's rule."""
        if path and path[0] == "head":
            return (None,) * len(shape)
        return model_axes(path, shape)

    def __call__(self, params, batch: dict, hparams, key, spec):
        if "pack" in batch:
            if self.pooling != "last":
                raise ValueError("the reference DST pooling attends padding: use the padded layout")
            model = family_of_config(spec.config).module(spec.config)
            pooled = forward_at(model, params["gpt2"], batch, key is not None, key,
                                pooled_index(batch["attention_mask"]))
            logits = dst_head_logits(pooled, params["head"])
        else:
            logits = dst_logits(params["gpt2"], params["head"], batch["input_ids"], batch["attention_mask"],
                                spec.config, pooling=self.pooling, dropout_rng=key)
        w = batch.get("weights")
        if w is None:  # the filler rows of a short last batch (no token) do not count
            w = (jnp.sum(batch["attention_mask"], axis=-1) > 0).astype(jnp.float32)
        loss = dst_loss(logits, batch["labels"], w)
        return loss, {"bce_loss": loss}


@partial(jax.jit, static_argnames=("config", "pooling"))
def _probs(params, head, input_ids, attention_mask, config, pooling):
    with FP32.matmul_context():  # the classifier is evaluated in full fp32 on every backend
        return jax.nn.sigmoid(dst_logits(params, head, input_ids, attention_mask, config, pooling=pooling))


def _on_mesh(params, head_params: dict, config, mesh) -> tuple:
    """The classifier on ``mesh``: the body split by its family's logical axes, the head replicated."""
    return shard_tree(params, mesh, logical_axes_for(config)), replicate(head_params, mesh)


def predict_proba(params, head_params: dict, arrays: dict[str, np.ndarray], config, *,
                  batch_size: int = 64, pooling: str = "last", bucket: int = 32, progress: bool = False,
                  desc: str = "DST", mesh=None) -> np.ndarray:
    """``sigmoid(dst_logits)`` of every row of ``arrays`` (:func:`encode_examples`), float32 ``(N,)``.

    Batches have ``batch_size`` rows; each is cut to its longest row rounded up to a multiple of ``bucket`` columns
    (at most ``block/bucket`` compiled shapes). Dropping trailing all-padding columns changes no logit, for either
    pooling (causal attention; the reference's column is the longest row's last token), and saves most of the
    work: MultiWOZ examples have 40 tokens on average, not 128. ``bucket=0`` keeps the full width.

    ``mesh`` (:func:`rbjax.core.mesh.make_mesh`): the body's parameters split by the family's logical axes over
    ``fsdp``/``tensor`` (the head replicated), each batch's rows over ``data``×``fsdp`` where they divide; ``None``:
    where the parameters already are.
    """
    n = len(arrays["labels"])
    rows_sharding = None
    if mesh is not None:
        params, head_params = _on_mesh(params, head_params, config, mesh)
        axes = batch_axes(mesh, batch_size)
        rows_sharding = NamedSharding(mesh, PartitionSpec(axes if axes else None))
    # (jax.device_put, not jnp.asarray: in jax 0.10 the latter compiles a small staging program per shape)
    put = jax.device_put if rows_sharding is None else (lambda x: jax.device_put(x, rows_sharding))
    out = np.zeros(n, np.float32)
    bar = None
    if progress:
        bar = progress_bar(n, desc, "pair")
    i = 0
    width = arrays["input_ids"].shape[1]
    for b in dst_batches(arrays, batch_size):
        w = _batch_width(b["attention_mask"], width, bucket)
        p = np.asarray(_probs(params, head_params, put(b["input_ids"][:, :w]), put(b["attention_mask"][:, :w]),
                              config, pooling))
        k = int(b["weights"].sum())
        out[i:i + k] = p[:k]
        i += k
        if bar is not None:
            bar.update(k)
        poll()  # an interrupt inside a long phase (rbjax.core.interrupt.interruptible) stops here
    if bar is not None:
        bar.close()
    return out


def _batch_width(attention_mask: np.ndarray, width: int, bucket: int) -> int:
    """Columns a batch of :func:`predict_proba` is cut to: its longest row rounded up to ``bucket``."""
    if not bucket:
        return width
    return min(width, -(-(int(_last_real_index(attention_mask)) + 1) // bucket) * bucket)


def prediction_widths(arrays: dict[str, np.ndarray] | None = None, batch_size: int = 64, bucket: int = 32, *,
                      block_size: int | None = None) -> set[int]:
    """The column counts of the batches :func:`predict_proba` runs on ``arrays`` (one compiled program each),
    without running them: for :func:`compile_predictions`. With ``block_size`` instead of ``arrays``: every width
    a batch of rows of ``block_size`` columns can be cut to (the joint goal's candidate batches, built per turn)."""
    if arrays is None:
        return {min(w, block_size) for w in range(bucket, block_size + bucket, bucket)} if bucket else {block_size}
    return {_batch_width(b["attention_mask"], arrays["input_ids"].shape[1], bucket)
            for b in dst_batches(arrays, batch_size)}


def compile_predictions(params, head_params: dict, config, widths, *, batch_size: int = 64,
                        pooling: str = "last") -> int:
    """Compile ahead (``jax.jit(...).lower(...).compile()``) the program :func:`predict_proba` (without a mesh)
    runs for batches of ``batch_size`` rows cut to each of ``widths`` columns (:func:`prediction_widths`), for
    parameters of the shapes, dtypes and placement of ``params`` / ``head_params`` (arrays or
    ``jax.ShapeDtypeStruct``); a later :func:`predict_proba` of those shapes then compiles nothing. Returns the
    number of programs."""
    p, h = abstract(params), abstract(head_params)
    for w in sorted(set(widths)):
        cols = jax.ShapeDtypeStruct((batch_size, w), jnp.int32)
        _probs.lower(p, h, cols, cols, config, pooling).compile()
    return len(set(widths))


def _last_real_index(attention_mask: np.ndarray) -> int:
    """Host-side: the largest last-real-token index over the rows of a mask (0 when nothing is real)."""
    m = np.asarray(attention_mask) > 0
    if not m.any():
        return 0
    return int(np.max(np.where(m, np.arange(m.shape[1]), -1)))


# ------------------------------------------------------------------------------------------------ metrics
def binary_metrics(scores, labels, *, threshold: float = 0.5, from_logits: bool = False) -> dict:
    """The reference's DST metrics over the sampled pairs (``TrainerDST.prediction_loop``).

    Predicted positive = ``sigmoid(logit) >= threshold`` (probabilities computed in float32 like the reference's
    ``torch.sigmoid``). Definitions as sklearn's: ``accuracy``; ``f1`` = binary F1 of class 1 (0 when there is no
    predicted or no true positive, sklearn's ``zero_division`` default); ``f1_macro`` = mean F1 over the classes
    present in labels or predictions; ``confusion_matrix`` = ``[[tn, fp], [fn, tp]]`` (rows true 0/1, columns
    predicted 0/1 — always 2×2; sklearn's is 1×1 when a single class occurs).

    Args:
        scores: ``(N,)`` probabilities, or logits with ``from_logits``. labels: ``(N,)`` 0/1.
    Returns:
        dict with ``accuracy``, ``f1``, ``f1_macro``, ``precision``, ``recall``, ``confusion_matrix``, ``n``,
        ``n_positive``.
    """
    s = np.asarray(scores, np.float32).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(np.int64)
    if s.shape != y.shape:
        raise ValueError(f"{s.shape[0]} scores for {y.shape[0]} labels")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    p = (1.0 / (1.0 + np.exp(-s)) if from_logits else s).astype(np.float32) >= threshold
    p = p.astype(np.int64)
    tp = int(((p == 1) & (y == 1)).sum())
    tn = int(((p == 0) & (y == 0)).sum())
    fp = int(((p == 1) & (y == 0)).sum())
    fn = int(((p == 0) & (y == 1)).sum())

    def f1(tp_, fp_, fn_):
        d = 2 * tp_ + fp_ + fn_
        return 2 * tp_ / d if d and tp_ else 0.0

    present = sorted(set(y.tolist()) | set(p.tolist()))
    per_class = {1: f1(tp, fp, fn), 0: f1(tn, fn, fp)}
    n = len(y)
    return {
        "accuracy": (tp + tn) / n if n else None,
        "f1": per_class[1],
        "f1_macro": float(np.mean([per_class[c] for c in present])) if present else None,
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "confusion_matrix": [[tn, fp], [fn, tp]],
        "n": n,
        "n_positive": int(y.sum()),
    }


# ------------------------------------------------------------------------------------------------ joint goal
def jga_slots(dialogue: dict, onto: SlotOntology, domains: Iterable[str] = EXPERIMENT_DOMAINS) -> list[str]:
    """Slots scored for a dialogue: the ontology slots of the dialogue's goal domains that are in ``domains``
    (TRADE's five evaluation domains by default), in ontology order."""
    keep = set(domains) & set(dialogue.get("domains") or [])
    return [s for s in onto.slots if s.split("-", 1)[0] in keep]


def jga_candidates(dialogue: dict, onto: SlotOntology, domains: Iterable[str] = EXPERIMENT_DOMAINS
                   ) -> list[tuple[str, str]]:
    """The ``(slot, value)`` pairs scored at every turn of ``dialogue`` for joint goal accuracy: every candidate
    value (:func:`candidate_values`) of every slot of :func:`jga_slots`."""
    return [(s, v) for s in jga_slots(dialogue, onto, domains) for v in candidate_values(onto, s)]


def gold_belief(turn: dict, domains: Iterable[str] | None = EXPERIMENT_DOMAINS) -> dict[str, str]:
    """``{slot: value}`` of a TRADE turn's ``belief_state`` (slots of ``domains`` only; ``None`` = all)."""
    keep = None if domains is None else set(domains)
    out = {}
    for b in turn["belief_state"]:
        for slot, value in b["slots"]:
            if keep is None or slot.split("-", 1)[0] in keep:
                out[slot] = value
    return out


def _canon_state(state: dict[str, str]) -> dict[str, str]:
    out = {}
    for slot, value in state.items():
        c = canonical_value(slot, value)
        if c != "none":
            out[slot] = c
    return out


def beliefs_equal(gold: dict[str, str], pred: dict[str, str]) -> bool:
    """Whether a predicted belief state matches the gold one (one turn of joint goal accuracy).

    Both sides go through :func:`~rbjax.dialog.multiwoz.canonical_value` ("center" = "centre", "do n't care" =
    "dontcare"); a slot whose value is ``none`` (or "not mentioned", "") counts as absent; ``dontcare`` is an
    ordinary value that must be predicted — it is never dropped before comparing. Equal iff the same slots carry
    the same values.
    """
    return _canon_state(gold) == _canon_state(pred)


def predict_beliefs(dialogue: dict, candidates: Sequence[tuple[str, str]], probs: np.ndarray, *,
                    threshold: float = 0.5) -> list[dict[str, str]]:
    """Belief states of every turn from the classifier's turn-level decisions.

    The classifier is trained on ``turn_label`` (pairs *added* in a turn), so at turn t the slots it accepts
    (``p >= threshold``; the highest-scoring value of a slot if several) overwrite the state of turn t-1.

    Args:
        candidates: :func:`jga_candidates` of the dialogue (``K`` pairs).
        probs: ``(T, K)`` probabilities, one row per turn.
    Returns:
        list of ``T`` dicts ``{slot: value}``.
    """
    probs = np.asarray(probs)
    if probs.shape != (len(dialogue["dialogue"]), len(candidates)):
        raise ValueError(f"probs has shape {probs.shape}, expected ({len(dialogue['dialogue'])}, {len(candidates)})")
    state: dict[str, str] = {}
    out = []
    for t in range(probs.shape[0]):
        best: dict[str, tuple[float, str]] = {}
        for (slot, value), p in zip(candidates, probs[t]):
            if p >= threshold and (slot not in best or p > best[slot][0]):
                best[slot] = (float(p), value)
        state = {**state, **{s: v for s, (_, v) in best.items()}}
        out.append(dict(state))
    return out


def joint_goal_accuracy(gold_states: Sequence[dict], pred_states: Sequence[dict]) -> dict:
    """Joint goal accuracy: the share of turns whose whole belief state is right (:func:`beliefs_equal`).

    Returns:
        ``{"jga", "n_turns", "n_correct", "correct": [bool per turn]}``.
    """
    if len(gold_states) != len(pred_states):
        raise ValueError(f"{len(gold_states)} gold states but {len(pred_states)} predictions")
    ok = [beliefs_equal(g, p) for g, p in zip(gold_states, pred_states)]
    return {"jga": sum(ok) / len(ok) if ok else None, "n_turns": len(ok), "n_correct": sum(ok), "correct": ok}


def jga_cost(dialogues: Sequence[dict], onto: SlotOntology, domains: Iterable[str] = EXPERIMENT_DOMAINS) -> dict:
    """How many pairs joint goal accuracy scores (every candidate of every turn), and the best reachable JGA.

    Returns:
        ``{"n_dialogues", "n_turns", "n_pairs", "pairs_per_turn_mean", "pairs_per_turn_min", "pairs_per_turn_max",
        "oracle_jga"}``; ``oracle_jga`` = share of turns whose gold state (in comparison form) uses only slots and
        values of the candidate set, i.e. the JGA of a perfect classifier with these candidates.
    """
    domains = tuple(domains)
    per_turn, reachable = [], 0
    for d in dialogues:
        cands = jga_candidates(d, onto, domains)
        cset = set(cands)
        for t in d["dialogue"]:
            per_turn.append(len(cands))
            gold = _canon_state(gold_belief(t, domains))
            reachable += all((s, v) in cset for s, v in gold.items())
    n = len(per_turn)
    return {"n_dialogues": len(dialogues), "n_turns": n, "n_pairs": int(sum(per_turn)),
            "pairs_per_turn_mean": float(np.mean(per_turn)) if n else None,
            "pairs_per_turn_min": int(min(per_turn)) if n else None,
            "pairs_per_turn_max": int(max(per_turn)) if n else None,
            "oracle_jga": reachable / n if n else None}


def _encode_turn_pairs(tokenizer, turn: dict, candidates: Sequence[tuple[str, str]], suffix_cache: dict
                       ) -> list[list[int]]:
    """Token ids of ``example_text(turn, slot, value)`` for every candidate: the context is encoded once and the
    ``" slot-value"`` suffix once per distinct pair. GPT-2's pre-tokeniser splits before a space that follows a
    non-space character, so the concatenation equals encoding the whole text; a context ending in whitespace
    is encoded whole, pair by pair."""
    ctx = turn_context(turn)
    if not ctx or ctx[-1].isspace():
        return tokenizer.encode_batch([example_text(turn, s, v) for s, v in candidates])
    c = tokenizer.encode(ctx)
    out = []
    for s, v in candidates:
        suf = suffix_cache.get((s, v))
        if suf is None:
            suf = suffix_cache[(s, v)] = tokenizer.encode(f" {s}-{v}")
        out.append(c + suf)
    return out


def score_joint_goal(params, head_params: dict, config, tokenizer, dialogues: Sequence[dict],
                     onto: SlotOntology, *, domains: Iterable[str] = EXPERIMENT_DOMAINS, batch_size: int = 64,
                     block_size: int = BLOCK_SIZE, truncation: str = "left", pooling: str = "last",
                     threshold: float = 0.5, pad_id: int | None = None, progress: bool = True, mesh=None) -> dict:
    """Joint goal accuracy of a DST classifier: score every candidate pair of every turn, decode the belief states
    (:func:`predict_beliefs`), compare with the gold states (:func:`beliefs_equal`).

    Cost: :func:`jga_cost` pairs, each a forward pass of up to ``block_size`` tokens: on the MultiWOZ 2.0 test split
    (ConvLab copy, 999 dialogues, 7368 turns) 4,713,028 pairs, 640 per turn on average (145–1292), against 15,870
    sampled pairs for the binary metrics — about 300 times the work. On a CPU score a slice of ``dialogues``.
    ``mesh``: as :func:`predict_proba`.

    Returns:
        ``{"jga", "n_turns", "n_correct", "n_pairs", "oracle_jga", "per_dialogue": [{dialogue_idx, correct}]}``.
    """
    domains = tuple(domains)
    if mesh is not None:  # placed once, not per turn (predict_proba then finds them in place)
        params, head_params = _on_mesh(params, head_params, config, mesh)
    if truncation not in TRUNCATION:
        raise ValueError(f"truncation must be one of {TRUNCATION}, got {truncation!r}")
    pad = tokenizer.eos_id if pad_id is None else int(pad_id)
    cost = jga_cost(dialogues, onto, domains)
    bar = None
    if progress:
        bar = progress_bar(cost["n_pairs"], "DST joint goal", "pair")
    golds, preds, per_dialogue = [], [], []
    cache: dict = {}
    for d in dialogues:
        cands = jga_candidates(d, onto, domains)
        T, K = len(d["dialogue"]), len(cands)
        probs = np.zeros((T, K), np.float32)
        if K:
            for ti, t in enumerate(d["dialogue"]):
                seqs = _encode_turn_pairs(tokenizer, t, cands, cache)
                ids, mask = pad_sequences(seqs, pad, width=block_size, truncate=_cut_end(truncation))
                arrays = {"input_ids": ids, "attention_mask": mask, "labels": np.zeros(K, np.float32)}
                probs[ti] = predict_proba(params, head_params, arrays, config, batch_size=batch_size, pooling=pooling,
                                          mesh=mesh)
                if bar is not None:
                    bar.update(K)
        pred = predict_beliefs(d, cands, probs, threshold=threshold)
        gold = [gold_belief(t, domains) for t in d["dialogue"]]
        ok = [beliefs_equal(g, p) for g, p in zip(gold, pred)]
        per_dialogue.append({"dialogue_idx": d["dialogue_idx"], "correct": ok})
        golds += gold
        preds += pred
    if bar is not None:
        bar.close()
    res = joint_goal_accuracy(golds, preds)
    return {"jga": res["jga"], "n_turns": res["n_turns"], "n_correct": res["n_correct"], "n_pairs": cost["n_pairs"],
            "oracle_jga": cost["oracle_jga"], "per_dialogue": per_dialogue}
