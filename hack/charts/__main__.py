"""``python -m hack.charts``: write the charts, or ``--check`` them (``hack.charts.cli``)."""

import sys

from hack.charts.cli import main

sys.exit(main())
