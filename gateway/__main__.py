"""``python -m gateway`` is ``mayu``."""

import sys

from gateway.cli import main

sys.exit(main())
