"""Launcher for tests: `onwatch serve` as its own process, without the console script.

    python tests/webhook/serve_inbox.py PATH [--host H] [--port N] [--config F] [--max-body B]
                                        [--allow-host NAME]…

Builds the same arguments the CLI does and calls core.webhooks.main.
"""

import argparse
import sys

from onwatch.core.webhooks import main

parser = argparse.ArgumentParser()
parser.add_argument("path")
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8787)
parser.add_argument("--config", default=None)
parser.add_argument("--max-body", type=int, default=None)
parser.add_argument("--allow-host", action="append")
sys.exit(main(parser.parse_args()))
