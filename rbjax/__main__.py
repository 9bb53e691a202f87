"""``python -m rbjax``: the ``rbjax`` command (:func:`rbjax.cli.main`), for environments without the console script."""
from rbjax.cli import console_main

if __name__ == "__main__":  # pragma: no cover
    console_main()
