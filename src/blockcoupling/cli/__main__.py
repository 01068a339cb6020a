"""``python -m blockcoupling.cli``."""

import sys

from blockcoupling.cli import main

sys.exit(main())
