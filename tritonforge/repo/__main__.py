"""``python -m tritonforge.repo``: see :mod:`tritonforge.repo.cli`."""

import sys

from tritonforge.repo.cli import main

sys.exit(main())
