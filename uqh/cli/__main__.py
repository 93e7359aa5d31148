"""``python -m uqh.cli``: the same as the ``uqh`` console script."""
import sys

from uqh.cli import main

sys.exit(main())
