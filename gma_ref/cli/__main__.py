"""``python -m gma_ref.cli``: the ``gma-ref`` command (:func:`gma_ref.cli.main`)."""

import sys

from . import main

__all__: list[str] = []

if __name__ == "__main__":  # imported (pkgutil.walk_packages), it runs nothing
    sys.exit(main())
