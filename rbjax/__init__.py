"""rbjax: RedditBias (Barikeri et al., ACL 2021) in JAX.

Main entry points (imported lazily, so ``import rbjax`` stays cheap):

* :func:`rbjax.measure_bias` — language model bias on RedditBias (paper §3.1),
  the same as ``rbjax measure``; see :func:`rbjax.lmb.measure.measure_bias`.
* :func:`rbjax.compare_models` — did the bias change? A paired comparison of two measured models on the same
  pairs, the same as ``rbjax compare``; see :mod:`rbjax.lmb.compare`.
* :func:`rbjax.load_spec` — a bias specification (paper §2.1, App. A).
"""
__version__ = "0.1.0"

_LAZY = {
    "measure_bias": ("rbjax.lmb.measure", "measure_bias"),
    "compare_models": ("rbjax.lmb.compare", "compare_models"),
    "load_spec": ("rbjax.specs", "load_spec"),
    "load_pretrained": ("rbjax.model.hf", "load_pretrained"),
    "save_pretrained": ("rbjax.model.hf", "save_pretrained"),
    "load_tokenizer": ("rbjax.model.tokenizer", "load_tokenizer"),
    "ModelHandle": ("rbjax.model.handle", "ModelHandle"),
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'rbjax' has no attribute {name!r}")
