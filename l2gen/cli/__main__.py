"""``python -m l2gen.cli``: the ``l2gen`` command."""

import sys

from . import main

sys.exit(main())
