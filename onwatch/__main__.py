"""`python -m onwatch`: the `onwatch` console script."""

import sys

from onwatch.cli.entry import main

sys.exit(main())
