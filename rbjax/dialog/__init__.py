"""Dialog-quality checks of a (debiased) conversational model (paper §3.2).

* :mod:`rbjax.dialog.lmp` — language-model perplexity (LMP) on the 6K Reddit reference utterances.
"""
