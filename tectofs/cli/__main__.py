"""``python -m tectofs.cli``."""

from . import main

main()
