"""rbjax: RedditBias (Barikeri et al., ACL 2021) in JAX."""
__version__ = "0.1.0"
