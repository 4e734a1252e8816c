"""`python -m cli`: the `onwatch` console script."""

import sys

from cli.entry import main

sys.exit(main())
