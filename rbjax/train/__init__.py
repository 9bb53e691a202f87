"""The task-agnostic trainer: settings (:mod:`~rbjax.train.config`), batches and updates (:mod:`~rbjax.train.batching`),
the causal-LM pieces objectives share (:mod:`~rbjax.train.lm`), clip + Adam (:mod:`~rbjax.train.optim`), the pure
step that takes a task's objective (:mod:`~rbjax.train.step`), orbax checkpoints (:mod:`~rbjax.train.checkpoint`),
the loop (:mod:`~rbjax.train.loop`) and its hooks, what a run does around its updates (:mod:`~rbjax.train.hooks`:
resume and checkpoints, the metrics file, the progress bar, signals, the user's own). It knows no task by name:
debiasing (:mod:`rbjax.debias`) and the dialog fine-tuning tasks (:mod:`rbjax.dialog`) each supply an objective and
their data."""
