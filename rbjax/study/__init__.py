"""The paper's §5 study as one command: a study file → keyed, resumable stages → a report (``rbjax run``)."""
