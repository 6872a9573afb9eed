"""`python -m freetoken.cli ...`: the `freetoken` command."""
import sys

from . import main

sys.exit(main())
