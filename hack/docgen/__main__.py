"""``python -m hack.docgen``: write the generated pages, or ``--check`` them (``hack.docgen.cli``)."""

import sys

from hack.docgen.cli import main

sys.exit(main())
