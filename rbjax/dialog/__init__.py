"""Dialog-quality checks of a (debiased) conversational model (paper §3.2, Tables 4–5); ``rbjax evaluate``.

* :mod:`rbjax.dialog.evaluate` — the entry point: :func:`~rbjax.dialog.evaluate.evaluate` runs ``lmp``, ``dst``,
  ``crg`` or ``all`` on a model and writes keyed, reusable ``OUT/<task>.json`` result files.
* :mod:`rbjax.dialog.tasks` — the tasks, one module each (its runner and settings dataclass), behind a registry
  (:func:`rbjax.dialog.tasks.get_task`); what they share in :mod:`rbjax.dialog.tasks.common`.
* :mod:`rbjax.dialog.reddit_perplexity` — language-model perplexity (LMP) on the 6K Reddit reference utterances.
* :mod:`rbjax.dialog.multiwoz` — MultiWOZ 2.0 in TRADE's turn format (three layouts, normalisation, ontology).
* :mod:`rbjax.dialog.state_tracking` — dialog state tracking as binary slot-value classification; metrics, joint goal accuracy.
* :mod:`rbjax.dialog.crg_data` — DSTC-7 conversation files, the offline test contexts, fine-tuning examples.
* :mod:`rbjax.dialog.crg_generation` — responses for dialog contexts with the jit KV-cache sampler, as JSONL.
* :mod:`rbjax.dialog.crg_metrics`, :mod:`rbjax.dialog.text` — the DSTC-7 metrics and ``-c`` cleaning.

Documentation: ``docs/dialog.md``.
"""
