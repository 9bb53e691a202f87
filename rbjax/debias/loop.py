"""The trainer of a debiasing run: the task-agnostic :class:`rbjax.train.loop.Trainer` with the method's objective
(:class:`rbjax.debias.objective.DebiasObjective`) and the run's training phrases and trigger arrays
(:class:`rbjax.debias.data.TrainingData`, built from the loaded model's tokenizer)."""
from __future__ import annotations

from rbjax.debias.config import TrainConfig
from rbjax.debias.data import TrainingData
from rbjax.debias.objective import DebiasObjective
from rbjax.train.loop import RunHparams, Trainer, TrainResult

__all__ = ["DebiasTrainer", "RunHparams", "TrainResult"]


class DebiasTrainer(Trainer):
    """A debiasing run (or a chunk of grid points sharing one batch plan) of :class:`TrainConfig`.

    Args:
        cfg: the run's :class:`TrainConfig`.
        texts: the training phrases (default: the bias type's, :func:`rbjax.debias.data.load_training_texts`).
        objective: default ``DebiasObjective(cfg.method, cfg.semantics)``.
        **kw: as :class:`rbjax.train.loop.Trainer` (points, model_config, params, model_key, tokenizer, data, plan,
            mesh).

    Raises:
        FileNotFoundError, ValueError, RuntimeError: missing model/data, bad settings.
    """

    def __init__(self, cfg: TrainConfig, *, texts: list[str] | None = None, objective=None, **kw):
        self.texts = texts
        super().__init__(cfg, objective or DebiasObjective(cfg.method, cfg.semantics), **kw)

    def make_data(self, tokenizer, vocab_size: int) -> TrainingData:
        return TrainingData(self.cfg, tokenizer, vocab_size, self.texts)

    # what the run's records report about its data
    trigger_stats = property(lambda self: self.data.trigger_stats)
    data_info = property(lambda self: self.data.info)
    n_occ = property(lambda self: self.data.n_occ)
    shared = property(lambda self: self.data.shared)
