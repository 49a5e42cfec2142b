"""``python -m verl.data.preprocess``: see :mod:`verl.data.preprocess.cli`."""

import sys

from verl.data.preprocess.cli import main

sys.exit(main())
