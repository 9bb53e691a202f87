"""``rbjax debias --method self-debias``: Self-Debias (Schick et al. 2021; :mod:`rbjax.model.self_debias`) as a run
folder like any other method's (docs/debiasing.md, "Self-Debias").

Self-Debias changes no weight: it rescales the next-token distribution at decoding time. The run folder therefore
holds the prefixes as data and the keys of its inputs, not a model::

    OUT/results.json    status "done", method "self-debias", ``training_free`` and ``inference_time`` true, the
                        settings (prefixes, λ, ε), the base model (its source, folder and files key), the tokenizer,
                        the key of the inputs
    OUT/prefixes.json   the prefix texts and their token ids (each tokenised on its own, no special tokens)

:meth:`rbjax.model.handle.ModelHandle.open` reads such a folder as the base model with
:attr:`~rbjax.model.handle.ModelHandle.self_debias` set (the base's files checked against the recorded key), so
``measure`` (every benchmark) scores it with the rescaled distribution. It cannot be folded into weights: ``export``
refuses it.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rbjax.core.io import atomic_folder, atomic_write_json
from rbjax.core.keys import digest
from rbjax.debias.config import resolve_bias_type
from rbjax.debias.training_free import TRAINING_FREE_METHODS, stored_run
from rbjax.model.handle import ModelHandle, is_run_folder
from rbjax.model.self_debias import DECAY_CONSTANT, EPSILON, SelfDebiasSettings, default_prefixes

__all__ = ["SelfDebiasRun", "run_self_debias", "METHOD"]

METHOD = "self-debias"
assert METHOD not in TRAINING_FREE_METHODS


@dataclasses.dataclass(frozen=True)
class SelfDebiasRun:
    """The settings of a Self-Debias run.

    Attributes:
        bias_type: a packaged bias type (its bias-bench prefix is the default) or a spec file (then ``prefixes``
            are needed). model, tokenizer, out_dir: as a trained run's. prefixes: the user's own prefix texts
            (``--prefix``, repeatable; default: bias-bench's for the bias type). decay_constant: λ. epsilon: ε.

    Raises:
        ValueError: no default prefix for the bias type and none given; an empty prefix; λ or ε out of range.
    """

    bias_type: str
    model: str
    out_dir: str
    tokenizer: str | None = None
    prefixes: tuple[str, ...] = ()
    decay_constant: float = DECAY_CONSTANT
    epsilon: float = EPSILON

    def __post_init__(self):
        object.__setattr__(self, "bias_type", resolve_bias_type(self.bias_type))
        object.__setattr__(self, "prefixes", tuple(self.prefixes))
        self.self_debias()  # the checks

    def self_debias(self) -> SelfDebiasSettings:
        prefixes = self.prefixes or default_prefixes(self.bias_type)
        return SelfDebiasSettings(prefixes, float(self.decay_constant), float(self.epsilon))


def run_self_debias(cfg: SelfDebiasRun, *, overwrite: bool = False) -> dict:
    """Write the run folder (module docstring); returns the results record.

    A finished run in ``cfg.out_dir`` with the same inputs (the ``key`` of results.json) is reused; with other
    inputs it is refused unless ``overwrite``.

    Raises:
        FileExistsError: ``out_dir`` holds another run (or anything else) and ``overwrite`` is false.
        ValueError: a prefix that encodes to no token; the base model is itself a run folder.
    """
    out = Path(cfg.out_dir)
    handle = ModelHandle.open(cfg.model, cfg.tokenizer)
    if handle.run_folder is not None:
        raise ValueError(f"--model {cfg.model}: Self-Debias rescales a base model's distribution; give the model "
                         "folder or hub id, not a debiasing run folder")
    settings = cfg.self_debias()
    handle.self_debias = settings  # (for the prefix ids only; the handle is not scored)
    prefix_ids = handle.self_debias_prefix_ids()
    key = {"method": METHOD, "settings": settings.to_dict(), "bias_type": cfg.bias_type, "model": handle.digest,
           "tokenizer": handle.tokenizer_digest}
    prev = None if overwrite else stored_run(out, key, METHOD)
    if prev is not None:
        return prev
    tok = handle.tokenizer_folder()
    res = {"status": "done", "method": METHOD, "bias_type": cfg.bias_type, "training_free": True,
           "inference_time": True, "self_debias": settings.to_dict(),
           "prefixes_default": not cfg.prefixes, "prefix_tokens": [len(p) for p in prefix_ids],
           "base_model": {"source": str(cfg.model), "folder": str(Path(handle.folder).resolve()),
                          "files_key": handle.files_key(), "files_digest": handle.digest},
           "tokenizer": None if cfg.tokenizer is None else str(Path(tok).resolve() if tok else cfg.tokenizer),
           "tokenizer_digest": handle.tokenizer_digest, "key": key, "key_digest": digest(key),
           "model": handle.describe(), "model_dir": None,
           "note": "Self-Debias is inference-time only: no weights are written; measure/evaluate read this folder "
                   "as the base model with the rescaled next-token distribution; export refuses it"}
    with atomic_folder(out) as tmp:  # written whole, then put in place (an earlier run is replaced, never mixed)
        atomic_write_json(tmp / "prefixes.json", [{"text": t, "token_ids": ids}
                                                  for t, ids in zip(settings.prefixes, prefix_ids)])
        atomic_write_json(tmp / "results.json", res)
    assert is_run_folder(out)
    return res
