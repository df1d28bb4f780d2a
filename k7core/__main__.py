"""``python -m k7core``: the ``k7`` command line (needs the ``cli`` extra)."""

from .cli import main

main()
