"""Language model bias (LMB, paper §3.1): perplexity scoring (:mod:`.perplexity`), statistics (:mod:`.stats`) and
the measurement (:mod:`.measure`)."""

#: the one description of the scorer's batch size, shown by every option that sets it (``measure --batch-size``,
#: ``splits --batch-size``, ``debias --eval-batch-size``) and by docs/lmb.md
SCORING_BATCH_HELP = ("nominal phrases per compiled scoring batch: a batch holds 16 × N token slots (1,024 by "
                      "default), packed into rows of several phrases; raise it on a GPU")
