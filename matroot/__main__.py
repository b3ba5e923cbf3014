"""``python -m matroot`` and the ``matroot`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
