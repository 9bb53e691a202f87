"""The training objective of a debiasing run (paper §4, eq. 2): the loss :func:`rbjax.train.step.train_step` takes.

``lm`` = mean next-token cross-entropy over the micro-batch's real targets (:func:`rbjax.train.lm.forward_and_nll`,
the next-token NLL shared with the LMB scorer); ``debias`` = the method's loss from :mod:`rbjax.debias.losses` on the
final hidden states (after the final norm) with the batch's trigger arrays and the target pairs; ``total`` =
λ_LM·L_LM + λ_D·L_D (:func:`rbjax.debias.losses.total_loss`, the reference's λ rule under reference semantics). CDA
and plain LM fine-tuning use ``lm`` alone.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from rbjax.debias import losses as L
from rbjax.debias.config import LOSS_METHODS, METHODS, SEMANTICS
from rbjax.model.registry import family_of_config
from rbjax.train.lm import forward_and_nll

__all__ = ["DebiasObjective"]


@dataclasses.dataclass(frozen=True)
class DebiasObjective:
    """The loss of one debiasing method (an :class:`rbjax.train.step.Objective`).

    Attributes:
        method: ``lmd``/``add``/``hd`` (a debiasing loss beside the LM loss), ``cda``/``lm`` (the LM loss alone).
        semantics: ``paper``/``reference`` (the official code's normalisations and λ rule: docs/debiasing.md §4,
            "Paper vs reference").

    The micro-batch holds ``input_ids``/``attention_mask`` ``(B, L)``, the method's trigger arrays (``lmd_mask``
    ``(B, L, P)`` and ``norm`` ``(B,)``; or ``occ_weights`` ``(B, N, L)`` and ``occ_mask`` ``(B, N)``) and the target
    pairs ``pair_ids``/``pair_mask`` ``(P, 2, W)``, shared by the micro-batches of an update; in the chat format also
    ``loss_mask`` ``(B, L)``, 1 on the phrase's tokens, the only targets of the LM loss. The hyper-parameters
    are ``(λ_LM, λ_D)`` for LMD, ADD and HD (:attr:`hparam_names`), none for CDA and LM; the metrics are
    ``lm_loss`` and ``debias_loss`` (0 for CDA and LM).

    Raises:
        ValueError: unknown method or semantics.
    """

    method: str
    semantics: str = "paper"
    shared_keys = ("pair_ids", "pair_mask")
    metric_names = ("lm_loss", "debias_loss")

    @property
    def hparam_names(self) -> tuple[str, ...]:
        return ("lambda_lm", "lambda_d") if self.method in LOSS_METHODS else ()

    def describe(self) -> dict:
        """The objective's static settings (for the run's key)."""
        return {"method": self.method, "semantics": self.semantics}

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {SEMANTICS}, got {self.semantics!r}")

    def __call__(self, params, batch: dict, hparams, key, spec):
        # chat format: the LM loss's targets are the phrase's tokens (``loss_mask``), never the template's
        score = batch["attention_mask"] * batch["loss_mask"] if "loss_mask" in batch else batch["attention_mask"]
        hidden, lm = forward_and_nll(params, batch, key, spec, score)
        if self.method not in LOSS_METHODS:
            return lm, {"lm_loss": lm, "debias_loss": jnp.zeros((), jnp.float32)}
        deb = self.debias_loss(spec.config, params, hidden, batch)
        return L.total_loss(lm, deb, hparams[0], hparams[1], self.semantics), {"lm_loss": lm, "debias_loss": deb}

    def debias_loss(self, config, params, hidden, batch):
        """The method's loss L_D on the final hidden states ``(B, L, d)`` (§4.1–§4.3)."""
        # the output embedding: the LM head (the tied wte for GPT-2, the untied head where a family has one)
        targets = L.gather_targets(family_of_config(config).lm_head(params), batch["pair_ids"], batch["pair_mask"])
        if self.method == "lmd":
            return L.equalising_loss(hidden, targets, batch["lmd_mask"], batch["norm"], semantics=self.semantics)
        if self.method == "add":
            return L.attribute_distance_loss(hidden, targets, batch["occ_weights"], batch["occ_mask"],
                                             semantics=self.semantics)
        basis, basis_mask = L.bias_subspace(targets, semantics=self.semantics)
        return L.neutralisation_loss(hidden, batch["occ_weights"], batch["occ_mask"], basis, basis_mask,
                                     semantics=self.semantics)
