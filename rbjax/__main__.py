"""``python -m rbjax``: the ``rbjax`` command (:func:`rbjax.cli.main`), for environments without the console script."""
import sys

from rbjax.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
